"""Integrations are thin and apart: the worker and the clients never import ``streams.integrations``
(nor the frameworks it adapts), so installing, upgrading or breaking an adapter can never
touch the stream processor or a runner that uses the client alone."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What the adapters bring in; none of it may reach the worker or the client.
FOREIGN = (
    "langchain",
    "langchain_core",
    "langgraph",
    "agents",
    "openai",
    "pydantic_ai",
    "claude_agent_sdk",
    "ag2",
    "crewai",
    "mcp",
    "opentelemetry",
)

# Imports the named modules (a package: every module in it), and with "worker-cli" goes down
# the CLI's worker path (`loopwatch worker --help`: the command's own imports, then its help).
PROBE = """
import contextlib, importlib, io, json, pkgutil, sys
for name in sys.argv[1:]:
    if name == "worker-cli":
        from streams.cli import main
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            main(["worker", "--help"])
        continue
    module = importlib.import_module(name)
    for info in pkgutil.walk_packages(getattr(module, "__path__", []), name + "."):
        importlib.import_module(info.name)
print(json.dumps(sorted(sys.modules)))
"""


def _loaded(*modules: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *modules], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _foreign(loaded: list[str]) -> list[str]:
    return [
        m
        for m in loaded
        if m.split(".")[0] in FOREIGN or m.startswith(("streams.integrations", "google.adk", "google.genai"))
    ]


def test_the_worker_and_the_cli_worker_path_import_no_integration():
    loaded = _loaded("worker-cli", "streams.app", "streams.engine", "schemas")
    assert {"streams.app.worker", "streams.app.processor", "streams.cli"} <= set(loaded)  # the probe loaded them
    assert _foreign(loaded) == []


def test_the_client_imports_no_integration():
    loaded = _loaded("streams.client", "streams.edge.events")
    assert "streams.client.runner" in loaded
    assert _foreign(loaded) == []


def test_no_worker_client_or_schema_source_names_integrations():
    """Lazy imports inside functions included (the worker's run_worker imports faust late).
    The CLI may start an integration's own command (a lazy import there is its business); its
    worker path is the runtime check above."""
    pattern = re.compile(
        r"^\s*(from|import)\s+(streams\.|\.\.)integrations\b|import_module\(\s*[\"'](streams\.)?integrations", re.M
    )
    offenders = [
        str(p.relative_to(REPO))
        for root in ("streams/app", "streams/client", "streams/engine", "schemas")
        for p in (REPO / root).rglob("*.py")
        if pattern.search(p.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_the_probe_sees_an_adapter_when_one_is_imported():
    """The check can fail: importing an adapter does show up."""
    assert "streams.integrations.frameworks.langchain" in _foreign(_loaded("streams.integrations.frameworks.langchain"))
