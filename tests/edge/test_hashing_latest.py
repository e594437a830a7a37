"""Profile latest's outcome hashing at the edge (openclaw-latest.md §4): untrusted-content
envelope ids, terminal exec failures and their identity, write outcomes and targets, and the
events that carry them.  Expected values are written out from the spec's rules, or built
independently (json.dumps for nested escaping, hashlib for digests)."""

import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.events import InvalidEvent, ToolCallCompleted, decode_event, encode_event
from streams.edge.events import completed_event, requested_event
from streams.edge.hashing import canonicalize_untrusted_envelopes, failure_shape, hash_outcome, write_target_hash

ids = st.text(alphabet="0123456789abcdef", min_size=16, max_size=16)
# Content between the markers: anything without a marker of its own.
bodies = st.text(alphabet=st.characters(blacklist_characters="<"), max_size=40)
ZERO = "0" * 16


def envelope(id_, body, quote='"'):
    return (
        f"<<<EXTERNAL_UNTRUSTED_CONTENT id={quote}{id_}{quote}>>>{body}"
        f"<<<END_EXTERNAL_UNTRUSTED_CONTENT id={quote}{id_}{quote}>>>"
    )


def text_result(text):
    return {"content": [{"type": "text", "text": text}], "details": {}}


@given(ids, ids, bodies)
def test_envelopes_differing_only_in_their_ids_hash_alike_under_latest_only(a, b, body):
    one = hash_outcome("web_fetch", {}, result=text_result("page: " + envelope(a, body)))
    two = hash_outcome("web_fetch", {}, result=text_result("page: " + envelope(b, body)))
    zero = hash_outcome("web_fetch", {}, result=text_result("page: " + envelope(ZERO, body)))
    assert one.latest_result_hash == two.latest_result_hash == zero.latest_result_hash
    if a != b:
        assert one.result_hash != two.result_hash  # configurable-final hashes verbatim


@given(ids, ids, bodies, st.integers(min_value=1, max_value=3))
def test_json_encoded_envelopes_are_canonicalised_at_any_depth(a, b, body, depth):
    """JSON-encoding a string 1, 2, 3 times puts 1, 3, 7 backslashes before each quote."""

    def nested(id_):
        text = envelope(id_, body)
        for _ in range(depth):
            text = json.dumps({"tool_output": text})
        return text

    assert canonicalize_untrusted_envelopes(nested(a)) == canonicalize_untrusted_envelopes(nested(b))


@pytest.mark.parametrize(
    "text",
    [
        envelope("ABCDEF0123456789", "x"),  # uppercase id
        envelope("abcdef012345678", "x"),  # 15 characters
        envelope("", "x"),  # empty id
        envelope("abcdef0123456789", "x").replace(
            'END_EXTERNAL_UNTRUSTED_CONTENT id="abcdef0123456789', 'END_EXTERNAL_UNTRUSTED_CONTENT id="abcdef0123456780'
        ),  # ids differ
        envelope("abcdef0123456789", "<<<EXTERNAL_UNTRUSTED_CONTENT inner"),  # a marker in between
        envelope("abcdef0123456789", "x", quote='\\\\"'),  # two backslashes: not 2^n - 1
        '<<<EXTERNAL_UNTRUSTED_CONTENT id="abcdef0123456789">>> unpaired',
    ],
)
def test_malformed_envelopes_keep_their_ids(text):
    assert canonicalize_untrusted_envelopes(text) == text
    assert hash_outcome("web_fetch", {}, result=text_result(text)).normalized_result_hash is None


def test_envelope_ids_in_keys_and_error_texts_are_canonicalised_too():
    a, b = envelope("0123456789abcdef", "x"), envelope("fedcba9876543210", "x")
    keyed = [hash_outcome("t", {}, result={"details": {a: 1}}), hash_outcome("t", {}, result={"details": {b: 1}})]
    assert keyed[0].latest_result_hash == keyed[1].latest_result_hash
    errors = [hash_outcome("t", {}, error=f"failed: {a}"), hash_outcome("t", {}, error=f"failed: {b}")]
    assert errors[0].latest_result_hash == errors[1].latest_result_hash
    assert errors[0].latest_result_hash.startswith("error:") and errors[0].no_progress


@pytest.mark.parametrize(
    "output, shape",
    [
        ("logged 2026-08-10T00:00:13.123+02:00 done", "logged # done"),  # ISO timestamp
        ("logged 2026-08-12t02:14:05.5 done", "logged # done"),  # lower-case t (flag i)
        ("at 12:34:56.789 and 1:02:03", "at # and #"),  # clock times
        ("attempt 3, Retry#4, ATTEMPT: 5", "#, #, #"),  # counters
        ("took 12ms, 1.5 s, 3 minutes, 1 hour, 40ns", "took #, #, #, #, #"),
        ("waited 5\u017f", "waited #"),  # U+017F folds to s
        ("pid=1001 ppid 7", "# #"),
        ("\u017fpid 12", "\u017fpid 12"),  # U+017F is a word character for \b
        ("p\u0130d 12", "p\u0130d 12"),  # U+0130 does not fold to i
        ("on 2026-08-10 exit 2 errno 13", "on 2026-08-10 exit 2 errno 13"),  # dates and codes stay
        ("retry\u00a0#: 9", "#"),  # JS \s includes NBSP
    ],
)
def test_failure_shape_masks_only_what_drifts(output, shape):
    assert failure_shape(output) == shape


def exec_result(**details):
    output = details.pop("output", "boom")
    return {"content": [{"type": "text", "text": output}], "details": {"aggregated": output, **details}}


