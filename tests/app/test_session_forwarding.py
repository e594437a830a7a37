"""Session scope's repartition without Kafka (issue 26): a record forwarded twice is applied
once, and a run's records keep their offset order whatever their timestamps say.

``Pipeline`` is the worker's loop over lists: ``tool-calls`` and ``<app id>-sessions`` as
partitions of records, the run store, the committed offsets; a crash is a new processor on
the store as the last checkpoint left it, reading from the committed offsets.  Expected
verdicts come from the engine alone (``RunDriver``) on the session's events in the order
they were published, or are worked out by hand from the spec's thresholds.
"""

from __future__ import annotations

import struct

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from schemas import MAX_EVENT_BYTES, decode_verdict, encode_event
from schemas.keys import partition_for, record_key, session_scope_key
from streams.app.metrics import Metrics
from streams.app.processor import FORWARDED_FROM_HEADER, FORWARDED_OFFSETS, BatchProcessor, forwarded_from
from streams.app.records import Record
from streams.app.run_store import (
    COMPARED_FROM_START,
    HEADER_SIZE,
    pack_state,
    source_stamps,
    unpack_header,
    unpack_state,
)
from streams.edge.events import requested_event
from streams.engine import RunDriver, engine_for
from streams.offline.scenarios import overlapping_runs

SESSION = {"tools": {"loopDetection": {"enabled": True, "historySize": 1000}}, "loopwatch": {"scope": "session"}}
TOPIC = "lw-sessions"
PARTITIONS = 4


def source(partition: int, offset: int) -> bytes:
    """A ``loopwatch.forwarded_from`` header's value: the partition in 4 bytes, the offset in 8,
    big endian."""
    return struct.pack(">Iq", partition, offset)


def processor() -> BatchProcessor:
    p = BatchProcessor(engine_for(SESSION), Metrics(CollectorRegistry(), process_metrics=False))
    p.sessions_topic = TOPIC
    p.partitions = PARTITIONS
    return p


def two_sessions(calls_per_run: int = 30) -> list:
    """2 sessions x 4 overlapping runs, keyed by run id (on several partitions), interleaved."""
    a = overlapping_runs("agent:main:left", calls_per_run=calls_per_run, gate=True)
    b = overlapping_runs("agent:main:right", calls_per_run=calls_per_run, gate=True)
    return [e for pair in zip(a, b) for e in pair]


class Pipeline:
    """A worker's loop over lists (see the module docstring)."""

    def __init__(self, events: list) -> None:
        self.tool_calls: dict[int, list[Record]] = {p: [] for p in range(PARTITIONS)}
        for i, event in enumerate(events):  # produced in this order, one ms apart
            key = record_key(event).encode()
            part = self.tool_calls[partition_for(key, PARTITIONS)]
            part.append(Record("tool-calls", partition_for(key, PARTITIONS), len(part), key, encode_event(event), i))
        self.sessions: dict[int, list[Record]] = {p: [] for p in range(PARTITIONS)}
        self.stored: dict = {}
        self.committed = {(t, p): 0 for t in ("tool-calls", TOPIC) for p in range(PARTITIONS)}
        self.processor = processor()
        self.restart()
        self.verdicts: list = []

    def read(self, partition, key):
        return self.stored.get((partition, key))

    def restart(self) -> None:
        """After a crash: a new worker, the store and positions of the last checkpoint."""
        self.processor = processor()
        self.position = dict(self.committed)

    def fetch(self, topic: str, up_to_ms: int | None = None) -> list[Record]:
        """What a fetch returns: partition by partition, each in offset order (``up_to_ms``:
        only records published before then)."""
        parts = self.tool_calls if topic == "tool-calls" else self.sessions
        out = []
        for p, records in parts.items():
            at = self.position[(topic, p)]
            taken = [r for r in records[at:] if up_to_ms is None or r.timestamp < up_to_ms]
            out += taken
            self.position[(topic, p)] = at + len(taken)
        return out

    def step(self, up_to_ms: int | None = None) -> None:
        """One batch of tool-calls (its forwards produced), then one of the repartition topic."""
        result = self.processor.process(self.fetch("tool-calls", up_to_ms), self.read)
        self.produce_forwards(result.forwards)
        result = self.processor.process(self.fetch(TOPIC), self.read)
        self.verdicts += [decode_verdict(v.value) for v in result.verdicts]

    def produce_forwards(self, forwards) -> None:
        for key, value, headers, _published in forwards:
            part = self.sessions[partition_for(key, PARTITIONS)]
            part.append(Record(TOPIC, partition_for(key, PARTITIONS), len(part), key, value, 0, headers))

    def checkpoint(self) -> None:
        for pk, value in self.processor.runs.checkpoint().writes.items():
            if value is None:
                self.stored.pop(pk, None)
            else:
                self.stored[pk] = value
        self.committed = dict(self.position)


