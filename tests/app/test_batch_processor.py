"""The batch processor without Kafka: decoding, dead letters, grouping, idempotent replay."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
from prometheus_client import CollectorRegistry

from schemas import MAX_EVENT_BYTES, decode_verdict, encode_event
from schemas.events import MAX_SAFE_INT
from schemas.keys import record_key
from streams.app.metrics import Metrics
from streams.app.processor import BatchProcessor
from streams.app.records import Record
from streams.app.run_store import (
    HEADER_SIZE,
    Envelope,
    idle_since_ms,
    is_ended,
    pack_state,
    unpack_header,
    unpack_state,
)
from streams.edge.events import compaction_event, completed_event, requested_event, run_ended_event
from streams.engine import LoopEngine, RunState, encode_state, engine_for, state_key

CONFIG = {"tools": {"loopDetection": {"enabled": True}}}
LIVE_ENFORCE = {"config": "live", "mode": "enforce"}


def engine() -> LoopEngine:
    return engine_for(CONFIG)


class Store(dict):
    """(partition, key) -> envelope, with the Faust layer's write semantics."""

    def read(self, partition: int, key: bytes):
        return self.get((partition, key))

    def apply(self, checkpoint) -> None:
        for pk, value in checkpoint.writes.items():
            if value is None:
                self.pop(pk, None)
            else:
                self[pk] = value


def records(events, partition=0, start=0, topic="tool-calls"):
    """Records as a runner publishes them: keyed by run id (raw values: key b"k")."""
    out = []
    for i, event in enumerate(events):
        raw = isinstance(event, (bytes, type(None)))
        value = event if raw else encode_event(event)
        out.append(
            Record(
                topic,
                partition,
                start + i,
                b"k" if raw else record_key(event).encode("utf-8", "surrogatepass"),
                value,
                1.0,
            )
        )
    return out


def repeat_run(n: int, run_id="r1", gate=True, result="same"):
    events = []
    for i in range(n):
        events.append(
            requested_event(
                f"{run_id}-{i}q", "read", {"path": "/a"}, run_id=run_id, session_key="s", gate=gate, ts_ms=1000 + i
            )
        )
        events.append(
            completed_event(
                f"{run_id}-{i}c", "read", {"path": "/a"}, result=result, run_id=run_id, session_key="s", ts_ms=1000 + i
            )
        )
    return events


def reference(events, config=CONFIG):
    """What the engine alone publishes for these events."""
    eng = engine_for(config)
    states: dict = {}
    out = []
    for event in events:
        key = state_key(event)
        step = eng.handle(states.get(key), event, validated=True)
        states[key] = step.state
        if step.decision is not None and (event.gate or step.decision.action != "allow"):
            out.append(step.decision)
        if step.abort is not None:
            out.append(step.abort)
    return out


def test_verdicts_match_the_engine_and_gate_rules():
    events = repeat_run(21) + repeat_run(12, run_id="quiet", gate=False)
    p = BatchProcessor(engine())
    store = Store()
    result = p.process(records(events), store.read)
    got = [decode_verdict(v.value) for v in result.verdicts]
    assert got == reference(events)
    block = [v for v in got if v.run_id == "r1"][-1]
    assert (block.action, block.detector, block.count) == ("block", "generic_repeat", 20)
    # non-gate run: only its emitted warning is published, not its allows
    quiet = [v for v in got if v.run_id == "quiet"]
    assert quiet and all(v.action != "allow" for v in quiet)
    assert {v.key for v in result.verdicts} == {b"run:r1", b"run:quiet"}
    assert all(v.partition == 0 for v in result.verdicts)


def test_one_write_per_run_per_checkpoint_and_split_batches_agree():
    events = repeat_run(15) + repeat_run(15, run_id="r2")
    whole = BatchProcessor(engine())
    s1 = Store()
    r = whole.process(records(events), s1.read)
    assert r.events == len(events) and r.runs == 2
    cp = whole.runs.checkpoint()
    assert set(cp.writes) == {(0, b"run:r1"), (0, b"run:r2")}
    assert cp.created == 2 and cp.deleted == 0
    s1.apply(cp)
    assert whole.runs.dirty == 0 and whole.runs.checkpoint().writes == {}
    # the same events in batches of 7, checkpointed every other batch, give the same
    # verdicts and the same final states
    split = BatchProcessor(engine())
    s2 = Store()
    got = []
    recs = records(events)
    for n, i in enumerate(range(0, len(recs), 7)):
        res = split.process(recs[i : i + 7], s2.read)
        got += [v.value for v in res.verdicts]
        if n % 2:
            s2.apply(split.runs.checkpoint())
    s2.apply(split.runs.checkpoint())
    assert got == [v.value for v in r.verdicts]
    for pk in s1:
        assert unpack_state(s1[pk]).state == unpack_state(s2[pk]).state