@pytest.mark.parametrize(
    "details, terminal",
    [
        ({"status": "failed", "exitCode": 1}, True),
        ({"status": "completed", "exitCode": -9}, True),
        ({"status": "failed", "exitCode": 1.5}, True),
        ({"status": "completed", "exitCode": 0}, False),
        ({"status": "failed"}, False),
        ({"status": "failed", "exitCode": "1"}, False),
        ({"status": "failed", "exitCode": True}, False),
        ({"status": "failed", "exitCode": 1, "timedOut": True}, False),
        ({"status": "failed", "exitCode": 2, "output": "  "}, False),
        ({"status": "failed", "exitCode": 2, "output": "(Command exited with code 2)"}, False),
        ({"status": "running", "exitCode": 1}, False),
    ],
)
def test_terminal_exec_failures(details, terminal):
    outcome = hash_outcome("exec", {"command": "make"}, result=exec_result(**details))
    assert outcome.result_hash is not None
    assert (outcome.outcome_kind == "terminal-exec-failure") is terminal
    assert (outcome.failure_identity_hash is not None) is terminal


def test_a_failure_identity_ignores_drift_but_not_the_exit_code():
    def identity(output, code=1):
        return hash_outcome(
            "exec", {}, result=exec_result(status="failed", exitCode=code, output=output)
        ).failure_identity_hash

    assert identity("x at 10:00:01 pid 4") == identity("x at 11:59:59 pid 77")
    assert identity("x at 10:00:01") != identity("x at 10:00:01", code=2)
    assert identity("x on 2026-08-10") != identity("x on 2026-08-11")


def test_write_outcomes_and_targets():
    changed = hash_outcome("write", {"path": "/a"}, result={"details": {"changed": True}})
    assert changed.outcome_kind == "write-mutation" and not changed.no_progress
    noop = hash_outcome("write", {"path": "/a"}, result={"details": {"changed": False}})
    assert noop.no_progress and noop.latest_result_hash == hashlib.sha256(b'{"status":"unchanged"}').hexdigest()
    assert noop.result_hash != noop.latest_result_hash  # configurable-final: the default hash
    other_tool = hash_outcome("edit", {"path": "/a"}, result={"details": {"changed": False}})
    assert not other_tool.no_progress and other_tool.normalized_result_hash is None
    assert write_target_hash("write", {"path": "notes.md"}) == hashlib.sha256(b'{"path":"notes.md"}').hexdigest()
    assert write_target_hash("write", {"path": "./notes.md"}) != write_target_hash("write", {"path": "notes.md"})
    assert write_target_hash("write", {"path": ""}) is None
    assert write_target_hash("write", ["/a"]) is None
    assert write_target_hash("edit", {"path": "/a"}) is None


def test_events_carry_latest_fields_and_old_events_still_decode():
    request = requested_event("e1", "write", {"path": "/a", "content": "x"}, run_id="r")
    assert request.target_hash == write_target_hash("write", {"path": "/a"})
    done = completed_event(
        "e2", "exec", {"command": "make"}, run_id="r", result=exec_result(status="failed", exitCode=1)
    )
    assert done.outcome_kind == "terminal-exec-failure" and len(done.failure_identity_hash) == 64
    assert decode_event(encode_event(done)) == done
    v1 = json.dumps(
        {
            "type": "tool_call.completed",
            "v": 1,
            "event_id": "e3",
            "run_id": "r",
            "tool_name": "read",
            "args_hash": "read:" + "0" * 64,
            "result_hash": "1" * 64,
        }
    ).encode()
    old = decode_event(v1)
    assert (
        old.outcome_kind,
        old.failure_identity_hash,
        old.normalized_result_hash,
        old.target_hash,
        old.no_progress,
    ) == (
        None,
        None,
        None,
        None,
        False,
    )


@pytest.mark.parametrize(
    "fields, field",
    [
        (
            {"tool_name": "read", "args_hash": "read:" + "0" * 64, "result_hash": "1" * 64, "target_hash": "2" * 64},
            "target_hash",
        ),
        (
            {
                "tool_name": "read",
                "args_hash": "read:" + "0" * 64,
                "result_hash": "1" * 64,
                "outcome_kind": "write-mutation",
            },
            "outcome_kind",
        ),
        (
            {
                "tool_name": "exec",
                "args_hash": "exec:" + "0" * 64,
                "result_hash": "1" * 64,
                "failure_identity_hash": "2" * 64,
            },
            "failure_identity_hash",
        ),
        (
            {"tool_name": "exec", "args_hash": "exec:" + "0" * 64, "outcome_kind": "terminal-exec-failure"},
            "outcome_kind",
        ),
        (
            {"tool_name": "write", "args_hash": "write:" + "0" * 64, "result_hash": "1" * 64, "target_hash": "XY"},
            "target_hash",
        ),
        (
            {
                "tool_name": "write",
                "args_hash": "write:" + "0" * 64,
                "result_hash": "1" * 64,
                "outcome_kind": "changed",
            },
            "outcome_kind",
        ),
    ],
)
def test_inconsistent_latest_fields_are_rejected_naming_the_field(fields, field):
    raw = json.dumps({"type": "tool_call.completed", "event_id": "e", "run_id": "r", **fields}).encode()
    with pytest.raises(InvalidEvent) as info:
        decode_event(raw)
    assert f"$.{field}" in str(info.value)


def test_a_completed_event_without_a_hash_or_kind_changes_nothing():
    event = ToolCallCompleted(event_id="e", run_id="r", session_key="s", tool_name="read", args_hash="read:" + "0" * 64)
    from streams.engine import engine_for

    step = engine_for({"loopwatch": {"profile": "latest"}}).handle(None, event)
    assert len(step.state) == 0
