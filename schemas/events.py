"""Events runners publish on ``tool-calls`` (key: run id, or session key without one).

Events carry hashes, never raw arguments or results: the runner hashes at the edge with
``streams.engine.hashing`` (byte-compatible with upstream OpenClaw).  Every event has an
``event_id`` that is unique per event and reused on retries; verdict ids derive from it.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Union

import msgspec

MAX_EVENT_BYTES = 64 * 1024
"""Records larger than this are rejected (and dead-lettered by the worker)."""

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
OptionalKey = Annotated[str, msgspec.Meta(max_length=512)] | None
ToolName = Annotated[str, msgspec.Meta(max_length=256)]
ArgsHash = Annotated[str, msgspec.Meta(max_length=256 + 65, description="<tool>:<64 lowercase hex>")]
ResultHash = Annotated[
    str,
    msgspec.Meta(pattern=r"^(error:)?[0-9a-f]{64}$", description="64 hex, or error: + 64 hex"),
]
Digest = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$", description="64 lowercase hex (SHA-256)")]
OutcomeKind = Literal["terminal-exec-failure", "write-mutation"]
TimestampMs = Annotated[int, msgspec.Meta(ge=0, description="event time, epoch milliseconds")]


# gc=False: events hold only scalars, so they can never be part of a reference cycle.
class _Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", forbid_unknown_fields=True, gc=False):
    v: int = 1
    event_id: Id
    run_id: OptionalKey = None
    session_key: OptionalKey = None
    session_id: OptionalKey = None
    agent_id: OptionalKey = None
    ts_ms: TimestampMs = 0


class ToolCallRequested(_Event, tag="tool_call.requested", kw_only=True):
    """A tool call the model asked for, published before the tool runs."""

    tool_call_id: OptionalKey = None
    tool_name: ToolName
    args_hash: ArgsHash
    known_poll: bool = False
    """``command_status``, or ``process`` with action poll/log (hashing.is_known_poll)."""
    gate: bool = False
    """The runner waits for a decision before executing; one is published even for allow."""
    target_hash: Digest | None = None
    """Tool ``write`` only: SHA-256 of ``{"path": <path>}`` (hashing.write_target_hash).
    Read by profile latest (argument churn on one target); optional."""


class ToolCallCompleted(_Event, tag="tool_call.completed", kw_only=True):
    """The outcome of a tool call, hashed at the edge (hashing.hash_outcome)."""

    tool_call_id: OptionalKey = None
    tool_name: ToolName
    args_hash: ArgsHash
    result_hash: ResultHash | None = None
    """None: the tool returned nothing, or the result was the loop's own veto."""
    is_error: bool = False
    unknown_tool_name: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    loop_veto: bool = False
    """The result was loopwatch's/the loop detector's own block (never hashed)."""
    # Profile latest's outcome fields (openclaw-latest.md §4), all optional: a runner sets
    # them whatever profile judges it (streams.edge does), and configurable-final ignores them.
    normalized_result_hash: ResultHash | None = None
    """The result hash under profile latest when it differs from ``result_hash``: untrusted-
    content envelope ids canonicalised, or a ``write`` that changed nothing."""
    outcome_kind: OutcomeKind | None = None
    """``terminal-exec-failure`` (an exec that ran and failed) or ``write-mutation`` (a
    ``write`` that changed its target)."""
    failure_identity_hash: Digest | None = None
    """Terminal exec failures only: a hash of the failure with timestamps, durations, pids
    and attempt counters masked, so drifting output of one failure matches."""
    no_progress: bool = False
    """The outcome made no progress: an error, or a ``write`` that changed nothing."""
    target_hash: Digest | None = None
    """As on the requested event (tool ``write``)."""


class CompactionRetried(_Event, tag="compaction.retried", kw_only=True):
    """A context compaction followed by a retry: arms the post-compaction guard."""


class RunEnded(_Event, tag="run.ended", kw_only=True):
    """The run finished; its state is freed at once."""

    reason: Annotated[str, msgspec.Meta(max_length=256)] | None = None


ToolCallEvent = Union[ToolCallRequested, ToolCallCompleted, CompactionRetried, RunEnded]

EVENT_TYPES = (ToolCallRequested, ToolCallCompleted, CompactionRetried, RunEnded)


class InvalidEvent(ValueError):
    """A record that is not a valid event; ``reason`` is a short machine-readable code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_decoder = msgspec.json.Decoder(ToolCallEvent)
_encoder = msgspec.json.Encoder()


def decode_event(data: bytes) -> ToolCallEvent:
    """Decode one ``tool-calls`` record, raising ``InvalidEvent`` naming the bad field."""
    if len(data) > MAX_EVENT_BYTES:
        raise InvalidEvent("oversized", f"record is {len(data)} bytes, the limit is {MAX_EVENT_BYTES}")
    try:
        event = _decoder.decode(data)
    except msgspec.ValidationError as exc:
        text = str(exc)
        reason = "unknown_type" if "Invalid value" in text and "`$.type`" in text else "invalid_event"
        if "missing required field `type`" in text:
            reason = "unknown_type"
        raise InvalidEvent(reason, text) from None
    except msgspec.DecodeError as exc:
        raise InvalidEvent("invalid_json", str(exc)) from None
    check_event(event)
    return event


def check_event(event: ToolCallEvent) -> None:
    """Rules msgspec cannot express: consistency between fields."""
    if isinstance(event, (ToolCallRequested, ToolCallCompleted)):
        tool, args_hash = event.tool_name, event.args_hash
        n = len(tool)
        if not (args_hash.startswith(tool) and args_hash[n:n + 1] == ":" and _HEX64.match(args_hash, n + 1)):
            raise InvalidEvent(
                "invalid_event",
                f"args_hash must be '<tool_name>:<64 lowercase hex>' for tool {event.tool_name!r} - at `$.args_hash`",
            )
        if event.target_hash is not None and tool != "write":
            raise InvalidEvent("invalid_event", "target_hash is for tool 'write' only - at `$.target_hash`")
    if not (event.run_id or event.session_key or event.session_id):
        raise InvalidEvent("missing_key", "one of run_id, session_key or session_id is required - at `$.run_id`")
    if type(event) is ToolCallCompleted and (event.outcome_kind or event.failure_identity_hash or event.normalized_result_hash):
        _check_latest_outcome(event)


def _check_latest_outcome(event: ToolCallCompleted) -> None:
    if event.result_hash is None:
        field = "outcome_kind" if event.outcome_kind else "normalized_result_hash" if event.normalized_result_hash else "failure_identity_hash"
        raise InvalidEvent("invalid_event", f"{field} needs a result_hash - at `$.{field}`")
    if event.failure_identity_hash is not None and event.outcome_kind != "terminal-exec-failure":
        raise InvalidEvent(
            "invalid_event", "failure_identity_hash needs outcome_kind 'terminal-exec-failure' - at `$.failure_identity_hash`"
        )
    owner = _OUTCOME_KIND_TOOL.get(event.outcome_kind)
    if owner is not None and event.tool_name != owner:
        raise InvalidEvent("invalid_event", f"outcome_kind {event.outcome_kind!r} is for tool {owner!r} only - at `$.outcome_kind`")


_OUTCOME_KIND_TOOL = {"terminal-exec-failure": "exec", "write-mutation": "write"}


def encode_event(event: ToolCallEvent) -> bytes:
    return _encoder.encode(event)