def test_a_run_is_encoded_once_per_checkpoint(monkeypatch):
    import streams.app.run_store as run_store

    calls = []
    real = run_store.pack_state
    monkeypatch.setattr(run_store, "pack_state", lambda *a: calls.append(1) or real(*a))
    p = BatchProcessor(engine())
    recs = records(repeat_run(10))
    for i in range(0, len(recs), 2):
        p.process(recs[i : i + 2], Store().read)
    assert calls == []
    assert len(p.runs.checkpoint().writes) == 1 and calls == [1]


def test_redelivered_events_are_not_applied_twice():
    events = repeat_run(21)
    recs = records(events)
    p = BatchProcessor(engine())
    store = Store()
    first = p.process(recs[:30], store.read)
    store.apply(p.runs.checkpoint())
    # a crash after the checkpoint's state write, before the offset commit: 20..41 come again
    fresh = BatchProcessor(engine())
    again = fresh.process(recs[20:], store.read)
    store.apply(fresh.runs.checkpoint())
    assert again.skipped == 10
    published = [decode_verdict(v.value) for v in first.verdicts + again.verdicts]
    assert published == reference(events)
    # a batch that is entirely old publishes nothing, and its run is re-written at the next
    # checkpoint (changelog repair) unchanged
    old = fresh.process(recs[:5], store.read)
    assert old.verdicts == [] and old.skipped == 5
    before = unpack_state(store[(0, b"run:r1")])
    again_cp = fresh.runs.checkpoint()
    assert set(again_cp.writes) == {(0, b"run:r1")}
    after = unpack_state(again_cp.writes[(0, b"run:r1")])
    assert (after.offset, after.state) == (before.offset, before.state)


def test_replay_after_a_lost_checkpoint_gives_the_same_verdict_ids_and_content():
    events = repeat_run(21)
    recs = records(events)
    p = BatchProcessor(engine())
    store = Store()
    p.process(recs[:20], store.read)
    store.apply(p.runs.checkpoint())
    lost = p.process(recs[20:], store.read)  # verdicts published, then a crash: no checkpoint
    replay = BatchProcessor(engine()).process(recs[20:], store.read)
    assert [v.value for v in replay.verdicts] == [v.value for v in lost.verdicts]


def test_run_ended_keeps_only_its_marker():
    events = repeat_run(3) + [run_ended_event("end", run_id="r1", session_key="s")]
    p = BatchProcessor(engine())
    store = Store()
    p.process(records(events[:6]), store.read)
    store.apply(p.runs.checkpoint())
    assert (0, b"run:r1") in store
    p.process(records(events[6:], start=6), store.read)
    cp = p.runs.checkpoint()
    # the state gives way to the 21-byte marker: version 3, the run.ended's offset (6), the
    # write time, no digests, no owner, no state
    marker = cp.writes[(0, b"run:r1")]
    assert len(marker) == HEADER_SIZE and marker[0] == 3 and unpack_header(marker)[0] == 6, marker
    assert is_ended(marker) and unpack_state(marker).state is None
    assert list(cp.writes) == [(0, b"run:r1")] and cp.deleted == 1 and cp.created == 0
    # a run that starts and ends between two checkpoints writes its marker and counts no run
    q = BatchProcessor(engine())
    q.process(records(events), Store().read)
    cp = q.runs.checkpoint()
    assert [unpack_header(v)[0] for v in cp.writes.values()] == [6] and cp.created == 0 and cp.deleted == 0


def test_an_ended_run_redelivered_from_before_its_end_publishes_nothing_again():
    """The changelog ahead of the committed offsets (issue 26: a checkpoint's changelog records
    were accepted, its commit was not): the ended run's events come again from offset 2.  With
    the state deleted they were applied to an empty history: calls 1 and 2 were decided again as
    the first calls of a new run and published under their ids again (in a loop past its
    warning, with other content: docs/reliability.md); the marker skips them."""
    events = repeat_run(3) + [run_ended_event("end", run_id="r1", session_key="s")]
    recs = records(events)
    p = BatchProcessor(engine())
    store = Store()
    first = p.process(recs, store.read)
    store.apply(p.runs.checkpoint())
    again = BatchProcessor(engine()).process(recs[2:], store.read)  # another worker, same store
    assert first.verdicts and again.verdicts == [] and again.skipped == 5
    # the run id used again after its end (a later offset) starts a new run
    later = BatchProcessor(engine()).process(records(repeat_run(1), start=7), store.read)
    assert [decode_verdict(v.value).action for v in later.verdicts] == ["allow"]


def test_runs_are_grouped_per_partition():
    e1 = requested_event("a", "read", {}, run_id="r", session_key="s", gate=True)
    e2 = requested_event("b", "read", {}, run_id="r", session_key="s", gate=True)
    recs = records([e1], partition=0) + records([e2], partition=3)
    p = BatchProcessor(engine())
    r = p.process(recs, Store().read)
    assert set(p.runs.checkpoint().writes) == {(0, b"run:r"), (3, b"run:r")}
    assert [v.partition for v in r.verdicts] == [0, 3]


