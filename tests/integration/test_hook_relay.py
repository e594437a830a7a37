"""The relays ``hook install`` writes (native and Python), against a real ``loopwatch hook --serve``,
worker and broker: the same hook outputs as ``call`` for the same inputs, a block included, and the
same one-line failure when the serve process refuses an input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from agent_cli_setup import start_serve, stop

from streams.integrations.hooks import call, install, relay

pytestmark = pytest.mark.kafka

CONFIG = {"tools": {"loopDetection": {"enabled": True, "warningThreshold": 10, "criticalThreshold": 12}}}


def hook(module: str, socket: str, payload: dict | bytes, *flags: str) -> tuple[int, str, str]:
    """``module``: a Python file run with ``-I -S``, or the native relay's binary."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    command = [module] if not module.endswith(".py") else [sys.executable, "-I", "-S", module]
    done = subprocess.run(
        [*command, "claude-code", "--socket", socket, *flags], input=data, capture_output=True, timeout=60
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def test_relays_and_call_answer_alike_from_the_real_serve_process(lw, tmp_path):
    compiler = install.find_compiler()
    assert compiler is not None, "no C compiler: the native relay cannot be built"
    native = str(install.build_native_relay(compiler, cache=tmp_path / "cache"))
    lw.configured_worker(CONFIG)
    socket = tmp_path / "hook.sock"
    serve = start_serve(lw, socket)
    try:
        outputs = {}
        for module in (native, relay.__file__, call.__file__):
            session = f"relay-{module.rsplit('/', 1)[1]}"
            seen = []
            for n in range(1, 14):  # the same Bash call: allowed 12 times, denied at the 13th
                pre = {"session_id": session, "hook_event_name": "PreToolUse", "tool_name": "Bash",
                       "tool_input": {"command": "ls"}, "tool_use_id": f"toolu_{n}"}  # fmt: skip
                code, out, err = hook(module, str(socket), pre)
                assert (code, err) == (0, ""), err
                seen.append(json.loads(out) if out else None)  # the same JSON, spaced or not
                if not out:
                    post = {**pre, "hook_event_name": "PostToolUse", "tool_response": {"stdout": "a\n"}}
                    assert hook(module, str(socket), post) == (0, "", "")
            outputs[module] = seen
        assert outputs[native] == outputs[relay.__file__] == outputs[call.__file__]
        assert outputs[relay.__file__][:12] == [None] * 12
        denied = outputs[relay.__file__][12]["hookSpecificOutput"]
        assert denied["permissionDecision"] == "deny", denied
        assert denied["permissionDecisionReason"].startswith("CRITICAL: Called Bash with identical arguments")
        # An input the serve process refuses (no session_id): the same line, failing open or closed.
        for flags in ((), ("--fail-closed",)):
            bad = {"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {}}
            got, python, expected = (hook(m, str(socket), bad, *flags) for m in (native, relay.__file__, call.__file__))
            assert got == python == expected, (got, python, expected)
            assert "session_id must be a non-empty string" in expected[2] and expected[2].count("\n") == 1
        # Not a JSON object: refused before anything is asked (call) or by the serve process (relay).
        got, python, expected = (hook(m, str(socket), b"[1]") for m in (native, relay.__file__, call.__file__))
        assert (
            got
            == python
            == expected
            == (1, "", "loopwatch hook: the hook input on stdin is not a JSON object: not a JSON object\n")
        )
    finally:
        stop(serve)
