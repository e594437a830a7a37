"""The README's snippets, found by their ``<!-- snippet: NAME -->`` markers: each named snippet
exists, and each config snippet is a valid config that turns detection on.  (The framework
adapters' Python snippets are run as written, against the broker and a worker, by
tests/integration/test_framework_adapters.py, which finds them by the same markers.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from schemas.config import load_config_file
from streams.engine import ConfigSet
from streams.engine.config import CONFIGURABLE_FINAL

README = Path(__file__).resolve().parents[2] / "README.md"
INTEGRATIONS_DOC = README.parent / "docs" / "integrations.md"
MARKER = re.compile(r"^<!-- snippet: ([a-z0-9-]+) -->\n```(\w+)\n(.*?)^```$", re.M | re.S)

PYTHON_SNIPPETS = {"langchain", "openai-agents", "pydantic-ai"}
ADAPTER_DOC_SNIPPETS = {"claude-agent-sdk", "ag2", "crewai", "google-adk"}
"""docs/integrations.md's adapters, run as written by tests/integration/test_framework_*.py."""
CONFIG_SNIPPETS = {"config-first"}
MCP_CLIENT_SNIPPETS = {"mcp-client-config"}
"""Run as written by tests/docs/test_mcp_client_config.py (every such block of README.md and docs/)."""


def snippets(page: Path = README) -> dict[str, tuple[str, str]]:
    """Marker name -> (language, code)."""
    found: dict[str, tuple[str, str]] = {}
    for name, lang, code in MARKER.findall(page.read_text(encoding="utf-8")):
        assert name not in found, f"snippet {name} marked twice"
        found[name] = (lang, code)
    return found


def snippet(name: str, lang: str) -> str:
    found = snippets()
    assert name in found, f"README.md has no `<!-- snippet: {name} -->` followed by a ```{lang} block"
    assert found[name][0] == lang, name
    return found[name][1]


def test_every_marker_is_one_the_tests_run() -> None:
    """A marker no test reads would be a snippet nobody checks; a missing one fails below."""
    assert set(snippets()) == PYTHON_SNIPPETS | CONFIG_SNIPPETS | MCP_CLIENT_SNIPPETS


@pytest.mark.parametrize("name", sorted(PYTHON_SNIPPETS))
def test_python_snippet_compiles(name: str) -> None:
    code = snippet(name, "python")
    compile(code, f"README.md ({name})", "exec")
    assert code.count('"kafka:9092"') == 1  # the one address the integration test replaces


def adapter_snippets() -> dict[str, str]:
    readme, doc = snippets(), snippets(INTEGRATIONS_DOC)
    assert set(doc) == ADAPTER_DOC_SNIPPETS
    return {name: readme[name][1] for name in PYTHON_SNIPPETS} | {name: doc[name][1] for name in doc}


@pytest.mark.parametrize("name", sorted(PYTHON_SNIPPETS | ADAPTER_DOC_SNIPPETS))
def test_adapter_setup_is_at_most_five_lines(name: str) -> None:
    """Setup is what an agent's code gains: the body of the snippet's ``main`` (the client,
    the adapter put on the agent, the run), its comments and blank lines aside; the imports
    and the agent itself are not counted."""
    code = adapter_snippets()[name]
    body = code.split("async def main(", 1)[1].splitlines()[1:]
    lines = [line for line in body if line.strip() and not line.strip().startswith("#")]
    assert len(lines) <= 5, (name, lines)


def config_snippet_paths(tmp_path: Path) -> list[Path]:
    paths = [README.parent / "examples" / "getting-started.yaml"]
    for name in sorted(CONFIG_SNIPPETS):
        path = tmp_path / f"{name}.yaml"
        path.write_text(snippet(name, "yaml"), encoding="utf-8")
        paths.append(path)
    return paths


@pytest.mark.parametrize("which", [0, 1])
def test_config_snippet_is_valid_and_turns_detection_on(which: int, tmp_path: Path) -> None:
    """The README's first config and examples/getting-started.yaml."""
    path = config_snippet_paths(tmp_path)[which]
    config = ConfigSet(load_config_file(path))  # strict: the validation `config check` runs
    assert config.detection_status() == [("*", CONFIGURABLE_FINAL, True)]
    settings = config.settings_for(None)
    # What the snippet says in its comments (hand-read from the README).
    assert settings.surface_warnings is True and settings.abort_after_critical_blocks == 3


def test_openai_agents_snippet_outlives_the_sdks_default_turns() -> None:
    """The SDK's default max_turns (10) ends a run before upstream's critical threshold (20)."""
    code = snippet("openai-agents", "python")
    turns = re.search(r"max_turns=(\d+)", code)
    assert turns is not None and int(turns.group(1)) > 20
    assert "set_tracing_disabled(True)" in code


def test_helm_install_commands_escape_commas() -> None:
    """``helm --set a=x,y`` splits at the comma (y becomes a key): lists need ``\\,``."""
    docs = README.parent / "docs"
    for doc in (
        README,
        docs / "operations.md",
        docs / "security.md",
        README.parent / "helm" / "loopwatch" / "README.md",
    ):
        for line in doc.read_text(encoding="utf-8").splitlines():
            for value in re.findall(r"--set(?:-string)? (\S+)", line):
                assert not re.search(r"(?<!\\),", value.split("=", 1)[1]), f"{doc.name}: {line.strip()}"
