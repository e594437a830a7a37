"""The native relay (``relay.c``, what ``hook install`` writes when a C compiler is found) gives
the Python relay's (``relay.py``) stdout, stderr and exit status byte for byte: with the serve
process away, answering each of its answers, refusing, silent or too long; with bad flags,
non-JSON and oversized input; and it sends the serve process the same request.  Each case runs
both commands on the same input and compares; the Python relay is the reference."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.integrations.hooks import install, relay

PRE = {"session_id": "s1", "hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": "ls"}}
POST = {**PRE, "hook_event_name": "PostToolUse", "tool_response": {"stdout": ""}}
BEFORE = {"session_id": "s1", "hook_event_name": "BeforeTool", "tool_name": "run_shell_command", "tool_input": {}}
PYTHON_RELAY = [sys.executable, "-I", "-S", relay.__file__]
# The environment of both commands: nothing of the caller's socket settings.
ENV = {k: v for k, v in os.environ.items() if k not in ("LOOPWATCH_HOOK_SOCKET", "XDG_RUNTIME_DIR", "TMPDIR")}


def compiler() -> list[str]:
    found = install.find_compiler()
    if found is None:
        pytest.fail("no C compiler (cc, gcc or clang): the native relay cannot be built")
    return found


@pytest.fixture(scope="module")
def native(tmp_path_factory) -> list[str]:
    return [str(install.build_native_relay(compiler(), cache=tmp_path_factory.mktemp("relay-cache")))]


def run(command: list[str], args: list[str], stdin: bytes, env: dict | None = None) -> tuple[int, bytes, bytes]:
    done = subprocess.run([*command, *args], input=stdin, capture_output=True, timeout=60, env=env or ENV)
    return done.returncode, done.stdout, done.stderr


def both(native: list[str], args: list[str], stdin: bytes, env: dict | None = None) -> tuple:
    expected = run(PYTHON_RELAY, args, stdin, env)
    got = run(native, args, stdin, env)
    assert got == expected
    return expected


class ScriptedServe:
    """A Unix socket that answers every relay request with ``answer`` (None: closes without a
    word; ``"mute"``: reads the request and never answers) and keeps each request it read."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.answer: bytes | str | None = b"O"
        self.requests: list[bytes] = []
        self.release = threading.Event()
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                chunks = []
                while chunk := conn.recv(65536):
                    chunks.append(chunk)
                self.requests.append(b"".join(chunks))
                if self.answer == "mute":
                    self.release.wait(60)
                elif isinstance(self.answer, bytes):
                    try:
                        conn.sendall(self.answer)
                    except OSError:
                        pass

    def close(self) -> None:
        self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        self.thread.join(10)


@pytest.fixture
def serve(tmp_path):
    server = ScriptedServe(tmp_path / "serve.sock")
    yield server
    server.close()


@pytest.mark.parametrize(
    ("args", "stdin"),
    [
        (["claude-code"], PRE),
        (["claude-code", "--fail-closed"], PRE),
        (["claude-code", "--fail-closed"], POST),
        (["codex", "--fail-closed", "--timeout", "2"], PRE),
        (["gemini", "--fail-closed"], BEFORE),
        (["gemini", "--timeout", "0.5"], BEFORE),
        (["claude-code", "--fail-closed"], b"[1, 2]"),
        (["claude-code"], b"{not json"),
        (["claude-code", "--fail-closed"], b"[" * 100_000),
        (["claude-code"], b"\xff\xfe{}"),
        (["claude-code"], b""),
        (["claude-code", "--fail-closed"], b"{}" + b" " * (4 * 1024 * 1024)),  # over 4 MiB: refused unsent
        (["cursor"], PRE),
        ([], PRE),
        (["claude-code", "--timeout", "soon"], PRE),
        (["claude-code", "--timeout", "0"], PRE),
        (["claude-code", "--timeout", "601"], PRE),
        (["claude-code", "--timeout", "1e1", "--fail-closed"], PRE),  # Python's float() decides
        (["claude-code", "--timeout", " 2 "], PRE),
        (["claude-code", "--timeout"], PRE),
        (["claude-code", "--socket"], PRE),
        (["gemini", "--verbose"], BEFORE),
        (["claude-code", "--fail-closed", "--fail-closed", "extra"], PRE),
    ],
)
def test_native_relay_answers_as_python_relay_when_serve_is_away(native, tmp_path, args, stdin):
    data = stdin if isinstance(stdin, bytes) else json.dumps(stdin).encode()
    full = [*args[:1], "--socket", str(tmp_path / "absent.sock"), *args[1:]] if args[:1] != ["cursor"] else args
    expected = both(native, full, data)
    assert expected[2].count(b"\n") == 1  # one line, whichever it is


