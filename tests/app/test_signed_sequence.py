"""Sequence numbers on signed events, without Kafka: a signed event whose ``seq`` is not above
the highest its run applied is dead-lettered ``replayed_event``, at any distance from its
original and within the max age; a retry in the id window is still a duplicate; a restarted
publisher continues above its predecessor; events without ``seq`` and unsigned events keep
the id window and the max age alone.  Every sequence below is written out by hand."""

from __future__ import annotations

import msgspec
from prometheus_client import CollectorRegistry
from test_signed_events import CONFIG, MAIN, T0, published, signed, spaced

from schemas.signing import Keyring
from streams.app.metrics import Metrics
from streams.app.processor import BatchProcessor
from streams.app.run_store import (
    MAX_SEQS,
    SEQS_ENVELOPE_VERSION,
    pack_state,
    seq_stamps,
    unpack_state,
)
from streams.edge.events import run_ended_event
from streams.edge.sequence import SeqCounter
from streams.engine import engine_for
from streams.engine.intake import event_digest

S0 = 1_760_000_000_000_000
"""A publisher's first ``seq``: T0 in microseconds, as ``streams.edge.sequence`` seeds it."""


def numbered(events, first: int = S0):
    """``events`` with the seqs ``first``, ``first + 1``, ... (what one publisher draws in a burst)."""
    return [msgspec.structs.replace(e, seq=first + i) for i, e in enumerate(events)]


def as_made(events, start: int = 0):
    """Signed records of ``events`` published when each was made (Kafka timestamp = ``ts_ms``)."""
    return [published(r, r.offset, e.ts_ms) for r, e in zip(signed(events, MAIN, start=start), events, strict=True)]


class Store:
    """The run table as the checkpoints leave it, for a restarted processor."""

    def __init__(self) -> None:
        self.values: dict = {}

    def read(self, partition, key):
        return self.values.get((partition, key))

    def checkpoint(self, processor: BatchProcessor) -> None:
        for pk, value in processor.runs.checkpoint().writes.items():
            if value is None:
                self.values.pop(pk, None)
            else:
                self.values[pk] = value


def processor(metrics=None) -> BatchProcessor:
    return BatchProcessor(engine_for(CONFIG), metrics, keyring=Keyring([MAIN]), signed_max_age_s=300)


def test_a_signed_event_replayed_after_64_newer_ones_within_the_max_age_is_dead_lettered_replayed():
    """80 events 1 s apart (T0 ... T0 + 79 s), seqs S0 ... S0 + 79.  Event 0 replayed at
    T0 + 80 s is 80 s old (the max age is 300 s) and 79 ids back (the window is 64): before
    sequence numbers it was applied again.  Its seq S0 is not above S0 + 79: refused."""
    metrics = Metrics(CollectorRegistry())
    p = processor(metrics)
    store = Store()
    events = numbered(spaced("r", 80, step_ms=1_000))
    records = as_made(events)
    first = p.process(records, store.read)
    assert first.events == 80 and first.dead_letters == []
    replays = [published(records[0], 80, T0 + 80_000), published(records[15], 81, T0 + 15_000)]
    result = p.process(replays, store.read)
    assert (result.events, result.duplicates) == (0, 0)
    assert [(l.reason, l.record.offset) for l in result.dead_letters] == [
        ("replayed_event", 80),
        ("replayed_event", 81),
    ]
    assert result.dead_letters[0].detail == (
        f"signed event 'r-0q' has seq {S0}, not above {S0 + 79}, the highest its run applied: a replay"
    )
    assert metrics.dead_letters.labels("replayed_event")._value.get() == 2
    # Read back from the stored envelope by a restarted worker: still refused.
    store.checkpoint(p)
    restarted = processor()
    again = restarted.process([published(records[0], 82, T0 + 81_000)], store.read)
    assert [(l.reason, l.record.offset) for l in again.dead_letters] == [("replayed_event", 82)]


def test_a_retry_within_the_id_window_is_still_skipped_as_a_duplicate():
    """The same event (same id, same seq) again 10 events later: the id window answers first."""
    p = processor()
    events = numbered(spaced("r", 20, step_ms=1_000))
    records = as_made(events)
    assert p.process(records, Store().read).events == 20
    retry = p.process([published(records[10], 20, T0 + 20_000)], Store().read)
    assert (retry.events, retry.duplicates, retry.dead_letters) == (0, 1, [])


