"""Codex CLI itself (npm ``@openai/codex``, ``make agent-clis``) with loopwatch's hooks, run
headless (``codex exec``) against a scripted Responses API (``scripted_responses``, a custom
model provider) that has the agent run the same ``ls`` through ``exec_command`` in a temp
directory again and again, on the real broker and a real worker.

What the model must see, by hand from the spec's rules (§2, §3) with warningThreshold 10 and
criticalThreshold 12: calls 1-10 run plainly; call 11 (ten identical calls before it, count 10,
warning bucket 10 // 10 = 1) runs, with loopwatch's warning as the PreToolUse hook's context
(Codex CLI gives it to the model as a developer message beside the call);
call 12 runs (count 11: no new bucket); calls 13 on are denied (count 12; a vetoed call is not
recorded, so the count stays), the deny reason reaching the model as the call's output.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from agent_cli_setup import AGENT_CLIS, python_env, start_serve, stop
from scripted_responses import ScriptedResponses, around_call, call_outputs

from harness import REPO

pytestmark = pytest.mark.kafka

CONFIG = {
    "tools": {"loopDetection": {"enabled": True, "warningThreshold": 10, "criticalThreshold": 12}},
    "loopwatch": {"surfaceWarnings": True},
}
CALLS = 14
WARNED, FIRST_DENIED = 11, 13
CODEX = AGENT_CLIS / "node_modules" / ".bin" / "codex"
BLOCKED = (
    "CRITICAL: Called Bash with identical arguments and identical outcomes 12 times. "
    "Session execution blocked to prevent runaway loops."
)
WARNING = "WARNING: You have called Bash 10 times with identical arguments."


@pytest.fixture
def codex() -> Path:
    if not CODEX.exists():
        pytest.fail(f"{CODEX} is missing: make agent-clis installs Codex CLI")
    return CODEX


def provider_config(url: str) -> str:
    return (
        'model_provider = "scripted"\n'
        "[model_providers.scripted]\n"
        'name = "scripted"\n'
        f'base_url = "{url}"\n'
        'wire_api = "responses"\n'
        'env_key = "OPENAI_API_KEY"\n'
    )


def run_codex(lw, codex: Path, tmp_path: Path, config: dict, calls: int, command: str = "ls"):
    """``codex exec`` with loopwatch's hooks against a script of ``calls`` identical calls of
    ``command`` in ``tmp_path/work``: its finished process and the requests of its agent loop."""
    lw.configured_worker(config)
    socket = tmp_path / "hook.sock"
    serve = start_serve(lw, socket)
    try:
        work = tmp_path / "work"
        work.mkdir()
        (work / "marker-file.txt").write_text("x\n")
        codex_home = tmp_path / "home" / ".codex"
        codex_home.mkdir(parents=True)
        env = python_env()
        env["CODEX_HOME"] = str(codex_home)
        installed = subprocess.run(
            [sys.executable, "-m", "streams.cli", "hook", "install", "--cli", "codex",
             "--socket", str(socket)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert installed.returncode == 0, installed.stderr
        assert installed.stdout.startswith("relay: native, "), installed.stdout  # what install writes with cc
        assert (codex_home / "hooks.json").exists(), installed.stdout
        with ScriptedResponses(calls, command) as model:
            (codex_home / "config.toml").write_text(provider_config(model.url))
            env.update(HOME=str(tmp_path / "home"), OPENAI_API_KEY="sk-test-dummy")
            started = time.monotonic()
            run = subprocess.run(
                [str(codex), "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                 "--dangerously-bypass-hook-trust", "-m", "gpt-5", "List the files here."],
                cwd=work, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            print(f"codex exec with {calls} scripted calls took {time.monotonic() - started:.1f}s")
            return run, list(model.requests)
    finally:
        stop(serve)
        if serve.stderr:
            print(serve.stderr.read()[-3000:])


def test_codex_cli_loop_is_warned_then_denied_through_its_own_hooks(lw, codex, tmp_path):
    run, requests = run_codex(lw, codex, tmp_path, CONFIG, CALLS)
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
    assert len(requests) == CALLS + 1, (len(requests), run.stdout[-1500:], run.stderr[-1500:])
    final = requests[-1]
    outputs = call_outputs(final)
    assert sorted(outputs) == [f"call_{n:04d}" for n in range(1, CALLS + 1)], sorted(outputs)
    for n in range(1, CALLS + 1):
        text = outputs[f"call_{n:04d}"]
        if n < FIRST_DENIED:
            assert "marker-file.txt" in text, (n, text)  # the real ls ran
        else:
            assert "marker-file.txt" not in text, (n, text)
            assert text == f"Command blocked by PreToolUse hook: {BLOCKED}. Command: ls", (n, text)
    # The warning is the PreToolUse hook's additionalContext: a developer message beside the call.
    warned = [n for n in range(1, CALLS + 1) if WARNING in around_call(final, f"call_{n:04d}")]
    assert warned == [WARNED], warned


def test_codex_cli_calls_of_an_aborted_run_are_all_denied(lw, codex, tmp_path):
    """With abortAfterCriticalBlocks 2, the second block (call 14) ends the run.  Codex CLI
    cannot be told to end its session from a tool hook (see streams.integrations.hooks.codex),
    so every later call is denied with the abort's message, and none of them runs: the command
    appends a line to a file, which has the twelve lines of the calls that ran.  (Call 15 may
    reach the worker before the client has read the abort, which follows call 14's decision;
    the worker then refuses it with its own words.)"""
    config = {**CONFIG, "loopwatch": {**CONFIG["loopwatch"], "abortAfterCriticalBlocks": 2}}
    command = "echo ran >> ran.log"
    run, requests = run_codex(lw, codex, tmp_path, config, 20, command)
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
    assert (tmp_path / "work" / "ran.log").read_text() == "ran\n" * 12
    assert len(requests) == 21, len(requests)
    outputs = call_outputs(requests[-1])
    aborted = (
        "CRITICAL: loopwatch ended this run after 2 critical tool-loop blocks (last: generic_repeat on Bash). "
        "Blocking single calls did not stop the loop."
    )
    refused = "CRITICAL: this run was aborted by loopwatch (critical_block_limit); no further tool calls are allowed."
    for n in range(13, 21):
        reasons = [BLOCKED] if n < 15 else [aborted, refused] if n == 15 else [aborted]
        expected = [f"Command blocked by PreToolUse hook: {r}. Command: {command}" for r in reasons]
        assert outputs[f"call_{n:04d}"] in expected, (n, outputs[f"call_{n:04d}"])
