"""The edge's event builders pass msgspec only the keywords that are set, in field order (its
fast path); the events they build are, byte for byte, the events spelled out with every field
(the Struct's own constructor, every keyword given), whatever the outcome and optional ids."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from schemas import encode_event
from schemas.events import UNSET, ToolCallCompleted, ToolCallRequested
from streams.edge.events import completed_from_outcome, requested_event
from streams.edge.hashing import (
    Outcome,
    args_hash,
    gemini_call_key,
    is_known_poll,
    near_args_hash,
    text_hash,
    write_target_hash,
)

HEX = st.text("0123456789abcdef", min_size=64, max_size=64)
IDS = st.none() | st.text(min_size=1, max_size=8)

outcomes = st.builds(
    Outcome,
    result_hash=st.none() | HEX,
    unknown_tool_name=st.none() | st.sampled_from(["grep", "x"]),
    loop_veto=st.booleans(),
    is_error=st.booleans(),
    normalized_result_hash=st.none() | HEX,
    outcome_kind=st.none() | st.sampled_from(["terminal-exec-failure", "write-mutation"]),
    failure_identity_hash=st.none() | HEX,
    no_progress=st.booleans(),
)


@given(
    outcomes,
    IDS,
    IDS,
    IDS,
    st.integers(0, 2**40),
    IDS,
    st.none() | HEX,
    st.none() | st.text(min_size=1),
    st.none() | HEX,
)
def test_a_completed_event_is_the_event_with_every_field_spelled_out(
    outcome, run_id, session_id, agent_id, ts_ms, call_id, target_hash, trace_id, near
):
    built = completed_from_outcome(
        "e1",
        "read",
        "read:" + "0" * 64,
        outcome,
        run_id=run_id,
        session_key=run_id,
        session_id=session_id,
        agent_id=agent_id,
        ts_ms=ts_ms,
        tool_call_id=call_id,
        target_hash=target_hash,
        trace_id=trace_id or UNSET,
        near_args_hash=UNSET if near is None else near,
    )
    spelled = ToolCallCompleted(
        v=1,
        event_id="e1",
        run_id=run_id,
        session_key=run_id,
        session_id=session_id,
        agent_id=agent_id,
        ts_ms=ts_ms,
        tool_call_id=call_id,
        tool_name="read",
        args_hash="read:" + "0" * 64,
        result_hash=outcome.result_hash,
        is_error=outcome.is_error,
        unknown_tool_name=outcome.unknown_tool_name,
        loop_veto=outcome.loop_veto,
        normalized_result_hash=outcome.normalized_result_hash,
        outcome_kind=outcome.outcome_kind,
        failure_identity_hash=outcome.failure_identity_hash,
        no_progress=outcome.no_progress,
        target_hash=target_hash,
        trace_id=trace_id or UNSET,
        target=UNSET,
        near_args_hash=UNSET if near is None else near,
    )
    assert built == spelled
    assert encode_event(built) == encode_event(spelled)


ARGS = st.sampled_from([{}, {"path": "/a"}, {"action": "poll"}, ["x"], "text"])


@given(
    st.sampled_from(["read", "write", "process", "command_status"]),
    ARGS,
    IDS,
    st.booleans(),
    st.none() | st.text(min_size=1),
    st.none() | st.text(min_size=1),
    st.none() | st.text(),
    st.booleans(),
)
def test_a_requested_event_is_the_event_with_every_field_spelled_out(
    tool, args, run_id, gate, trace_id, target, thought, gemini_key
):
    built = requested_event(
        "e1",
        tool,
        args,
        tool_call_id="c1",
        run_id=run_id,
        session_key=run_id,
        agent_id="main",
        gate=gate,
        ts_ms=7,
        trace_id=trace_id,
        target=target,
        thought=thought,
        gemini_key=gemini_key,
    )
    spelled = ToolCallRequested(
        v=1,
        event_id="e1",
        run_id=run_id,
        session_key=run_id,
        session_id=None,
        agent_id="main",
        ts_ms=7,
        tool_call_id="c1",
        tool_name=tool,
        args_hash=args_hash(tool, args),
        known_poll=is_known_poll(tool, args),
        gate=gate,
        target_hash=write_target_hash(tool, args),
        trace_id=trace_id or UNSET,
        target=target or UNSET,
        thought_hash=UNSET if thought is None else text_hash(thought),
        call_key=gemini_call_key(tool, args) if gemini_key else UNSET,
        near_args_hash=near_args_hash(args),
    )
    assert built == spelled
    assert encode_event(built) == encode_event(spelled)
