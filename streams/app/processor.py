"""The batch processor: a batch of ``tool-calls`` records in, everything they cause out.

This is the worker's whole per-record logic and it does no I/O (the Faust layer in
``streams.app.app`` feeds it and ships its output), so it is unit-tested without Kafka.

One batch:

1. decode every record (``schemas.decode_event``); a record that fails becomes a dead letter
   carrying its reason and detail;
2. group the valid events by ``(partition, state_key)``, in offset order: per-run order is
   the partition's order, and the engine runs over each run's events one after another;
3. read each touched run's state once, run the engine, and write it back once (or delete it
   when the run ended): one table write per run per batch, not per event;
4. collect verdicts (every decision of a ``gate`` call, every warn/block, every abort),
   engine log lines and metric counts.

Table values are an envelope around ``streams.engine.encode_state``::

    byte 0       format version (1)
    bytes 1-8    offset of the last source record applied to this state (big endian)
    bytes 9-16   wall-clock ms when this worker last applied an event (idle expiry)
    bytes 17-24  the run's last_event_ms (event time, from the state)
    bytes 25-    encode_state(RunState)

The source offset makes re-delivery idempotent.  Kafka delivery is at least once: after a
crash the records since the last committed offset are processed again, while the table
(recovered from its changelog) may already hold their effect.  An event whose offset is not
newer than the state's stamp is skipped instead of being applied twice (applying it twice
would change counts, and so verdicts).  The Faust layer publishes a batch's verdicts, and
waits for them, before it writes the batch's states, so a skipped event's verdict has always
been delivered; verdict ids derive from event ids, so any re-published duplicate is dropped
by consumers.
"""

from __future__ import annotations

import logging
import struct
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from schemas.events import (
    CompactionRetried,
    InvalidEvent,
    RunEnded,
    ToolCallCompleted,
    ToolCallRequested,
    decode_event,
)
from schemas.verdicts import Decision, RunAborted, encode_verdict
from streams.engine import LoopEngine, RunState, decode_state, encode_state, state_key

from . import logs

__all__ = [
    "BatchResult",
    "BatchProcessor",
    "DeadLetter",
    "Envelope",
    "Record",
    "VerdictOut",
    "pack_state",
    "unpack_state",
]

log = logging.getLogger("loopwatch.worker")

ENVELOPE_VERSION = 1
_HEADER = struct.Struct(">Bqqq")
HEADER_SIZE = _HEADER.size

EVENT_TYPE_NAMES = {
    ToolCallRequested: "tool_call.requested",
    ToolCallCompleted: "tool_call.completed",
    CompactionRetried: "compaction.retried",
    RunEnded: "run.ended",
}
GUARD_SUBSYSTEM = "agents/post-compaction-guard"
_LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
               "warning": logging.WARNING, "error": logging.ERROR}
DETAIL_LIMIT = 2048
"""Dead-letter detail strings are cut to this many characters."""


# -- records in, results out --------------------------------------------------------------------


