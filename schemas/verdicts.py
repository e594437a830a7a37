"""Verdicts loopwatch publishes on ``loop-verdicts`` (key: the run's state key).

Every verdict has a ``verdict_id`` derived from the event that caused it, so a replay or
a redelivery reproduces the same id and a runner can drop duplicates by id.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal

import msgspec

from . import names
from .events import (
    MAX_ID_LENGTH,
    MAX_SAFE_INT,
    MAX_TOOL_NAME_LENGTH,
    SCHEMA_VERSION,
    UNSET,
    ArgsHash,
    Id,
    OptionalKey,
    TimestampMs,
    Unset,
    Version,
)

Action = Literal[names.ACTIONS]  # type: ignore[valid-type]  # msgspec reads the tuple; mypy wants the values spelled out
Level = Literal[names.LEVELS]  # type: ignore[valid-type]  # (as Action)
LivenessSignal = Literal["argument_churn"]

# Bounds.  Every value a verdict carries comes from its event (bounded there) or from the
# engine's own texts; the limits leave room for the longest the engine builds from the
# longest event fields (tests/schemas/test_bounds.py drives events at their bounds through it).
VerdictId = Annotated[
    str,
    msgspec.Meta(min_length=1, max_length=MAX_ID_LENGTH + 16, description="<event_id>/decision or <event_id>/abort"),
]
ToolName = Annotated[str, msgspec.Meta(max_length=MAX_TOOL_NAME_LENGTH)]
Detector = Annotated[str, msgspec.Meta(max_length=64, description="generic_repeat, ping_pong, ... (docs/metrics.md)")]
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_SAFE_INT)]
Message = Annotated[str, msgspec.Meta(max_length=4096)]
WarningKey = Annotated[str, msgspec.Meta(max_length=2048)]
IncidentId = Annotated[
    str, msgspec.Meta(min_length=1, max_length=64, description="the fleet incident (loop-incidents)")
]


class _Verdict(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", forbid_unknown_fields=True, gc=False):
    v: Version = SCHEMA_VERSION
    verdict_id: VerdictId
    cause_event_id: Id
    run_id: OptionalKey = None
    session_key: OptionalKey = None
    agent_id: OptionalKey = None
    ts_ms: TimestampMs = 0
    """Timestamp of the causing event (the engine has no clock)."""


class Decision(_Verdict, tag=names.DECISION, kw_only=True, frozen=True):
    """The answer to one requested tool call.

    ``action`` is ``block`` for a critical detection (the call must not run), ``warn`` for a
    warning that passed upstream's warning-bucket rule, otherwise ``allow``.  A warning the
    bucket rule hid keeps its ``level``/``detector`` with ``action=allow`` and
    ``warning_emitted=false``.  ``notify_model`` says whether the runner should show
    ``message`` to the model: always for a block (upstream's blocked result); for warnings
    only with the ``surfaceWarnings`` option (upstream never shows them, OpenClaw issue #120449).

    With ``loopwatch.fleetIncidents``, a call of a tool with an open fleet incident gets a
    decision whatever its action (also when not gated): it carries ``incident_id``, its
    ``message`` starts with the incident's (the tool is failing across the fleet) and
    ``notify_model`` is true.  loopwatch's own detectors ``cycle`` and ``agent_ring`` are
    opt-in (``loopwatch.detectors.cycle``, ``loopwatch.agentRings``).

    Profile latest adds detector ``argument_churn`` (warnings only) and ``liveness_signal``:
    ``argument_churn`` when the call also continues an argument churn, i.e. the run is busy
    without getting anywhere.  Its write-churn warning can also answer a
    ``tool_call.completed`` event (``cause_event_id``): upstream attaches it to the tool's
    result, so it carries ``notify_model: true``.
    """

    tool_call_id: OptionalKey = None
    tool_name: ToolName
    args_hash: ArgsHash
    action: Action
    level: Level | None = None
    detector: Detector | None = None
    count: Count | None = None
    message: Message | None = None
    paired_tool_name: ToolName | None = None
    warning_key: WarningKey | None = None
    warning_emitted: bool | None = None
    notify_model: bool = False
    liveness_signal: LivenessSignal | None = None
    incident_id: IncidentId | Unset = UNSET
    """Left out of the record unless the tool has an open fleet incident."""
    detection_off: bool | Unset = UNSET
    """True on an ``allow`` when the config runs no detection for the agent
    (``tools.loopDetection.enabled`` is not true): the call was not checked.  Left out of the
    record otherwise, so a runner can warn that the guard it waits for is off."""


class RunAborted(_Verdict, tag=names.RUN_ABORTED, kw_only=True, frozen=True):
    """The run must end: the post-compaction guard's ``compaction_loop_persisted``, or the
    optional ``critical_block_limit`` (``loopwatch.abortAfterCriticalBlocks``)."""

    detector: Detector
    count: Count
    tool_name: ToolName
    message: Message


Verdict = Decision | RunAborted

_decoder = msgspec.json.Decoder(Verdict)
_encoder = msgspec.json.Encoder()


def decode_verdict(data: bytes) -> Verdict:
    return _decoder.decode(data)


encode_verdict: Callable[[Verdict], bytes] = _encoder.encode
"""A verdict's record value.  (The encoder's own method: the worker encodes one per gated call,
and a Python wrapper around it cost a call per verdict.)"""