def test_events_without_seq_or_unsigned_keep_todays_behaviour():
    """Without seq the replay of event 0 after 79 newer ones, within the max age, is applied
    again (the gap that seq closes); unsigned events are never compared, seq or not."""
    p = processor()
    records = as_made(spaced("r", 80, step_ms=1_000))
    assert p.process(records, Store().read).events == 80
    replay = p.process([published(records[0], 80, T0 + 80_000)], Store().read)
    assert (replay.events, replay.dead_letters) == (1, [])

    plain = BatchProcessor(engine_for(CONFIG))  # no keyring
    events = numbered(spaced("u", 80, step_ms=1_000))
    unsigned = [published(r, r.offset, e.ts_ms) for r, e in zip(signed(events, None), events, strict=True)]
    assert plain.process(unsigned, Store().read).events == 80
    assert plain.process([published(unsigned[0], 80, T0 + 80_000)], Store().read).events == 1
    stored = plain.runs.checkpoint().writes
    assert all(value is None or value[0] != SEQS_ENVELOPE_VERSION for value in stored.values())


def test_a_restarted_publisher_resuming_the_run_continues_above_its_predecessor():
    """Publisher 1 draws 5 seqs in one microsecond of its clock (T0 + 1 µs): S0 + 1 ...
    S0 + 5.  It dies; publisher 2 starts 2 s later and resumes run r: its clock gives
    S0 + 2,000,000 and on.  The worker (restarted in between too) applies all of them."""
    one = SeqCounter(clock=lambda: (S0 + 1) * 1000)
    assert [one() for _ in range(5)] == [S0 + 1, S0 + 2, S0 + 3, S0 + 4, S0 + 5]
    two = SeqCounter(clock=lambda: (S0 + 2_000_000) * 1000)
    assert [two() for _ in range(3)] == [S0 + 2_000_000, S0 + 2_000_001, S0 + 2_000_002]

    events = spaced("r", 8, step_ms=250)
    before = [msgspec.structs.replace(e, seq=S0 + 1 + i) for i, e in enumerate(events[:5])]
    after = [msgspec.structs.replace(e, seq=S0 + 2_000_000 + i) for i, e in enumerate(events[5:])]
    store = Store()
    p = processor()
    assert p.process(as_made(before), store.read).events == 5
    store.checkpoint(p)
    restarted = processor()
    resumed = restarted.process(as_made(after, start=5), store.read)
    assert (resumed.events, resumed.dead_letters) == (3, [])


def test_a_batch_processed_again_after_a_crash_is_judged_as_the_first_time():
    """Checkpoint after 10 of 20 events; the crash loses the commit, so all 20 come again to a
    restarted worker: 10 are skipped by their offsets, 10 applied (their seqs are above the
    checkpointed S0 + 9), none dead-lettered."""
    store = Store()
    p = processor()
    records = as_made(numbered(spaced("r", 20, step_ms=1_000)))
    assert p.process(records[:10], store.read).events == 10
    store.checkpoint(p)
    p.process(records[10:], store.read)  # applied, never checkpointed
    again = processor().process(records, store.read)
    assert (again.skipped, again.events, again.dead_letters) == (10, 10, [])


def test_an_ended_runs_marker_keeps_its_highest_seq():
    """Run r ends (seq S0 + 4); its event 0 replayed after the end, within the max age, is
    refused, also read back from the stored marker; the run id started again by a publisher
    whose clock is past the old numbers is accepted."""
    store = Store()
    p = processor()
    events = spaced("r", 4, step_ms=1_000)
    ended = run_ended_event("r-end", run_id="r", session_key="s-r", agent_id="main", ts_ms=T0 + 4_000)
    records = as_made(numbered([*events, ended]))
    assert p.process(records, store.read).events == 5
    store.checkpoint(p)
    marker = store.values[(0, b"run:r")]
    assert marker[0] == SEQS_ENVELOPE_VERSION
    assert seq_stamps(marker) == {event_digest("r"): S0 + 4}
    restarted = processor()
    replay = restarted.process([published(records[0], 5, T0 + 5_000)], store.read)
    assert [l.reason for l in replay.dead_letters] == ["replayed_event"]
    again = numbered(spaced("r", 2, step_ms=1_000), first=S0 + 10_000_000)
    fresh = restarted.process(as_made(again, start=6), store.read)
    assert (fresh.events, fresh.dead_letters) == (2, [])


