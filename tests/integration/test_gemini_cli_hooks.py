"""Gemini CLI itself (npm ``@google/gemini-cli``, ``make agent-clis``) with loopwatch's hooks,
run headless against a scripted Gemini API (``scripted_gemini``) that has the agent run the
same shell ``ls`` in a temp directory again and again, on the real broker and a real worker.

What the model must see, by hand from the spec's rules (§2, §3) with warningThreshold 10 and
criticalThreshold 12: calls 1-10 run plainly; call 11 (ten identical calls before it, count 10,
warning bucket 10 // 10 = 1) runs, and loopwatch's warning reaches the model appended to its
result (Gemini CLI reads context from an AfterTool hook only); call 12 runs (count 11: no new
bucket); calls 13 on are denied (count 12, and twelve identical outcomes once the shell tool's
process ids are left out; a vetoed call is not recorded, so the count stays), the reason
reaching the model as the tool's error.  Gemini CLI's own loop detection (five identical calls)
is switched off, so that loopwatch's is the one that acts.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agent_cli_setup import AGENT_CLIS, python_env, start_serve, stop
from scripted_gemini import ScriptedGemini, function_responses

from harness import REPO
from harness.kafka import collect
from schemas import decode_event
from schemas.events import RunEnded

pytestmark = pytest.mark.kafka

CONFIG = {
    "tools": {"loopDetection": {"enabled": True, "warningThreshold": 10, "criticalThreshold": 12}},
    "loopwatch": {"surfaceWarnings": True},
}
CALLS = 14
WARNED, FIRST_DENIED = 11, 13
GEMINI = AGENT_CLIS / "node_modules" / ".bin" / "gemini"
BLOCKED = (
    "Tool execution blocked: CRITICAL: Called run_shell_command with identical arguments and identical "
    "outcomes 12 times. Session execution blocked to prevent runaway loops."
)
WARNING = "WARNING: You have called run_shell_command 10 times with identical arguments."
USER_SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "model": {"disableLoopDetection": True},
    "privacy": {"usageStatisticsEnabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
}


@pytest.fixture
def gemini() -> Path:
    if not GEMINI.exists():
        pytest.fail(f"{GEMINI} is missing: make agent-clis installs Gemini CLI")
    return GEMINI


def output_of(response: dict) -> str:
    body = response.get("response") or {}
    return str(body.get("output", "")) + str(body.get("error", ""))


def run_gemini(lw, gemini: Path, tmp_path: Path, config: dict, calls: int, command: str = "ls"):
    """Gemini CLI headless with loopwatch's hooks against a script of ``calls`` identical
    calls of ``command`` in ``tmp_path/work``: its finished process and the requests of its
    agent loop."""
    lw.configured_worker(config)
    socket = tmp_path / "hook.sock"
    serve = start_serve(lw, socket)
    try:
        work = tmp_path / "work"
        work.mkdir()
        (work / "marker-file.txt").write_text("x\n")
        home = tmp_path / "home"
        (home / ".gemini").mkdir(parents=True)
        (home / ".gemini" / "settings.json").write_text(json.dumps(USER_SETTINGS))
        installed = subprocess.run(
            [sys.executable, "-m", "streams.cli", "hook", "install", "--cli", "gemini",
             "--settings", str(work / ".gemini" / "settings.json"),
             "--socket", str(socket)],
            cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert installed.returncode == 0, installed.stderr
        assert installed.stdout.startswith("relay: native, "), installed.stdout  # what install writes with cc
        with ScriptedGemini(calls, command) as model:
            env = python_env()
            env.update(
                HOME=str(home),
                GEMINI_API_KEY="test-dummy-key",
                GOOGLE_GEMINI_BASE_URL=model.url,
                GEMINI_CLI_TRUST_WORKSPACE="true",
            )
            started = time.monotonic()
            run = subprocess.run(
                [str(gemini), "-p", "List the files here.", "--output-format", "json", "--approval-mode", "yolo",
                 "-m", "gemini-2.5-flash"],
                cwd=work, env=env, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            print(f"gemini -p with {calls} scripted calls took {time.monotonic() - started:.1f}s")
            return run, list(model.requests)
    finally:
        stop(serve)
        if serve.stderr:
            print(serve.stderr.read()[-3000:])


def outputs_seen(requests: list[dict]) -> list[str]:
    """What the model got back for each call, in order (request n carries call n's result)."""
    seen = []
    for n, request in enumerate(requests[1:], start=1):
        responses = function_responses(request)
        assert [r.get("name") for r in responses] == ["run_shell_command"], (n, responses)
        seen.append(output_of(responses[0]))
    return seen


def test_gemini_cli_loop_is_warned_then_denied_through_its_own_hooks(lw, gemini, tmp_path):
    run, requests = run_gemini(lw, gemini, tmp_path, CONFIG, CALLS)
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
    # One request per call, and the one after the last call, each with that call's result.
    assert len(requests) == CALLS + 1, (len(requests), run.stdout[-1000:], run.stderr[-1000:])
    seen = outputs_seen(requests)
    for n, text in enumerate(seen, start=1):
        if n < FIRST_DENIED:
            assert "marker-file.txt" in text, (n, text)  # the real ls ran
            assert "blocked" not in text, (n, text)
        else:
            assert "marker-file.txt" not in text, (n, text)
            assert text == BLOCKED, (n, text)
    warned = [n for n, text in enumerate(seen, start=1) if WARNING in text]
    assert warned == [WARNED], seen
    assert f"<hook_context>{WARNING}" in seen[WARNED - 1], seen[WARNED - 1]
    # Gemini CLI's SessionEnd hook ended the run: the session's run_ended event is on the topic.
    session_id = json.loads(run.stdout)["session_id"]

    def ended(records: list) -> list:
        events = [decode_event(r.value) for r in records]
        return [e for e in events if isinstance(e, RunEnded) and e.run_id == session_id]

    records = asyncio.run(collect(lw.broker, lw.names.tool_calls, until=lambda rs: bool(ended(rs)), timeout=30))
    (end,) = ended(records)
    assert (end.session_key, end.agent_id, end.reason) == (f"gemini:{session_id}", "gemini-cli", "exit")


def test_gemini_cli_session_is_stopped_when_loopwatch_aborts_the_run(lw, gemini, tmp_path):
    """With abortAfterCriticalBlocks 2, the second block (call 14) ends the run.  Its abort
    follows its decision on the verdicts topic, so the hook of call 14 stops the session when
    the abort has arrived with the decision, else call 15's hook does (the run is over: its
    request is refused).  Either way Gemini CLI stops its agent loop there: the model is asked
    nothing more, and the script's later calls never come.  The command appends a line to a
    file: the twelve calls that ran wrote it, none of the denied or stopped ones did."""
    config = {**CONFIG, "loopwatch": {**CONFIG["loopwatch"], "abortAfterCriticalBlocks": 2}}
    run, requests = run_gemini(lw, gemini, tmp_path, config, 20, "echo ran >> ran.log")
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
    stopped_at = len(requests)  # requests 0..k-1 were made: call k was the one stopped
    assert stopped_at in (14, 15), (stopped_at, run.stderr[-2000:])
    assert json.loads(run.stdout)["stats"]["tools"]["totalCalls"] == stopped_at
    assert (tmp_path / "work" / "ran.log").read_text() == "ran\n" * 12
    seen = outputs_seen(requests)
    assert seen[12:] == [BLOCKED] * (stopped_at - 13), seen[12:]
    assert (
        "Agent execution stopped by hook: CRITICAL: loopwatch ended this run after 2 critical tool-loop blocks "
        "(last: generic_repeat on run_shell_command). Blocking single calls did not stop the loop."
    ) in run.stderr, run.stderr[-2000:]
