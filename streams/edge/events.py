"""Build ``tool-calls`` events from raw tool calls at the runner's edge.

This is the one place where raw arguments and results become hashes: the runner client,
``loopwatch conformance`` and the examples all build their events here, so the engine
only ever sees what a real runner would publish.  ``UNDEFINED`` (JavaScript's ``undefined``)
is re-exported for callers that pass "no error" explicitly, as the runner client does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from schemas.events import (
    UNSET,
    AgentMessage,
    CompactionRetried,
    ModelText,
    RunEnded,
    ToolCallCompleted,
    ToolCallRequested,
)

from .canonical import UNDEFINED
from .hashing import (
    Outcome,
    args_hash,
    gemini_call_key,
    hash_outcome,
    is_known_poll,
    near_args_hash,
    text_hash,
    write_target_hash,
)

__all__ = [
    "UNDEFINED",
    "agent_message_event",
    "blocked_result",
    "compaction_event",
    "completed_event",
    "model_text_event",
    "requested_event",
    "run_ended_event",
]


def blocked_result(message: str) -> dict:
    """The result a vetoed call gets instead of running (upstream's blocked result, spec §3).
    A runner completes the call with it: it never hashes, and under profile latest it
    records the veto."""
    return {
        "content": [{"type": "text", "text": message}],
        "details": {"status": "blocked", "deniedReason": "tool-loop", "reason": message},
    }


def requested_event(
    event_id: str,
    tool_name: str,
    args: Any,
    *,
    tool_call_id: str | None = None,
    run_id: str | None = None,
    session_key: str | None = None,
    session_id: str | None = None,
    agent_id: str | None = None,
    gate: bool = False,
    ts_ms: int = 0,
    trace_id: str | None = None,
    target: str | None = None,
    thought: str | None = None,
    gemini_key: bool = False,
) -> ToolCallRequested:
    """``trace_id`` and ``target`` (agent rings, optional): the conversation the call belongs
    to and, on a send, the session key or agent id the message goes to.  ``thought``
    (optional): the text the model wrote with the call, sent as its hash (profile openhands
    tells actions apart by it).  ``gemini_key``: also send Gemini CLI's own key of the call
    (``call_key``, for profile gemini-cli).  ``near_args_hash`` (the arguments read loosely,
    ``hashing.near_args_hash``) is always sent: ``loopwatch.detectors.nearIdentical`` reads it."""
    call_hash = args_hash(tool_name, args)
    # The optional fields are passed only when set: left out they are UNSET all the same, and
    # msgspec takes a keyword of UNSET several times slower than any other (an import makes
    # one of these a call).
    optional: dict[str, Any] = {}
    if trace_id:
        optional["trace_id"] = trace_id
    if target:
        optional["target"] = target
    if thought is not None:
        optional["thought_hash"] = text_hash(thought)
    if gemini_key:
        optional["call_key"] = gemini_call_key(tool_name, args)
    return ToolCallRequested(
        event_id=event_id,
        run_id=run_id,
        session_key=session_key,
        session_id=session_id,
        agent_id=agent_id,
        ts_ms=ts_ms,
        tool_call_id=tool_call_id,
        tool_name=tool_name,
        args_hash=call_hash,
        known_poll=is_known_poll(tool_name, args),
        gate=gate,
        target_hash=write_target_hash(tool_name, args),
        **optional,
        near_args_hash=near_args_hash(args, call_hash[len(tool_name) + 1 :]),
    )


def completed_event(
    event_id: str,
    tool_name: str,
    args: Any,
    *,
    result: Any = None,
    error: Any = UNDEFINED,
    returned: bool = True,
    provider_send_tools: Iterable[str] = (),
    tool_call_id: str | None = None,
    run_id: str | None = None,
    session_key: str | None = None,
    session_id: str | None = None,
    agent_id: str | None = None,
    ts_ms: int = 0,
    trace_id: str | None = None,
    target: str | None = None,
) -> ToolCallCompleted:
    outcome = hash_outcome(
        tool_name, args, result=result, error=error, returned=returned, provider_send_tools=provider_send_tools
    )
    call_hash = args_hash(tool_name, args)
    return completed_from_outcome(
        event_id,
        tool_name,
        call_hash,
        outcome,
        target_hash=write_target_hash(tool_name, args),
        tool_call_id=tool_call_id,
        run_id=run_id,
        session_key=session_key,
        session_id=session_id,
        agent_id=agent_id,
        ts_ms=ts_ms,
        trace_id=trace_id or UNSET,
        target=target or UNSET,
        near_args_hash=near_args_hash(args, call_hash[len(tool_name) + 1 :]),
    )


def completed_from_outcome(
    event_id: str,
    tool_name: str,
    call_hash: str,
    outcome: Outcome,
    *,
    run_id: str | None = None,
    session_key: str | None = None,
    session_id: str | None = None,
    agent_id: str | None = None,
    ts_ms: int = 0,
    tool_call_id: str | None = None,
    target_hash: str | None = None,
    trace_id: Any = UNSET,
    target: Any = UNSET,
    near_args_hash: Any = UNSET,
) -> ToolCallCompleted:
    # The keywords in the Struct's field order, which msgspec matches in one pass (out of
    # order it searches for each: three times the cost), and the optional three only when set.
    optional: dict[str, Any] = {}
    if trace_id is not UNSET:
        optional["trace_id"] = trace_id
    if target is not UNSET:
        optional["target"] = target
    near: dict[str, Any] = {} if near_args_hash is UNSET else {"near_args_hash": near_args_hash}
    if outcome.plain and not optional:
        # Most outcomes set none of profile latest's fields: left out, they take their
        # defaults (the same event), and msgspec takes sixteen keywords at half the cost of
        # twenty.
        return ToolCallCompleted(
            event_id=event_id,
            run_id=run_id,
            session_key=session_key,
            session_id=session_id,
            agent_id=agent_id,
            ts_ms=ts_ms,
            tool_call_id=tool_call_id,
            tool_name=tool_name,
            args_hash=call_hash,
            result_hash=outcome.result_hash,
            is_error=outcome.is_error,
            no_progress=outcome.no_progress,
            target_hash=target_hash,
            **near,
        )
    return ToolCallCompleted(
        event_id=event_id,
        run_id=run_id,
        session_key=session_key,
        session_id=session_id,
        agent_id=agent_id,
        ts_ms=ts_ms,
        tool_call_id=tool_call_id,
        tool_name=tool_name,
        args_hash=call_hash,
        result_hash=outcome.result_hash,
        is_error=outcome.is_error,
        unknown_tool_name=outcome.unknown_tool_name,
        loop_veto=outcome.loop_veto,
        normalized_result_hash=outcome.normalized_result_hash,
        outcome_kind=outcome.outcome_kind,
        failure_identity_hash=outcome.failure_identity_hash,
        no_progress=outcome.no_progress,
        target_hash=target_hash,
        **optional,
        **near,
    )


def compaction_event(event_id: str, **fields: Any) -> CompactionRetried:
    return CompactionRetried(event_id=event_id, **fields)


def run_ended_event(event_id: str, reason: str | None = None, **fields: Any) -> RunEnded:
    return RunEnded(event_id=event_id, reason=reason, **fields)


def agent_message_event(
    event_id: str, text: str, *, source: Literal["agent", "user"] = "agent", empty: bool | None = None, **fields: Any
) -> AgentMessage:
    """A reply of the model without tool calls (``source="agent"``), or a message of the user
    (``source="user"``), as its hash.  ``empty``: the reply had no user-visible content (by
    default: the text is blank), as OpenHands classifies an empty or reasoning-only reply."""
    if empty is None:
        empty = source == "agent" and not text.strip()
    return AgentMessage(event_id=event_id, source=source, text_hash=text_hash(text), empty=empty, **fields)


def model_text_event(event_id: str, edge: Any, text: str, **fields: Any) -> ModelText:
    """A chunk of the model's streamed text as Gemini CLI's content loop detector reads it: the
    run's ``edge`` (one ``streams.edge.content_windows.ContentEdge`` per run, told of its tool
    calls and user prompts)
    turns it into window hashes.  The text itself is not in the event."""
    chunk = edge.feed(text)
    return ModelText(
        event_id=event_id,
        reset=chunk.reset,
        skipped=chunk.skipped,
        truncated=chunk.truncated,
        length=chunk.length,
        windows=chunk.windows,
        **fields,
    )
