"""The batch processor: batches of ``tool-calls`` records in, verdicts and dead letters out.

This is the worker's whole per-record logic and it does no I/O (the checkpointer in
``streams.app.checkpoint`` feeds it and ships its output), so it is unit-tested without Kafka.

One batch (``process``):

1. decode every record (``schemas.decode_event``), after checking its signature when the
   worker has a keyring (``schemas.signing``); a record that fails becomes a dead letter
   carrying its reason and detail;
2. group the valid events by ``(partition, state_key)``, in offset order: per-run order is
   the partition's order, and the engine runs over each run's events one after another;
3. run the engine on each touched run's state, kept in memory (``live_runs.LiveRuns``) from
   the first touch until the next checkpoint;
4. collect what each step publishes (the engine's rule, ``Step.published_decision``: the
   decision of a ``gate`` call, every warn and block; every abort), engine log lines and
   metric counts.

Shadow: the verdicts of an agent in shadow mode (``loopwatch.mode: shadow``) go to the shadow
topic (``BatchResult.shadow``), and its runner gets ``streams.engine.shadow_answer`` on
``loop-verdicts`` (an ``allow`` for a gated call).  A candidate config
(``use_candidate``) runs on every event the live config applied, on the run's candidate state
(``LiveRun.candidate``, stored with the live one); its verdicts go to the shadow topic
(``BatchResult.candidate``) and nothing of it reaches ``loop-verdicts`` or the dead letters.
When a run ends (``run.ended``) that the candidate saw from its first event, a difference in
the run's outcome (``streams.engine.outcome``) is counted
(``loopwatch_candidate_outcome_changes_total``).  Without shadow agents and without a
candidate, none of this runs.

Before the engine, an event is checked against its run's stored envelope
(``streams.app.run_store``): an event whose offset is not newer than the state's stamp is
already in it (a redelivery after a crash) and is skipped; one whose id is among the run's
last applied ids (a runner's retry) is skipped and counted; with signed events (a keyring),
an event of another agent than the run's owner is dead-lettered ``bad_signature``: a runner
holding agent A's key cannot write history into a run of agent B's by naming its run id.
Without a keyring agent ids are unverified, so nothing is checked (the owner is still
recorded, so that turning signing on protects the runs already open).

With a keyring, signed events are also checked for freshness (a replay past the id window):
one stamped (``ts_ms``, which the signature covers) more than ``signed_max_age_s`` before its
record's Kafka timestamp, or before the newest event its run applied (``RunState.last_event_ms``),
is dead-lettered ``stale_event``.  Both references are the record's and the stored state's,
never the worker's clock, so a backlog and a batch processed again after a crash are judged
as the first time.  A signed event that carries a ``seq`` (its publisher's number, strictly
increasing within its run, also signed) not above the highest its run applied
(``LiveRun.seqs``, stored with the state and kept in an ended run's marker) is dead-lettered
``replayed_event``: a replay within the max age, however many events after its original.  The
id window is checked first, so a runner's retry (the same event again) is still skipped as a
duplicate.  Events without ``seq``, and unsigned ones, are not compared.

Records are checked before they reach the engine: the Kafka key must be one of the forms
``streams.engine.intake.kafka_key_problem`` accepts (all of a run's events must land on one partition), and an
event time further ahead of the worker's clock than ``clock_skew_ms`` is clamped to the
worker's clock (``loopwatch_event_time_clamped_total``).  Idle expiry never reads event
times: a runner's clock cannot keep a run alive.

loopwatch's own options add, each only when on:

* ``loopwatch.scope: session``: a session's runs arrive on the partitions of their run ids
  (runners that key by run id), but the session's state lives on one partition.  So such a
  ``tool-calls`` record is first forwarded, unchanged (headers too), to the worker's
  repartition topic ``<app id>-sessions`` under its session's key
  (``schemas.keys.session_scope_key``; ``BatchResult.forwards``), and processed from there.
  A record its runner keyed by session already is on its session's partition: processed at
  once.  A forwarded record carries the ``tool-calls`` partition and offset it came from
  (``FORWARDED_FROM_HEADER``), and a session's state the offset of the last record applied
  per source partition: a record forwarded again after a crash is applied once
  (``_session_fresh``).  Verdicts stay keyed by the run (``state_key``), so
  runners route them as before.
* ``loopwatch.fleetIncidents``, ``loopwatch.agentRings``: a completed call that failed or made
  no progress, and a completed send of a trace, also become a record for the fleet topology
  (``streams.app.fleet``): an outcome goes first to the per-agent limit
  (``BatchResult.fleet_outcomes``, keyed by ``agent:<digest>``), a send straight to the fleet
  topology (``BatchResult.fleet``, keyed by ``trace:<id>``).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from hashlib import blake2b
from typing import Any

import msgspec

from schemas.events import (
    EVENT_TYPE_OF,
    MAX_EVENT_BYTES,
    UNSET,
    CompactionRetried,
    InvalidEvent,
    RunEnded,
    ToolCallCompleted,
    decode_event,
)
from schemas.fleet import FleetSend, encode_fleet_record
from schemas.keys import partition_for, session_scope_key
from schemas.names import (
    BAD_SIGNATURE,
    CANDIDATE,
    ENFORCE,
    LIVE,
    OUTCOMES,
    PROCESSING_ERROR,
    REPLAYED_EVENT,
    STALE_EVENT,
    WARNING,
)
from schemas.signing import Keyring
from schemas.verdicts import Decision, encode_verdict
from streams.engine import LoopEngine, RunState, copy_state, outcome, shadow_answer, state_key
from streams.engine.compaction_guard import SUBSYSTEM as GUARD_SUBSYSTEM
from streams.engine.extensions import FleetStep
from streams.engine.fleet import fleet_outcome, fleet_send
from streams.engine.intake import (
    DIGEST_SIZE,
    SEEN_BYTES,
    check_record,
    event_digest,
    forwarded_key_problem,
    kafka_key_problem,
    seen_before,
)

from . import logs
from .live_runs import LiveRun, LiveRuns
from .output import source_offset
from .records import BatchResult, DeadLetter, Record, VerdictOut
from .run_store import COMPARED_FROM_START, MAX_SEQS, SOURCE, compare, compared_outcomes

__all__ = ["BatchProcessor", "FORWARDED_FROM_HEADER", "forwarded_from"]

log = logging.getLogger("loopwatch.worker")

KEY_MEMO_SIZE = 100_000
"""The state keys and key checks of this many distinct (Kafka key, run) pairs are remembered
(the memo is emptied when it grows beyond)."""
DETAIL_LIMIT = 2048
"""Dead-letter detail strings are cut to this many characters."""
FORWARDED_OFFSETS = 1 << 61
"""Under session scope, records of the repartition topic are stamped on states as their offset
plus this: an offset space of their own (Kafka's offsets stay far below it).  Only records
forwarded without ``FORWARDED_FROM_HEADER`` (by an earlier release) are compared so."""
FORWARDED_FROM_HEADER = "loopwatch.forwarded_from"
"""The header a forwarded record carries last: the partition and offset of the ``tool-calls``
record it was forwarded from (``run_store.SOURCE``: 4 and 8 bytes, big endian).  A session's state keeps, per partition, the offset of the last
one it applied (``LiveRun.sources``): a record forwarded again is recognised whatever its offset
in the repartition topic."""


# -- the processor ----------------------------------------------------------------------------


class BatchProcessor:
    """Runs batches of records through the engine; the touched runs' states stay in memory
    (``runs``, a ``live_runs.LiveRuns``) until a checkpoint stores them.

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
        signed_max_age_s: float = 300.0,
    ) -> None:
        self.engine = engine
        self.candidate: LoopEngine | None = None
        """The candidate config's engine (``use_candidate``), swapped like ``engine``."""
        self.sha256: dict[str, str] = {LIVE: "defaults"}
        """Config (live, candidate) -> the SHA-256 tag of its file (``ConfigWatcher.sha256``):
        what its verdicts are tagged with on the shadow topic.  Replaced, never changed in
        place: a batch's result keeps the tags it ran on."""
        self.keyring = keyring
        """With a keyring, only events signed by their agent's key are applied (schemas.signing);
        swapped like ``engine`` when the key files change."""
        self.metrics = metrics
        self.clock = clock
        self.clock_skew_ms = None if clock_skew_s is None else int(clock_skew_s * 1000)
        self.signed_max_age_ms = int(signed_max_age_s * 1000)
        """With a keyring: how much older than its record's Kafka timestamp, or than its run's
        newest applied event, a signed event may be (``_check_record_age``, ``_run_group``)."""
        self.runs = LiveRuns(metrics, clock=clock, cache_size=cache_size)
        self._keys: dict[bytes | None, tuple[Any, ...]] = {}
        """``check_record``'s memo: ``Kafka key -> (run_id, session_key, session_id, state key, key problem)``."""
        self._keys_of: Callable[[Any], str] | None = None
        """The ``key_of`` the memo was filled with (emptied when a config changes the scope)."""
        self.sessions_topic: str | None = None
        """Under session scope, the repartition topic (``_forward``)."""
        self.partitions = 1
        """Partitions of ``tool-calls`` (and of the repartition topic): where a key belongs."""
        self._partitions_of: dict[bytes, int] = {}

    def use_config(self, engine: LoopEngine, sha256: str) -> None:
        """Run the live config ``engine`` (tagged ``sha256``) from the next batch on."""
        self.engine = engine
        self.sha256 = {**self.sha256, LIVE: sha256}

    def use_candidate(self, engine: LoopEngine | None, sha256: str = "defaults") -> None:
        """Run a candidate config beside the live one from the next batch on (None: none).
        Whether the worker has one is fixed at its start: the run store keeps the candidate's
        states only while it does (``LiveRuns.with_candidate``)."""
        self.candidate = engine
        self.runs.with_candidate = engine is not None
        self.sha256 = {**self.sha256, CANDIDATE: sha256}

    def process(self, records: Iterable[Record], read: Callable[[int, bytes], bytes | None]) -> BatchResult:
        """Process one batch.  ``read(partition, key)`` returns a run's stored envelope or None."""
        engine, keyring = self.engine, self.keyring
        result = BatchResult(sha256=self.sha256)
        dead = result.dead_letters
        groups: dict[tuple[int, bytes], list[tuple[Record, Any, Any]]] = {}
        keys = self._keys
        if len(keys) > KEY_MEMO_SIZE:
            keys.clear()
        now_ms = int(self.clock() * 1000)
        latest_ms = None if self.clock_skew_ms is None else now_ms + self.clock_skew_ms
        key_of = engine.key_of
        if key_of is not self._keys_of:
            keys.clear()
            self._keys_of = key_of
        session = key_of is session_scope_key
        key_problem = forwarded_key_problem if session else kafka_key_problem
        if session:
            records = self._forward(records, result)
        for record in records:
            try:
                # (Positional: keyword arguments cost a fifth more per call, on every record.)
                event, key = check_record(record, keyring, True, key_of, key_problem, keys)
                if keyring is not None:
                    self._check_record_age(record, event)
            except InvalidEvent as exc:
                dead.append(DeadLetter(record, exc.reason, _cut(exc.detail)))
                continue
            except Exception as exc:  # noqa: BLE001 - a bad record must never stop the worker
                dead.append(DeadLetter(record, PROCESSING_ERROR, _cut(f"decode: {exc!r}")))
                self._count_error("decode")
                log.exception(
                    "unexpected error decoding %s[%d]@%d", record.topic, record.partition, source_offset(record)
                )
                continue
            # Kept to rebuild the run after an engine error: the record's value (the decoded
            # event is a third larger, and a busy worker holds seconds of events), or the
            # event itself when it is not what the value decodes to.
            replay = record.value
            if latest_ms is not None and event.ts_ms > latest_ms:
                # A runner's clock far ahead (or a hostile ts_ms): the event counts as
                # happening now.  Past times are left alone (replays, backlogs, ts_ms 0).
                event = replay = msgspec.structs.replace(event, ts_ms=now_ms)
                result.clamped += 1
            group = groups.get((record.partition, key))
            if group is None:
                groups[(record.partition, key)] = group = []
            group.append((record, event, replay))

        counts = _Counts()
        tallies = {(LIVE, ENFORCE): counts}
        shadow = _Shadow(engine.config, LIVE, tallies) if engine.config.uses_shadow() else None
        candidate = self.candidate
        judged = None if candidate is None else _Shadow(candidate.config, CANDIDATE, tallies)
        # A run's (record, event, step) of the batch are kept only for who reads them after.
        with_steps = judged is not None or bool(engine.fleet_records)
        runs = self.runs
        touched = runs.touched
        for pk, items in groups.items():
            live = touched.get(pk)
            if live is None:
                live = touched[pk] = runs.load(pk, read)
            applied = self._run_group(engine, pk, live, items, result, counts, shadow, session, with_steps)
            if judged is not None and applied:
                self._run_candidate(candidate, pk, live, applied, result, judged, session)
        result.runs = len(groups)
        if counts.lines:
            logs.log_many("loopwatch.", counts.lines)
        self._account(result, tallies, counts)
        return result

    def _check_record_age(self, record: Record, event: Any) -> None:
        """Raise ``InvalidEvent("stale_event")`` when a signed event is older than its record's
        Kafka timestamp by more than ``signed_max_age_ms``.

        The signature covers ``ts_ms`` (it is part of the record's value), so a replay carries
        its old time; the record's Kafka timestamp is that of the new publication (the broker's
        clock on a ``LogAppendTime`` topic).  Both are read from the record alone: a record
        processed again after a crash, or in a backlog long after it was published, is judged
        as it was the first time.  A forwarded record (session scope) carries the timestamp
        of the ``tool-calls`` record it was forwarded from."""
        published = record.timestamp
        if published is None or published < 0:
            raise InvalidEvent(STALE_EVENT, "signed event without a Kafka timestamp to check its age against")
        age = int(published) - event.ts_ms
        if age > self.signed_max_age_ms:
            raise InvalidEvent(
                STALE_EVENT,
                f"signed event {event.event_id[:128]!r} is stamped {event.ts_ms} ms, {age} ms before its record's "
                f"Kafka timestamp ({int(published)} ms; at most {self.signed_max_age_ms} ms): a replay",
            )

    def _forward(self, records: Iterable[Record], result: BatchResult) -> list[Record]:
        """Under session scope: which records reach the engine here, and which are forwarded
        to the repartition topic first (``BatchResult.forwards``, under their session's key).

        A ``tool-calls`` record keyed by a session (``session_scope_key``, a runner that keys so)
        on the partition that key gives is processed at once (if the key is not its event's,
        the key check after decoding dead-letters it); any other is forwarded, with its
        partition and offset in ``FORWARDED_FROM_HEADER``, after the runner's headers.  A record without a value, an oversized one or one whose run fields
        cannot be read is not forwarded: processed here, it becomes the dead letter it is.
        The repartition topic's records reach the engine with the partition and offset they
        were forwarded from (``Record.forwarded_from``): applying them is idempotent per
        source partition (``_session_fresh``), so a record forwarded twice (its batch redone
        after a crash, or forwarded by a paused worker and by its partition's new owner) is
        applied once.

        Order: a fetch lists its records partition by partition, each partition's in offset
        order, and a run's records are on one partition.  Each partition's records are
        forwarded in their offset order (what idempotence per source partition rests on, and
        a run's own order whatever its producer's clock says), and the partitions are merged
        by their records' Kafka timestamps, a record counting as stamped with the latest
        timestamp of its partition so far (a clock that steps back moves nothing before what
        was published before it): the runs of a session reach its state in about the order
        they were published.  (Runs of one session that overlap in time on several
        partitions interleave in no order Kafka defines.)"""
        own = self.sessions_topic
        partition_of = self._partition_of
        kept = []
        foreign: list[tuple[int, int, Record]] = []
        latest: dict[int, int] = {}
        for record in records:
            key = record.key
            if record.topic == own:
                kept.append(
                    Record(
                        own,
                        record.partition,
                        record.offset + FORWARDED_OFFSETS,
                        key,
                        record.value,
                        record.timestamp,
                        record.headers,
                        record.offset,
                        forwarded_from(record.headers),
                    )
                )
            elif key is not None and key.startswith(b"scope:") and partition_of(key) == record.partition:
                # Keyed by session by its runner, on that key's partition: its state is here (the
                # key check after decoding makes sure the key is its event's).
                kept.append(record)
            else:
                # Sorted by the latest timestamp of its partition so far: never before a record
                # of its partition that came before it (the sort is stable, and the key never
                # falls within a partition), however its producer's clock stepped.
                at = record.timestamp or 0
                partition = record.partition
                if at < latest.get(partition, 0):
                    at = latest[partition]
                else:
                    latest[partition] = at
                foreign.append((at, len(foreign), record))
        if len(latest) > 1:
            foreign.sort()  # (by time, then arrival: records are never compared)
        for _at, _n, record in foreign:
            if record.value is None or len(record.value) > MAX_EVENT_BYTES:
                # Dead-lettered here (no value, oversized): forwarded, an oversized record might
                # exceed the repartition topic's limit, and a forward refused while later ones
                # go through would leave a gap in its partition's forwarded order.
                kept.append(record)
                continue
            try:
                fields = _RUN_FIELDS.decode(record.value)
            except (msgspec.MsgspecError, RecursionError, ValueError):
                kept.append(record)
                continue
            if not (fields.run_id or fields.session_key or fields.session_id):
                kept.append(record)  # missing_key, below
                continue
            key = session_scope_key(fields).encode("utf-8", "surrogatepass")
            headers = list(record.headers or ())
            headers.append((FORWARDED_FROM_HEADER, pack_source(record.partition, record.offset)))
            result.forwards.append((key, record.value, headers, record.timestamp))
        return kept

    def _partition_of(self, key: bytes) -> int:
        """``schemas.keys.partition_for`` of a session's key, remembered (murmur2 in Python, per record)."""
        cache = self._partitions_of
        partition = cache.get(key)
        if partition is None:
            if len(cache) >= 100_000:
                cache.clear()
            partition = cache[key] = partition_for(key, self.partitions)
        return partition

    # -- one run's events ---------------------------------------------------------------------

    def _run_group(
        self,
        engine: LoopEngine,
        pk: tuple[int, bytes],
        live: LiveRun,
        items: list[tuple[Any, Any, Any]],
        result: BatchResult,
        counts: _Counts,
        shadow: _Shadow | None,
        session: bool = False,
        with_steps: bool = False,
    ) -> list[tuple[Any, Any, Any]] | None:
        """Apply a run's events of this batch, in order, and collect what each step publishes
        (the engine's rule, ``Step.published_decision``), its log lines and its counts.
        ``with_steps`` (a candidate config or the fleet topology reads them): returns
        ``(record, event, step)`` of each event applied; else None.  ``session``: session
        scope (offsets of two topics; verdicts keyed by their run).

        Each step is read right after its event: the run's next event changes the state a
        step describes.  This loop runs once per event, so it is written flat (no call per
        event beyond the engine's, the dedupe's, the collection's and the verdict's encoding)."""
        stamp = None
        if session:
            fresh, stamp, again = self._session_fresh(live, items, self.sessions_topic)
            result.forwarded_again += again
        elif items[0][0].offset <= live.offset:
            # Offsets rise within a group, so only a group whose first record is old holds any.
            fresh = [item for item in items if item[0].offset > live.offset]
        else:
            fresh = items
        if len(fresh) < len(items):
            # Already in the stored state (a redelivery).  The run stays dirty even
            # when nothing is new: the checkpoint re-writes it, so the changelog holds it
            # even if a crash lost its first changelog send (local store ahead of the changelog).
            result.skipped += len(items) - len(fresh)
            if not fresh:
                return None
            items = fresh
        partition, key = pk
        state = live.state
        seen = live.seen
        applied = live.applied
        verdicts = result.verdicts
        check_owner = self.keyring is not None
        max_age_ms = self.signed_max_age_ms
        handle = engine.handle
        collect = self._collect
        steps: list[tuple[Any, Any, Any]] | None = [] if with_steps else None
        plain = shadow is None and not session
        types = counts.types
        applied_before = len(applied)
        run_id: Any = UNSET
        run = b""  # the digest of run_id (a state's events mostly share one run: worked out once)
        for record, event, replay in items:
            # run_store.event_digest and remember, written out: two calls cost more than the
            # dedupe's own work, on every event.
            digest = blake2b(event.event_id.encode("utf-8", "surrogatepass"), digest_size=DIGEST_SIZE).digest()
            if seen.find(digest) >= 0 and seen_before(seen, digest):  # (most digests are not there at all)
                result.duplicates += 1  # not applied: not part of a rebuild either
                continue
            owner = live.owner
            if check_owner and state is not None and event.ts_ms < state.last_event_ms - max_age_ms:
                result.dead_letters.append(
                    DeadLetter(
                        record,
                        STALE_EVENT,
                        f"signed event {event.event_id[:128]!r} is stamped {event.ts_ms} ms, more than "
                        f"{max_age_ms} ms before the newest event its run applied ({state.last_event_ms} ms): "
                        "a replay",
                    )
                )
                continue
            if check_owner and owner is not None and event.agent_id != owner:
                result.dead_letters.append(
                    DeadLetter(
                        record,
                        BAD_SIGNATURE,
                        _cut(
                            f"run {key.decode('utf-8', 'replace')} belongs to agent {owner!r}; "
                            f"the event (signed by a key of agent {event.agent_id!r}) may not change it"
                        ),
                    )
                )
                continue
            seq = event.seq
            if seq is not UNSET and check_owner:
                # A replay of a signed event past the id window, within the max age.
                if event.run_id != run_id:
                    run_id = event.run_id
                    run = event_digest(run_id or "")
                seqs = live.seqs
                top = None if seqs is None else seqs.get(run)
                if top is not None and seq <= top:
                    result.dead_letters.append(
                        DeadLetter(
                            record,
                            REPLAYED_EVENT,
                            f"signed event {event.event_id[:128]!r} has seq {seq}, not above {top}, the highest "
                            "its run applied: a replay",
                        )
                    )
                    continue
            try:
                step = handle(state, event, True)  # validated (decode_event)
            except Exception as exc:  # noqa: BLE001 - see below
                reason = exc.reason if isinstance(exc, InvalidEvent) else PROCESSING_ERROR
                detail = exc.detail if isinstance(exc, InvalidEvent) else f"engine: {exc!r}"
                result.dead_letters.append(DeadLetter(record, reason, _cut(detail)))
                if reason == PROCESSING_ERROR:
                    self._count_error("engine")
                    log.exception("engine failed on %s[%d]@%d", record.topic, record.partition, source_offset(record))
                # The engine may have changed the state in place before failing: rebuild it
                # from the stored state and every event applied since (their verdicts are out).
                state = self._rebuild(engine, live)
                continue
            state = step.state
            if state is None:
                seen.clear()  # the run ended: its ids and its owner go with its state
                live.owner = None
                live.ended = True  # stored as its marker (run_store.pack_ended)
            else:
                seen += digest
                if len(seen) > SEEN_BYTES:
                    del seen[:DIGEST_SIZE]
                if owner is None:
                    live.owner = event.agent_id
            if seq is not UNSET and check_owner:
                seqs = live.seqs
                if seqs is None:
                    seqs = live.seqs = {}
                elif len(seqs) > 1:
                    seqs.pop(run, None)  # least recently raised first: the bound drops the oldest
                seqs[run] = seq
                if len(seqs) > MAX_SEQS:
                    del seqs[next(iter(seqs))]
            applied.append(replay)
            if plain:
                lines = step.built_logs
                if (
                    lines is not None
                    and not lines
                    and step.request is None
                    and step.built_decision is None
                    and step.abort is None
                ):
                    types[type(event)] += 1  # what _collect counts of a step that publishes and logs nothing
                else:
                    collect(partition, key, event, step, verdicts, counts)
            else:
                self._collect_moded(partition, key, event, step, result, counts, shadow, by_run=session)
            if steps is not None:
                steps.append((record, event, step))
        if steps and engine.fleet_records:
            self._fleet_records(engine, steps, result)
        result.events += len(applied) - applied_before
        live.state = state
        live.offset = items[-1][0].offset if stamp is None else stamp
        return steps

    @staticmethod
    def _session_fresh(
        live: LiveRun,
        items: list[tuple[Any, Any, Any]],
        own: str | None,
    ) -> tuple[list[tuple[Any, Any, Any]], int, int]:
        """Under session scope, a state's records of this batch not applied yet, as
        ``(fresh, the state's offset stamp after them, how many were forwarded again)``.

        A forwarded record (``Record.forwarded_from``) is new when its ``tool-calls`` offset is
        above the state's stamp for that partition (``live.sources``, advanced here).  Each
        partition's records of a session are forwarded in offset order and a producer keeps
        a partition's order, so every copy of a record that comes after its first (a batch
        forwarded again after a crash, by a paused worker, or a produce retried) is below
        that stamp.  The other records keep the offset stamp (``live.offset``), compared
        within their own topic (``FORWARDED_OFFSETS``): the direct ones (keyed by session by
        their runner, a stream of their own even on a partition that records are forwarded
        from) and the repartition topic's records forwarded without a source (by an earlier
        release)."""
        stamp = stamped = live.offset
        stamp_forwarded = stamp >= FORWARDED_OFFSETS
        sources = live.sources
        fresh = []
        again = 0
        for item in items:
            record = item[0]
            # (The repartition topic's records are _forward's Records; tool-calls' are aiokafka's.)
            source = record.forwarded_from if record.topic == own else None
            if source is not None:
                partition, offset = source
                if sources is None:
                    sources = live.sources = {}
                if offset <= sources.get(partition, -1):
                    again += 1
                    continue
                sources[partition] = offset
            else:
                offset = record.offset
                if stamp >= 0 and (offset >= FORWARDED_OFFSETS) == stamp_forwarded and offset <= stamp:
                    continue
                stamped = offset
            fresh.append(item)
        return fresh, stamped, again

    @staticmethod
    def _fleet_records(engine: LoopEngine, outputs: list[tuple[Any, Any, Any]], result: BatchResult) -> None:
        """What the fleet topology hears of a run's completed calls in this batch
        (``streams.app.fleet``), and how many of its decisions carried an incident.

        A run's repeats within a batch say nothing more to the fleet topology: a window counts
        distinct runs, so a run's outcome is sent once per batch; a hop's streak counts
        identical sends in a row, so consecutive identical sends go as one, with their count."""
        incidents, rings = engine.incidents_on, engine.rings_on
        outcomes: set[tuple[str, str, str]] = set()
        last_send: FleetSend | None = None
        repeats = 0

        def flush() -> None:
            if last_send is not None:
                send = last_send if repeats == 1 else msgspec.structs.replace(last_send, count=repeats)
                result.fleet.append(
                    (f"trace:{send.trace_id}".encode("utf-8", "surrogatepass"), encode_fleet_record(send))
                )
                result.fleet_kinds["send"] += 1

        for _record, event, step in outputs:
            if type(event) is not ToolCallCompleted:
                if type(step) is FleetStep:
                    result.incident_decisions += 1
                continue
            outcome = fleet_outcome(event) if incidents else None
            if outcome is not None and (seen := (outcome.run, outcome.tool_name, outcome.fingerprint)) not in outcomes:
                outcomes.add(seen)  # (by run: under session scope a state holds several runs)
                # By agent: the rate limit per agent is decided where all of an agent's
                # outcomes meet (streams.app.fleet), which forwards them by tool.
                result.fleet_outcomes.append((f"agent:{outcome.agent}".encode(), encode_fleet_record(outcome)))
                result.fleet_kinds["outcome"] += 1
            send = fleet_send(event) if rings else None
            if send is not None:
                if send == last_send:
                    repeats += 1
                else:
                    flush()
                    last_send, repeats = send, 1
        flush()

    def _rebuild(self, engine: LoopEngine, live: LiveRun) -> RunState | None:
        """The run's state from its stored state and the events applied since (``live.applied``)."""
        base = live.base
        if isinstance(base, RunState):
            state = copy_state(base)  # the checkpoint being taken encodes base meanwhile
        else:
            state = self.runs.decode(base, (0, b"?")) if base is not None else None
        for replay in live.applied:
            try:
                event = decode_event(replay) if type(replay) is bytes else replay
                state = engine.handle(state, event, validated=True).state
            except Exception:  # noqa: BLE001 - failed the first time too: skip it again
                pass
        return state

    def _collect(self, partition, key, event, step, out: list[VerdictOut], counts: _Counts, live: bool = True) -> None:
        """Count a step and put what it publishes in ``out``; ``live``: a step of the live
        config (its event and log lines count; a candidate's are neither counted nor logged)."""
        if live:
            counts.types[type(event)] += 1
            # Step.logs builds the lines of a detection on first read; the others are there.
            step_lines = step.built_logs
            if step_lines is None:
                step_lines = step.logs
            if step_lines:
                counts.lines += step_lines
                if type(event) is CompactionRetried:
                    counts.armings += sum(1 for line in step_lines if line.subsystem == GUARD_SUBSYSTEM)
        # What is published is the engine's rule (Step.published_decision); an allow nobody
        # waits for is counted like any decision, from the step, and never built.  A step
        # with neither a request nor a decision (most outcomes) publishes nothing.
        if step.request is None and step.built_decision is None:
            decision = None
        else:
            decision = step.published_decision
        if decision is not None or step.request is not None:
            detection = step.detection
            if decision is not None:
                out.append(VerdictOut(partition, key, encode_verdict(decision), decision))
                detector, level, action = decision.detector, decision.level, decision.action
                liveness, emitted = decision.liveness_signal, decision.warning_emitted
            else:
                action, emitted = "allow", step.emitted
                if detection is None:
                    detector = level = liveness = None
                else:
                    detector, level, liveness = detection.detector, detection.level, detection.liveness_signal
            if detector is None and action == "allow":
                counts.allows += 1  # the common decision, counted without a key
            else:
                counts.decisions[(detector or "none", level or "none", action)] += 1
            if liveness is not None:
                counts.liveness[(liveness, detector)] += 1
            if detection is not None:
                counts.detections[(detection.detector, detection.level, event.tool_name)] += 1
                if detection.level == WARNING and not emitted:
                    counts.suppressed[detection.detector] += 1
        abort = step.abort
        if abort is not None:
            counts.aborts[abort.detector] += 1
            out.append(VerdictOut(partition, key, encode_verdict(abort), abort))

    def _collect_moded(
        self,
        partition,
        key,
        event,
        step,
        result: BatchResult,
        counts: _Counts,
        shadow: _Shadow | None,
        by_run: bool = False,
    ) -> None:
        """``_collect`` when the live config has agents in shadow mode: theirs go to the shadow
        topic, and their runners get ``shadow_answer`` on ``loop-verdicts``.  ``by_run``
        (session scope): verdicts are keyed by their run (``state_key``), whose runner routes
        them by that key, not by the session's state key."""
        if by_run:
            key = state_key(event).encode("utf-8", "surrogatepass")
        tally = None if shadow is None else shadow.tally_for(event.agent_id)
        if tally is None:
            self._collect(partition, key, event, step, result.verdicts, counts)
            return
        self._collect(partition, key, event, step, result.shadow, tally)
        answer = shadow_answer(step)
        if answer is not None:
            result.verdicts.append(VerdictOut(partition, key, encode_verdict(answer), answer))

    # -- the candidate config ----------------------------------------------------------------------

    def _run_candidate(
        self,
        engine: LoopEngine,
        pk,
        live: LiveRun,
        applied,
        result: BatchResult,
        judged: _Shadow,
        session: bool = False,
    ) -> None:
        """The candidate on the events the live config applied to a run, on the run's
        candidate state; compares the run's outcomes when it ends (``run.ended``).
        ``session`` (session scope): the state is a session's, which outlives its runs; its
        verdicts are keyed by their run, as the live ones are (``_collect_moded``)."""
        partition, key = pk
        state, compared = live.candidate, live.compared
        changes = judged.tallies[(LIVE, ENFORCE)].changes
        for record, event, step in applied:
            try:
                judged_step = engine.handle(state, event, validated=True)
            except Exception:  # noqa: BLE001 - the candidate never affects the live run
                self._count_error(CANDIDATE)
                log.exception(
                    "the candidate config's engine failed on %s[%d]@%d: the candidate starts the run afresh",
                    record.topic,
                    record.partition,
                    source_offset(record),
                )
                state, compared = None, 0
                continue
            state = judged_step.state
            if compared & COMPARED_FROM_START:
                compared = compare(compared, outcome(step), outcome(judged_step))
            if session:
                key = state_key(event).encode("utf-8", "surrogatepass")
            self._collect(
                partition, key, event, judged_step, result.candidate, judged.tally_for(event.agent_id), live=False
            )
            if state is None or type(event) is RunEnded:  # the run ended under both configs
                if compared & COMPARED_FROM_START:
                    was, would = compared_outcomes(compared)
                    if was != would:
                        changes[(OUTCOMES[was], OUTCOMES[would])] += 1
                compared = COMPARED_FROM_START  # a later event of the key starts afresh in both
        live.candidate, live.compared = state, compared

    # -- metrics --------------------------------------------------------------------------------

    def _count_error(self, stage: str) -> None:
        if self.metrics is not None:
            self.metrics.count_error(stage)

    def _account(self, result: BatchResult, tallies: dict[tuple[str, str], _Counts], counts: _Counts) -> None:
        """Add a batch's counts to the metrics: ``tallies`` by (config, mode), the metrics'
        labels; ``counts``, the live enforce ones, also hold the run-level counts."""
        m = self.metrics
        if m is None:
            return
        for labels, tally in tallies.items():
            m.add(m.events_consumed, {EVENT_TYPE_OF[kind]: n for kind, n in tally.types.items()})
            if tally.allows:
                tally.decisions[("none", "none", "allow")] += tally.allows
            m.add(m.decisions, {k + labels: n for k, n in tally.decisions.items()})
            if tally.detections:
                tools: dict[tuple[str, ...], int] = defaultdict(int)
                for (detector, level, tool), n in tally.detections.items():
                    tools[(detector, level, m.tool_label(tool)) + labels] += n
                m.add(m.loop_detections, tools)
            m.add(m.warnings_suppressed, {(k,) + labels: n for k, n in tally.suppressed.items()})
            m.add(m.liveness_signals, {k + labels: n for k, n in tally.liveness.items()})
            m.add(m.run_aborts, {(k,) + labels: n for k, n in tally.aborts.items()})
            if tally.armings:
                m.guard_armings.inc(tally.armings)
        m.add(m.candidate_outcome_changes, counts.changes)
        if result.duplicates:
            m.duplicate_events.inc(result.duplicates)
        if result.forwards:
            m.events_forwarded.inc(len(result.forwards))
        if result.forwarded_again:
            m.events_forwarded_again.inc(result.forwarded_again)
        if result.fleet or result.fleet_outcomes:
            m.add(m.fleet_records, result.fleet_kinds)
        if result.incident_decisions:
            m.fleet_incident_decisions.inc(result.incident_decisions)
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
        latencies = []
        for out in verdicts:
            verdict = out.verdict
            if verdict.ts_ms > 0 and type(verdict) is Decision:
                latencies.append(max(0.0, now_ms - verdict.ts_ms) / 1000.0)
        m.decision_latency.observe_many(latencies)


