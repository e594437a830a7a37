"""The engine as a state machine: bad input is rejected without touching state, state
survives serialisation (as it does through a Faust changelog), and options work."""

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.events import InvalidEvent, ToolCallCompleted, ToolCallRequested, decode_event, encode_event
from schemas.verdicts import encode_verdict
from streams.edge.events import compaction_event, completed_event, requested_event, run_ended_event
from streams.engine import RunState, copy_state, decode_state, encode_state, engine_for, state_key
from streams.offline.scenarios import SCENARIOS, run_events

ENABLED = {"tools": {"loopDetection": {"enabled": True}}}
SAME = {"content": [{"type": "text", "text": "same"}], "details": {"ok": True}}


def call(engine, state, n, tool="read", args=None, result=SAME, run_id="r1"):
    fields = dict(run_id=run_id, session_key="s", agent_id="main", tool_call_id=f"c{n}")
    args = {"path": "/x"} if args is None else args
    step = engine.handle(state, requested_event(f"e{n}", tool, args, **fields))
    if step.decision.action != "block":
        step = engine.handle(step.state, completed_event(f"d{n}", tool, args, result=result, **fields))
    return step


def test_generic_repeat_blocks_the_21st_identical_call_and_stays_blocked():
    engine = engine_for(ENABLED)
    state = None
    actions = []
    for n in range(25):
        req = requested_event(f"e{n}", "read", {"path": "/x"}, run_id="r1", session_key="s", tool_call_id=f"c{n}")
        step = engine.handle(state, req)
        state = step.state
        actions.append((step.decision.action, step.decision.count))
        if step.decision.action != "block":
            state = engine.handle(
                state,
                completed_event(
                    f"d{n}", "read", {"path": "/x"}, result=SAME, run_id="r1", session_key="s", tool_call_id=f"c{n}"
                ),
            ).state
    assert actions[10] == ("warn", 10)
    assert actions[19][0] == "allow" and actions[20] == ("block", 20)
    assert all(a == ("block", 20) for a in actions[20:])  # vetoed calls are not recorded
    assert len(state) == 20


def test_verdict_ids_derive_from_the_event():
    engine = engine_for(ENABLED)
    req = requested_event("evt-42", "read", {}, run_id="r", session_key="s")
    assert (
        engine.handle(None, req).decision.verdict_id
        == engine.handle(None, req).decision.verdict_id
        == "evt-42/decision"
    )


def test_rejected_events_leave_state_untouched():
    engine = engine_for(ENABLED)
    state = call(engine, None, 0).state
    before = encode_state(state)
    bad = ToolCallRequested(event_id="x", run_id="r1", session_key="s", tool_name="read", args_hash="write:" + "0" * 64)
    with pytest.raises(InvalidEvent) as info:
        engine.handle(state, bad)
    assert "args_hash" in str(info.value)
    no_key = ToolCallCompleted(event_id="y", tool_name="read", args_hash="read:" + "0" * 64, result_hash="1" * 64)
    with pytest.raises(InvalidEvent, match="run_id"):
        engine.handle(state, no_key)
    assert encode_state(state) == before


@pytest.mark.parametrize(
    "raw, reason, field",
    [
        (b"{not json", "invalid_json", None),
        (b'{"type":"tool_call.exploded","event_id":"e"}', "unknown_type", "type"),
        (b'{"event_id":"e"}', "unknown_type", "type"),
        (
            b'{"type":"tool_call.requested","event_id":"e","run_id":"r","tool_name":"read","args_hash":5}',
            "invalid_event",
            "args_hash",
        ),
        (
            b'{"type":"tool_call.requested","event_id":"e","run_id":"r","tool_name":"read"}',
            "invalid_event",
            "args_hash",
        ),
        (
            b'{"type":"tool_call.completed","event_id":"e","run_id":"r","tool_name":"read","args_hash":"read:'
            + b"0" * 64
            + b'","result_hash":"zz"}',
            "invalid_event",
            "result_hash",
        ),
        (b'{"type":"run.ended","event_id":"e","run_id":"r","surprise":1}', "invalid_event", "surprise"),
        (b'{"type":"run.ended","event_id":"e"}', "missing_key", "run_id"),
        (b'{"type":"run.ended","event_id":"e","run_id":"r","reason":"' + b"x" * 70000 + b'"}', "oversized", None),
    ],
)
def test_decode_event_names_the_problem(raw, reason, field):
    with pytest.raises(InvalidEvent) as info:
        decode_event(raw)
    assert info.value.reason == reason
    if field:
        assert field in str(info.value)


@given(st.binary(max_size=300))
def test_decoding_arbitrary_bytes_never_crashes(raw):
    try:
        decode_event(raw)
    except InvalidEvent:
        pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=12), c, max_size=5),
    max_leaves=12,
)


@given(
    st.dictionaries(
        st.sampled_from(["type", "event_id", "run_id", "tool_name", "args_hash", "result_hash", "gate", "ts_ms", "v"]),
        json_values,
    )
)
def test_decoding_arbitrary_objects_only_raises_invalid_event(obj):
    try:
        event = decode_event(msgspec.json.encode(obj))
    except InvalidEvent:
        return
    engine_for(ENABLED).handle(None, event, validated=True)  # whatever decodes, the engine takes


