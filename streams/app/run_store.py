"""The run store: the only code that reads and writes the run table (RocksDB and its changelog),
and the envelope a run's state is stored in.

The table is Faust's ``runs`` table (``rocksdb://`` store, ``rocksdict`` driver), raw bytes
keys (state keys) and values (the envelope below), with a compacted changelog topic
``<app id>-runs-changelog``; Faust recovers it on start and on rebalance and keeps standby
copies on other workers.  Writes bypass ``table[key] = value``, which sends one changelog
record through Faust's producer buffer per call: here each run touched since the last
checkpoint is written once per checkpoint, straight to its partition's RocksDB with one
``WriteBatch``, and its changelog records go out as one Kafka record batch per partition
(``RunStore.write``).  Recovery, standbys and the persisted changelog offsets stay Faust's.

Table values are an envelope around ``streams.engine.encode_state``::

    byte 0       format version (3)
    bytes 1-8    offset of the last source record applied to this state (big endian)
    bytes 9-16   wall-clock ms when this worker last wrote the run (idle expiry)
    bytes 17-18  n: how many event-id digests follow
    bytes 19-20  m: the length of the owner's agent id
    bytes 21-    n x 8 bytes: digests of the run's last ``SEEN_EVENT_IDS`` applied event ids
    then         m bytes: the agent id (UTF-8) of the run's first applied event (its owner)
    then         encode_state(RunState)

With a candidate config loaded (``LOOPWATCH_CANDIDATE_CONFIG``) the envelope is version 4:
the same, with the candidate's state of the run in a section of its own before the digests::

    bytes 1-20   as version 3
    bytes 21-24  k: the length of the candidate section
    bytes 25-    k bytes: the candidate section, then the digests, the owner and the live
                 state as in version 3
    the section  byte 0: the comparison of the run's outcomes (``COMPARED_FROM_START``: the
                 candidate saw the run from its first event; bits 0-1: the rank of its
                 strongest outcome under the live config, bits 2-3: under the candidate,
                 ``streams.engine.drive.outcome``), then encode_state(the candidate's state),
                 or nothing when the candidate has none

One envelope per run keeps one checkpoint protocol for both configs: the two states are
written, recovered, expired and deduplicated together, at the same source offset.  Without a
candidate the worker writes version 3 and skips the section of a version 4 (the candidate's
state is dropped at the run's next write).

Under session scope (``loopwatch.scope: session``) a state fed by forwarded records
is version 5: it also holds, per ``tool-calls`` partition its forwarded records came from, the
offset of the last one applied (``Envelope.sources``)::

    bytes 1-20   as version 3
    bytes 21-24  k: the length of the candidate section (0: none)
    bytes 25-26  s: how many source stamps follow the candidate section
    bytes 27-    k bytes: the candidate section (as in version 4), then s x 12 bytes: a
                 ``tool-calls`` partition (4 bytes) and the offset (8 bytes, big endian) of
                 the last record of that partition forwarded to this state and applied;
                 then the digests, the owner and the live state as in version 3

A state without source stamps is still written as version 3 or 4 (so a worker of an earlier
release reads it): every state under run scope, and a session's state fed only by records its
runners keyed by session.  A version 3 or 4 state read under session scope starts with no
source stamps: its next forwarded records are compared with its offset stamp only when they
carry no source (forwarded by an earlier release, ``streams.app.processor``).

With signed events carrying ``seq`` (``schemas.events.Seq``), a state is version 6: version 5
with the highest ``seq`` applied per run of the state (``Envelope.seqs``; one run under run
scope, a session's runs under session scope)::

    bytes 1-26   as version 5 (k and s may be 0)
    bytes 27-28  q: how many sequence stamps follow the source stamps
    bytes 29-    the candidate section and the source stamps as in version 5, then q x 16
                 bytes: the first 8 bytes of BLAKE2b of the run id (``event_digest``; "" for
                 events without one) and the highest ``seq`` of that run applied (8 bytes, big
                 endian), least recently raised first; then the digests, the owner and the
                 live state as in version 3

A state without sequence stamps is still written as version 3, 4 or 5, so every state of
runners that send no ``seq``, or of a worker without signed events, is what an earlier release
reads; a version 3, 4 or 5 state read by this release starts with none (its runs' next events
are accepted and stamp it).  An ended run's marker keeps its sequence stamps (version 6), so a
replay of the ended run's events within the max age is refused too.

(Still read: version 2, the same as 3 without bytes 19-20 and the owner; version 1, with the
run's last event time at bytes 17-24 and no digests.)

**An ended run** (``run.ended``) is stored as its marker (``pack_ended``): the envelope's header
with its offset stamp (and, under session scope, its source stamps), no digests, no owner and
no state (version 3: 21 bytes; version 5: 27 + 12 per source).  A redelivery of the run's
events after a crash or a rebalance (the changelog can be ahead of the committed offsets: a
checkpoint's changelog records are accepted before its offsets are committed) is then skipped
by the stamp, as for a live run; deleting the state instead let a redelivery start the run
again from an empty history in mid-run, with verdicts under the same ids and other content.
A later event of the same run id starts a new run, as before.  The idle sweep
deletes markers like idle runs; ``loopwatch_runs_tracked`` does not count them.  (A worker of
an earlier release reads a marker as an undecodable state and starts the run afresh.)

* The source offset makes re-delivery idempotent: an event whose offset is not newer than
  its run's stamp is already in the state (``streams.app.processor``).  The source stamps of
  version 5 do the same for records forwarded by session, whatever the repartition topic's
  offsets: a record forwarded again (after a crash, or by a paused worker) carries the
  ``tool-calls`` partition and offset it was forwarded from, and is skipped when its
  session's stamp for that partition is not older.
* The event-id digests catch a runner's retry (the same event at two offsets): an event whose
  id is among its run's last ``SEEN_EVENT_IDS`` applied ids is skipped.  Stored with the
  state, they survive restarts and rebalances and are freed with it.
* The owner is the agent a run belongs to (the agent id of its first applied event); with
  signed events another agent's event for the run is dead-lettered.
* The write time decides idle expiry (``streams.app.expiry``): a runner's clock never does.

A stored envelope is at most ``MAX_STATE_BYTES``: the changelog topic takes records up to
``CHANGELOG_MAX_MESSAGE_BYTES``, and a state the changelog refuses would be lost on the next
restore.  ``historySize`` is bounded in the config (``schemas.config``), so only runs with very
long ids and names reach the limit; ``pack_within_limit`` then drops their oldest history.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import struct
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from streams.engine import RunState, decode_state, encode_state
from streams.engine.history import trim as trim_history
from streams.engine.intake import DIGEST_SIZE

from .output import send_records

__all__ = [
    "state_disk_full",
    "CHANGELOG_MAX_MESSAGE_BYTES",
    "COMPARED_FROM_START",
    "Envelope",
    "MAX_STATE_BYTES",
    "RunStore",
    "SOURCE",
    "candidate_section",
    "compare",
    "compared_outcomes",
    "idle_since_ms",
    "is_ended",
    "pack_ended",
    "pack_state",
    "pack_within_limit",
    "seq_stamps",
    "source_stamps",
    "unpack_header",
    "unpack_state",
]

log = logging.getLogger("loopwatch.worker")

TABLE_NAME = "runs"
CHANGELOG_MAX_MESSAGE_BYTES = 2 * 1024 * 1024
"""``max.message.bytes`` of the run table's changelog (set when Faust creates it): twice
what a stored state may take (``MAX_STATE_BYTES``, 1 MB)."""
MAX_STATE_BYTES = 1_000_000
"""Upper bound of a stored envelope: under the broker's default ``message.max.bytes``
(1,048,588), with room for the key and the record batch around it, so that a changelog
created before ``CHANGELOG_MAX_MESSAGE_BYTES`` was set takes it too."""

ENVELOPE_VERSION = 3
_HEADER = struct.Struct(">BqqHH")
HEADER_SIZE = _HEADER.size
CANDIDATE_ENVELOPE_VERSION = 4
_HEADER_V4 = struct.Struct(">BqqHHI")
SOURCES_ENVELOPE_VERSION = 5
_HEADER_V5 = struct.Struct(">BqqHHIH")
SEQS_ENVELOPE_VERSION = 6
_HEADER_V6 = struct.Struct(">BqqHHIHH")
SEQ = struct.Struct(">8sq")
"""A sequence stamp: a run id's digest and the highest ``seq`` of that run applied (16 bytes)."""
MAX_SEQS = 64
"""At most this many sequence stamps per state: a session's 64 most recently advanced runs (a
run state has one).  A run whose stamp was dropped has its replays judged by the id window and
the max age alone, as before sequence numbers."""
SOURCE = struct.Struct(">Iq")
"""A ``tool-calls`` partition and offset, as the envelope's source stamps hold them and as the
processor's ``FORWARDED_FROM_HEADER`` carries them (12 bytes, big endian)."""
MAX_SOURCES = 0xFFFF
"""At most this many source stamps per state (one per ``tool-calls`` partition)."""
COMPARED_FROM_START = 0x80
"""The candidate section's comparison byte: the candidate saw the run from its first event,
so the two outcomes compare (bits 0-1 live, 2-3 candidate)."""