@dataclass(slots=True)
class Record:
    """One consumed record.  The Faust layer passes Faust's own messages, which have the
    same attributes; this class is for tests and other drivers."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: float | None = None
    """Kafka record timestamp, seconds (Faust's convention)."""


@dataclass(slots=True)
class VerdictOut:
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


@dataclass(slots=True)
class Envelope:
    offset: int
    touched_ms: int
    last_event_ms: int
    state: RunState | None


@dataclass
class BatchResult:
    verdicts: list[VerdictOut] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    writes: dict[tuple[int, bytes], bytes | None] = field(default_factory=dict)
    """``(partition, key) -> envelope`` to store, or None to delete; one entry per touched run."""
    skipped: int = 0
    """Events not applied again because their run's state already holds them (re-delivery)."""
    events: int = 0
    """Valid events applied."""
    created: int = 0
    """Runs that had no state before this batch and have one after it."""
    deleted: int = 0
    """Runs that had state before this batch and have none after it."""


# -- the state envelope -----------------------------------------------------------------------


def pack_state(state: RunState, offset: int, touched_ms: int) -> bytes:
    return _HEADER.pack(ENVELOPE_VERSION, offset, touched_ms, state.last_event_ms) + encode_state(state)


def unpack_header(value: bytes) -> tuple[int, int, int]:
    """``(offset, touched_ms, last_event_ms)`` of a stored envelope, without decoding the state."""
    version, offset, touched_ms, last_event_ms = _HEADER.unpack_from(value)
    if version != ENVELOPE_VERSION:
        raise ValueError(f"unknown state envelope version {version}")
    return offset, touched_ms, last_event_ms


def unpack_state(value: bytes) -> Envelope:
    """The whole envelope, state decoded."""
    offset, touched_ms, last_event_ms = unpack_header(value)
    return Envelope(offset, touched_ms, last_event_ms, decode_state(value[HEADER_SIZE:]))


def idle_since_ms(value: bytes) -> int:
    """When the run was last active: the later of processing time and event time."""
    _offset, touched_ms, last_event_ms = unpack_header(value)
    return max(touched_ms, last_event_ms)


# -- the processor ----------------------------------------------------------------------------


class BatchProcessor:
    """Runs batches of records through the engine.  Holds no run state of its own.

    ``engine`` may be swapped at any time between batches (config hot reload); a batch
    always runs on one engine.
    """

    def __init__(
        self,
        engine: LoopEngine,
        metrics: Any = None,
        *,
        clock: Callable[[], float] = time.time,
        cache_size: int = 4096,
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.clock = clock
        self.cache_size = cache_size
        self._cache: dict[tuple[int, bytes], tuple[int, int, RunState]] = {}
        """The last state object this worker stored per run (insertion-ordered, LRU-ish):
        valid only while the stored envelope still carries the same offset and time stamp,
        so a state changed elsewhere (another worker, a deletion) is never used."""
        self._loggers: dict[str, tuple[logging.Logger, Any]] = {}

    def process(self, records: Iterable[Record], read: Callable[[int, bytes], bytes | None]) -> BatchResult:
        """Process one batch.  ``read(partition, key)`` returns a run's stored envelope or None."""
        engine = self.engine
        self._loggers.clear()  # re-checks the logging set-up once per batch (logs.direct_writer)
        result = BatchResult()
        dead = result.dead_letters
        groups: dict[tuple[int, bytes], list[tuple[Record, Any]]] = {}
        for record in records:
            value = record.value
            try:
                if value is None:
                    raise InvalidEvent("invalid_json", "the record has no value (null)")
                event = decode_event(value)
                key = state_key(event).encode("utf-8", "surrogatepass")
            except InvalidEvent as exc:
                dead.append(DeadLetter(record, exc.reason, _cut(exc.detail)))
                continue
            except Exception as exc:  # noqa: BLE001 - a bad record must never stop the worker
                dead.append(DeadLetter(record, "processing_error", _cut(f"decode: {exc!r}")))
                self._count_error("decode")
                log.exception("unexpected error decoding %s[%d]@%d", record.topic, record.partition, record.offset)
                continue
            group = groups.get((record.partition, key))
            if group is None:
                groups[(record.partition, key)] = group = []
            group.append((record, event))

        counts = _Counts()
        now_ms = int(self.clock() * 1000)
        for (partition, key), items in groups.items():
            self._run_group(engine, partition, key, items, read, result, counts, now_ms)
        self._account(result, counts)
        return result

    # -- one run's events ---------------------------------------------------------------------

    def _run_group(
        self,
        engine: LoopEngine,
        partition: int,
        key: bytes,
        items: list[tuple[Any, Any]],
        read: Callable[[int, bytes], bytes | None],
        result: BatchResult,
        counts: "_Counts",
        now_ms: int,
    ) -> None:
        stored = read(partition, key)
        header = None
        if stored is not None:
            try:
                header = unpack_header(stored)
            except Exception as exc:  # noqa: BLE001
                log.error("unreadable state for %r on partition %d (%r): starting the run afresh", key, partition, exc)
                self._count_error("state_decode")
                stored = None
        stamp = header[0] if header is not None else -1
        fresh = [item for item in items if item[0].offset > stamp]
        if len(fresh) < len(items):
            result.skipped += len(items) - len(fresh)
            if not fresh:
                # Every event is already in the stored state: re-send the stored value so the
                # changelog holds it even if a crash lost the first send (local store ahead).
                result.writes[(partition, key)] = stored
                return
        cache_key = (partition, key)
        cached = self._cache.pop(cache_key, None)
        failed: set[int] = set()
        while True:
            state = None
            if cached is not None and header is not None and cached[0] == header[0] and cached[1] == header[1]:
                state = cached[2]  # the object this worker stored last: no decode needed
            elif stored is not None:
                try:
                    state = decode_state(stored[HEADER_SIZE:])
                except Exception as exc:  # noqa: BLE001
                    log.error("undecodable state for %r on partition %d (%r): starting the run afresh", key, partition, exc)
                    self._count_error("state_decode")
                    stored = header = None
            cached = None  # a retry starts from the stored bytes (the engine mutates in place)
            outputs: list[tuple[Any, Any, Any]] = []
            for i, (record, event) in enumerate(fresh):
                if i in failed:
                    continue
                try:
                    step = engine.handle(state, event, validated=True)
                except Exception as exc:  # noqa: BLE001 - see below
                    # The engine may have changed the state in place before failing: start the
                    # run's batch over from its stored state, without this event.
                    failed.add(i)
                    reason = exc.reason if isinstance(exc, InvalidEvent) else "processing_error"
                    detail = exc.detail if isinstance(exc, InvalidEvent) else f"engine: {exc!r}"
                    result.dead_letters.append(DeadLetter(record, reason, _cut(detail)))
                    if reason == "processing_error":
                        self._count_error("engine")
                        log.exception("engine failed on %s[%d]@%d", record.topic, record.partition, record.offset)
                    break
                state = step.state
                outputs.append((record, event, step))
            else:
                break  # every event went through
        for record, event, step in outputs:
            self._collect(partition, key, record, event, step, result, counts)
        result.events += len(outputs)
        last_offset = fresh[-1][0].offset
        if state is None:
            if stored is not None:
                result.writes[cache_key] = None
                result.deleted += 1
        else:
            result.writes[cache_key] = pack_state(state, last_offset, now_ms)
            if stored is None:
                result.created += 1
            cache = self._cache
            cache[cache_key] = (last_offset, now_ms, state)
            if len(cache) > self.cache_size:
                del cache[next(iter(cache))]

    def _collect(self, partition, key, record, event, step, result: BatchResult, counts: "_Counts") -> None:
        etype = type(event)
        counts.events[EVENT_TYPE_NAMES.get(etype, etype.__name__)] += 1
        for line in step.logs:
            self._log(line)
            if etype is CompactionRetried and line.subsystem == GUARD_SUBSYSTEM:
                counts.armings += 1
        decision = step.decision
        if decision is not None:
            action = decision.action
            detection = step.detection
            counts.decisions[(decision.detector or "none", decision.level or "none", action)] += 1
            if detection is not None:
                counts.detections[(detection.detector, detection.level, event.tool_name)] += 1
                if detection.level == "warning" and not decision.warning_emitted:
                    counts.suppressed[detection.detector] += 1
            if action != "allow" or event.gate:
                result.verdicts.append(VerdictOut(partition, key, encode_verdict(decision), decision))
        abort = step.abort
        if abort is not None:
            counts.aborts[abort.detector] += 1
            result.verdicts.append(VerdictOut(partition, key, encode_verdict(abort), abort))

    def _log(self, line) -> None:
        entry = self._loggers.get(line.subsystem)
        if entry is None:
            logger = logging.getLogger(f"loopwatch.{line.subsystem}")
            entry = self._loggers[line.subsystem] = (logger, logs.direct_writer(logger))
        logger, write = entry
        level = _LOG_LEVELS.get(line.level, logging.INFO)
        if logger.isEnabledFor(level):
            if write is not None:
                write(level, line.message)
            else:
                # makeRecord + handle: Logger.log without its per-record stack walk
                # (findCaller); levels, filters and handlers apply as usual.
                logger.handle(logger.makeRecord(logger.name, level, "(engine)", 0, line.message, None, None))

    # -- metrics --------------------------------------------------------------------------------

    def _count_error(self, stage: str) -> None:
        if self.metrics is not None:
            self.metrics.processing_errors.labels(stage).inc()

    def _account(self, result: BatchResult, counts: "_Counts") -> None:
        m = self.metrics
        if m is None:
            return
        m.add(m.events_consumed, counts.events)
        m.add(m.decisions, counts.decisions)
        if counts.detections:
            tools: dict[tuple[str, str, str], int] = defaultdict(int)
            for (detector, level, tool), n in counts.detections.items():
                tools[(detector, level, m.tool_label(tool))] += n
            m.add(m.loop_detections, tools)
        m.add(m.warnings_suppressed, counts.suppressed)
        m.add(m.run_aborts, counts.aborts)
        if counts.armings:
            m.guard_armings.inc(counts.armings)
        if result.dead_letters:
            reasons: dict[str, int] = defaultdict(int)
            for letter in result.dead_letters:
                reasons[letter.reason] += 1
            m.add(m.dead_letters, reasons)

    def observe_latency(self, verdicts: Iterable[VerdictOut], now: float | None = None) -> None:
        """Decision latency (event ``ts_ms`` -> now) of verdicts about to be produced."""
        m = self.metrics
        if m is None:
            return
        now_ms = (self.clock() if now is None else now) * 1000.0
        observe = m.decision_latency.observe
        for out in verdicts:
            verdict = out.verdict
            if verdict.ts_ms > 0 and isinstance(verdict, Decision):
                observe(max(0.0, now_ms - verdict.ts_ms) / 1000.0)


class _Counts:
    __slots__ = ("events", "decisions", "detections", "suppressed", "aborts", "armings")

    def __init__(self) -> None:
        self.events: dict[str, int] = defaultdict(int)
        self.decisions: dict[tuple[str, str, str], int] = defaultdict(int)
        self.detections: dict[tuple[str, str, str], int] = defaultdict(int)
        self.suppressed: dict[str, int] = defaultdict(int)
        self.aborts: dict[str, int] = defaultdict(int)
        self.armings = 0


def _cut(text: str) -> str:
    return text if len(text) <= DETAIL_LIMIT else text[: DETAIL_LIMIT - 1] + "…"