def decisions_of(events, engine, roundtrip):
    states, out = {}, []
    for event in events:
        key = state_key(event)
        state = states.get(key)
        if roundtrip and state is not None:
            state = decode_state(encode_state(state))
        step = engine.handle(state, event)
        states[key] = step.state
        for verdict in (step.decision, step.abort):
            if verdict is not None:
                out.append(msgspec.json.encode(verdict))
    return out


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(SCENARIOS), st.integers(5, 40)), min_size=1, max_size=4), st.randoms())
def test_state_survives_serialisation_between_any_two_events(runs, rnd):
    # What a Faust changelog replay does: decode the stored state before every event.
    streams = [list(run_events(kind, f"run{n}", length=length, seed=n)) for n, (kind, length) in enumerate(runs)]
    events = []
    while any(streams):
        s = rnd.choice([s for s in streams if s])
        events.append(s.pop(0))
    engine = engine_for(ENABLED)
    assert decisions_of(events, engine, roundtrip=True) == decisions_of(events, engine_for(ENABLED), roundtrip=False)


def test_wire_round_trip_of_events():
    for event in run_events("post_compaction", "r", length=8):
        assert decode_event(encode_event(event)) == event


def test_run_ended_frees_state():
    engine = engine_for(ENABLED)
    state = call(engine, None, 0).state
    assert engine.handle(state, run_ended_event("end", run_id="r1", session_key="s")).state is None


def test_post_compaction_abort_then_late_calls_are_refused():
    engine = engine_for(ENABLED)
    state = engine.handle(None, compaction_event("c", run_id="r1", session_key="s")).state
    aborts = []
    for n in range(3):
        step = call(engine, state, n, tool="gateway", args={"a": 1})
        state = step.state
        aborts.append(step.abort)
    assert aborts[0] is None and aborts[1] is None
    assert aborts[2].detector == "compaction_loop_persisted" and aborts[2].count == 3
    late = engine.handle(state, requested_event("late", "read", {}, run_id="r1", session_key="s"))
    assert late.decision.action == "block" and late.decision.detector == "compaction_loop_persisted"


def test_guard_runs_even_when_detection_is_disabled_unless_explicitly_off():
    for block, expect_abort in ((None, True), ({"enabled": False}, False)):
        engine = engine_for({"tools": {"loopDetection": block}})
        state = engine.handle(None, compaction_event("c", run_id="r1", session_key="s")).state
        steps = [call(engine, state, n) for n in range(3)]
        assert (steps[-1].abort is not None) == expect_abort


def test_option_abort_after_critical_blocks():
    root = {"tools": {"loopDetection": {"enabled": True}}, "loopwatch": {"abortAfterCriticalBlocks": 2}}
    engine = engine_for(root)
    state, aborts = None, []
    for n in range(24):
        step = call(engine, state, n)
        state = step.state
        if step.abort:
            aborts.append((n, step.abort.detector, step.abort.count))
    assert aborts == [(21, "critical_block_limit", 2)]
    # Upstream default: blocks go on for ever, the run is never ended.
    default = engine_for(ENABLED)
    state, blocks = None, 0
    for n in range(24):
        step = call(default, state, n)
        state = step.state
        blocks += step.decision is not None and step.decision.action == "block"
        assert step.abort is None
    assert blocks == 4


def test_option_surface_warnings():
    for surface in (False, True):
        root = {"tools": {"loopDetection": {"enabled": True}}, "loopwatch": {"surfaceWarnings": surface}}
        engine = engine_for(root)
        state = None
        for n in range(11):
            step = call(engine, state, n)
            state = step.state
        req = engine.handle(state, requested_event("w", "read", {"path": "/x"}, run_id="r1", session_key="s"))
        # count 11 is in the same bucket as 10: hidden by upstream's bucket rule
        assert req.decision.action == "allow" and req.decision.level == "warning"
    engine = engine_for({"tools": {"loopDetection": {"enabled": True}}, "loopwatch": {"surfaceWarnings": True}})
    state = None
    notified = []
    for n in range(12):
        step = engine.handle(
            state, requested_event(f"e{n}", "read", {"path": "/x"}, run_id="r1", session_key="s", tool_call_id=f"c{n}")
        )
        notified.append((step.decision.action, step.decision.notify_model))
        state = engine.handle(
            step.state,
            completed_event(
                f"d{n}", "read", {"path": "/x"}, result=SAME, run_id="r1", session_key="s", tool_call_id=f"c{n}"
            ),
        ).state
    assert notified[10] == ("warn", True) and notified[11] == ("allow", False)