HOSTILE = [
    (b"{not json", "invalid_json"),
    (None, "invalid_json"),
    (
        json.dumps(
            {
                "type": "tool_call.requested",
                "event_id": 5,
                "run_id": "r",
                "tool_name": "read",
                "args_hash": "read:" + "0" * 64,
            }
        ).encode(),
        "invalid_event",
    ),
    (json.dumps({"type": "tool_call.teleported", "event_id": "x", "run_id": "r"}).encode(), "unknown_type"),
    (json.dumps({"event_id": "x", "run_id": "r"}).encode(), "unknown_type"),
    (json.dumps({"type": "run.ended", "event_id": "x"}).encode(), "missing_key"),
    (
        json.dumps({"type": "run.ended", "event_id": "x", "run_id": "r", "reason": "x" * MAX_EVENT_BYTES}).encode(),
        "oversized",
    ),
    (
        json.dumps(
            {
                "type": "tool_call.requested",
                "event_id": "x",
                "run_id": "r",
                "tool_name": "read",
                "args_hash": "exec:" + "0" * 64,
            }
        ).encode(),
        "invalid_event",
    ),
    # issue 13: past a schema bound, an unknown version, nesting deeper than the decoder goes
    (
        json.dumps(
            {
                "type": "tool_call.requested",
                "event_id": "x",
                "run_id": "r",
                "tool_name": "read",
                "args_hash": "read:" + "0" * 64,
                "ts_ms": 2**63,
            }
        ).encode(),
        "invalid_event",
    ),
    (json.dumps({"type": "run.ended", "v": 2, "event_id": "x", "run_id": "r"}).encode(), "unsupported_version"),
    (json.dumps({"type": "run.ended", "v": -5, "event_id": "x", "run_id": "r"}).encode(), "unsupported_version"),
    (
        b'{"x": ' + b"[" * 30000 + b"]" * 30000 + b', "type": "run.ended", "event_id": "x", "run_id": "r"}',
        "invalid_json",
    ),
]


@pytest.mark.parametrize("value, reason", HOSTILE)
def test_bad_records_become_dead_letters(value, reason):
    good = requested_event("ok", "read", {}, run_id="r", session_key="s", gate=True)
    recs = records([value, good])
    registry = CollectorRegistry()
    p = BatchProcessor(engine(), Metrics(registry, process_metrics=False))
    r = p.process(recs, Store().read)
    assert [(d.record.offset, d.reason) for d in r.dead_letters] == [(0, reason)]
    assert r.dead_letters[0].detail and "\n" not in r.dead_letters[0].detail
    assert len(r.verdicts) == 1  # the good record still gets its answer
    assert registry.get_sample_value("loopwatch_dead_letters_total", {"reason": reason}) == 1


class Exploding(LoopEngine):
    def handle(self, state, event, validated=False):
        if event.event_id == "r1-3q":
            if state is not None:
                state.critical_blocks += 100  # damage the state before failing
            raise RuntimeError("boom")
        return super().handle(state, event, validated=validated)


@pytest.mark.parametrize("checkpoint", ["none", "written", "in_progress"])
def test_engine_errors_dead_letter_the_record_and_keep_the_state_clean(checkpoint):
    events = repeat_run(6)
    registry = CollectorRegistry()
    p = BatchProcessor(Exploding(CONFIG), Metrics(registry, process_metrics=False))
    store = Store()
    recs = records(events)
    # earlier events of the run are applied in a previous batch (checkpointed, being
    # checkpointed while the failing batch runs, or not)
    first = p.process(recs[:3], store.read)
    if checkpoint == "written":
        store.apply(p.runs.checkpoint())
    elif checkpoint == "in_progress":
        p.runs.begin_checkpoint()
    r = p.process(recs[3:], store.read)
    if checkpoint == "in_progress":
        cp = p.runs.end_checkpoint()
        # the checkpoint holds the first batch's effect, undamaged by the failing one
        assert unpack_state(cp.writes[(0, b"run:r1")]).offset == 2
        assert unpack_state(cp.writes[(0, b"run:r1")]).state.critical_blocks == 0
        store.apply(cp)
        p.runs.checkpoint_written()
    assert [(d.record.offset, d.reason) for d in r.dead_letters] == [(6, "processing_error")]
    assert "boom" in r.dead_letters[0].detail
    assert registry.get_sample_value("loopwatch_processing_errors_total", {"stage": "engine"}) == 1
    store.apply(p.runs.checkpoint())
    expected = [e for e in events if e.event_id != "r1-3q"]
    ref_state = None
    eng = engine()
    for e in expected:
        ref_state = eng.handle(ref_state, e, validated=True).state
    assert unpack_state(store[(0, b"run:r1")]).state == ref_state
    assert [decode_verdict(v.value) for v in first.verdicts + r.verdicts] == reference(expected)


def test_unreadable_stored_state_starts_the_run_afresh():
    registry = CollectorRegistry()
    p = BatchProcessor(engine(), Metrics(registry, process_metrics=False))
    store = Store({(0, b"run:r1"): b"\x07garbage"})
    r = p.process(records(repeat_run(1)), store.read)
    assert len(r.verdicts) == 1 and not r.dead_letters
    assert registry.get_sample_value("loopwatch_processing_errors_total", {"stage": "state_decode"}) == 1


