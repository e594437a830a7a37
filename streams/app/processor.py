"""The batch processor: batches of ``tool-calls`` records in, verdicts out, run states
checkpointed.

This is the worker's whole per-record logic and it does no I/O (the Faust layer in
``streams.app.app`` feeds it and ships its output), so it is unit-tested without Kafka.

One batch (``process``):

1. decode every record (``schemas.decode_event``), after checking its signature when the
   worker has a keyring (``schemas.signing``); a record that fails becomes a dead letter
   carrying its reason and detail;
2. group the valid events by ``(partition, state_key)``, in offset order: per-run order is
   the partition's order, and the engine runs over each run's events one after another;
3. run the engine on each touched run's state, kept in memory (``_Live``) from the first
   touch until the next checkpoint;
4. collect verdicts (every decision of a ``gate`` call, every warn/block, every abort),
   engine log lines and metric counts.  Verdicts are published at once.

A checkpoint (``checkpoint``) encodes every run touched since the previous one exactly once
and hands the table writes (or deletions, for ended runs) to the Faust layer, which first
waits for the delivery of every verdict produced since the previous checkpoint, then writes
the states, then acks the records.  A run's state is thus written once per checkpoint, not
once per event or per batch: the state codec (``encode_state``) is the engine's most
expensive call, and with small batches at moderate load it would otherwise run per event.

Table values are an envelope around ``streams.engine.encode_state``::

    byte 0       format version (3)
    bytes 1-8    offset of the last source record applied to this state (big endian)
    bytes 9-16   wall-clock ms when this worker last wrote the run (idle expiry)
    bytes 17-18  n: how many event-id digests follow
    bytes 19-20  m: the length of the owner's agent id
    bytes 21-    n x 8 bytes: digests of the run's last ``SEEN_EVENT_IDS`` applied event ids
    then         m bytes: the agent id (UTF-8) of the run's first applied event (its owner)
    then         encode_state(RunState)

(Still read: version 2, the same without bytes 19-20 and the owner; version 1, with the
run's last event time at bytes 17-24 and no digests.)

The source offset makes re-delivery idempotent.  Kafka delivery is at least once: after a
crash the records since the last committed offset are processed again, while the table
(recovered from its changelog) may already hold their effect.  An event whose offset is not
newer than the state's stamp is skipped instead of being applied twice (applying it twice
would change counts, and so verdicts).  Because states are only written after the verdicts of
every event they contain were delivered, a skipped event's verdict has always been
published; verdict ids derive from event ids, so any re-published duplicate is dropped by
consumers.

The event-id digests catch the other kind of duplicate: a runner that publishes an event
again after a failed send (the README tells runners to reuse the ``event_id`` on retries), so
the same event arrives at two offsets.  An event whose id is among its run's last
``SEEN_EVENT_IDS`` applied ids is skipped and counted, never applied twice.  The digests are
stored with the run's state (and so survive restarts and rebalances) and freed with it.

The owner is the agent that a run belongs to: the agent id of its first applied event.  With
signed events (a keyring), an event of another agent for the run is dead-lettered
``bad_signature``: a runner holding agent A's key cannot write history into a run of agent
B's by naming its run id.  Without a keyring agent ids are unverified, so nothing is checked
(the owner is still recorded, so that turning signing on protects the runs already open).

Records are checked before they reach the engine: the Kafka key must be one of the forms
``kafka_key_problem`` accepts (all of a run's events must land on one partition), and an
event time further ahead of the worker's clock than ``clock_skew_ms`` is clamped to the
worker's clock (``loopwatch_event_time_clamped_total``).  Idle expiry never reads event
times: a runner's clock cannot keep a run alive.

A stored state is at most ``MAX_STATE_BYTES``: the changelog topic takes records up to
``CHANGELOG_MAX_MESSAGE_BYTES`` (streams.app.app), and a state the changelog refuses would be
lost on the next restore.  ``historySize`` is bounded in the config (``schemas.config``), so
only runs with very long ids and names reach the limit; their oldest history is dropped
until the state fits, with an error line and ``loopwatch_state_trimmed_total``.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import msgspec

from schemas.events import (
    CompactionRetried,
    InvalidEvent,
    RunEnded,
    ToolCallCompleted,
    ToolCallRequested,
    decode_event,
)
from schemas.signing import BAD_SIGNATURE, Keyring
from schemas.verdicts import Decision, RunAborted, encode_verdict
from schemas.keys import record_key
from streams.engine import LoopEngine, RunState, copy_state, decode_state, encode_state, state_key
from streams.engine.history import trim as trim_history

from . import logs

__all__ = [
    "BatchResult",
    "BatchProcessor",
    "DeadLetter",
    "Envelope",
    "Record",
    "VerdictOut",
    "kafka_key_problem",
    "pack_state",
    "unpack_state",
]

log = logging.getLogger("loopwatch.worker")

ENVELOPE_VERSION = 3
_HEADER = struct.Struct(">BqqHH")
HEADER_SIZE = _HEADER.size
_HEADER_V2 = struct.Struct(">BqqH")
_HEADER_V1 = struct.Struct(">Bqqq")
DIGEST_SIZE = 8
SEEN_EVENT_IDS = 64
"""Per run, the ids of this many most recently applied events are remembered (as 8-byte
digests, 512 bytes a run) to skip an event published again.  A retry follows its original
within a few events of the same run; a run's events are sequential (each call waits for its
tool), so 64 covers any retry a runner makes while the run goes on."""
_SEEN_BYTES = SEEN_EVENT_IDS * DIGEST_SIZE
MAX_STATE_BYTES = 1_000_000
"""Upper bound of a stored envelope (see the module docstring): under the broker's default
``message.max.bytes`` (1,048,588), with room for the key and the record batch around it,
so that a changelog created before ``CHANGELOG_MAX_MESSAGE_BYTES`` was set takes it too."""

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

    def to_record(self, value_limit: int) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
        """``(key, value, headers)`` for the dead-letter topic.

        A key or value larger than ``value_limit`` bytes is cut to its first
        ``value_limit`` bytes (``tool-calls`` may accept records larger than the dead-letter
        topic does, and a dead letter that cannot be delivered would stop the worker);
        ``loopwatch.truncated`` then names what was cut and ``loopwatch.source.{key,value}_bytes``
        give the original sizes.
        """
        record = self.record
        key, value = record.key, record.value
        headers = [
            ("loopwatch.reason", self.reason.encode()),
            ("loopwatch.detail", self.detail.encode("utf-8", "replace")),
            ("loopwatch.source.topic", record.topic.encode()),
            ("loopwatch.source.partition", str(record.partition).encode()),
            ("loopwatch.source.offset", str(record.offset).encode()),
        ]
        if record.timestamp:
            headers.append(("loopwatch.source.timestamp_ms", str(int(record.timestamp)).encode()))
        cut = []
        if key is not None and len(key) > value_limit:
            headers.append(("loopwatch.source.key_bytes", str(len(key)).encode()))
            key = key[:value_limit]
            cut.append("key")
        if value is not None and len(value) > value_limit:
            headers.append(("loopwatch.source.value_bytes", str(len(value)).encode()))
            value = value[:value_limit]
            cut.append("value")
        if cut:
            headers.append(("loopwatch.truncated", ",".join(cut).encode()))
        if not key and not value:
            value = b""  # Kafka needs a key or a value
        return key, value, headers


@dataclass(slots=True)
class Envelope:
    offset: int
    touched_ms: int
    seen: bytes
    """Digests of the run's last applied event ids, oldest first (``event_digest``)."""
    state: RunState | None
    owner: str | None = None
    """The agent id of the run's first applied event."""


