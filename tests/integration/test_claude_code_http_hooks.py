"""Claude Code itself with loopwatch's HTTP hooks (``"type": "http"``, written by ``loopwatch hook
install --http``) POSTing to ``loopwatch hook --serve --http``, run headless against the scripted
Messages API, on the real broker and a real worker.  The model's view is the command hooks' one
(test_claude_code_hooks, whose docstring works the thresholds by hand): calls 1-10 run plainly,
call 11 carries loopwatch's warning, call 12 runs, calls 13 on are denied.  Every request carries
the endpoint's bearer token, which Claude Code fills in from ``$LOOPWATCH_HOOK_TOKEN``."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from agent_cli_setup import AGENT_CLIS, http_url_of, python_env, start_serve, stop
from scripted_model import ScriptedModel, seen_per_call, text_of, tool_results

from harness import REPO

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


def claude_env(model: ScriptedModel, home: Path, token: str | None) -> dict[str, str]:
    env = python_env()
    env.pop("LOOPWATCH_HOOK_TOKEN", None)
    env.update(
        HOME=str(home),
        ANTHROPIC_BASE_URL=model.url,
        ANTHROPIC_API_KEY="sk-ant-test-dummy",
        DISABLE_TELEMETRY="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_AUTOUPDATER="1",
    )
    if token is not None:
        env["LOOPWATCH_HOOK_TOKEN"] = token
    return env


def install_http(work: Path, url: str) -> None:
    settings = work / ".claude" / "settings.json"
    installed = subprocess.run(
        [sys.executable, "-m", "streams.cli", "hook", "install", "--cli", "claude-code",
         "--settings", str(settings), "--http", url],
        cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    hooks = json.loads(settings.read_text())["hooks"]
    assert {h["type"] for e in hooks.values() for g in e for h in g["hooks"]} == {"http"}


def test_claude_code_loop_is_warned_then_denied_through_its_http_hooks(lw, claude, tmp_path):
    lw.configured_worker(CONFIG)
    token_file = tmp_path / "token"
    serve = start_serve(lw, tmp_path / "hook.sock", "--http", "0", "--http-token-file", str(token_file))
    try:
        token = token_file.read_text().strip()  # made by the serve process, the user's alone
        assert len(token) >= 32 and token_file.stat().st_mode & 0o777 == 0o600
        url = http_url_of(serve)
        assert url.startswith("http://127.0.0.1:"), url  # loopback unless told otherwise
        work = tmp_path / "work"
        work.mkdir()
        (work / "marker-file.txt").write_text("x\n")
        home = tmp_path / "home"
        home.mkdir()
        install_http(work, url)
        with ScriptedModel(CALLS) as model:
            env = claude_env(model, home, token)
            started = time.monotonic()
            run = subprocess.run(
                [str(claude), "-p", "List the files here.", "--output-format", "json", "--allowedTools", "Bash"],
                cwd=work, env=env, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            elapsed = time.monotonic() - started
            requests = list(model.requests)
        assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
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
        print(f"claude -p with {CALLS} HTTP-hooked calls took {elapsed:.1f}s")
    finally:
        stop(serve)
        err = serve.stderr.read() if serve.stderr else ""
        print(err[-3000:])
    assert "refused" not in err, err[-2000:]


def test_claude_code_without_the_token_is_refused_and_logged_and_its_calls_run_ungated(lw, claude, tmp_path):
    """Claude Code takes a 401 as a non-blocking hook error: the calls run, loopwatch sees none,
    and the serve process logs each refusal in one line (what a user who forgot to export
    $LOOPWATCH_HOOK_TOKEN sees)."""
    lw.configured_worker(CONFIG)
    token_file = tmp_path / "token"
    serve = start_serve(lw, tmp_path / "hook.sock", "--http", "0", "--http-token-file", str(token_file))
    calls = 2
    try:
        work = tmp_path / "work"
        work.mkdir()
        (work / "marker-file.txt").write_text("x\n")
        home = tmp_path / "home"
        home.mkdir()
        install_http(work, http_url_of(serve))
        with ScriptedModel(calls) as model:
            run = subprocess.run(
                [str(claude), "-p", "List the files here.", "--output-format", "json", "--allowedTools", "Bash"],
                cwd=work, env=claude_env(model, home, None), capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            requests = list(model.requests)
        assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
        results = [tool_results(r)[0] for r in requests[1:]]
        assert len(results) == calls and all("marker-file.txt" in text_of(r.get("content")) for r in results)
    finally:
        stop(serve)
        err = serve.stderr.read() if serve.stderr else ""
    refusals = [line for line in err.splitlines() if "refused an HTTP hook request" in line]
    # A PreToolUse, a PostToolUse and a PostToolBatch per call, and the SessionEnd: each refused, each one line.
    assert len(refusals) == 3 * calls + 1, err[-2000:]
    assert all(line.endswith(": no bearer token (401)") for line in refusals), refusals


def test_http_hook_endpoint_refuses_what_is_not_a_hook_input_in_one_line(lw, tmp_path):
    lw.configured_worker(CONFIG)
    token_file = tmp_path / "token"
    serve = start_serve(lw, tmp_path / "hook.sock", "--http", "0", "--http-token-file", str(token_file))
    try:
        parts = urlsplit(http_url_of(serve))
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)

        token = token_file.read_text().strip()

        def post(path: str, body: bytes, method: str = "POST") -> tuple[int, bytes]:
            headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()

        status, body = post(parts.path, b"{not json")
        assert status == 400 and body.count(b"\n") == 1 and body.startswith(b"not a claude-code hook input"), body
        status, body = post(parts.path, b"[1, 2]")
        assert (status, body) == (400, b"not a claude-code hook input: the hook input is not a JSON object\n")
        assert post("/hooks/gemini", b"{}")[0] == 404  # Gemini CLI has no HTTP hooks
        assert post(parts.path, b"", method="GET")[0] == 405
        # The same kept-alive connection still answers a hook input: a new call, allowed (no output).
        payload = {"session_id": "http-s1", "hook_event_name": "PreToolUse", "tool_name": "Bash",
                   "tool_input": {"command": "ls"}, "tool_use_id": "toolu_1", "cwd": str(tmp_path)}  # fmt: skip
        status, body = post(parts.path, json.dumps(payload).encode())
        assert status == 200 and json.loads(body) == {}, body
        conn.close()
        # Bounded body: the head announces more than the limit; refused before reading it.
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        conn.putrequest("POST", parts.path)
        conn.putheader("Authorization", f"Bearer {token}")
        conn.putheader("Content-Length", str(4 * 1024 * 1024 + 1))
        conn.endheaders()
        response = conn.getresponse()
        assert response.status == 413 and response.read() == b"a hook body is at most 4194304 bytes\n"
        conn.close()
    finally:
        stop(serve)


def test_http_hook_without_the_bearer_token_gets_a_401_and_a_one_line_log(lw, tmp_path):
    lw.configured_worker(CONFIG)
    env_token = "t0k3n-from-the-environment-0123456789"
    serve = start_serve(lw, tmp_path / "hook.sock", "--http", "0", env={"LOOPWATCH_HOOK_TOKEN": env_token})
    try:
        assert "(bearer token: $LOOPWATCH_HOOK_TOKEN)" in serve.first_line, serve.first_line  # type: ignore[attr-defined]
        parts = urlsplit(http_url_of(serve))
        payload = {"session_id": "http-auth", "hook_event_name": "PreToolUse", "tool_name": "Bash",
                   "tool_input": {"command": "ls"}, "tool_use_id": "toolu_1", "cwd": str(tmp_path)}  # fmt: skip
        body = json.dumps(payload).encode()
        answers = []
        for authorization in (None, "Bearer wrong-token-0123456789abcdef", f"Basic {env_token}", f"bearer {env_token}"):
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
            headers = {} if authorization is None else {"Authorization": authorization}
            conn.request("POST", parts.path, body=body, headers=headers)
            response = conn.getresponse()
            answers.append((response.status, response.getheader("WWW-Authenticate"), response.read()))
            conn.close()
        hint = b"send Authorization: Bearer <token> (hook --serve's $LOOPWATCH_HOOK_TOKEN or token file)\n"
        assert answers[:3] == [
            (401, "Bearer", b"no bearer token: " + hint),
            (401, "Bearer", b"wrong bearer token: " + hint),
            (401, "Bearer", b"no bearer token: " + hint),
        ]
        assert answers[3][0] == 200 and json.loads(answers[3][2]) == {}  # the scheme's case does not matter
    finally:
        stop(serve)
        err = serve.stderr.read() if serve.stderr else ""
    refusals = [line for line in err.splitlines() if "refused an HTTP hook request" in line]
    assert [line.rsplit(": ", 1)[1] for line in refusals] == [
        "no bearer token (401)", "wrong bearer token (401)", "no bearer token (401)"
    ], err[-2000:]  # fmt: skip
    logged = "WARNING loopwatch.hook: refused an HTTP hook request from 127.0.0.1:"
    assert all(line.startswith(logged) for line in refusals), refusals


def test_http_hook_fails_closed_with_a_200_deny_when_no_decision_arrives(lw, tmp_path):
    """Claude Code runs the call on any non-2xx answer, so a fail-closed deny must be a 200."""
    worker = lw.configured_worker(CONFIG)
    token_file = tmp_path / "token"
    endpoint = ("--http", "0", "--http-token-file", str(token_file))
    serve = start_serve(lw, tmp_path / "hook.sock", *endpoint, "--fail-closed", "--timeout", "1")
    try:
        parts = urlsplit(http_url_of(serve))
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        auth = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        payload = {"session_id": "http-closed", "hook_event_name": "PreToolUse", "tool_name": "Bash",
                   "tool_input": {"command": "ls"}, "tool_use_id": "toolu_1", "cwd": str(tmp_path)}  # fmt: skip
        conn.request("POST", parts.path, body=json.dumps(payload).encode(), headers=auth)
        response = conn.getresponse()
        assert (response.status, json.loads(response.read())) == (200, {})  # the worker is there: allowed
        worker.stop()
        payload["tool_use_id"] = "toolu_2"
        started = time.monotonic()
        conn.request("POST", parts.path, body=json.dumps(payload).encode(), headers=auth)
        response = conn.getresponse()
        output = json.loads(response.read())["hookSpecificOutput"]
        assert response.status == 200 and time.monotonic() - started < 10
        assert output["permissionDecision"] == "deny", output
        assert output["permissionDecisionReason"].startswith(
            "Tool call blocked: loopwatch loop protection is unavailable"
        ), output
        conn.close()
    finally:
        stop(serve)
