"""The records of loopwatch's fleet-wide view: what no single runner can see.

Public, on ``loop-incidents`` (key: the tool name; compacted, so the latest record per tool
is the tool's state):

* ``fleet.incident_opened``: one tool returned the same error (or the same no-progress
  outcome) in at least ``minRuns`` distinct runs of ``minAgents`` agents within one window;
* ``fleet.incident_resolved``: the same incident, once the tool has stayed below those
  thresholds for ``quietSeconds``.

Internal (the worker's own topics, named after its app id):

* ``FleetRecord`` on ``<app id>-fleet``: what the per-run topology sends to the fleet
  topology, keyed by ``tool:<name>`` (an error or no-progress outcome; a tick that lets the
  owner of a tool resolve its incident) or ``trace:<id>`` (a completed send of a trace);
* ``FleetOutcome`` on ``<app id>-fleet-agents``, keyed by ``agent:<digest>``: an outcome on its
  way to ``<app id>-fleet``, through the per-agent rate limit, which forwards it unchanged;
* ``RingNotice`` on ``<app id>-rings`` (key: the trace id; compacted, a tombstone once the
  ring is broken): an agent ring the fleet topology found, for every worker's per-run
  decisions.

Every field is bounded as the events' are.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from . import names
from .events import MAX_ID_LENGTH, MAX_SAFE_INT, MAX_TOOL_NAME_LENGTH, SCHEMA_VERSION, TimestampMs, Version

__all__ = [
    "FleetOutcome",
    "FleetRecord",
    "FleetSend",
    "FleetTick",
    "Incident",
    "IncidentOpened",
    "IncidentResolved",
    "RingNotice",
    "decode_fleet_record",
    "decode_incident",
    "decode_ring_notice",
    "encode_fleet_record",
    "encode_incident",
    "encode_ring_notice",
]

MAX_RING_MEMBERS = 32
"""The largest ring the detector looks for (``streams.engine.fleet``)."""

IncidentId = Annotated[str, msgspec.Meta(min_length=1, max_length=64, description="inc-<16 hex>-<opened_ms>")]
ToolName = Annotated[str, msgspec.Meta(max_length=MAX_TOOL_NAME_LENGTH)]
Fingerprint = Annotated[
    str, msgspec.Meta(pattern=r"^(error:)?[0-9a-f]{64}$", max_length=70, description="the shared outcome's hash")
]
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_SAFE_INT)]
Seconds = Annotated[int, msgspec.Meta(ge=0, le=86_400)]
Message = Annotated[str, msgspec.Meta(max_length=4096)]
Digest16 = Annotated[str, msgspec.Meta(min_length=16, max_length=16, pattern=r"^[0-9a-f]{16}$")]
Id = Annotated[str, msgspec.Meta(max_length=MAX_ID_LENGTH)]


# -- loop-incidents ---------------------------------------------------------------------------------


class _Incident(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", forbid_unknown_fields=True, gc=False):
    v: Version = SCHEMA_VERSION
    incident_id: IncidentId
    tool_name: ToolName
    outcome_hash: Fingerprint
    """The outcome the runs shared: a result hash (``error:`` + 64 hex for errors), or a
    failure identity (profile latest's drift-free hash of a failing command)."""
    runs: Count
    """Distinct runs that had it within one window when the incident opened: ``minRuns`` (a
    window counts no further)."""
    agents: Count
    """Distinct agents among them: ``minAgents`` (idem)."""
    window_s: Seconds
    opened_ms: TimestampMs
    """The worker's clock when the incident opened."""
    message: Message
    """What decisions for the tool tell the model while the incident is open."""


class IncidentOpened(_Incident, tag=names.INCIDENT_OPENED, kw_only=True, frozen=True):
    """A tool is failing across the fleet."""


class IncidentResolved(_Incident, tag=names.INCIDENT_RESOLVED, kw_only=True, frozen=True):
    """The tool has stayed below the thresholds for ``quietSeconds``."""

    resolved_ms: TimestampMs


Incident = IncidentOpened | IncidentResolved

_incident_decoder = msgspec.json.Decoder(Incident)
_encoder = msgspec.json.Encoder()


def decode_incident(data: bytes) -> Incident:
    return _incident_decoder.decode(data)


def encode_incident(incident: Incident) -> bytes:
    return _encoder.encode(incident)


# -- <app id>-fleet: the per-run topology to the fleet topology ---------------------------------------


class FleetOutcome(msgspec.Struct, frozen=True, array_like=True, tag="o", gc=False):
    """A completed call of ``tool_name`` that failed or made no progress (key ``tool:<name>``)."""

    tool_name: ToolName
    fingerprint: Fingerprint
    run: Digest16
    """A digest of the run's key: the window counts distinct runs without storing their ids."""
    agent: Digest16
    error: bool
    """An error (else a no-progress outcome)."""


class FleetTick(msgspec.Struct, frozen=True, array_like=True, tag="t", gc=False):
    """Lets the owner of a tool's partition look at the tool's open incident when no outcome
    comes (resolution after a quiet window needs no event); key ``tool:<name>``.  Carries the
    incident as announced, so that one whose state is gone (nobody owns it) is still resolved."""

    incident: IncidentOpened


class FleetSend(msgspec.Struct, frozen=True, array_like=True, tag="s", gc=False):
    """A completed send of a trace (key ``trace:<id>``): who sent, to whom, with which outcome."""

    trace_id: Id
    session_key: Id | None
    agent_id: Id | None
    target: Id
    outcome: Fingerprint
    count: Annotated[int, msgspec.Meta(ge=1, le=MAX_SAFE_INT)] = 1
    """How many such sends in a row (a run's identical sends of one batch go as one record)."""


FleetRecord = FleetOutcome | FleetTick | FleetSend

_fleet_decoder = msgspec.json.Decoder(FleetRecord)


def decode_fleet_record(data: bytes) -> FleetRecord:
    return _fleet_decoder.decode(data)


def encode_fleet_record(record: FleetRecord) -> bytes:
    return _encoder.encode(record)


# -- <app id>-rings: the fleet topology's rings, for every worker --------------------------------------


class RingHop(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One hop of a ring: a sender (its session key and agent id as its events carry them) and
    the target it sends to."""

    session_key: Id | None
    agent_id: Id | None
    target: Id


class RingNotice(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, gc=False):
    """An agent ring of one trace: its hops in order, how many rounds they repeated with
    identical outcomes, and the level that gives."""

    trace_id: Id
    ring_id: Digest16
    level: Literal[names.LEVELS]  # type: ignore[valid-type]  # msgspec reads the tuple; mypy wants the values spelled out
    rounds: Annotated[int, msgspec.Meta(ge=1, le=MAX_SAFE_INT)]
    hops: Annotated[list[RingHop], msgspec.Meta(min_length=3, max_length=MAX_RING_MEMBERS)]
    updated_ms: TimestampMs


_ring_decoder = msgspec.json.Decoder(RingNotice)


def decode_ring_notice(data: bytes) -> RingNotice:
    return _ring_decoder.decode(data)


def encode_ring_notice(notice: RingNotice) -> bytes:
    return _encoder.encode(notice)