@dataclass
class BatchResult:
    verdicts: list[VerdictOut] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    skipped: int = 0
    """Events not applied again because their run's state already holds them (re-delivery)."""
    duplicates: int = 0
    """Events not applied because their run already applied an event with the same id."""
    clamped: int = 0
    """Events whose time was too far ahead of the worker's clock and was clamped to it."""
    events: int = 0
    """Valid events applied."""
    runs: int = 0
    """Runs this batch touched."""


@dataclass
class Checkpoint:
    writes: dict[tuple[int, bytes], bytes | None] = field(default_factory=dict)
    """``(partition, key) -> envelope`` to store, or None to delete; one entry per run touched
    since the previous checkpoint."""
    created: int = 0
    """Runs that had no stored state before and have one now."""
    deleted: int = 0
    """Runs that had a stored state before and have none now."""


class _Live:
    """A run touched since the last checkpoint: the authoritative copy until it is written."""

    __slots__ = ("base", "state", "offset", "applied", "seen", "owner")

    def __init__(
        self, base: bytes | RunState | None, state: RunState | None, offset: int, seen: bytes = b"",
        owner: str | None = None,
    ) -> None:
        self.base = base
        """What is stored for the run at the first touch: its envelope, or the state that the
        checkpoint being taken will store (None: nothing stored)."""
        self.state = state
        self.offset = offset
        """Offset of the last source record applied (-1: none)."""
        self.applied: list[Any] = []
        """Events applied since the checkpoint, in order (to rebuild after an engine error)."""
        self.seen = bytearray(seen)
        """Digests of the last ``SEEN_EVENT_IDS`` applied event ids, oldest first."""
        self.owner = owner
        """The agent id of the run's first applied event (None: not known yet)."""


