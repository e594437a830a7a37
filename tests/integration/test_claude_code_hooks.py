"""Claude Code itself (npm ``@anthropic-ai/claude-code``, ``make agent-clis``) with loopwatch's
hooks, run headless against a scripted Messages API (``scripted_model``) that has the agent run
the same Bash ``ls`` in a temp directory again and again, on the real broker and a real worker.

What the model must see, by hand from the spec's rules (§2, §3) with warningThreshold 10 and
criticalThreshold 12: calls 1-10 run plainly; call 11 (ten identical calls before it, count 10,
warning bucket 10 // 10 = 1) runs with loopwatch's warning as the hook's context; call 12 runs
(count 11: no new bucket); calls 13 on are denied (count 12; a vetoed call is not recorded, so
the count stays), the deny reason reaching the model as the tool's error result.  (A warning
threshold under 10 is never surfaced: its bucket is 0.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agent_cli_setup import AGENT_CLIS, python_env, start_serve, stop
from scripted_model import COMMAND, ScriptedModel, seen_per_call, text_of, tool_results

from harness import REPO
from streams.integrations.hooks.install import build_native_relay, find_compiler, native_command

pytestmark = pytest.mark.kafka

CONFIG = {
    "tools": {"loopDetection": {"enabled": True, "warningThreshold": 10, "criticalThreshold": 12}},
    "loopwatch": {"surfaceWarnings": True},
}
CALLS = 14
WARNED, FIRST_DENIED = 11, 13
CLAUDE = AGENT_CLIS / "node_modules" / ".bin" / "claude"
DENIED = (
    "CRITICAL: Called Bash with identical arguments and identical outcomes 12 times. "
    "Session execution blocked to prevent runaway loops."
)


@pytest.fixture
def claude() -> Path:
    if not CLAUDE.exists():
        pytest.fail(f"{CLAUDE} is missing: make agent-clis installs Claude Code")
    return CLAUDE


def run_claude(lw, claude: Path, tmp_path: Path, config: dict, calls: int, command: str = COMMAND):
    """Claude Code with the hooks ``hook install`` writes by default (the native relay), against a worker
    with ``config``, the scripted model asking for ``calls`` calls of ``command`` in
    ``tmp_path/work``: its finished process, the requests of its agent loop, and the serve
    process's stderr."""
    lw.configured_worker(config)
    socket = tmp_path / "hook.sock"
    serve = start_serve(lw, socket)
    try:
        work = tmp_path / "work"
        work.mkdir()
        (work / "marker-file.txt").write_text("x\n")
        home = tmp_path / "home"
        home.mkdir()
        settings = work / ".claude" / "settings.json"
        installed = subprocess.run(
            [sys.executable, "-m", "streams.cli", "hook", "install", "--cli", "claude-code",
             "--settings", str(settings), "--socket", str(socket)],
            cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert installed.returncode == 0, installed.stderr
        assert installed.stdout.startswith("relay: native, "), installed.stdout
        commands = {
            h["command"] for e in json.loads(settings.read_text())["hooks"].values() for g in e for h in g["hooks"]
        }
        compiler = find_compiler()
        assert compiler is not None, "no C compiler: the native relay cannot be built"
        native = native_command("claude-code", build_native_relay(compiler))  # the one install built, cached
        assert commands == {f"{native} --socket {socket}"}, commands
        with ScriptedModel(calls, command) as model:
            env = python_env()
            env.update(
                HOME=str(home),
                ANTHROPIC_BASE_URL=model.url,
                ANTHROPIC_API_KEY="sk-ant-test-dummy",
                DISABLE_TELEMETRY="1",
                CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                DISABLE_AUTOUPDATER="1",
            )
            started = time.monotonic()
            run = subprocess.run(
                [str(claude), "-p", "List the files here.", "--output-format", "json", "--allowedTools", "Bash"],
                cwd=work, env=env, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            print(f"claude -p with {calls} scripted calls took {time.monotonic() - started:.1f}s")
            requests = list(model.requests)
    finally:
        stop(serve)
        err = serve.stderr.read() if serve.stderr else ""
        print(err[-3000:])
    return run, requests, err


def test_claude_code_loop_is_warned_then_denied_through_its_own_hooks(lw, claude, tmp_path):
    run, requests, _ = run_claude(lw, claude, tmp_path, CONFIG, CALLS)
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
    # One request per call, and the one after the last call, each with that call's result.
    assert len(requests) == CALLS + 1, (len(requests), run.stdout[-1000:])
    seen = seen_per_call(requests)
    for n, (result, _) in enumerate(seen, start=1):
        content = text_of(result.get("content"))
        if n < FIRST_DENIED:
            assert not result.get("is_error"), (n, result)
            assert "marker-file.txt" in content, (n, content)  # the real ls ran
        else:
            assert result.get("is_error") is True, (n, result)
            assert "marker-file.txt" not in content, (n, content)
            assert content == DENIED, (n, content)
    warning = "WARNING: You have called Bash 10 times with identical arguments."
    warned = [n for n, (_, text) in enumerate(seen, start=1) if warning in text]
    assert warned == [WARNED], [t[-600:] for _, t in seen]


def test_claude_code_session_ends_when_loopwatch_aborts_the_run(lw, claude, tmp_path):
    """With abortAfterCriticalBlocks 2, the second block (call 14) ends the run.  Claude Code
    (2.1.197) ignores ``continue: false`` beside a deny, so the stop is the ``PostToolBatch`` hook's
    answer after the denied call, before the model is asked again.  The abort follows call 14's
    decision over Kafka: when it has arrived by then, the session ends after call 14; else call 15
    is denied with the abort's message and the session ends after it.  Either way the model is
    asked nothing more although its script has 20 calls, and the command, which appends a line
    to a file, ran for the twelve calls before the blocks only."""
    config = {**CONFIG, "loopwatch": {**CONFIG["loopwatch"], "abortAfterCriticalBlocks": 2}}
    run, requests, _ = run_claude(lw, claude, tmp_path, config, 20, "echo ran >> ran.log")
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
    assert (tmp_path / "work" / "ran.log").read_text() == "ran\n" * 12
    result = json.loads(run.stdout)
    assert result["terminal_reason"] == "hook_stopped", result
    # The first request and one after each call up to call 13, the first block; none after the last call.
    assert len(requests) in (14, 15), (len(requests), run.stdout[-2000:])
    results = [text_of(tool_results(r)[0].get("content")) for r in requests[1:]]
    assert results[12] == DENIED, results[12]
    aborted = (
        "CRITICAL: loopwatch ended this run after 2 critical tool-loop blocks (last: generic_repeat on Bash). "
        "Blocking single calls did not stop the loop."
    )
    refused = "CRITICAL: this run was aborted by loopwatch (critical_block_limit); no further tool calls are allowed."
    if len(requests) == 15:  # the abort came after call 14's batch: call 15 is refused, and then it stops
        assert results[13] == DENIED, results[13]
    stops = [a for a in _attachments(tmp_path) if a.get("type") == "hook_stopped_continuation"]
    assert [(a["hookName"], a["message"] in (aborted, refused)) for a in stops] == [("PostToolBatch", True)], stops


def _attachments(tmp_path: Path) -> list[dict]:
    """The attachments in the session's transcript (Claude Code keeps it under HOME/.claude/projects)."""
    out = []
    for path in (tmp_path / "home" / ".claude" / "projects").rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if isinstance(entry.get("attachment"), dict):
                out.append(entry["attachment"])
    return out