class _RunFields(msgspec.Struct):
    """The fields of an event that say which session it belongs to (anything else ignored)."""

    run_id: str | None = None
    session_key: str | None = None
    session_id: str | None = None


_RUN_FIELDS = msgspec.json.Decoder(_RunFields)


pack_source = SOURCE.pack
_unpack_source = SOURCE.unpack


def forwarded_from(headers: Any) -> tuple[int, int] | None:
    """The ``tool-calls`` partition and offset in a forwarded record's ``FORWARDED_FROM_HEADER``;
    None without one (forwarded by an earlier release) or when it is not 12 bytes.  Only the
    last header counts: the worker appends it to the runner's headers, so a header of that
    name a runner sent (or an earlier release forwarded) is never taken for it."""
    if not headers:
        return None
    name, value = headers[-1]
    if name != FORWARDED_FROM_HEADER or type(value) is not bytes or len(value) != SOURCE.size:
        return None
    return _unpack_source(value)


class _Shadow:
    """Where the steps of one config go when shadow is in play: the ``_Counts`` of an agent's
    mode under ``config`` (``tag``: live or candidate), made on first use in ``tallies``.
    For the live config, an agent in enforce mode has none (``tally_for``: None): its steps
    take the ordinary path."""

    __slots__ = ("config", "tag", "tallies")

    def __init__(self, config: Any, tag: str, tallies: dict[tuple[str, str], _Counts]) -> None:
        self.config = config
        self.tag = tag
        self.tallies = tallies

    def tally_for(self, agent_id: str | None) -> _Counts | None:
        mode = self.config.mode_for(agent_id)
        if mode == ENFORCE and self.tag == LIVE:
            return None
        labels = (self.tag, mode)
        tally = self.tallies.get(labels)
        if tally is None:
            # One list of log lines per batch, in the order of its events, whatever their tally.
            tally = self.tallies[labels] = _Counts(lines=self.tallies[(LIVE, ENFORCE)].lines)
        return tally