def compare(compared: int, live: int, candidate: int) -> int:
    """A comparison byte that saw the run from its start, with one more step's outcome rank
    under each config (``streams.engine.outcome``): the strongest so far of each."""
    return COMPARED_FROM_START | max(compared & 3, live) | max(compared >> 2 & 3, candidate) << 2


def compared_outcomes(compared: int) -> tuple[int, int]:
    """The (live, candidate) outcome ranks in a comparison byte."""
    return compared & 3, compared >> 2 & 3


_HEADER_V2 = struct.Struct(">BqqH")
_HEADER_V1 = struct.Struct(">Bqqq")


# -- the envelope -------------------------------------------------------------------------------


@dataclass(slots=True)
class Envelope:
    offset: int
    touched_ms: int
    seen: bytes
    """Digests of the run's last applied event ids, oldest first (``event_digest``)."""
    state: RunState | None
    owner: str | None = None
    """The agent id of the run's first applied event."""
    candidate: RunState | None = None
    """The candidate config's state of the run (version 4)."""
    compared: int | None = None
    """The candidate section's comparison byte; None: no candidate section (version 3)."""
    sources: dict[int, int] | None = None
    """``tool-calls`` partition -> offset of the last record forwarded from it and applied
    (version 5, session scope); None: none."""
    seqs: dict[bytes, int] | None = None
    """Run id digest -> the highest ``seq`` of that run applied, least recently raised first
    (version 6); None: none."""


