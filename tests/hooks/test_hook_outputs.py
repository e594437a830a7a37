"""What ``loopwatch hook`` hands the CLIs: Gemini CLI's shell outcome without its process ids,
and each CLI's deny from the per-call command when the serve process is away (fail closed)."""

from __future__ import annotations

import json
import subprocess
import sys

from hypothesis import assume, given
from hypothesis import strategies as st

from streams.integrations.hooks import call
from streams.integrations.hooks.gemini import outcome

# Two AfterTool tool_responses Gemini CLI 0.61.0 sent for the same `ls` (captured).
CAPTURED = [
    {
        "llmContent": f"<untrusted_context>\nOutput: marker-file.txt\nProcess Group PGID: {pgid}\n</untrusted_context>",
        "returnDisplay": "marker-file.txt",
    }
    for pgid in (29541, 29549)
]


def test_the_same_command_has_the_same_outcome_whatever_its_process_group():
    assert (
        outcome("run_shell_command", CAPTURED[0])
        == outcome("run_shell_command", CAPTURED[1])
        == {
            "llmContent": "<untrusted_context>\nOutput: marker-file.txt\n</untrusted_context>",
            "returnDisplay": "marker-file.txt",
        }
    )
    assert CAPTURED[0] != CAPTURED[1]  # what the hook receives does differ


_text = st.text(st.characters(codec="utf-8", exclude_characters="\r"), max_size=80)
_pid = st.integers(1, 4_000_000)


@given(output=_text, pgid=_pid, background=st.lists(_pid, max_size=3), wrapped=st.booleans())
def test_only_the_trailing_process_ids_are_left_out(output, pgid, background, wrapped):
    assume("\nBackground PIDs: " not in f"\n{output}")  # a line no one could tell from the tool's own
    body = f"Output: {output}"
    tail = (
        f"\nBackground PIDs: {', '.join(map(str, background))}" if background else ""
    ) + f"\nProcess Group PGID: {pgid}"
    if wrapped:
        got = outcome("run_shell_command", {"llmContent": f"<untrusted_context>\n{body}{tail}\n</untrusted_context>"})
        assert got == {"llmContent": f"<untrusted_context>\n{body}\n</untrusted_context>"}
    else:
        assert outcome("run_shell_command", {"llmContent": body + tail}) == {"llmContent": body}


@given(pgid=_pid)
def test_other_tools_keep_their_whole_response(pgid):
    response = {"llmContent": f"Output: x\nProcess Group PGID: {pgid}", "returnDisplay": "x"}
    assert outcome("read_file", response) is response


def _hook(event: str, *flags: str, tmp_path) -> subprocess.CompletedProcess:
    payload = {
        "session_id": "s1",
        "hook_event_name": event,
        "tool_name": "run_shell_command",
        "tool_input": {"command": "ls"},
    }
    return subprocess.run(
        [sys.executable, "-S", call.__file__, "gemini", "--socket", str(tmp_path / "absent.sock"), *flags],
        input=json.dumps(payload), capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def test_gemini_fails_closed_with_its_own_deny_when_serve_is_away(tmp_path):
    denied = _hook("BeforeTool", "--fail-closed", tmp_path=tmp_path)
    assert denied.returncode == 0, denied.stderr
    out = json.loads(denied.stdout)
    assert set(out) == {"decision", "reason"} and out["decision"] == "deny"
    assert out["reason"].startswith("Tool call blocked: loopwatch loop protection is unavailable (no answer from")
    assert "failing closed" in denied.stderr
    after = _hook("AfterTool", "--fail-closed", tmp_path=tmp_path)
    assert after.returncode == 0 and after.stdout == ""  # nothing to refuse after the fact


def test_gemini_fails_open_and_the_call_runs(tmp_path):
    allowed = _hook("BeforeTool", tmp_path=tmp_path)
    assert allowed.returncode == 0 and allowed.stdout == ""
    assert "failing open" in allowed.stderr


def test_codex_fails_closed_with_claude_codes_deny(tmp_path):
    payload = {"session_id": "s1", "hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {}}
    denied = subprocess.run(
        [sys.executable, "-S", call.__file__, "codex", "--socket", str(tmp_path / "absent.sock"), "--fail-closed"],
        input=json.dumps(payload), capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    out = json.loads(denied.stdout)["hookSpecificOutput"]
    assert out["hookEventName"] == "PreToolUse" and out["permissionDecision"] == "deny"
    assert out["permissionDecisionReason"].startswith("Tool call blocked: loopwatch loop protection is unavailable")