# -- the state envelope -----------------------------------------------------------------------


def pack_state(
    state: RunState, offset: int, touched_ms: int, seen: bytes | bytearray = b"", owner: str | None = None
) -> bytes:
    who = owner.encode("utf-8", "surrogatepass") if owner else b""
    return (
        _HEADER.pack(ENVELOPE_VERSION, offset, touched_ms, len(seen) // DIGEST_SIZE, len(who))
        + seen + who + encode_state(state)
    )


def _parse_header(value: bytes) -> tuple[int, int, int, int, int]:
    """``(offset, touched_ms, where the digests start, where the owner starts, where the
    state starts)``."""
    version = value[0] if value else None
    if version == ENVELOPE_VERSION:
        _version, offset, touched_ms, n, m = _HEADER.unpack_from(value)
        owner_at = HEADER_SIZE + n * DIGEST_SIZE
        return offset, touched_ms, HEADER_SIZE, owner_at, owner_at + m
    if version == 2:
        _version, offset, touched_ms, n = _HEADER_V2.unpack_from(value)
        state_at = _HEADER_V2.size + n * DIGEST_SIZE
        return offset, touched_ms, _HEADER_V2.size, state_at, state_at
    if version == 1:
        _version, offset, touched_ms, _last_event_ms = _HEADER_V1.unpack_from(value)
        return offset, touched_ms, _HEADER_V1.size, _HEADER_V1.size, _HEADER_V1.size
    raise ValueError(f"unknown state envelope version {version}")


def _owner(value: bytes, owner_at: int, state_at: int) -> str | None:
    return value[owner_at:state_at].decode("utf-8", "surrogatepass") if state_at > owner_at else None


def unpack_header(value: bytes) -> tuple[int, int]:
    """``(offset, touched_ms)`` of a stored envelope, without decoding the state."""
    offset, touched_ms, _seen_at, _owner_at, _state_at = _parse_header(value)
    return offset, touched_ms


def unpack_state(value: bytes) -> Envelope:
    """The whole envelope, state decoded."""
    offset, touched_ms, seen_at, owner_at, state_at = _parse_header(value)
    return Envelope(
        offset, touched_ms, bytes(value[seen_at:owner_at]), decode_state(value[state_at:]),
        _owner(value, owner_at, state_at),
    )


def idle_since_ms(value: bytes) -> int:
    """When this worker last wrote the run, by its own clock (a runner's clock never counts:
    a run stamped in the far future must still expire)."""
    return unpack_header(value)[1]


def event_digest(event_id: str) -> bytes:
    """The 8 bytes an event id is remembered by (a collision within one run's last 64 ids
    is a 1 in 2^58 chance)."""
    return hashlib.blake2b(event_id.encode("utf-8", "surrogatepass"), digest_size=DIGEST_SIZE).digest()


def _seen_before(seen: bytearray, digest: bytes) -> bool:
    at = seen.find(digest)
    while at >= 0:
        if at % DIGEST_SIZE == 0:
            return True
        at = seen.find(digest, at + 1)
    return False


def _remember(seen: bytearray, digest: bytes) -> None:
    seen += digest
    if len(seen) > _SEEN_BYTES:
        del seen[:DIGEST_SIZE]


def kafka_key_problem(key: bytes | None, event: Any, state_key_bytes: bytes) -> tuple[str, str] | None:
    """Why a record's Kafka key does not fit its event, as ``(reason, detail)``; None if it does.

    Kafka picks a record's partition from its key, and a run's state lives on one partition:
    a record keyed otherwise than its run's other events is processed against an empty
    state elsewhere, and its loop is never seen.  Accepted keys, as UTF-8 bytes
    (``schemas.keys``):

    * the runner's key, ``record_key``: the event's run id, or without one its state key
      (what the README tells runners, and what the clients of this repository send);
    * the key the README gave before ``record_key``: the event's ``run_id`` exactly as
      published, or without one its ``session_key``, else its ``session_id``;
    * the event's state key, ``state_key``: ``run:<run id>``, ``session:<session key>|`` or
      ``session:|<session id>`` (the form verdicts are keyed by).

    A missing or empty key is ``missing_key``; any other key is ``key_mismatch``.
    """
    if not key:
        return "missing_key", "the record has no Kafka key: key every event by its run id (schemas.keys.record_key)"
    if key == state_key_bytes:
        return None
    expected = record_key(event).encode("utf-8", "surrogatepass")
    if key == expected:
        return None
    legacy = event.run_id or event.session_key or event.session_id
    if legacy and key == legacy.encode("utf-8", "surrogatepass"):
        return None
    shown = key[:200].decode("utf-8", "replace")
    return "key_mismatch", (
        f"Kafka key {shown!r} is not the event's run key {expected.decode('utf-8', 'replace')!r}"
        f" nor its state key {state_key_bytes.decode('utf-8', 'replace')!r}"
    )


# -- the processor ----------------------------------------------------------------------------


class BatchProcessor:
    """Runs batches of records through the engine and keeps the touched runs' states until
    the next checkpoint.

    ``engine`` may be swapped at any time between batches (config hot reload); a batch
    always runs on one engine.  ``clock_skew_s``: event times further ahead of ``clock``
    are clamped to it (None: never).
    """

    def __init__(
        self,
        engine: LoopEngine,
        metrics: Any = None,
        *,
        clock: Callable[[], float] = time.time,
        cache_size: int = 4096,
        keyring: Keyring | None = None,
        clock_skew_s: float | None = 300.0,
    ) -> None:
        self.engine = engine
        self.keyring = keyring
        """With a keyring, only events signed by their agent's key are applied (schemas.signing);
        swapped like ``engine`` when the key files change."""
        self.metrics = metrics
        self.clock = clock
        self.cache_size = cache_size
        self.clock_skew_ms = None if clock_skew_s is None else int(clock_skew_s * 1000)
        self._dirty: dict[tuple[int, bytes], _Live] = {}
        self._frozen: dict[tuple[int, bytes], _Live] | None = None
        """Runs of the checkpoint being taken, not encoded yet."""
        self._out: Checkpoint | None = None
        self._written: dict[tuple[int, bytes], bytes | None] | None = None
        """The last checkpoint's writes until the store has them."""
        self._now_ms = 0
        self._cache: dict[tuple[int, bytes], tuple[int, int, RunState, bytes]] = {}
        """The state object this worker last wrote per run (insertion-ordered, LRU-ish):
        used only while the stored envelope still carries the same offset and time stamp,
        so a state changed elsewhere (another worker, a deletion) is never used."""
        self._loggers: dict[str, tuple[logging.Logger, Any]] = {}

    @property
    def dirty(self) -> int:
        """Runs touched since the last checkpoint (begun)."""
        return len(self._dirty)

    def is_dirty(self, partition: int, key: bytes) -> bool:
        """Touched since the last checkpoint, or part of one not written yet."""
        pk = (partition, key)
        return (
            pk in self._dirty
            or (self._frozen is not None and pk in self._frozen)
            or (self._out is not None and pk in self._out.writes)
            or (self._written is not None and pk in self._written)
        )

    def forget(self, partition: int, key: bytes) -> None:
        """Drop a clean cached state (its stored value was deleted or replaced elsewhere)."""
        self._cache.pop((partition, key), None)

    def process(self, records: Iterable[Record], read: Callable[[int, bytes], bytes | None]) -> BatchResult:
        """Process one batch.  ``read(partition, key)`` returns a run's stored envelope or None."""
        engine, keyring = self.engine, self.keyring
        self._loggers.clear()  # re-checks the logging set-up once per batch (logs.direct_writer)
        result = BatchResult()
        dead = result.dead_letters
        groups: dict[tuple[int, bytes], list[tuple[Record, Any]]] = {}
        now_ms = int(self.clock() * 1000)
        latest_ms = None if self.clock_skew_ms is None else now_ms + self.clock_skew_ms
        for record in records:
            value = record.value
            try:
                if value is None:
                    raise InvalidEvent("invalid_json", "the record has no value (null)")
                signer = keyring.verify(record.headers, value) if keyring is not None else None
                event = decode_event(value)
                if signer is not None:
                    signer.check_agent(event)
                key = state_key(event).encode("utf-8", "surrogatepass")
                problem = kafka_key_problem(record.key, event, key)
                if problem is not None:
                    raise InvalidEvent(*problem)
            except InvalidEvent as exc:
                dead.append(DeadLetter(record, exc.reason, _cut(exc.detail)))
                continue
            except Exception as exc:  # noqa: BLE001 - a bad record must never stop the worker
                dead.append(DeadLetter(record, "processing_error", _cut(f"decode: {exc!r}")))
                self._count_error("decode")
                log.exception("unexpected error decoding %s[%d]@%d", record.topic, record.partition, record.offset)
                continue
            if latest_ms is not None and event.ts_ms > latest_ms:
                # A runner's clock far ahead (or a hostile ts_ms): the event counts as
                # happening now.  Past times are left alone (replays, backlogs, ts_ms 0).
                event = msgspec.structs.replace(event, ts_ms=now_ms)
                result.clamped += 1
            group = groups.get((record.partition, key))
            if group is None:
                groups[(record.partition, key)] = group = []
            group.append((record, event))

        counts = _Counts()
        for pk, items in groups.items():
            self._run_group(engine, pk, items, read, result, counts)
        result.runs = len(groups)
        self._account(result, counts)
        return result

    def checkpoint(self) -> Checkpoint:
        """Encode every run touched since the last checkpoint, once, in one go (see
        ``begin_checkpoint`` for the incremental form the worker uses)."""
        self.begin_checkpoint()
        self.encode_some(None)
        out = self.end_checkpoint()
        self.checkpoint_written()
        return out

    def begin_checkpoint(self) -> None:
        """Freeze the runs touched so far as the next checkpoint's content.

        Batches may go on while it is encoded (``encode_some`` in slices): a frozen run that a
        batch touches is copied first (``copy_state``), before the batch changes it, so the
        checkpoint holds exactly the effects of the batches processed before
        ``begin_checkpoint``.
        """
        if self._frozen is not None or self._written is not None:
            raise RuntimeError("a checkpoint is already being taken")
        self._frozen = self._dirty
        self._dirty = {}
        self._out = Checkpoint()
        self._now_ms = int(self.clock() * 1000)

    def encode_some(self, n: int | None = 256) -> bool:
        """Encode up to ``n`` frozen runs (None: all).  True when none is left."""
        frozen = self._frozen
        if frozen is None:
            return True
        while frozen and (n is None or n > 0):
            pk, live = frozen.popitem()
            self._emit(pk, live)
            if n is not None:
                n -= 1
        return not frozen

    def end_checkpoint(self) -> Checkpoint:
        """The checkpoint's writes; until ``checkpoint_written`` they also serve reads."""
        self.encode_some(None)
        out = self._out
        self._written = out.writes
        self._frozen = None
        self._out = None
        return out

    def checkpoint_written(self) -> None:
        """The checkpoint's writes are in the store: reads go to the store again."""
        self._written = None

    def _emit(self, pk: tuple[int, bytes], live: _Live) -> bytes | None:
        out = self._out
        value = None if live.state is None else self._pack(pk, live)
        if value is None:
            if live.base is not None:
                out.writes[pk] = None
                out.deleted += 1
            else:
                out.writes.pop(pk, None)
            return None
        out.writes[pk] = value
        if live.base is None:
            out.created += 1
        cache = self._cache
        cache[pk] = (live.offset, self._now_ms, live.state, bytes(live.seen), live.owner)
        if len(cache) > self.cache_size:
            del cache[next(iter(cache))]
        return value

    def _pack(self, pk: tuple[int, bytes], live: _Live) -> bytes | None:
        """The run's envelope, at most ``MAX_STATE_BYTES``; None when it cannot be stored
        (the run is then dropped: a state the checkpoint cannot write would stop the worker
        at every restart)."""
        state = live.state
        try:
            value = pack_state(state, live.offset, self._now_ms, live.seen, live.owner)
            if len(value) <= MAX_STATE_BYTES:
                return value
            size, records = len(value), len(state)
            kept = records
            while len(value) > MAX_STATE_BYTES and kept > 0:
                kept //= 2
                trim_history(state, kept)
                value = pack_state(state, live.offset, self._now_ms, live.seen, live.owner)
            if len(value) > MAX_STATE_BYTES:
                state.warning_buckets.clear()
                value = pack_state(state, live.offset, self._now_ms, live.seen, live.owner)
            if len(value) > MAX_STATE_BYTES:
                raise ValueError(f"{len(value)} bytes even without history and warning buckets")
        except Exception as exc:  # noqa: BLE001 - one bad state must not stop the worker
            log.error("cannot store the state of %r on partition %d (%r): the run starts afresh at its next event",
                      pk[1], pk[0], exc)
            self._count_error("state_encode")
            self._cache.pop(pk, None)
            return None
        log.error("state of %r on partition %d was %d bytes, over the %d-byte limit: kept its newest %d of %d "
                  "history records", pk[1], pk[0], size, MAX_STATE_BYTES, len(state), records)
        if self.metrics is not None:
            self.metrics.states_trimmed.inc()
        return value

    # -- one run's events ---------------------------------------------------------------------

    def _load(self, pk: tuple[int, bytes], read: Callable[[int, bytes], bytes | None]) -> _Live:
        """A run's state at its first touch since the last checkpoint."""
        frozen = self._frozen
        if frozen is not None:
            live = frozen.get(pk)
            if live is not None:
                # Part of the checkpoint being taken.  The checkpoint keeps a copy of the state
                # as it is and encodes it in its own time; encoding it here, before this batch
                # changes the state, put most of a checkpoint's encoding (~0.1-0.3 ms a run on
                # a busy 2-core machine) into the decisions made while it ran.
                self._cache.pop(pk, None)
                if live.state is None:
                    del frozen[pk]
                    self._emit(pk, live)  # a deletion: nothing to encode
                    return _Live(None, None, live.offset)
                snapshot = copy_state(live.state)
                frozen[pk] = _Live(live.base, snapshot, live.offset, live.seen, live.owner)
                return _Live(snapshot, live.state, live.offset, live.seen, live.owner)
        partition, key = pk
        written = self._written if self._written is not None else (self._out.writes if self._out is not None else None)
        if written is not None and pk in written:
            stored = written[pk]  # encoded by the checkpoint in progress, not in the store yet
        else:
            stored = read(partition, key)
        cached = self._cache.pop(pk, None)  # becomes the live object (mutated in place)
        if stored is None:
            return _Live(None, None, -1)
        try:
            offset, touched_ms, seen_at, owner_at, state_at = _parse_header(stored)
        except Exception as exc:  # noqa: BLE001
            log.error("unreadable state for %r on partition %d (%r): starting the run afresh", key, partition, exc)
            self._count_error("state_decode")
            return _Live(None, None, -1)
        if cached is not None and cached[0] == offset and cached[1] == touched_ms:
            return _Live(stored, cached[2], offset, cached[3], cached[4])  # the object this worker wrote: no decode
        state = self._decode(stored, pk)
        if state is None:
            return _Live(None, None, -1)
        return _Live(stored, state, offset, stored[seen_at:owner_at], _owner(stored, owner_at, state_at))

    def _decode(self, stored: bytes, pk: tuple[int, bytes]) -> RunState | None:
        try:
            return decode_state(stored[_parse_header(stored)[4]:])
        except Exception as exc:  # noqa: BLE001
            log.error("undecodable state for %r on partition %d (%r): starting the run afresh", pk[1], pk[0], exc)
            self._count_error("state_decode")
            return None

    def _run_group(
        self,
        engine: LoopEngine,
        pk: tuple[int, bytes],
        items: list[tuple[Any, Any]],
        read: Callable[[int, bytes], bytes | None],
        result: BatchResult,
        counts: "_Counts",
    ) -> None:
        live = self._dirty.get(pk)
        if live is None:
            live = self._load(pk, read)
            self._dirty[pk] = live
        fresh = [item for item in items if item[0].offset > live.offset]
        if len(fresh) < len(items):
            # Already in the stored state (a redelivery).  The run stays dirty even when
            # nothing is new: the checkpoint re-writes it, so the changelog holds it even if
            # a crash lost its first changelog send (local store ahead of the changelog).
            result.skipped += len(items) - len(fresh)
            if not fresh:
                return
        state = live.state
        seen = live.seen
        failed: set[int] = set()
        outputs: list[tuple[Any, Any, Any]] = []
        i = 0
        while i < len(fresh):
            record, event = fresh[i]
            digest = event_digest(event.event_id)
            if _seen_before(seen, digest):
                failed.add(i)  # not applied: not part of a rebuild either
                result.duplicates += 1
                i += 1
                continue
            owner = live.owner
            if owner is not None and event.agent_id != owner and self.keyring is not None:
                failed.add(i)
                result.dead_letters.append(DeadLetter(record, BAD_SIGNATURE, _cut(
                    f"run {pk[1].decode('utf-8', 'replace')} belongs to agent {owner!r}; "
                    f"the event (signed by a key of agent {event.agent_id!r}) may not change it"
                )))
                i += 1
                continue
            try:
                step = engine.handle(state, event, validated=True)
            except Exception as exc:  # noqa: BLE001 - see below
                failed.add(i)
                reason = exc.reason if isinstance(exc, InvalidEvent) else "processing_error"
                detail = exc.detail if isinstance(exc, InvalidEvent) else f"engine: {exc!r}"
                result.dead_letters.append(DeadLetter(record, reason, _cut(detail)))
                if reason == "processing_error":
                    self._count_error("engine")
                    log.exception("engine failed on %s[%d]@%d", record.topic, record.partition, record.offset)
                # The engine may have changed the state in place before failing: rebuild it
                # from the stored state and every event applied since (their verdicts are out).
                state = self._rebuild(engine, live, [e for j, (_r, e) in enumerate(fresh[:i]) if j not in failed])
                i += 1
                continue
            state = step.state
            if state is None:
                seen.clear()  # the run ended: its ids and its owner go with its state
                live.owner = None
            else:
                _remember(seen, digest)
                if owner is None:
                    live.owner = event.agent_id
            outputs.append((record, event, step))
            i += 1
        for record, event, step in outputs:
            self._collect(pk[0], pk[1], record, event, step, result, counts)
        result.events += len(outputs)
        live.state = state
        live.offset = fresh[-1][0].offset
        live.applied.extend(event for _record, event, _step in outputs)

    def _rebuild(self, engine: LoopEngine, live: _Live, more: list[Any]) -> RunState | None:
        base = live.base
        if isinstance(base, RunState):
            state = copy_state(base)  # the checkpoint being taken encodes base meanwhile
        else:
            state = self._decode(base, (0, b"?")) if base is not None else None
        for event in live.applied + more:
            try:
                state = engine.handle(state, event, validated=True).state
            except Exception:  # noqa: BLE001 - failed the first time too: skip it again
                pass
        return state

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
            if decision.liveness_signal is not None:
                counts.liveness[(decision.liveness_signal, decision.detector)] += 1
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
        m.add(m.liveness_signals, counts.liveness)
        m.add(m.run_aborts, counts.aborts)
        if counts.armings:
            m.guard_armings.inc(counts.armings)
        if result.duplicates:
            m.duplicate_events.inc(result.duplicates)
        if result.clamped:
            m.event_time_clamped.inc(result.clamped)
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
    __slots__ = ("events", "decisions", "detections", "suppressed", "aborts", "armings", "liveness")

    def __init__(self) -> None:
        self.events: dict[str, int] = defaultdict(int)
        self.decisions: dict[tuple[str, str, str], int] = defaultdict(int)
        self.detections: dict[tuple[str, str, str], int] = defaultdict(int)
        self.suppressed: dict[str, int] = defaultdict(int)
        self.aborts: dict[str, int] = defaultdict(int)
        self.armings = 0
        self.liveness: dict[tuple[str, str], int] = defaultdict(int)


def _cut(text: str) -> str:
    return text if len(text) <= DETAIL_LIMIT else text[: DETAIL_LIMIT - 1] + "…"