def by_id(verdicts) -> dict:
    """Verdicts by id; every copy of an id must have the same content."""
    out: dict = {}
    for v in verdicts:
        assert out.setdefault(v.verdict_id, v) == v, f"{v.verdict_id} published twice with different content"
    return out


# -- item 2: a record forwarded twice is applied once ---------------------------------------------


def test_a_batch_forwarded_again_after_a_crash_is_applied_once():
    """The issue's case: 2 sessions x 4 overlapping runs keyed by run id; the worker forwards
    and applies a stretch of them, crashes before its checkpoint, and does that stretch again:
    every record of it is forwarded a second time, far more than the 64 ids a run remembers
    behind the first copies.  Each is applied once: every verdict as the engine gives it."""
    events = two_sessions()
    pipe = Pipeline(events)
    pipe.step(up_to_ms=100)
    pipe.checkpoint()
    pipe.step(up_to_ms=300)  # 200 events forwarded and applied, their verdicts out ...
    pipe.restart()  # ... and no checkpoint: kill -9
    pipe.step()
    pipe.checkpoint()
    forwarded = sum(len(records) for records in pipe.sessions.values())
    assert forwarded == len(events) + 200  # the crash's stretch went through the repartition twice
    want = RunDriver(engine_for(SESSION)).verdicts(events)
    assert by_id(pipe.verdicts) == {v.verdict_id: v for v in want}
    assert max(v.count or 0 for v in want) >= 100  # counts that a second application would move
    metrics = pipe.processor.metrics
    assert metrics.events_forwarded_again._value.get() == 200
    assert metrics.duplicate_events._value.get() == 0  # not the 64-id window's doing


def test_the_crash_case_fails_without_the_source_header():
    """The same crash with the forwarded records' source header removed (an earlier release's
    records): the second copies are applied again, and verdicts differ.  What the test above
    proves is the header's doing."""
    events = two_sessions()
    pipe = Pipeline(events)
    strip = pipe.produce_forwards

    def without_source(forwards):
        strip([(k, v, [h for h in headers if h[0] != FORWARDED_FROM_HEADER], t) for k, v, headers, t in forwards])

    pipe.produce_forwards = without_source
    pipe.step(up_to_ms=100)
    pipe.checkpoint()
    pipe.step(up_to_ms=300)
    pipe.restart()
    pipe.step()
    want = {v.verdict_id: v for v in RunDriver(engine_for(SESSION)).verdicts(events)}
    with pytest.raises(AssertionError, match="different content"):
        by_id(pipe.verdicts)
    assert {v.verdict_id: v for v in pipe.verdicts} != want


def test_copies_from_a_paused_worker_and_the_new_owner_are_applied_once_however_they_interleave():
    """Two workers forwarding one tool-calls partition (a paused one and the partition's new
    owner, both from offset 0), their copies interleaved on the repartition topic, and a
    produce retried (a batch twice in a row): each record is applied once, in offset order."""
    events = overlapping_runs("agent:main:solo", run_ids=["solo"], calls_per_run=40, gate=True)
    p = processor()
    forwards = p.process(
        [Record("tool-calls", 1, i, b"solo", encode_event(e), i) for i, e in enumerate(events)], lambda *_: None
    ).forwards
    first, second = forwards[:60], forwards
    mixed = first[:25] + second[:10] + first[25:50] + second[10:70] + first[50:] + second[70:] + second[60:80]
    records = [Record(TOPIC, 0, i, k, v, 0, h) for i, (k, v, h, _t) in enumerate(mixed)]
    stored: dict = {}
    verdicts = []
    for at in range(0, len(records), 17):  # batches of 17, checkpointed after each
        result = p.process(records[at : at + 17], lambda part, key: stored.get((part, key)))
        verdicts += [decode_verdict(v.value) for v in result.verdicts]
        stored.update(p.runs.checkpoint().writes)
    assert by_id(verdicts) == {v.verdict_id: v for v in RunDriver(engine_for(SESSION)).verdicts(events)}
    assert len(verdicts) == 40 and p.metrics.events_forwarded_again._value.get() == len(mixed) - len(events)
    [envelope] = stored.values()
    assert unpack_state(envelope).sources == {1: len(events) - 1}