def test_state_cache_is_only_used_while_the_store_agrees():
    events = repeat_run(21)
    recs = records(events)
    p = BatchProcessor(engine())
    store = Store()
    p.process(recs[:20], store.read)
    store.apply(p.runs.checkpoint())
    # someone else (another worker, a sweep) replaced the stored state: the cache must not win
    store[(0, b"run:r1")] = pack_state(RunState(run_id="r1"), 19, 1)
    r = p.process(recs[20:], store.read)
    assert [decode_verdict(v.value) for v in r.verdicts] == reference(events[20:])


def test_envelope_round_trip():
    st = (
        engine()
        .handle(None, requested_event("a", "read", {}, run_id="r", session_key="s", ts_ms=5000), validated=True)
        .state
    )
    seen = bytes(range(16))  # two 8-byte digests
    value = pack_state(st, offset=41, touched_ms=7000, seen=seen, owner="agent-\u00e9")
    assert unpack_header(value) == (41, 7000)
    assert idle_since_ms(value) == 7000
    env = unpack_state(value)
    assert (env.offset, env.touched_ms, env.seen, env.state, env.owner) == (41, 7000, seen, st, "agent-\u00e9")
    assert len(value) == HEADER_SIZE + 16 + len("agent-\u00e9".encode()) + len(encode_state(st))
    assert unpack_state(pack_state(st, 41, 7000)).owner is None
    with pytest.raises(ValueError):
        unpack_header(b"\x07" + value[1:])  # (4: a candidate section; 5: source stamps; 6: sequence stamps)


def test_version_2_envelopes_are_still_read():
    # Written before run owners (header: version 2, offset, touched_ms, digest count).
    st = (
        engine()
        .handle(None, requested_event("a", "read", {}, run_id="r1", session_key="s", ts_ms=5000), validated=True)
        .state
    )
    seen = bytes(range(8))
    old = struct.pack(">BqqH", 2, 41, 7000, 1) + seen + encode_state(st)
    env = unpack_state(old)
    assert (env.offset, env.touched_ms, env.seen, env.state, env.owner) == (41, 7000, seen, st, None)


def test_version_1_envelopes_are_still_read():
    # Written by the worker before event-id digests (header: version 1, offset, touched_ms,
    # last event ms, as big-endian signed 64-bit integers); changelogs still hold them.
    st = (
        engine()
        .handle(None, requested_event("a", "read", {}, run_id="r1", session_key="s", ts_ms=5000), validated=True)
        .state
    )
    old = struct.pack(">Bqqq", 1, 41, 7000, 5000) + encode_state(st)
    env = unpack_state(old)
    assert (env.offset, env.touched_ms, env.seen, env.state) == (41, 7000, b"", st)
    assert idle_since_ms(old) == 7000
    p = BatchProcessor(engine())
    store = Store({(0, b"run:r1"): old})
    later = requested_event("b", "read", {}, run_id="r1", session_key="s", ts_ms=6000)
    p.process(records([later], start=42), store.read)
    assert len(unpack_state(p.runs.checkpoint().writes[(0, b"run:r1")]).state) == 2


def test_metrics_follow_the_contract():
    registry = CollectorRegistry()
    m = Metrics(registry, process_metrics=False)
    p = BatchProcessor(engine(), m)
    events = repeat_run(21) + [compaction_event("c", run_id="r1", session_key="s")]
    r = p.process(records(events), Store().read)
    g = registry.get_sample_value
    assert g("loopwatch_events_consumed_total", {"type": "tool_call.requested"}) == 21
    assert g("loopwatch_events_consumed_total", {"type": "tool_call.completed"}) == 21
    assert g("loopwatch_events_consumed_total", {"type": "compaction.retried"}) == 1
    assert (
        g("loopwatch_decisions_total", {"detector": "none", "level": "none", "action": "allow", **LIVE_ENFORCE}) == 10
    )
    assert (
        g(
            "loopwatch_decisions_total",
            {"detector": "generic_repeat", "level": "critical", "action": "block", **LIVE_ENFORCE},
        )
        == 1
    )
    assert (
        g(
            "loopwatch_loop_detections_total",
            {"detector": "generic_repeat", "level": "critical", "tool": "read", **LIVE_ENFORCE},
        )
        == 1
    )
    assert g("loopwatch_guard_armings_total") == 1
    warn = g(
        "loopwatch_decisions_total",
        {"detector": "generic_repeat", "level": "warning", "action": "warn", **LIVE_ENFORCE},
    )
    suppressed = g("loopwatch_warnings_suppressed_total", {"detector": "generic_repeat", **LIVE_ENFORCE})
    assert warn == 1 and suppressed == 9
    p.observe_latency(r.verdicts, now=2.0)
    assert g("loopwatch_decision_latency_seconds_count") == 21


