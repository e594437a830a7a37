"""Outcome hashing rules (spec §2.3, §5)."""

from hypothesis import given
from hypothesis import strategies as st

from streams.edge.hashing import (
    ThrownError,
    hash_outcome,
    is_known_poll,
    is_send_call,
    strip_volatile_send_ids,
    unknown_tool_name,
)


def result(text, **details):
    return {"content": [{"type": "text", "text": text}], "details": details}


def test_undefined_result_has_no_hash_and_non_objects_hash_whole():
    assert hash_outcome("read", {}, returned=False).result_hash is None
    assert hash_outcome("read", {}, result="text").result_hash is not None
    assert hash_outcome("read", {}, result=[1]).result_hash != hash_outcome("read", {}, result=[2]).result_hash


def test_loop_veto_never_hashes_but_other_denials_do():
    veto = hash_outcome("read", {}, result=result("x", status="blocked", deniedReason="tool-loop"))
    assert veto.result_hash is None and veto.loop_veto
    plugin = hash_outcome("read", {}, result=result("x", status="blocked", deniedReason="plugin-approval"))
    assert plugin.result_hash is not None and not plugin.loop_veto


def test_exec_ignores_volatile_fields_but_not_exit_code():
    a = hash_outcome(
        "exec", {"c": 1}, result=result("t", status="completed", exitCode=0, aggregated="ok", durationMs=5, pid=1)
    )
    b = hash_outcome(
        "exec", {"c": 1}, result=result("u", status="completed", exitCode=0, aggregated=" ok\n", durationMs=9, pid=2)
    )
    c = hash_outcome("exec", {"c": 1}, result=result("t", status="completed", exitCode=1, aggregated="ok"))
    assert a.result_hash == b.result_hash != c.result_hash
    running1 = hash_outcome("exec", {}, result=result("session 1 pid 4", status="running", sessionId="1", pid=4))
    running2 = hash_outcome("exec", {}, result=result("session 2 pid 5", status="running", sessionId="2", pid=5))
    assert running1.result_hash == running2.result_hash


def test_process_poll_distinguishes_missing_and_null_status():
    args = {"action": "poll", "sessionId": "s"}
    missing = hash_outcome("process", args, result=result("x"))
    null = hash_outcome("process", args, result=result("x", status=None))
    assert missing.result_hash != null.result_hash


def test_send_results_drop_volatile_ids_only():
    args = {"action": "send", "target": "t"}
    one = hash_outcome("message", args, result=result("id 1", ok=True, messageId="m1", route={"id": "r"}))
    two = hash_outcome("message", args, result=result("id 2", ok=True, messageId="m2", route={"id": "r"}))
    other_route = hash_outcome("message", args, result=result("id 2", ok=True, messageId="m2", route={"id": "q"}))
    assert one.result_hash == two.result_hash != other_route.result_hash
    read = {"action": "read"}
    assert (
        hash_outcome("message", read, result=result("", messageId="m1")).result_hash
        != hash_outcome("message", read, result=result("", messageId="m2")).result_hash
    )


def test_message_delivery_object_id_is_stripped_other_ids_kept():
    stripped = strip_volatile_send_ids(
        {"message": {"id": "x", "text": "hi", "accountId": "a"}, "conversation": {"id": "c"}}
    )
    assert stripped == {"message": {"text": "hi", "accountId": "a"}, "conversation": {"id": "c"}}
    assert strip_volatile_send_ids({"__proto__": {"x": 1}, "a": [{"ts": 1, "b": 2}]}) == {"a": [{"b": 2}]}


def test_send_and_poll_classification():
    assert is_send_call("sessions_send", None)
    assert is_send_call("message", {"action": "poll"}) and not is_known_poll("message", {"action": "poll"})
    assert is_send_call("telegram", {"to": "x"}, provider_send_tools={"telegram"})
    assert not is_send_call("telegram", {"to": "x"})
    assert is_known_poll("command_status", None) and is_known_poll("process", {"action": "log"})
    assert not is_known_poll("process", {"action": "kill"}) and not is_known_poll("exec", {"action": "poll"})


def test_unknown_tool_name_extraction():
    assert unknown_tool_name(ThrownError("Unknown tool: Browser_Use")) == "browser_use"
    assert unknown_tool_name("tool 'web.fetch' is not available") == "web.fetch"
    assert unknown_tool_name("Tool exec not found") == "exec"
    assert unknown_tool_name("unknown tool \u212a") is None  # Kelvin sign is not [a-z] without /u
    assert unknown_tool_name("permission denied") is None
    assert unknown_tool_name(ThrownError("", name="")) is None


def test_error_text_rules():
    by_name = hash_outcome("x", {}, error=ThrownError("", name="TypeError")).result_hash
    assert by_name == hash_outcome("x", {}, error="TypeError").result_hash
    assert hash_outcome("x", {}, error=3).result_hash == hash_outcome("x", {}, error="3").result_hash
    assert hash_outcome("x", {}, error=None).result_hash == hash_outcome("x", {}, error="null").result_hash


@given(st.text())
def test_error_hashes_are_prefixed_and_fixed_size(text):
    h = hash_outcome("tool", {}, error=text).result_hash
    assert h.startswith("error:") and len(h) == 70