def test_records_forwarded_from_a_partition_and_direct_ones_from_it_are_separate_streams():
    """A session's state on partition q gets records its runner keyed by session (tool-calls q,
    offsets 10-13, processed directly) and records of another of its runs that landed on q and
    were forwarded (tool-calls q, offsets 2-5): neither is taken for a redelivery of the other."""
    a, b = (
        [
            msgspec.structs.replace(e, event_id=f"{run}-{e.event_id}")
            for e in overlapping_runs("agent:main:mixed", run_ids=[run], calls_per_run=2, gate=True)
        ]
        for run in "ab"
    )
    key = session_scope_key(a[0]).encode()
    q = partition_for(key, PARTITIONS)
    p = processor()
    stored: dict = {}

    def read(part, k):
        return stored.get((part, k))

    direct = p.process([Record("tool-calls", q, 10 + i, key, encode_event(e), i) for i, e in enumerate(a)], read)
    stored.update(p.runs.checkpoint().writes)
    forwards = p.process(
        [Record("tool-calls", q, 2 + i, b"b", encode_event(e), 4 + i) for i, e in enumerate(b)], read
    ).forwards
    assert [h[-1] for _k, _v, h, _t in forwards] == [(FORWARDED_FROM_HEADER, source(q, 2 + i)) for i in range(4)]
    forwarded = p.process([Record(TOPIC, q, i, k, v, 0, h) for i, (k, v, h, _t) in enumerate(forwards)], read)
    stored.update(p.runs.checkpoint().writes)
    assert (direct.events, forwarded.events, forwarded.skipped, forwarded.duplicates) == (4, 4, 0, 0)
    envelope = unpack_state(stored[(q, key)])
    assert (envelope.offset, envelope.sources) == (13, {q: 5})  # the direct stamp, the forwarded one
    again = p.process([Record("tool-calls", q, 13, key, encode_event(a[3]), 3)], read)  # a direct redelivery
    assert (again.events, again.skipped) == (0, 1)


def test_a_runners_own_forwarded_from_header_is_never_taken_for_the_workers():
    """A runner's header of that name stays where the runner put it, before the worker's;
    only the last header counts (and, forwarded by an earlier release, it is not last)."""
    event = requested_event("e", "read", {}, run_id="r1", session_key="s1")
    forged = [(FORWARDED_FROM_HEADER, source(0, 999999)), ("loopwatch.key_id", b"k")]
    record = Record("tool-calls", 3, 7, b"r1", encode_event(event), 0, forged)
    [(_key, _value, headers, _published)] = processor().process([record], lambda *_: None).forwards
    assert headers == forged + [(FORWARDED_FROM_HEADER, source(3, 7))] and forwarded_from(headers) == (3, 7)
    assert forwarded_from(forged) is None


def test_a_signed_record_forwarded_under_session_scope_keeps_its_age():
    """The forward carries the tool-calls record's Kafka timestamp (the repartition record is
    produced with it): a signed event forwarded late, in a backlog, is judged by the time it
    was published; one that was already stale when published is refused after the hop."""
    from schemas.signing import Keyring, SigningKey

    key = SigningKey("main-1", "main", b"m" * 32)
    published_ms = 1_760_000_000_000
    fresh = requested_event("fresh", "read", {}, run_id="r1", session_key="s1", agent_id="main", ts_ms=published_ms)
    stale = requested_event("stale", "read", {}, run_id="r2", session_key="s1", agent_id="main", ts_ms=1)
    p = processor()
    p.keyring = Keyring([key])
    records = [
        Record("tool-calls", 3, i, e.run_id.encode(), encode_event(e), published_ms, key.headers(encode_event(e)))
        for i, e in enumerate([fresh, stale])
    ]
    forwards = p.process(records, lambda *_: None).forwards
    assert [t for _k, _v, _h, t in forwards] == [published_ms, published_ms]
    hop = p.process([Record(TOPIC, 0, i, k, v, t, h) for i, (k, v, h, t) in enumerate(forwards)], lambda *_: None)
    assert hop.events == 1 and [(l.reason, l.record.source_offset) for l in hop.dead_letters] == [("stale_event", 1)]