def test_an_allow_nobody_waits_for_is_counted_but_not_published():
    # The same run as above without gate: the decision counts are the same (10 plain allows,
    # 9 warnings the bucket rule hid, 1 warning shown, 1 block), but only the warning and the
    # block are published.
    registry = CollectorRegistry()
    p = BatchProcessor(engine(), Metrics(registry, process_metrics=False))
    r = p.process(records(repeat_run(21, gate=False)), Store().read)
    g = registry.get_sample_value
    assert (
        g("loopwatch_decisions_total", {"detector": "none", "level": "none", "action": "allow", **LIVE_ENFORCE}) == 10
    )
    assert (
        g(
            "loopwatch_decisions_total",
            {"detector": "generic_repeat", "level": "warning", "action": "allow", **LIVE_ENFORCE},
        )
        == 9
    )
    assert (
        g(
            "loopwatch_decisions_total",
            {"detector": "generic_repeat", "level": "warning", "action": "warn", **LIVE_ENFORCE},
        )
        == 1
    )
    assert (
        g(
            "loopwatch_decisions_total",
            {"detector": "generic_repeat", "level": "critical", "action": "block", **LIVE_ENFORCE},
        )
        == 1
    )
    assert g("loopwatch_warnings_suppressed_total", {"detector": "generic_repeat", **LIVE_ENFORCE}) == 9
    assert (
        g(
            "loopwatch_loop_detections_total",
            {"detector": "generic_repeat", "level": "warning", "tool": "read", **LIVE_ENFORCE},
        )
        == 10
    )
    assert [decode_verdict(v.value).action for v in r.verdicts] == ["warn", "block"]


def test_tool_label_is_capped():
    m = Metrics(CollectorRegistry(), process_metrics=False)
    labels = [m.tool_label(f"tool{i}") for i in range(250)]
    assert labels[:200] == [f"tool{i}" for i in range(200)]
    assert set(labels[200:]) == {"other"}
    assert m.tool_label("tool5") == "tool5"


def test_engine_log_lines_go_to_python_logging(caplog):
    p = BatchProcessor(engine())
    with caplog.at_level("INFO", logger="loopwatch"):
        p.process(records(repeat_run(21)), Store().read)
    names = {(r.name, r.levelname) for r in caplog.records}
    assert ("loopwatch.agents/tools", "ERROR") in names
    assert ("loopwatch.agents/loop-detection", "WARNING") in names


def test_batches_during_an_incremental_checkpoint_do_not_leak_into_it():
    events = repeat_run(10) + repeat_run(10, run_id="r2")
    recs = records(events)
    first, second = recs[:20], recs[20:]  # r1 entirely, then r2 entirely
    p = BatchProcessor(engine())
    store = Store()
    p.process(recs[:12], store.read)  # r1 calls 0..5 (of 10)
    p.runs.begin_checkpoint()
    assert p.runs.is_dirty(0, b"run:r1")
    # a batch arrives before r1 was encoded: r1 is copied first, then changed
    p.process(first[12:] + second, store.read)
    assert p.runs.encode_some(1)
    cp = p.runs.end_checkpoint()
    assert set(cp.writes) == {(0, b"run:r1")}
    assert unpack_state(cp.writes[(0, b"run:r1")]).offset == 11
    # until written, reads of r1 come from the checkpoint, not the (stale) store
    p.process([], store.read)
    store.apply(cp)
    p.runs.checkpoint_written()
    store.apply(p.runs.checkpoint())
    whole = BatchProcessor(engine())
    ref = Store()
    whole.process(recs, ref.read)
    ref.apply(whole.runs.checkpoint())
    assert store.keys() == ref.keys()
    for pk in ref:
        assert unpack_state(store[pk]).state == unpack_state(ref[pk]).state
        assert unpack_state(store[pk]).offset == unpack_state(ref[pk]).offset


def test_a_batch_copies_a_run_of_the_checkpoint_in_progress_instead_of_encoding_it(monkeypatch):
    # Encoding is the checkpoint task's work: done inside the batches that touched frozen
    # runs, it landed on the decisions made during a checkpoint.
    import streams.app.run_store as run_store

    calls = []
    real = run_store.pack_state
    monkeypatch.setattr(run_store, "pack_state", lambda *a: calls.append(a[1]) or real(*a))
    recs = records(repeat_run(10) + repeat_run(3, run_id="r2"))
    p = BatchProcessor(engine())
    store = Store()
    p.process(recs[:6] + recs[20:], store.read)  # r1 calls 0..2, all of r2
    p.runs.begin_checkpoint()
    p.process(recs[6:14] + [run_ended_record(recs, "r2")], store.read)  # r1 goes on, r2 ends
    assert calls == []  # nothing encoded by the batch
    cp = p.runs.end_checkpoint()
    assert sorted(calls) == [5, 25]  # each run as the checkpoint froze it, once
    assert unpack_state(cp.writes[(0, b"run:r1")]).offset == 5
    assert len(unpack_state(cp.writes[(0, b"run:r1")]).state) == 3
    assert len(unpack_state(cp.writes[(0, b"run:r2")]).state) == 3
    assert cp.created == 2
    store.apply(cp)
    p.runs.checkpoint_written()
    cp = p.runs.checkpoint()
    ended = cp.writes[(0, b"run:r2")]  # its marker, at the run.ended's offset
    assert is_ended(ended) and unpack_header(ended)[0] == 26 and cp.deleted == 1 and cp.created == 0
    assert unpack_state(cp.writes[(0, b"run:r1")]).offset == 13
    assert len(unpack_state(cp.writes[(0, b"run:r1")]).state) == 7


