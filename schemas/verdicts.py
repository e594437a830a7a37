"""Verdicts loopwatch publishes on ``loop-verdicts`` (key: the run's state key).

Every verdict has a ``verdict_id`` derived from the event that caused it, so a replay or
a redelivery reproduces the same id and a runner can drop duplicates by id.
"""

from __future__ import annotations

from typing import Literal, Union

import msgspec

Action = Literal["allow", "warn", "block"]
Level = Literal["warning", "critical"]
LivenessSignal = Literal["argument_churn"]


class _Verdict(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", forbid_unknown_fields=True, gc=False):
    v: int = 1
    verdict_id: str
    cause_event_id: str
    run_id: str | None = None
    session_key: str | None = None
    agent_id: str | None = None
    ts_ms: int = 0
    """Timestamp of the causing event (the engine has no clock)."""


class Decision(_Verdict, tag="loop.decision", kw_only=True):
    """The answer to one requested tool call.

    ``action`` is ``block`` for a critical detection (the call must not run), ``warn`` for a
    warning that passed upstream's warning-bucket rule, otherwise ``allow``.  A warning the
    bucket rule hid keeps its ``level``/``detector`` with ``action=allow`` and
    ``warning_emitted=false``.  ``notify_model`` says whether the runner should show
    ``message`` to the model: always for a block (upstream's blocked result); for warnings
    only with the ``surfaceWarnings`` option (upstream never shows them, #120449).

    Profile latest adds detector ``argument_churn`` (warnings only) and ``liveness_signal``:
    ``argument_churn`` when the call also continues an argument churn, i.e. the run is busy
    without getting anywhere.  Its write-churn warning can also answer a
    ``tool_call.completed`` event (``cause_event_id``): upstream attaches it to the tool's
    result, so it carries ``notify_model: true``.
    """

    tool_call_id: str | None = None
    tool_name: str
    args_hash: str
    action: Action
    level: Level | None = None
    detector: str | None = None
    count: int | None = None
    message: str | None = None
    paired_tool_name: str | None = None
    warning_key: str | None = None
    warning_emitted: bool | None = None
    notify_model: bool = False
    liveness_signal: LivenessSignal | None = None


class RunAborted(_Verdict, tag="loop.run_aborted", kw_only=True):
    """The run must end: the post-compaction guard's ``compaction_loop_persisted``, or the
    optional ``critical_block_limit`` (``loopwatch.abortAfterCriticalBlocks``)."""

    detector: str
    count: int
    tool_name: str
    message: str


Verdict = Union[Decision, RunAborted]

_decoder = msgspec.json.Decoder(Verdict)
_encoder = msgspec.json.Encoder()


def decode_verdict(data: bytes) -> Verdict:
    return _decoder.decode(data)


def encode_verdict(verdict: Verdict) -> bytes:
    return _encoder.encode(verdict)