def test_the_envelope_keeps_sequence_stamps_and_migrates_earlier_versions():
    """Version 6 round-trips the stamps in order next to source stamps and a candidate
    section; a version 3 or 5 envelope reads as none; at most MAX_SEQS are stored."""
    from streams.engine import RunState

    state = RunState()
    seqs = {b"a" * 8: 7, b"b" * 8: 2**53 - 1}
    value = pack_state(state, 41, 7000, b"\x01" * 8, "main", None, 0x80, {3: 9}, seqs)
    assert value[0] == SEQS_ENVELOPE_VERSION
    env = unpack_state(value)
    assert (env.offset, env.touched_ms, env.seen, env.owner, env.compared, env.sources, env.seqs) == (
        41,
        7000,
        b"\x01" * 8,
        "main",
        0x80,
        {3: 9},
        seqs,
    )
    assert list(env.seqs) == [b"a" * 8, b"b" * 8]
    assert unpack_state(pack_state(state, 41, 7000)).seqs is None  # version 3
    assert unpack_state(pack_state(state, 41, 7000, sources={1: 2})).seqs is None  # version 5
    assert unpack_state(pack_state(state, 41, 7000, seqs={b"c" * 8: 1})).sources is None

    p = processor()
    store = Store()
    # 70 runs of one event each share nothing: one stamp per run state, never more.
    for i in range(70):
        (e,) = numbered(spaced(f"r{i}", 1))
        p.process(as_made([e], start=i), store.read)
    store.checkpoint(p)
    assert all(len(seq_stamps(v)) == 1 for v in store.values.values())
    assert MAX_SEQS == 64


def test_under_session_scope_each_run_of_a_session_is_compared_with_its_own_highest_seq():
    """Runs a and b of session s, from two publishers whose numbers interleave: a has S0 + 10,
    S0 + 30, b has S0 + 5, S0 + 20 (its clock is behind a's).  Forwarded to the session's
    state and applied in the order a, b, a, b (the numbers go 10, 5, 30, 20): none is refused,
    each run is compared with its own highest.  b's next event numbered S0 + 20 again (not
    above b's highest) is refused; a's first record forwarded again from a new offset, within
    the id window, is still a duplicate."""
    from streams.app.records import Record as Rec

    topic = "app-sessions"
    config = {"tools": {"loopDetection": {"enabled": True}}, "loopwatch": {"scope": "session"}}
    p = BatchProcessor(engine_for(config), keyring=Keyring([MAIN]), signed_max_age_s=300)
    p.sessions_topic = topic

    def event(run: str, i: int, seq: int):
        (e,) = numbered(spaced(run, 1), first=seq)
        return msgspec.structs.replace(e, event_id=f"{run}-{i}", session_key="s", ts_ms=T0 + i)

    order = [event("a", 0, S0 + 10), event("b", 1, S0 + 5), event("a", 2, S0 + 30), event("b", 3, S0 + 20)]
    records = [
        Rec("tool-calls", 0, i, e.run_id.encode(), r.value, T0 + i, r.headers)
        for i, (e, r) in enumerate(zip(order, signed(order, MAIN), strict=True))
    ]
    store = Store()

    def hop(batch):
        forwards = p.process(batch, store.read).forwards
        return p.process(
            [Rec(topic, 0, 100 + r.offset, k, v, t, h) for r, (k, v, h, t) in zip(batch, forwards)], store.read
        )

    applied = hop(records)
    assert (applied.events, applied.dead_letters) == (4, [])
    store.checkpoint(p)
    assert seq_stamps(store.values[(0, b"scope:session:s|")]) == {
        event_digest("a"): S0 + 30,
        event_digest("b"): S0 + 20,
    }
    (late,) = signed([event("b", 4, S0 + 20)], MAIN)
    refused = hop([Rec("tool-calls", 0, 4, b"b", late.value, T0 + 4, late.headers)])
    assert [l.reason for l in refused.dead_letters] == ["replayed_event"]
    replayed = hop([Rec("tool-calls", 0, 5, b"a", records[0].value, T0 + 5, records[0].headers)])
    assert (replayed.events, replayed.duplicates, replayed.dead_letters) == (0, 1, [])