def run_ended_record(recs, run_id):
    return Record(
        "tool-calls",
        0,
        recs[-1].offset + 1,
        run_id.encode(),
        encode_event(run_ended_event("end-" + run_id, run_id=run_id, session_key="s")),
        1.0,
    )


def test_a_run_touched_while_its_checkpoint_is_unwritten_reads_the_checkpoint():
    events = repeat_run(21)
    recs = records(events)
    p = BatchProcessor(engine())
    store = Store()
    p.process(recs[:20], store.read)
    p.runs.begin_checkpoint()
    p.runs.encode_some(None)
    cp = p.runs.end_checkpoint()
    # the store does not have cp yet; a batch for the same run must continue from cp
    r = p.process(recs[20:], store.read)
    assert [decode_verdict(v.value) for v in r.verdicts] == reference(events)[10:]
    store.apply(cp)
    p.runs.checkpoint_written()


# -- the Kafka key -------------------------------------------------------------------------------


def keyed(event, key, offset=0, partition=0):
    return Record("tool-calls", partition, offset, key, encode_event(event), 1.0)


@pytest.mark.parametrize(
    "fields, key",
    [
        ({"run_id": "r1", "session_key": "s"}, b"r1"),  # the README's key: the run id
        ({"run_id": "r1", "session_key": "s"}, b"run:r1"),  # the state key (verdicts' key)
        ({"run_id": " r1 ", "session_key": "s"}, b" r1 "),  # the run id as published
        ({"session_key": "agent:main:1"}, b"agent:main:1"),  # no run id: the session key
        ({"session_key": "agent:main:1", "session_id": "x"}, b"session:agent:main:1|"),  # its state key
        ({"session_id": "x"}, b"session:|x"),  # no run id or session key: its state key
        ({"session_id": "x"}, b"x"),  # neither: the session id
    ],
)
def test_accepted_kafka_keys(fields, key):
    event = requested_event("e1", "read", {}, gate=True, **fields)
    r = BatchProcessor(engine()).process([keyed(event, key)], Store().read)
    assert r.dead_letters == [] and len(r.verdicts) == 1


@pytest.mark.parametrize(
    "key, reason",
    [
        (None, "missing_key"),
        (b"", "missing_key"),
        (b"r2", "key_mismatch"),  # another run's id
        (b"R1", "key_mismatch"),
        (b"s", "key_mismatch"),  # the session key of an event that has a run id
        (b"run:r1 ", "key_mismatch"),
        (b"\xff\xfe", "key_mismatch"),
    ],
)
def test_a_record_keyed_otherwise_than_its_run_is_dead_lettered(key, reason):
    # A polling loop published without a key or with random keys spreads over partitions
    # and is never detected; such records must not be processed at all.
    registry = CollectorRegistry()
    p = BatchProcessor(engine(), Metrics(registry, process_metrics=False))
    event = requested_event("e1", "read", {}, run_id="r1", session_key="s", gate=True)
    r = p.process([keyed(event, key)], Store().read)
    assert [(d.reason, d.record.key) for d in r.dead_letters] == [(reason, key)]
    assert r.verdicts == [] and p.runs.dirty == 0
    assert registry.get_sample_value("loopwatch_dead_letters_total", {"reason": reason}) == 1


# -- retries: an event id is applied once -------------------------------------------------------

POLL = {"action": "poll", "sessionId": "s1"}
STILL_RUNNING = {"content": [{"type": "text", "text": "Process still running."}], "details": {"status": "running"}}


def polling_loop(n: int, run_id="poll"):
    """``n`` identical process polls with identical outcomes (a known poll, no progress)."""
    events = []
    for i in range(n):
        common = dict(
            run_id=run_id, session_key="agent:main:poll", agent_id="main", tool_call_id=f"c{i}", ts_ms=1000 + i
        )
        events.append(requested_event(f"{run_id}:{i}:req", "process", POLL, gate=True, **common))
        events.append(completed_event(f"{run_id}:{i}:done", "process", POLL, result=STILL_RUNNING, **common))
    return events


def first_warning(verdicts):
    """1-based number of the poll whose decision was the first warning."""
    for v in verdicts:
        decision = decode_verdict(v.value)
        if decision.action == "warn":
            assert (decision.detector, decision.count) == ("known_poll_no_progress", 10)
            return int(decision.verdict_id.split(":")[1]) + 1
    return None


def test_a_polling_loop_published_twice_warns_at_the_same_call_as_once():
    # Hand-worked from the spec (§2.10, §2.7 rule 4): the no-progress streak counts the
    # earlier identical outcomes; warningThreshold 10 is reached when ten polls have
    # completed, so the 11th poll warns with count 10.  Counted twice, five polls would
    # already make ten outcomes and the 6th poll would warn.
    events = polling_loop(15)
    once = BatchProcessor(engine()).process(records(events), Store().read)
    assert first_warning(once.verdicts) == 11
    twice = [e for e in events for _copy in (1, 2)]
    registry = CollectorRegistry()
    p = BatchProcessor(engine(), Metrics(registry, process_metrics=False))
    r = p.process(records(twice), Store().read)
    assert first_warning(r.verdicts) == 11
    assert r.duplicates == len(events)
    assert [v.value for v in r.verdicts] == [v.value for v in once.verdicts]
    assert registry.get_sample_value("loopwatch_duplicate_events_total") == len(events)


