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

import subprocess
import sys
import time
from pathlib import Path

import pytest
from agent_cli_setup import AGENT_CLIS, python_env, start_serve, stop
from scripted_model import ScriptedModel, text_of, tool_results

from harness import REPO

pytestmark = pytest.mark.kafka

CONFIG = {
    "tools": {"loopDetection": {"enabled": True, "warningThreshold": 10, "criticalThreshold": 12}},
    "loopwatch": {"surfaceWarnings": True},
}
CALLS = 14
WARNED, FIRST_DENIED = 11, 13
CLAUDE = AGENT_CLIS / "node_modules" / ".bin" / "claude"


@pytest.fixture
def claude() -> Path:
    if not CLAUDE.exists():
        pytest.fail(f"{CLAUDE} is missing: make agent-clis installs Claude Code")
    return CLAUDE


def test_claude_code_loop_is_warned_then_denied_through_its_own_hooks(lw, claude, tmp_path):
    lw.configured_worker(CONFIG)
    socket = tmp_path / "hook.sock"
    serve = start_serve(lw, socket)
    try:
        work = tmp_path / "work"
        work.mkdir()
        (work / "marker-file.txt").write_text("x\n")
        home = tmp_path / "home"
        home.mkdir()
        installed = subprocess.run(
            [sys.executable, "-m", "streams.cli", "hook", "install", "--cli", "claude-code",
             "--settings", str(work / ".claude" / "settings.json"),
             "--command", f"{sys.executable} -m streams.cli hook claude-code", "--socket", str(socket)],
            cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert installed.returncode == 0, installed.stderr
        with ScriptedModel(CALLS) as model:
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
            elapsed = time.monotonic() - started
            requests = list(model.requests)
        assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
        # One request per call, and the one after the last call, each with that call's result.
        assert len(requests) == CALLS + 1, (len(requests), run.stdout[-1000:])
        seen = []
        for n, request in enumerate(requests[1:], start=1):
            results = tool_results(request)
            assert [r.get("tool_use_id") for r in results] == [f"toolu_{n:04d}"], results
            last_user = next(m for m in reversed(request["messages"]) if m.get("role") == "user")
            seen.append((results[0], text_of(last_user["content"])))
        for n, (result, _) in enumerate(seen, start=1):
            content = text_of(result.get("content"))
            if n < FIRST_DENIED:
                assert not result.get("is_error"), (n, result)
                assert "marker-file.txt" in content, (n, content)  # the real ls ran
            else:
                assert result.get("is_error") is True, (n, result)
                assert "marker-file.txt" not in content, (n, content)
                assert content == (
                    "CRITICAL: Called Bash with identical arguments and identical outcomes 12 times. "
                    "Session execution blocked to prevent runaway loops."
                ), (n, content)
        warning = "WARNING: You have called Bash 10 times with identical arguments."
        warned = [n for n, (_, text) in enumerate(seen, start=1) if warning in text]
        assert warned == [WARNED], [t[-600:] for _, t in seen]
        print(f"claude -p with {CALLS} hooked calls took {elapsed:.1f}s")
    finally:
        stop(serve)
        if serve.stderr:
            err = serve.stderr.read()
            print(err[-3000:])