class _Counts:
    """What one batch adds to the metrics and the log, gathered as plain values and added once."""

    __slots__ = (
        "types",
        "allows",
        "decisions",
        "detections",
        "suppressed",
        "aborts",
        "armings",
        "liveness",
        "lines",
        "changes",
    )

    def __init__(self, lines: list[Any] | None = None) -> None:
        self.types: dict[type, int] = defaultdict(int)
        """Applied events by class."""
        self.allows = 0
        """Decisions ``allow`` without a detection (the usual one)."""
        self.decisions: dict[tuple[str, str, str], int] = defaultdict(int)
        self.detections: dict[tuple[str, str, str], int] = defaultdict(int)
        self.suppressed: dict[str, int] = defaultdict(int)
        self.aborts: dict[str, int] = defaultdict(int)
        self.armings = 0
        self.liveness: dict[tuple[str, str], int] = defaultdict(int)
        self.lines: list[Any] = [] if lines is None else lines
        """The engine's log lines, in order (``LogLine``), written after the batch (``logs.log_many``)."""
        self.changes: dict[tuple[str, str], int] = defaultdict(int)
        """Runs ended whose outcome differs, by (live outcome, candidate outcome)."""


def _cut(text: str) -> str:
    return text if len(text) <= DETAIL_LIMIT else text[: DETAIL_LIMIT - 1] + "…"