def test_an_oversized_record_is_dead_lettered_where_it_is_not_forwarded():
    """Forwarded, it could exceed the repartition topic's limit: that forward refused while the
    partition's later ones go through would leave a gap in the partition's forwarded order."""
    big = (
        b'{"type": "run.ended", "event_id": "big", "run_id": "r1", "session_key": "s1", "reason": "'
        + b"x" * MAX_EVENT_BYTES
        + b'"}'
    )
    small = requested_event("e", "read", {}, run_id="r1", session_key="s1")
    result = processor().process(
        [Record("tool-calls", 0, 0, b"r1", big, 0), Record("tool-calls", 0, 1, b"r1", encode_event(small), 1)],
        lambda *_: None,
    )
    assert [d.reason for d in result.dead_letters] == ["oversized"]
    assert [h[-1] for _k, _v, h, _t in result.forwards] == [(FORWARDED_FROM_HEADER, source(0, 1))]


@given(st.integers(0, 2**32 - 1), st.integers(0, 2**63 - 1))
def test_the_source_header_round_trips(partition, offset):
    others = [("loopwatch.key_id", b"k"), ("loopwatch.signature", b"sha256=00")]
    assert forwarded_from(others + [(FORWARDED_FROM_HEADER, source(partition, offset))]) == (partition, offset)


@given(st.binary(max_size=40))
def test_a_malformed_source_header_is_no_source(raw):
    """A value of any other length reads as no source (the record is compared by its
    repartition offset, as an earlier release's), never as an error."""
    found = forwarded_from([(FORWARDED_FROM_HEADER, raw)])
    assert found == (struct.unpack(">Iq", raw) if len(raw) == 12 else None)
    assert forwarded_from([(FORWARDED_FROM_HEADER, None)]) is None and forwarded_from(None) is None
    assert forwarded_from([("loopwatch.key_id", b"k")]) is None


# -- the envelope: version 5 and the way from 3 and 4 ---------------------------------------------


def _state(events):
    engine, state = engine_for(SESSION), None
    for event in events:
        state = engine.handle(state, event, validated=True).state
    return state


def test_version_5_envelopes_round_trip_with_and_without_a_candidate_section():
    state = _state(overlapping_runs("agent:main:env", run_ids=["r"], calls_per_run=3))
    judged = _state(overlapping_runs("agent:main:env", run_ids=["r"], calls_per_run=2))
    seen = bytes(range(16))
    sources = {3: 41, 0: 2**40}
    plain = pack_state(state, 7, 7000, seen, "main", sources=sources)
    # byte 0: 5; then offset, time, 2 digests, owner of 4 bytes, no candidate section, 2 stamps
    assert struct.unpack_from(">BqqHHIH", plain) == (5, 7, 7000, 2, 4, 0, 2)
    assert plain[27:51] == struct.pack(">Iq", 0, 2**40) + struct.pack(">Iq", 3, 41)  # by partition
    env = unpack_state(plain)
    assert (env.offset, env.touched_ms, env.seen, env.owner, env.state, env.sources) == (
        7,
        7000,
        seen,
        "main",
        state,
        sources,
    )
    assert (env.candidate, env.compared) == (None, None) and unpack_header(plain) == (7, 7000)
    both = unpack_state(pack_state(state, 7, 7000, seen, "main", judged, COMPARED_FROM_START | 1, sources))
    assert (both.state, both.candidate, both.compared, both.sources, both.seen) == (
        state,
        judged,
        COMPARED_FROM_START | 1,
        sources,
        seen,
    )
    # Without stamps, what an earlier release reads: version 3 (or 4 with a candidate).
    assert pack_state(state, 7, 7000, seen, "main", sources={})[0] == 3
    assert pack_state(state, 7, 7000, seen, "main", judged, 0)[0] == 4
    assert source_stamps(pack_state(state, 7, 7000, seen, "main")) is None
    assert len(plain) - len(pack_state(state, 7, 7000, seen, "main")) == 27 - HEADER_SIZE + 2 * 12