def pack_state(
    state: RunState | None,
    offset: int,
    touched_ms: int,
    seen: bytes | bytearray = b"",
    owner: str | None = None,
    candidate: RunState | None = None,
    compared: int | None = None,
    sources: dict[int, int] | None = None,
    seqs: dict[bytes, int] | None = None,
) -> bytes:
    """The envelope: version 3, or version 4 with a candidate section when ``compared`` is
    not None (``candidate``: the candidate's state, None when it has none), or version 5 when
    there are source stamps (``sources``, with or without a candidate section), or version 6
    when there are sequence stamps (``seqs``).  ``state`` None: an ended run's marker
    (``pack_ended``)."""
    who = owner.encode("utf-8", "surrogatepass") if owner else b""
    encoded = b"" if state is None else encode_state(state)
    if compared is None:
        section = b""
    else:
        section = bytes((compared,)) + (b"" if candidate is None else encode_state(candidate))
    if seqs:
        if len(seqs) > MAX_SEQS:
            raise ValueError(f"{len(seqs)} sequence stamps, over {MAX_SEQS}")
        stamps = b"".join(SOURCE.pack(partition, at) for partition, at in sorted((sources or {}).items()))
        return (
            _HEADER_V6.pack(
                SEQS_ENVELOPE_VERSION,
                offset,
                touched_ms,
                len(seen) // DIGEST_SIZE,
                len(who),
                len(section),
                len(sources or ()),
                len(seqs),
            )
            + section
            + stamps
            + b"".join(SEQ.pack(run, seq) for run, seq in seqs.items())
            + seen
            + who
            + encoded
        )
    if sources:
        if len(sources) > MAX_SOURCES:
            raise ValueError(f"{len(sources)} source stamps, over {MAX_SOURCES}")
        stamps = b"".join(SOURCE.pack(partition, at) for partition, at in sorted(sources.items()))
        return (
            _HEADER_V5.pack(
                SOURCES_ENVELOPE_VERSION,
                offset,
                touched_ms,
                len(seen) // DIGEST_SIZE,
                len(who),
                len(section),
                len(sources),
            )
            + section
            + stamps
            + seen
            + who
            + encoded
        )
    if compared is None:
        return (
            _HEADER.pack(ENVELOPE_VERSION, offset, touched_ms, len(seen) // DIGEST_SIZE, len(who))
            + seen
            + who
            + encoded
        )
    return (
        _HEADER_V4.pack(
            CANDIDATE_ENVELOPE_VERSION, offset, touched_ms, len(seen) // DIGEST_SIZE, len(who), len(section)
        )
        + section
        + seen
        + who
        + encoded
    )


def pack_ended(
    offset: int, touched_ms: int, sources: dict[int, int] | None = None, seqs: dict[bytes, int] | None = None
) -> bytes:
    """An ended run's marker (module docstring): its offset stamp, its source stamps under
    session scope and its sequence stamps; no state."""
    if sources or seqs:
        return pack_state(None, offset, touched_ms, sources=sources, seqs=seqs)
    return _HEADER.pack(ENVELOPE_VERSION, offset, touched_ms, 0, 0)


def is_ended(value: bytes) -> bool:
    """Whether a stored envelope is an ended run's marker (``pack_ended``)."""
    return parse_header(value)[4] == len(value)


def pack_within_limit(
    state: RunState,
    offset: int,
    touched_ms: int,
    seen: bytes | bytearray,
    owner: str | None,
    candidate: RunState | None = None,
    compared: int | None = None,
    sources: dict[int, int] | None = None,
    seqs: dict[bytes, int] | None = None,
) -> tuple[bytes, tuple[int, int] | None]:
    """``(envelope, None)``, or when the envelope is over ``MAX_STATE_BYTES``: the run's newest
    history that fits (its oldest records dropped from ``state`` and ``candidate``, in place;
    then their warning buckets) as ``(envelope, (the envelope's former size, the history's
    former length))``.  Raises when even empty histories do not fit, or a state cannot be
    encoded at all."""
    states = (state,) if candidate is None else (state, candidate)

    def pack() -> bytes:
        return pack_state(state, offset, touched_ms, seen, owner, candidate, compared, sources, seqs)

    value = pack()
    if len(value) <= MAX_STATE_BYTES:
        return value, None
    size = len(value)
    records = kept = max(len(s) for s in states)
    while len(value) > MAX_STATE_BYTES and kept > 0:
        kept //= 2
        for s in states:
            trim_history(s, kept)
        value = pack()
    if len(value) > MAX_STATE_BYTES:
        for s in states:
            s.warning_buckets.clear()
        value = pack()
    if len(value) > MAX_STATE_BYTES:
        raise ValueError(f"{len(value)} bytes even without history and warning buckets")
    return value, (size, records)


def parse_header(value: bytes) -> tuple[int, int, int, int, int]:
    """``(offset, touched_ms, where the digests start, where the owner starts, where the
    state starts)``."""
    version = value[0] if value else None
    if version == ENVELOPE_VERSION:
        _version, offset, touched_ms, n, m = _HEADER.unpack_from(value)
        owner_at = HEADER_SIZE + n * DIGEST_SIZE
        return offset, touched_ms, HEADER_SIZE, owner_at, owner_at + m
    if version == CANDIDATE_ENVELOPE_VERSION:
        _version, offset, touched_ms, n, m, k = _HEADER_V4.unpack_from(value)
        seen_at = _HEADER_V4.size + k
        owner_at = seen_at + n * DIGEST_SIZE
        return offset, touched_ms, seen_at, owner_at, owner_at + m
    if version == SOURCES_ENVELOPE_VERSION:
        _version, offset, touched_ms, n, m, k, s = _HEADER_V5.unpack_from(value)
        seen_at = _HEADER_V5.size + k + s * SOURCE.size
        owner_at = seen_at + n * DIGEST_SIZE
        return offset, touched_ms, seen_at, owner_at, owner_at + m
    if version == SEQS_ENVELOPE_VERSION:
        _version, offset, touched_ms, n, m, k, s, q = _HEADER_V6.unpack_from(value)
        seen_at = _HEADER_V6.size + k + s * SOURCE.size + q * SEQ.size
        owner_at = seen_at + n * DIGEST_SIZE
        return offset, touched_ms, seen_at, owner_at, owner_at + m
    if version == 2:
        _version, offset, touched_ms, n = _HEADER_V2.unpack_from(value)
        state_at = _HEADER_V2.size + n * DIGEST_SIZE
        return offset, touched_ms, _HEADER_V2.size, state_at, state_at
    if version == 1:
        _version, offset, touched_ms, _last_event_ms = _HEADER_V1.unpack_from(value)
        return offset, touched_ms, _HEADER_V1.size, _HEADER_V1.size, _HEADER_V1.size
    raise ValueError(f"unknown state envelope version {version}")


def candidate_section(value: bytes) -> tuple[int, bytes] | None:
    """A version 4 (5 or 6) envelope's candidate section as ``(comparison byte, the candidate's
    encoded state or b"")``; None for an envelope without one."""
    version = value[0] if value else None
    if version == CANDIDATE_ENVELOPE_VERSION:
        at = _HEADER_V4.size
        k = _HEADER_V4.unpack_from(value)[5]
        if k < 1:
            raise ValueError("a version 4 envelope with an empty candidate section")
    elif version == SOURCES_ENVELOPE_VERSION or version == SEQS_ENVELOPE_VERSION:
        at = _HEADER_V5.size if version == SOURCES_ENVELOPE_VERSION else _HEADER_V6.size
        k = _HEADER_V5.unpack_from(value)[5]
        if k < 1:
            return None
    else:
        return None
    return value[at], value[at + 1 : at + k]


def source_stamps(value: bytes) -> dict[int, int] | None:
    """A version 5 (or 6) envelope's source stamps (``Envelope.sources``); None for any other,
    or none."""
    if not value or (value[0] != SOURCES_ENVELOPE_VERSION and value[0] != SEQS_ENVELOPE_VERSION):
        return None
    fields = _HEADER_V5.unpack_from(value)
    if not fields[6]:
        return None
    at = (_HEADER_V5.size if value[0] == SOURCES_ENVELOPE_VERSION else _HEADER_V6.size) + fields[5]
    return {partition: offset for partition, offset in SOURCE.iter_unpack(value[at : at + fields[6] * SOURCE.size])}


def seq_stamps(value: bytes) -> dict[bytes, int] | None:
    """A version 6 envelope's sequence stamps (``Envelope.seqs``), in their stored order; None
    for any other version (an earlier envelope migrates to none)."""
    if not value or value[0] != SEQS_ENVELOPE_VERSION:
        return None
    fields = _HEADER_V6.unpack_from(value)
    at = _HEADER_V6.size + fields[5] + fields[6] * SOURCE.size
    return dict(SEQ.iter_unpack(value[at : at + fields[7] * SEQ.size]))


def owner_of(value: bytes, owner_at: int, state_at: int) -> str | None:
    return value[owner_at:state_at].decode("utf-8", "surrogatepass") if state_at > owner_at else None


def unpack_header(value: bytes) -> tuple[int, int]:
    """``(offset, touched_ms)`` of a stored envelope, without decoding the state."""
    offset, touched_ms, _seen_at, _owner_at, _state_at = parse_header(value)
    return offset, touched_ms


def unpack_state(value: bytes) -> Envelope:
    """The whole envelope, state decoded."""
    offset, touched_ms, seen_at, owner_at, state_at = parse_header(value)
    section = candidate_section(value)
    compared = candidate = None
    if section is not None:
        compared, encoded = section
        candidate = decode_state(encoded) if encoded else None
    return Envelope(
        offset,
        touched_ms,
        bytes(value[seen_at:owner_at]),
        decode_state(value[state_at:]) if state_at < len(value) else None,
        owner_of(value, owner_at, state_at),
        candidate,
        compared,
        source_stamps(value),
        seq_stamps(value),
    )


def idle_since_ms(value: bytes) -> int:
    """When this worker last wrote the run, by its own clock (a runner's clock never counts:
    a run stamped in the far future must still expire)."""
    return unpack_header(value)[1]


# -- the store ----------------------------------------------------------------------------------


NO_SPACE = os.strerror(errno.ENOSPC)
"""How RocksDB (through rocksdict, a plain ``Exception``) and the OS say the disk is full."""


def state_disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` (a failed write of the run table, or what it caused) is a full disk."""
    seen = 0
    while exc is not None and seen < 8:
        if (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or NO_SPACE in str(exc):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class RunStore:
    """Reads and writes of the run table.

    ``table``: the table's partitions (``streams.app.faust_adapter.TableAccess``); ``producer()``:
    the aiokafka producer its changelog records go out on.  ``runs_tracked`` is how many runs
    this worker holds: set by each idle sweep (``streams.app.expiry``), moved by each
    checkpoint in between.
    """

    def __init__(self, table: Any, producer: Callable[[], Any]) -> None:
        self.changelog_topic: str = table.changelog_topic
        self._table = table
        self._db = table.db
        self._producer = producer
        self.runs_tracked = 0

    def read(self, partition: int, key: bytes) -> bytes | None:
        """A run's stored envelope, or None."""
        return self._db(partition).get(key)

    async def write(
        self,
        writes: Iterable[tuple[tuple[int, bytes], bytes | None]],
        on_stored: Callable[[], None] | None = None,
        step_aside: Callable[[], Any] | None = None,
    ) -> list[asyncio.Future]:
        """Store envelopes (None: delete) in RocksDB, then queue their changelog records;
        returns the futures of their delivery.

        ``on_stored`` is called once every RocksDB write is done; ``step_aside()`` is awaited
        after each partition's RocksDB write and after each partition's changelog sends (a
        checkpoint lets batches in between; the sweep, which writes under the write lock,
        passes none).
        """
        import rocksdict

        by_partition: dict[int, list[tuple[bytes, bytes | None]]] = defaultdict(list)
        for (partition, key), value in writes:
            by_partition[partition].append((key, value))
        for partition, items in by_partition.items():
            wb = rocksdict.WriteBatch(raw_mode=True)
            for key, value in items:
                if value is None:
                    wb.delete(key)
                else:
                    wb.put(key, value)
            self._db(partition).write(wb)
            if step_aside is not None:
                await step_aside()  # until on_stored the checkpoint serves reads of these runs
        if on_stored is not None:
            on_stored()  # every RocksDB write is done: reads go to the store from now on
        changelog = self.changelog_topic
        sent = []
        for partition, items in by_partition.items():
            for future, n in await send_records(self._producer(), changelog, partition, items):
                future.add_done_callback(self._persisted_callback(partition, n))
                sent.append(future)
            if step_aside is not None:
                await step_aside()
        return sent

    def _persisted_callback(self, partition: int, n: int) -> Callable[[asyncio.Future], None]:
        def on_sent(future: asyncio.Future) -> None:
            if future.cancelled():
                return
            exc = future.exception()
            if exc is not None:
                # A checkpoint raises it (and stops the worker); a sweep's tombstones only
                # log it: the local store is then ahead of the changelog, and a restore
                # brings the expired runs back until the next sweep expires them again.
                log.error("%d changelog records for %s[%d] not written: %r", n, self.changelog_topic, partition, exc)
                return
            self._table.set_persisted_offset(partition, future.result().offset + n - 1)

        return on_sent

    # -- scans (the idle sweep) --------------------------------------------------------------------

    def open_partitions(self) -> list[int]:
        """Partitions whose database is open on this worker (active or standby)."""
        return self._table.open_partitions()

    def partition_db(self, partition: int) -> Any:
        """An open partition's database, as a handle: a rebalance that closes or reopens the
        partition gives another one (compare with ``is``); None when it is not open."""
        return self._table.open_db(partition)

    def items(self, db: Any) -> Iterator[tuple[bytes, bytes]]:
        """Every run of a partition's database: ``(state key, envelope)``."""
        offset_key = self._table.offset_key
        for key, value in db.items():
            if key != offset_key:
                yield key, value

    def count(self, created: int, deleted: int) -> None:
        """A checkpoint stored ``created`` runs that had no state and deleted ``deleted``."""
        self.runs_tracked = max(0, self.runs_tracked + created - deleted)
