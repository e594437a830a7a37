"""``loopwatch hook install``: the snippet in docs/agent-clis.md is what it writes; it is
idempotent, keeps other hooks and backs up the file it changes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from streams.integrations.hooks.install import (
    DEFAULT_COMMAND,
    InstallError,
    http_hook,
    install,
    native_command,
    relay_command,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "agent-clis.md"


@pytest.mark.parametrize(
    ("cli", "heading"), [("claude-code", "Claude Code"), ("codex", "Codex CLI"), ("gemini", "Gemini CLI")]
)
def test_documented_snippet_is_what_install_writes(tmp_path, cli, heading):
    section = DOC.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    snippet = re.search(r"```json\n(.*?)```", section, re.S).group(1)
    # The doc's native relay was built for the user me (hook install writes its own build's path).
    binary = "/home/me/.cache/loopwatch/relay/3f2a9c0d5e7b1a46/loopwatch-relay"
    install(tmp_path / "settings.json", native_command(cli, binary), cli)
    assert json.loads((tmp_path / "settings.json").read_text()) == json.loads(snippet)


def test_documented_python_relay_command_is_what_install_writes_without_a_compiler():
    relay = "/opt/loopwatch/lib/python3.11/site-packages/streams/integrations/hooks/relay.py"
    command = relay_command("claude-code", python="/opt/loopwatch/bin/python", relay=relay)
    assert f"`{command}`" in DOC.read_text()


def test_documented_http_snippet_is_what_install_http_writes(tmp_path):
    section = DOC.read_text().split("\n### HTTP hooks\n", 1)[1].split("\n## ", 1)[0]
    snippet = re.search(r"```json\n(.*?)```", section, re.S).group(1)
    install(tmp_path / "settings.json", http_hook("claude-code", "http://127.0.0.1:8975/hooks/claude-code"))
    assert json.loads((tmp_path / "settings.json").read_text()) == json.loads(snippet)


def test_install_http_replaces_the_command_hooks_idempotently_with_a_backup(tmp_path):
    path = tmp_path / "settings.json"
    other = {"matcher": "Bash", "hooks": [{"type": "http", "url": "http://127.0.0.1:1/audit"}]}
    path.write_text(json.dumps({"hooks": {"PreToolUse": [other]}}))
    install(path, DEFAULT_COMMAND)
    with_command = path.read_text()
    hook = http_hook("claude-code", "http://127.0.0.1:8975/hooks/claude-code")
    assert "written" in install(path, hook)
    assert (tmp_path / "settings.json.bak").read_text() == with_command
    first = path.read_text()
    assert "nothing changed" in install(path, hook)
    assert path.read_text() == first
    pre = json.loads(first)["hooks"]["PreToolUse"]
    bearer = {"Authorization": "Bearer ${LOOPWATCH_HOOK_TOKEN}"}
    ours = {"type": "http", "url": hook["url"], "headers": bearer, "allowedEnvVars": ["LOOPWATCH_HOOK_TOKEN"]}
    assert pre == [other, {"matcher": "*", "hooks": [{**ours, "timeout": 10}]}]
    install(path, DEFAULT_COMMAND)  # and back: the HTTP hook is loopwatch's, replaced
    assert [g["hooks"][0]["type"] for g in json.loads(path.read_text())["hooks"]["PreToolUse"]] == ["http", "command"]


@pytest.mark.parametrize(
    ("cli", "url", "says"),
    [
        ("gemini", "http://127.0.0.1:8975/hooks/gemini", "gemini has no HTTP hooks"),
        ("codex", "http://127.0.0.1:8975/hooks/codex", "codex has no HTTP hooks"),
        ("claude-code", "127.0.0.1:8975/hooks/claude-code", "is not an http:// URL"),
        ("claude-code", "http://127.0.0.1:8975/", "at the path /hooks/claude-code"),
    ],
)
def test_install_http_refuses_what_cannot_work_in_one_line(cli, url, says):
    with pytest.raises(InstallError, match=says):
        http_hook(cli, url)


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


def test_install_of_gemini_keeps_its_other_settings_and_hooks(tmp_path):
    path = tmp_path / "settings.json"
    other = {"matcher": "write_file", "hooks": [{"type": "command", "command": "./lint.sh"}]}
    path.write_text(json.dumps({"model": {"name": "m"}, "hooks": {"AfterTool": [other]}}))
    install(path, "loopwatch hook gemini --fail-closed", "gemini")
    assert "nothing changed" not in install(path, "loopwatch hook gemini", "gemini")  # replaced, not added
    settings = json.loads(path.read_text())
    assert settings["model"] == {"name": "m"}
    after = settings["hooks"]["AfterTool"]
    assert after[0] == other and len(after) == 2 and after[1]["hooks"][0]["command"] == "loopwatch hook gemini"
    assert [len(settings["hooks"][e]) for e in ("BeforeTool", "SessionEnd")] == [1, 1]
    assert "PreToolUse" not in settings["hooks"]  # nothing of Claude Code's


def test_codex_hooks_go_to_codex_home(tmp_path, monkeypatch):
    from streams.integrations.hooks.install import CLIS

    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "ch"))
    assert CLIS["codex"].path() == str(tmp_path / "ch" / "hooks.json")
    monkeypatch.delenv("CODEX_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert CLIS["codex"].path() == str(tmp_path / ".codex" / "hooks.json")


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--cli", "gemini", "--http", "http://127.0.0.1:8975/hooks/gemini"], "gemini has no HTTP hooks"),
        (
            ["--cli", "claude-code", "--http", "http://127.0.0.1:8975/hooks/claude-code", "--fail-closed"],
            "--http takes no --command, --relay, --socket or --fail-closed",
        ),
    ],
)
def test_hook_install_http_cli_refuses_in_one_line_and_writes_nothing(tmp_path, extra, says):
    import subprocess
    import sys

    settings = tmp_path / "settings.json"
    done = subprocess.run(
        [sys.executable, "-m", "streams.cli", "hook", "install", "--settings", str(settings), *extra],
        cwd=DOC.parents[1], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
    assert not settings.exists()


# -- which relay install writes ------------------------------------------------------------------


def _hook_install(tmp_path: Path, env: dict, *extra: str):
    import os
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "streams.cli", "hook", "install", "--cli", "claude-code",
         "--settings", str(tmp_path / "settings.json"), *extra],
        cwd=DOC.parents[1], capture_output=True, text=True, timeout=120,
        env={**{k: v for k, v in os.environ.items() if k != "CC"}, "XDG_CACHE_HOME": str(tmp_path / "cache"), **env},
    )  # fmt: skip


def _commands(tmp_path: Path) -> set[str]:
    hooks = json.loads((tmp_path / "settings.json").read_text())["hooks"]
    return {h["command"] for groups in hooks.values() for g in groups for h in g["hooks"]}


def test_install_compiles_the_native_relay_once_into_the_cache_and_says_so(tmp_path):
    done = _hook_install(tmp_path, {})
    assert done.returncode == 0, done.stderr
    said, written = done.stdout.splitlines()
    built = list((tmp_path / "cache" / "loopwatch" / "relay").glob("*/loopwatch-relay"))
    assert len(built) == 1 and said.startswith(f"relay: native, {built[0]} (built by ")
    assert _commands(tmp_path) == {f"{built[0]} claude-code"} and "written" in written
    stamp = built[0].stat().st_mtime_ns
    again = _hook_install(tmp_path, {})  # idempotent: the same binary, the same file
    assert again.stdout.splitlines() == [
        said,
        f"loopwatch hooks already in {tmp_path / 'settings.json'}; nothing changed",
    ]
    assert built[0].stat().st_mtime_ns == stamp
    assert sorted(p.name for p in built[0].parent.iterdir()) == ["loopwatch-relay"]  # no temporary left


def test_install_without_a_compiler_writes_the_python_relay_and_says_why(tmp_path):
    import sys

    done = _hook_install(tmp_path, {"PATH": str(tmp_path / "empty")})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "relay: python -I -S relay.py (no C compiler: none of cc, gcc, clang on PATH)"
    assert _commands(tmp_path) == {relay_command("claude-code", python=sys.executable)}
    native = _hook_install(tmp_path, {})  # the Python relay is loopwatch's: replaced, with a backup
    assert native.returncode == 0 and "previous file" in native.stdout, native
    assert [c.rsplit("/", 1)[1] for c in _commands(tmp_path)] == ["loopwatch-relay claude-code"]
    assert json.loads((tmp_path / "settings.json.bak").read_text())["hooks"]["PreToolUse"][0]["hooks"][0][
        "command"
    ] == relay_command("claude-code", python=sys.executable)


def test_install_relay_python_writes_the_python_relay_even_with_a_compiler(tmp_path):
    done = _hook_install(tmp_path, {}, "--relay", "python", "--fail-closed")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "relay: python -I -S relay.py (--relay python)"
    assert _commands(tmp_path) == {f"{relay_command('claude-code')} --fail-closed"}
    assert not (tmp_path / "cache").exists()  # nothing compiled


def test_install_with_a_broken_compiler_falls_back_to_python_unless_native_is_asked(tmp_path):
    done = _hook_install(tmp_path, {"CC": "false"})
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.splitlines()[0]
        == "relay: python -I -S relay.py (false could not build the native relay: exit status 1)"
    )
    assert not [p for p in (tmp_path / "cache").rglob("*") if not p.is_dir()]  # no half-built relay
    first = (tmp_path / "settings.json").read_text()
    for env in ({"CC": "false"}, {"PATH": str(tmp_path / "empty")}):
        refused = _hook_install(tmp_path, env, "--relay", "native")
        assert refused.returncode == 2 and refused.stdout == "" and refused.stderr.count("\n") == 1, refused
        assert refused.stderr.startswith("loopwatch hook install: ")
    assert (tmp_path / "settings.json").read_text() == first


def test_install_refuses_command_with_relay_in_one_line(tmp_path):
    done = _hook_install(tmp_path, {}, "--relay", "python", "--command", "loopwatch hook claude-code")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "loopwatch hook install: give --command or --relay, not both\n"
    assert not (tmp_path / "settings.json").exists()