def test_state_size_at_default_history_is_recorded():
    engine = engine_for(ENABLED)
    state = None
    for n in range(40):
        state = call(
            engine, state, n, args={"path": f"/f{n}"}, result={"content": [{"type": "text", "text": str(n)}]}
        ).state
    assert len(state) == 30
    assert isinstance(decode_state(encode_state(state)), RunState)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["read", "a:b", "exec"]), st.text(max_size=8), st.one_of(st.none(), st.text(max_size=70))
        ),
        max_size=12,
    ),
    st.dictionaries(st.text(max_size=5), st.integers(0, 9), max_size=3),
)
def test_compact_state_encoding_round_trips_any_history(rows, buckets):
    from streams.edge.hashing import args_hash

    state = RunState(run_id="r", warning_buckets=buckets, last_event_ms=1000)
    for n, (tool, arg, result) in enumerate(rows):
        sig = args_hash(tool, arg) if n % 2 else f"{tool}:{arg}"  # standard and verbatim entries
        state.tools.append(tool)
        state.sigs.append(sig)
        state.call_ids.append(None if n % 3 == 0 else f"c{n}")
        state.results.append(result if n % 4 else "error:" + "ab" * 32)
        state.unknowns.append(None if n % 5 else "ghost")
        state.stamps.append(1000 - n)
    assert decode_state(encode_state(state)) == state


def test_a_text_that_is_both_a_signature_and_a_result_round_trips_as_each():
    # "error:<64 hex>" is the signature of a tool named "error" and an error result: packed
    # (and memoised) differently as one and as the other.
    digest = "cd" * 32
    state = RunState(run_id="r", last_event_ms=5)
    for sig, result in ((f"error:{digest}", f"error:{digest}"), (f"read:{digest}", digest)):
        state.tools.append(sig.split(":")[0])
        state.sigs.append(sig)
        state.call_ids.append(None)
        state.results.append(result)
        state.unknowns.append(None)
        state.stamps.append(5)
    assert decode_state(encode_state(state)) == state


@given(st.text(max_size=12), st.text(alphabet="0123456789abcdefABCDEF:x", min_size=0, max_size=70))
def test_args_hash_must_be_the_tool_name_and_64_lowercase_hex(tool, digest):
    event = ToolCallRequested(event_id="e", run_id="r", tool_name=tool, args_hash=f"{tool}:{digest}")
    valid = len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
    try:
        from schemas.events import check_event

        check_event(event)
        assert valid
    except InvalidEvent as exc:
        assert not valid and "args_hash" in str(exc)


# -- the ping-pong warning key sorts as JavaScript does ---------------------------------------


@given(st.text(), st.text())
def test_ping_pong_key_sorts_signatures_by_utf16_units(a, b):
    from streams.engine.detectors import ping_pong_key

    def units(text):  # JavaScript compares strings by UTF-16 code units
        return text.encode("utf-16-be", "surrogatepass")

    low, high = sorted((a, b), key=units)
    assert ping_pong_key(a, b) == ping_pong_key(b, a) == f"pingpong:{low}|{high}"


def test_ping_pong_key_orders_astral_below_high_bmp_characters():
    from streams.engine.detectors import ping_pong_key

    # U+1F600 is a surrogate pair (0xD83D ...) and so sorts before U+FF01 in JavaScript,
    # although its code point is larger.
    assert ping_pong_key("\uff01", "\U0001f600") == "pingpong:\U0001f600|\uff01"
    assert ping_pong_key("read:b", "read:a") == "pingpong:read:a|read:b"


def test_copy_state_copies_every_part_the_engine_changes_in_place():
    # A field added to RunState later must be copied too, or a checkpoint in progress
    # would store changes made after it froze the run.
    engine = engine_for(ENABLED)
    state = None
    for n in range(12):
        state = call(engine, state, n).state
    state = engine.handle(state, compaction_event("k1", run_id="r1", session_key="s")).state
    copy = copy_state(state)
    assert copy == state
    for field in msgspec.structs.fields(RunState):
        value = getattr(state, field.name)
        if isinstance(value, (list, dict, msgspec.Struct)):
            assert getattr(copy, field.name) is not value, field.name
    frozen = encode_state(copy)
    for n in range(12, 40):
        state = call(engine, state, n, args={"path": f"/{n % 3}"}).state
    assert encode_state(copy) == frozen and copy != state


@pytest.mark.parametrize(
    ("root", "off"),
    [
        (None, True),  # no config: upstream's defaults
        ({}, True),
        ({"tools": {"loopDetection": {"enabled": True}}}, False),
        ({"loopwatch": {"profile": "latest"}}, True),
        ({"loopwatch": {"profile": "latest"}, "tools": {"loopDetection": {"enabled": True}}}, False),
        ({"loopwatch": {"detectors": {"cycle": True}}}, True),
        ({"loopwatch": {"profile": "openhands"}}, False),  # reads no loopDetection block
    ],
)
def test_an_allow_says_when_the_agent_runs_no_detection(root, off):
    """A gated call's allow carries ``detection_off`` when its agent's config checks nothing,
    so the runner can tell; on the wire only then (left out otherwise)."""
    event = ToolCallRequested(
        event_id="e1", run_id="r", session_key="s", tool_name="read", args_hash="read:" + "0" * 64, gate=True
    )
    decision = engine_for(root).handle(None, event).published_decision
    assert decision.action == "allow"
    assert (decision.detection_off is True) is off
    assert (b"detection_off" in encode_verdict(decision)) is off