@pytest.mark.parametrize(
    "socket_path",
    [
        "",  # connect refuses an empty address
        "x" * 108,  # as long as an AF_UNIX address can be
        "x" * 109,  # too long
        "/tmp/loopwatch-\u00e9t\u00e9-absent.sock",  # not ASCII: left to the Python relay whole
        "relative-absent.sock",
    ],
)
def test_native_relay_words_socket_failures_as_python_does(native, socket_path):
    expected = both(native, ["claude-code", "--socket", socket_path, "--fail-closed"], json.dumps(PRE).encode())
    assert expected[0] == 0 and b"failing closed" in expected[2]


@pytest.mark.parametrize(
    "env",
    [
        {"LOOPWATCH_HOOK_SOCKET": "/nonexistent/explicit.sock"},
        {"LOOPWATCH_HOOK_SOCKET": "", "XDG_RUNTIME_DIR": "/nonexistent/run//"},
        {"XDG_RUNTIME_DIR": "", "TMPDIR": "/nonexistent/tmp"},
        {"TMPDIR": "/"},
        {},
    ],
)
def test_native_relay_finds_the_default_socket_as_python_does(native, env):
    expected = both(native, ["claude-code"], json.dumps(PRE).encode(), env={**ENV, **env})
    assert b"no answer from loopwatch hook --serve at " in expected[2]


def test_native_relay_sends_the_same_request_and_writes_the_decision(native, serve):
    stdin = json.dumps(PRE, indent=1).encode()  # several lines: sent as they are
    serve.answer = b'O{"continue":false}'
    args = ["codex", "--socket", serve.path]
    assert both(native, args, stdin) == (0, b'{"continue":false}', b"")
    assert serve.requests == [b"LWR1 codex\n" + stdin] * 2


def test_native_relay_passes_an_input_of_exactly_4_mib_and_a_long_answer(native, serve):
    stdin = b"{}" + b" " * (4 * 1024 * 1024 - 2)
    serve.answer = b"O" + b"y" * (relay.MAX_ANSWER - 1)  # the longest answer taken
    assert both(native, ["claude-code", "--socket", serve.path], stdin)[:2] == (0, serve.answer[1:])
    assert serve.requests == [b"LWR1 claude-code\n" + stdin] * 2


def test_native_relay_refuses_an_answer_too_long_as_python_does(native, serve):
    serve.answer = b"O" + b"y" * relay.MAX_ANSWER
    expected = both(native, ["claude-code", "--socket", serve.path, "--fail-closed"], json.dumps(PRE).encode())
    assert b"answer too long; failing closed" in expected[2]


def test_native_relay_fails_as_python_does_when_serve_does_not_answer_in_time(native, serve):
    serve.answer = "mute"
    args = ["claude-code", "--socket", serve.path, "--timeout", "0.5", "--fail-closed"]
    expected = both(native, args, json.dumps(PRE).encode())
    serve.release.set()
    assert b"timed out; failing closed" in expected[2]
    serve.answer = b"O"
    assert both(native, args[:3], b"{}") == (0, b"", b"")  # after the two mute ones
    assert len(serve.requests) == 4  # asked once each: a fallback never asks again


ANSWERS = st.one_of(
    st.none(),  # the serve process closes without a word
    st.tuples(st.sampled_from([b"O", b"E", b"X", b"Z"]), st.binary(max_size=400)).map(b"".join),
    st.tuples(
        st.sampled_from([b"E", b"X"]),
        st.text(alphabet=st.characters(codec="utf-8"), max_size=400).map(lambda t: f" \u00a0{t}\u2003\n".encode()),
    ).map(b"".join),
)
BODIES = st.one_of(
    st.binary(max_size=600),
    st.dictionaries(st.text(max_size=8), st.recursive(st.none() | st.integers() | st.text(), st.lists)).map(
        lambda d: json.dumps(d).encode()
    ),
    st.sampled_from([PRE, POST, BEFORE]).map(lambda d: json.dumps(d).encode()),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answer=ANSWERS, stdin=BODIES, cli=st.sampled_from(["claude-code", "codex", "gemini"]), closed=st.booleans())
def test_native_relay_matches_python_relay_on_any_input_and_answer(native, serve, answer, stdin, cli, closed):
    serve.answer = answer
    serve.requests.clear()
    both(native, [cli, "--socket", serve.path, *(["--fail-closed"] if closed else [])], stdin)
    assert serve.requests == [b"LWR1 " + cli.encode() + b"\n" + stdin] * 2


def test_native_relay_runs_no_interpreter_on_a_decision(tmp_path, serve):
    """Built with a fallback interpreter that does not exist, it still answers a decision (no
    Python runs on that path) and says in one line that it cannot fall back."""
    built = install.build_native_relay(compiler(), python="/nonexistent/python", cache=tmp_path / "cache")
    serve.answer = b'O{"decision":"deny"}'
    assert run([str(built)], ["gemini", "--socket", serve.path], b"{}") == (0, b'{"decision":"deny"}', b"")
    code, out, err = run([str(built)], ["gemini", "--socket", str(tmp_path / "absent.sock")], b"{}")
    assert (code, out) == (
        127,
        b"",
    ) and err == b"loopwatch hook: cannot run /nonexistent/python: No such file or directory\n"