def test_event_ids_are_remembered_across_checkpoints_and_restarts():
    events = polling_loop(15)
    recs = records([e for e in events for _copy in (1, 2)])
    store = Store()
    p = BatchProcessor(engine())
    first = p.process(recs[:9], store.read)  # ... up to the first copy of poll 3's request
    store.apply(p.runs.checkpoint())
    # A new worker (nothing cached), reading only the stored state: poll 3's request comes
    # again in the next batch, and every later duplicate too.
    restarted = BatchProcessor(engine())
    rest = restarted.process(recs[9:], store.read)
    assert rest.duplicates == len(events) - 4 - 1 + 1  # 4 duplicates fell in the first batch
    assert first_warning(first.verdicts + rest.verdicts) == 11


def test_the_remembered_ids_are_bounded_per_run():
    from streams.engine.intake import SEEN_EVENT_IDS, event_digest

    events = repeat_run(SEEN_EVENT_IDS, gate=False)  # 2 x 64 events
    p = BatchProcessor(engine())
    store = Store()
    p.process(records(events), store.read)
    store.apply(p.runs.checkpoint())
    envelope = unpack_state(store[(0, b"run:r1")])
    assert len(envelope.seen) == SEEN_EVENT_IDS * 8
    # The last 64 ids, oldest first, each as its 8-byte BLAKE2b (the stored format the
    # backtest's event_digest and earlier workers' states share).
    assert envelope.seen == b"".join(
        hashlib.blake2b(e.event_id.encode(), digest_size=8).digest() for e in events[-SEEN_EVENT_IDS:]
    )
    assert envelope.seen[:8] == event_digest(events[-SEEN_EVENT_IDS].event_id)
    # The oldest ids are forgotten: a very late copy of the first event counts again, a
    # copy of a recent one does not.
    late = p.process(records([events[0], events[-1]], start=len(events)), store.read)
    assert late.duplicates == 1


def test_an_ended_run_forgets_its_ids_with_its_state():
    events = repeat_run(2) + [run_ended_event("end", run_id="r1", session_key="s")]
    p = BatchProcessor(engine())
    store = Store()
    p.process(records(events), store.read)
    store.apply(p.runs.checkpoint())
    [marker] = store.values()  # the marker keeps the offset stamp only: no ids, no owner
    assert unpack_state(marker) == Envelope(offset=4, touched_ms=unpack_header(marker)[1], seen=b"", state=None)
    # the same event id at a later offset (a runner's retry) is a new run's event again
    retry = p.process(records(events[:1], start=5), store.read)
    assert retry.duplicates == 0 and retry.events == 1


# -- event time: the worker's clock decides ------------------------------------------------------


def test_event_times_far_ahead_of_the_worker_are_clamped_to_its_clock():
    registry = CollectorRegistry()
    p = BatchProcessor(engine(), Metrics(registry, process_metrics=False), clock=lambda: 1_000_000.0, clock_skew_s=60)
    now_ms = 1_000_000_000
    times = [MAX_SAFE_INT, now_ms + 60_001, now_ms + 60_000, 5, 0]
    events = [
        requested_event(f"e{i}", "read", {"i": i}, run_id="r1", session_key="s", gate=True, ts_ms=t)
        for i, t in enumerate(times)
    ]
    r = p.process(records(events), Store().read)
    assert [decode_verdict(v.value).ts_ms for v in r.verdicts] == [now_ms, now_ms, now_ms + 60_000, 5, 0]
    assert r.clamped == 2
    assert registry.get_sample_value("loopwatch_event_time_clamped_total") == 2
    state = unpack_state(p.runs.checkpoint().writes[(0, b"run:r1")]).state
    assert state.last_event_ms == now_ms + 60_000


def test_a_run_stamped_in_the_far_future_is_idle_by_the_worker_clock():
    # Expiry reads only when the worker last wrote the run, never its event times; and
    # with clamping off, the largest time the schema takes is stored as it is.
    p = BatchProcessor(engine(), clock=lambda: 1_000.0, clock_skew_s=None)
    event = requested_event("e", "read", {}, run_id="r1", session_key="s", ts_ms=MAX_SAFE_INT)
    p.process(records([event]), Store().read)
    value = p.runs.checkpoint().writes[(0, b"run:r1")]
    assert idle_since_ms(value) == 1_000_000
    assert unpack_state(value).state.last_event_ms == MAX_SAFE_INT


