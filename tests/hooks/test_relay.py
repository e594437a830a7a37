"""The fast per-call command (``relay``) behaves as ``call`` does, word for word, whenever the
serve process gives no decision, and on its fast path loads nothing but ``_socket`` (and
``types``) on top of a bare ``python -I -S``."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from streams.integrations.hooks import call, install, relay

PRE = {"session_id": "s1", "hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": "ls"}}
POST = {**PRE, "hook_event_name": "PostToolUse", "tool_response": {"stdout": ""}}
BEFORE = {"session_id": "s1", "hook_event_name": "BeforeTool", "tool_name": "run_shell_command", "tool_input": {}}


def run(module: Path, args: list[str], stdin: bytes) -> tuple[int, bytes, bytes]:
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(module), *args], input=stdin, capture_output=True, timeout=30
    )
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize(
    ("args", "stdin"),
    [
        (["claude-code"], PRE),
        (["claude-code", "--fail-closed"], PRE),
        (["claude-code", "--fail-closed"], POST),
        (["codex", "--fail-closed", "--timeout", "2"], PRE),
        (["gemini", "--fail-closed"], BEFORE),
        (["gemini"], BEFORE),
        (["claude-code", "--fail-closed"], b"[1, 2]"),
        (["claude-code"], b"{not json"),
        (["claude-code", "--fail-closed"], b"[" * 100_000),
        (["claude-code"], b""),
        (["cursor"], PRE),
        ([], PRE),
        (["claude-code", "--timeout", "soon"], PRE),
        (["claude-code", "--timeout", "0"], PRE),
        (["claude-code", "--socket"], PRE),
        (["gemini", "--verbose"], BEFORE),
    ],
)
def test_relay_answers_as_call_does_when_serve_is_away(tmp_path, args, stdin):
    data = stdin if isinstance(stdin, bytes) else json.dumps(stdin).encode()
    full = [*args[:1], "--socket", str(tmp_path / "absent.sock"), *args[1:]] if args[:1] != ["cursor"] else args
    expected = run(Path(call.__file__), full, data)
    assert run(Path(relay.__file__), full, data) == expected
    assert expected[2].count(b"\n") == 1  # one line, whichever it is


def test_relay_fails_as_call_does_when_serve_does_not_answer_in_time(tmp_path):
    path = tmp_path / "mute.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as mute:
        mute.bind(str(path))
        mute.listen(4)  # accepts, never answers
        args = ["claude-code", "--socket", str(path), "--timeout", "0.5", "--fail-closed"]
        expected = run(Path(call.__file__), args, json.dumps(PRE).encode())
        got = run(Path(relay.__file__), args, json.dumps(PRE).encode())
    assert got == expected
    assert b"timed out; failing closed" in expected[2]


def test_relay_sends_stdin_as_it_is_and_loads_only_the_socket_module(tmp_path):
    path = tmp_path / "answer.sock"
    received: list[bytes] = []
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            chunks = []
            while chunk := conn.recv(65536):
                chunks.append(chunk)
            received.append(b"".join(chunks))
            conn.sendall(b'O{"continue":false}')

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    stdin = json.dumps(PRE, indent=1).encode()  # several lines: sent as they are
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-X", "importtime", relay.__file__, "codex", "--socket", str(path)],
        input=stdin, capture_output=True, timeout=30,
    )  # fmt: skip
    thread.join(10)
    server.close()
    assert (done.returncode, done.stdout) == (0, b'{"continue":false}'), done.stderr[-2000:]
    assert received == [b"LWR1 codex\n" + stdin]
    loaded = {
        line.split("|")[-1].strip()
        for line in done.stderr.decode().splitlines()
        if line.startswith("import time:") and "imported package" not in line
    }
    bare = subprocess.run([sys.executable, "-I", "-S", "-X", "importtime", "-c", "pass"], capture_output=True)
    before = {line.split("|")[-1].strip() for line in bare.stderr.decode().splitlines()}
    assert loaded - before == {"_socket", "types"}, loaded - before


def test_install_writes_the_relay_by_this_interpreter_and_replaces_it_idempotently(tmp_path):
    command = install.relay_command("claude-code")
    assert command.split() == [sys.executable, "-I", "-S", relay.__file__, "claude-code"]
    path = tmp_path / "settings.json"
    install.install(path, install.hook_command(command, socket="/run/x.sock"))
    assert "nothing changed" in install.install(path, install.hook_command(command, socket="/run/x.sock"))
    install.install(path, install.DEFAULT_COMMAND)  # loopwatch's own entry: replaced, not added to
    groups = json.loads(path.read_text())["hooks"]["PreToolUse"]
    assert [h["command"] for g in groups for h in g["hooks"]] == [install.DEFAULT_COMMAND]
