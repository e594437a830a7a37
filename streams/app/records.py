"""The worker's record types: a consumed record, and what a batch produces from it.

Their own module so that the parts that pass them along (the processor makes them, the
checkpointer and output ship them) depend on these types, not on each other.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from schemas.verdicts import Decision, RunAborted

__all__ = ["BatchResult", "DeadLetter", "Record", "VerdictOut"]


@dataclass(slots=True)
class Record:
    """One consumed record.  The Faust layer passes aiokafka's ``ConsumerRecord``s, which
    have the same attributes; this class is for tests and other drivers."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int | None = None
    """Kafka record timestamp, ms (aiokafka's convention)."""
    headers: Sequence[tuple[str, bytes]] = ()
    source_offset: int | None = None
    """The offset in its topic when ``offset`` is not (a forwarded record's, ``FORWARDED_OFFSETS``)."""
    forwarded_from: tuple[int, int] | None = None
    """A forwarded record's ``tool-calls`` partition and offset (its ``processor.FORWARDED_FROM_HEADER``):
    what makes applying it idempotent (``streams.app.processor``)."""


class VerdictOut(msgspec.Struct, gc=False):
    """One verdict to produce.  (A msgspec Struct: one is made per gated call, and its
    constructor runs in C, at about a third of a slotted dataclass's.)"""

    partition: int
    """The source partition: verdicts are co-partitioned with the events that caused them."""
    key: bytes
    value: bytes
    verdict: Decision | RunAborted


@dataclass(slots=True)
class DeadLetter:
    record: Record
    reason: str
    detail: str


@dataclass
class BatchResult:
    verdicts: list[VerdictOut] = field(default_factory=list)
    """For ``loop-verdicts``."""
    dead_letters: list[DeadLetter] = field(default_factory=list)
    shadow: list[VerdictOut] = field(default_factory=list)
    """For the shadow topic, from the live config (agents in shadow mode)."""
    candidate: list[VerdictOut] = field(default_factory=list)
    """For the shadow topic, from the candidate config."""
    sha256: dict[str, str] = field(default_factory=dict)
    """The configs the batch ran on: config (live, candidate) -> its tag on the shadow topic."""
    skipped: int = 0
    """Events not applied again because their run's state already holds them (re-delivery)."""
    forwarded_again: int = 0
    """Of ``skipped``, under session scope: records forwarded again whose ``tool-calls`` offset
    their session's state holds (``processor.FORWARDED_FROM_HEADER``)."""
    duplicates: int = 0
    """Events not applied because their run already applied an event with the same id."""
    clamped: int = 0
    """Events whose time was too far ahead of the worker's clock and was clamped to it."""
    events: int = 0
    """Valid events applied."""
    runs: int = 0
    """Runs this batch touched."""
    forwards: list[tuple[bytes, bytes, list, int | None]] = field(default_factory=list)
    """Under session scope: ``tool-calls`` records to repartition, as (session key, value,
    headers, the record's Kafka timestamp: the forwarded record keeps it)."""
    fleet: list[tuple[bytes, bytes]] = field(default_factory=list)
    """Records for the fleet topology (``<app id>-fleet``: sends of traces), as (key, value)."""
    fleet_outcomes: list[tuple[bytes, bytes]] = field(default_factory=list)
    """Failing outcomes for the fleet topology's per-agent limit (``<app id>-fleet-agents``,
    keyed ``agent:<digest>``), as (key, value)."""
    fleet_kinds: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """How many of them are failing outcomes (``outcome``) and sends (``send``)."""
    incident_decisions: int = 0
    """Decisions that carried an open fleet incident."""
