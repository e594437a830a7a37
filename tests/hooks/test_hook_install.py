"""``loopwatch hook install``: the snippet in docs/agent-clis.md is what it writes; it is
idempotent, keeps other hooks and backs up the file it changes."""

from __future__ import annotations

import json
import re
from pathlib import Path

from streams.integrations.hooks.install import DEFAULT_COMMAND, install

DOC = Path(__file__).resolve().parents[2] / "docs" / "agent-clis.md"


def test_documented_snippet_is_what_install_writes(tmp_path):
    snippet = re.search(r"```json\n(.*?)```", DOC.read_text(), re.S).group(1)
    install(tmp_path / "settings.json", DEFAULT_COMMAND)
    assert json.loads((tmp_path / "settings.json").read_text()) == json.loads(snippet)


def test_install_is_idempotent_keeps_other_hooks_and_backs_up(tmp_path):
    path = tmp_path / "settings.json"
    other = {"matcher": "Bash", "hooks": [{"type": "command", "command": "echo mine"}]}
    path.write_text(json.dumps({"model": "x", "hooks": {"PreToolUse": [other]}}))
    install(path, DEFAULT_COMMAND)
    first = path.read_text()
    assert json.loads((tmp_path / "settings.json.bak").read_text())["hooks"]["PreToolUse"] == [other]
    assert "nothing changed" in install(path, DEFAULT_COMMAND)
    assert path.read_text() == first
    pre = json.loads(first)["hooks"]["PreToolUse"]
    assert pre[0] == other and len(pre) == 2 and pre[1]["hooks"][0]["command"] == DEFAULT_COMMAND
    assert json.loads(first)["model"] == "x"
