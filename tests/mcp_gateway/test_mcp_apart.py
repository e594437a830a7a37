"""The gateway is apart (the founders' rule for integrations): the worker and the runner client
never load it or the ``mcp`` SDK, and the one place outside ``streams/integrations/`` that names it is
the ``loopwatch mcp-gateway`` command, which imports it only when run."""

from __future__ import annotations

import re
import subprocess
import sys

from harness import REPO


def test_worker_and_client_load_neither_the_gateway_nor_the_sdk():
    code = (
        "import sys, streams.app.worker, streams.client, streams.cli; "
        "bad = sorted(m for m in sys.modules if m == 'mcp' or m.startswith(('mcp.', 'mcp_types', 'streams.integrations')));"
        "print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"


def test_only_the_cli_names_the_gateway_and_only_inside_its_command():
    pattern = re.compile(r"^\s*(from|import)\s+(streams\.|\.+)integrations\b")
    places = [
        (path.relative_to(REPO).as_posix(), line)
        for root in ("streams", "schemas")
        for path in (REPO / root).rglob("*.py")
        if "integrations" not in path.relative_to(REPO).parts
        for line in path.read_text(encoding="utf-8").splitlines()
        if pattern.match(line)
    ]
    assert ("streams/cli.py", "    from streams.integrations.mcp.cli import main as gateway_main") in places
    assert all(path == "streams/cli.py" and line.startswith(" ") for path, line in places), places  # inside a function