@pytest.mark.parametrize("with_candidate", [False, True], ids=["version 3", "version 4"])
def test_a_state_stored_by_an_earlier_release_goes_on_and_is_stored_as_version_5(with_candidate):
    """An earlier release stored a session's state stamped with a repartition offset (version 3,
    or 4 with a candidate).  After the upgrade: that release's own forwarded records (no
    source header) redelivered are still skipped by that stamp; the new worker's forwarded
    records are applied, and the state is stored with their source stamp (version 5)."""
    events = overlapping_runs("agent:main:upgrade", run_ids=["u"], calls_per_run=6, gate=True)
    key = session_scope_key(events[0]).encode()
    engine = engine_for(SESSION)
    before = _state(events[:6])
    old = pack_state(before, FORWARDED_OFFSETS + 5, 1000, b"", "main", *((None, 0) if with_candidate else ()))
    assert old[0] == (4 if with_candidate else 3)
    stored = {(2, key): old}
    p = processor()
    if with_candidate:
        p.use_candidate(engine_for(SESSION))

    def read(part, k):
        return stored.get((part, k))

    redelivered = [Record(TOPIC, 2, i, key, encode_event(e), 0) for i, e in enumerate(events[:6])]  # no header
    assert p.process(redelivered, read).skipped == 6
    forwards = p.process(
        [Record("tool-calls", 1, 6 + i, b"u", encode_event(e), i) for i, e in enumerate(events[6:])], read
    ).forwards
    result = p.process([Record(TOPIC, 2, 6 + i, k, v, 0, h) for i, (k, v, h, _t) in enumerate(forwards)], read)
    assert [decode_verdict(v.value) for v in result.verdicts] == RunDriver(engine).verdicts(events)[3:]
    value = p.runs.checkpoint().writes[(2, key)]
    assert value[0] == 5
    env = unpack_state(value)
    assert (env.offset, env.sources, env.state) == (FORWARDED_OFFSETS + 5, {1: 6 + len(events[6:]) - 1}, _state(events))
    assert (env.candidate is not None) == with_candidate


# -- item 3: a run's records keep their offset order ----------------------------------------------


def test_a_runs_records_keep_their_offset_order_when_its_producers_clock_steps_back():
    """A run of 20 identical gated reads whose producer's clock stepped back 120 s after call
    9: calls 10-19 carry Kafka timestamps (and event times) 120 s before calls 0-9.
    Hand-worked (spec: warningThreshold 10): the 11th read, call 10, is the first to have 10
    identical reads before it, so it is warned, with count 10; no call before it is.  Sorted
    by timestamp, calls 10-19 went first and the warning landed on call 0."""
    events = overlapping_runs(
        "agent:main:clock", run_ids=["clock"], calls_per_run=20, gate=True, start_ms=1_700_000_200_000
    )
    stepped = [e if i < 20 else msgspec.structs.replace(e, ts_ms=e.ts_ms - 120_000) for i, e in enumerate(events)]
    stamps = [e.ts_ms for e in stepped]
    assert stamps[20] < stamps[0]
    p = processor()
    published = [Record("tool-calls", 0, i, b"clock", encode_event(e), stamps[i]) for i, e in enumerate(stepped)]
    forwards = p.process(published, lambda *_: None).forwards
    assert [v for _k, v, _h, _t in forwards] == [encode_event(e) for e in stepped]  # offset order
    result = p.process([Record(TOPIC, 0, i, k, v, 0, h) for i, (k, v, h, _t) in enumerate(forwards)], lambda *_: None)
    decisions = [decode_verdict(v.value) for v in result.verdicts]
    warned = [(n, d.count) for n, d in enumerate(decisions) if d.action == "warn"]
    assert warned[0] == (10, 10)
    assert all(d.action == "allow" for d in decisions[:10])


def test_partitions_are_merged_by_timestamp_each_in_its_offset_order():
    """Hand-worked: partition 0 holds records stamped 5, 1, 9 and partition 1 records stamped
    2, 3, 10.  The merge takes the earliest head each time: p1's 2 and 3, p0's 5, then p0's
    head is its 1 (earlier than p1's 10, and after its 5 in offset order), its 9, p1's 10."""
    run = {0: "r-zero", 1: "r-one"}
    stamps = {0: [5, 1, 9], 1: [2, 3, 10]}
    records = [
        Record(
            "tool-calls",
            part,
            i,
            run[part].encode(),
            encode_event(requested_event(f"{part}-{i}", "read", {}, run_id=run[part], session_key="s")),
            ts,
        )
        for part in (0, 1)
        for i, ts in enumerate(stamps[part])
    ]
    forwards = processor().process(records, lambda *_: None).forwards
    assert [h[-1][1] for _k, _v, h, _t in forwards] == [
        source(*at) for at in ((1, 0), (1, 1), (0, 0), (0, 1), (0, 2), (1, 2))
    ]