@pytest.mark.parametrize("ts", [2**53, 2**63, 2**70])
def test_an_event_time_beyond_the_schema_is_dead_lettered_and_the_checkpoint_goes_on(ts):
    # ts_ms = 2^63 once passed the schema and stopped every checkpoint (the envelope packed
    # the event time as a signed 64-bit integer); the schema now stops it at 2^53 - 1.
    value = (
        b'{"type": "tool_call.requested", "event_id": "e", "run_id": "r1", "session_key": "s", '
        b'"tool_name": "read", "args_hash": "read:' + b"0" * 64 + b'", "ts_ms": ' + str(ts).encode() + b"}"
    )
    record = Record("tool-calls", 0, 0, b"r1", value, 1.0)
    p = BatchProcessor(engine(), clock_skew_s=None)
    other = records([requested_event("f", "read", {}, run_id="r2", session_key="s", gate=True)], start=1)
    r = p.process([record] + other, Store().read)
    assert [(d.reason, d.record.offset) for d in r.dead_letters] == [("invalid_event", 0)]
    assert len(r.verdicts) == 1
    cp = p.runs.checkpoint()  # must not raise
    assert (0, b"run:r1") not in cp.writes and (0, b"run:r2") in cp.writes


def test_a_state_that_cannot_be_packed_drops_the_run_instead_of_stopping_the_checkpoint(monkeypatch, caplog):
    import streams.app.run_store as run_store

    real = run_store.encode_state

    def encode(state):
        if state.run_id == "bad":
            raise OverflowError("int too large to convert")
        return real(state)

    store = Store({(0, b"run:bad"): pack_state(RunState(run_id="bad"), 0, 1)})
    monkeypatch.setattr(run_store, "encode_state", encode)
    registry = CollectorRegistry()
    p = BatchProcessor(engine(), Metrics(registry, process_metrics=False))
    events = [requested_event(f"{run}-1", "read", {}, run_id=run, session_key="s") for run in ("bad", "good")]
    p.process(records(events, start=1), store.read)
    cp = p.runs.checkpoint()  # must not raise
    assert cp.writes[(0, b"run:bad")] is None and cp.deleted == 1  # the stored state goes too
    assert unpack_state(cp.writes[(0, b"run:good")]).offset == 2
    assert registry.get_sample_value("loopwatch_processing_errors_total", {"stage": "state_encode"}) == 1
    assert any("cannot store the state of b'run:bad'" in r.getMessage() for r in caplog.records)


def test_a_state_over_the_size_limit_keeps_its_newest_history():
    from streams.app.run_store import MAX_STATE_BYTES

    # historySize 1000 (the config's upper bound) of calls with 512-character ids of 4-byte
    # characters: 2 KiB a record, twice the limit.  Only such hostile ids get there.
    config = {"tools": {"loopDetection": {"enabled": True, "historySize": 1000}}}
    long_id = "\U0001f600" * 511
    events = [
        requested_event(f"e{i}", "read", {"i": i}, run_id="r1", session_key="s", tool_call_id=f"{long_id}{i % 10}")
        for i in range(1000)
    ]
    registry = CollectorRegistry()
    p = BatchProcessor(engine_for(config), Metrics(registry, process_metrics=False))
    p.process(records(events), Store().read)
    value = p.runs.checkpoint().writes[(0, b"run:r1")]
    assert len(value) <= MAX_STATE_BYTES
    state = unpack_state(value).state
    assert 0 < len(state) < 1000
    assert state.call_ids[-1] == f"{long_id}9"  # the newest records are the ones kept
    assert registry.get_sample_value("loopwatch_state_trimmed_total") == 1


# -- dead letters are cut to fit the dead-letter topic ------------------------------------------


def test_dead_letters_larger_than_the_limit_are_cut_with_their_sizes_in_headers():
    from streams.app.output import dead_letter_record
    from streams.app.records import DeadLetter

    big = Record("tool-calls", 3, 77, b"k" * 10, b"v" * 2_500_000, 1700000000000)
    key, value, headers = dead_letter_record(DeadLetter(big, "oversized", "record is 2500000 bytes"), 1024)
    h = dict(headers)
    assert (key, value) == (b"k" * 10, b"v" * 1024)
    assert h["loopwatch.truncated"] == b"value" and h["loopwatch.source.value_bytes"] == b"2500000"
    assert "loopwatch.source.key_bytes" not in h
    assert (h["loopwatch.reason"], h["loopwatch.source.partition"], h["loopwatch.source.offset"]) == (
        b"oversized",
        b"3",
        b"77",
    )
    key, value, headers = dead_letter_record(DeadLetter(big, "oversized", "x"), 0)  # headers only
    assert (key, value, dict(headers)["loopwatch.truncated"]) == (b"", b"", b"key,value")
    small = Record("tool-calls", 0, 1, None, b"{bad", None)
    key, value, headers = dead_letter_record(DeadLetter(small, "invalid_json", "x"), 1024)
    assert (key, value) == (None, b"{bad") and "loopwatch.truncated" not in dict(headers)


def test_the_processor_loads_no_kafka_client():
    # The per-batch logic (and the checkpoint's runs and the envelope it uses) does no I/O:
    # importing it loads neither Faust nor aiokafka.
    import subprocess
    import sys

    code = "import sys, streams.app.processor; print(sorted({'aiokafka', 'faust', 'mode'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
