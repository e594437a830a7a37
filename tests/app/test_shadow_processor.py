"""Shadow mode and the candidate config in the batch processor, without Kafka (issue 16).

Expected verdicts are hand-worked from upstream's rules (spec §2.7, §2.10: an identical call
counts the identical calls before it; a warning at ``warningThreshold``, shown only when
``count // 10`` reaches a new high for its key; a block at ``criticalThreshold``, and a
blocked call is not recorded, so the count stays) and, for whole runs, the engine driven
directly with each config (``reference``).
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from test_batch_processor import Store, records, reference

from schemas import decode_verdict
from streams.app.metrics import Metrics
from streams.app.processor import BatchProcessor
from streams.app.run_store import COMPARED_FROM_START, unpack_state
from streams.edge.events import completed_event, requested_event, run_ended_event
from streams.engine import RunDriver, engine_for

LIVE = {"tools": {"loopDetection": {"enabled": True}}}
STRICT = {"tools": {"loopDetection": {"enabled": True, "warningThreshold": 5, "criticalThreshold": 8}}}
"""The candidate of these tests: its warnings (counts 5-9) are all hidden by the bucket rule
(count // 10 is 0), and the 9th identical call is blocked (count 8)."""


def repeat(run_id: str, n: int, *, agent: str = "main", gate: bool = True, end: bool = False, start: int = 0):
    """``n`` identical reads of one run, each completed with the same result."""
    fields = dict(run_id=run_id, session_key=f"s-{run_id}", agent_id=agent)
    events = []
    for i in range(start, start + n):
        events.append(
            requested_event(
                f"{run_id}-{i}q", "read", {"p": 1}, tool_call_id=f"c{i}", gate=gate, ts_ms=1000 + i, **fields
            )
        )
        events.append(
            completed_event(
                f"{run_id}-{i}c", "read", {"p": 1}, result="same", tool_call_id=f"c{i}", ts_ms=1000 + i, **fields
            )
        )
    if end:
        events.append(run_ended_event(f"{run_id}-end", reason="completed", ts_ms=2000, **fields))
    return events


def actions(verdicts, run_id=None):
    """Each verdict's action, ``abort`` for an abort."""
    return [
        getattr(v, "action", "abort")
        for v in map(decode_verdict, (o.value for o in verdicts))
        if run_id is None or v.run_id == run_id
    ]


def changed_runs(registry) -> float:
    """All of loopwatch_candidate_outcome_changes_total."""
    return sum(
        s.value
        for metric in registry.collect()
        if metric.name == "loopwatch_candidate_outcome_changes"
        for s in metric.samples
        if s.name.endswith("_total")
    )


def shadow_config(agent: str = "trial", root=LIVE) -> dict:
    return {**root, "agents": {"list": [{"id": agent, "loopwatch": {"mode": "shadow"}}]}}


# -- shadow mode -------------------------------------------------------------------------------


def test_a_shadow_agents_runner_gets_only_allows_and_the_shadow_topic_gets_its_verdicts():
    config = shadow_config()
    p = BatchProcessor(engine_for(config))
    events = repeat("t", 21, agent="trial") + repeat("m", 21, agent="main")
    r = p.process(records(events), Store().read)
    # The enforce agent: call 11 warns (count 10), call 21 blocks (count 20), every other call
    # of a gated run gets an allow.
    assert actions(r.verdicts, "m") == ["allow"] * 10 + ["warn"] + ["allow"] * 9 + ["block"]
    # The shadow agent's runner: an allow for each of its 21 gated calls, with no detection in it.
    answered = [decode_verdict(o.value) for o in r.verdicts if o.key == b"run:t"]
    assert [(v.action, v.detector, v.level, v.message) for v in answered] == [("allow", None, None, None)] * 21
    assert [v.verdict_id for v in answered] == [f"t-{i}q/decision" for i in range(21)]
    # The shadow topic: what enforce mode would have published for it.
    assert actions(r.shadow) == ["allow"] * 10 + ["warn"] + ["allow"] * 9 + ["block"]
    trial_events = [e for e in events if e.run_id == "t"]
    assert [decode_verdict(o.value) for o in r.shadow] == reference(trial_events, config)
    assert r.candidate == []


def test_an_ungated_shadow_runner_gets_nothing_at_all():
    p = BatchProcessor(engine_for(shadow_config()))
    r = p.process(records(repeat("t", 21, agent="trial", gate=False)), Store().read)
    assert r.verdicts == []
    assert actions(r.shadow) == ["warn", "block"]


def test_a_shadow_agent_that_would_be_aborted_is_never_aborted():
    root = {**LIVE, "loopwatch": {"abortAfterCriticalBlocks": 1, "mode": "shadow"}}
    p = BatchProcessor(engine_for(root))
    r = p.process(records(repeat("t", 23, agent="trial")), Store().read)
    assert set(actions(r.verdicts)) == {"allow"} and len(r.verdicts) == 23
    # call 21 blocks and ends the run; the late calls 22 and 23 are refused: on the shadow topic
    assert actions(r.shadow)[20:] == ["block", "abort", "block", "block"]


def test_a_shadow_agents_engine_log_lines_are_logged_as_an_enforce_agents(caplog):
    # The engine logs the same lines whatever the agent's mode (upstream's: one warning, then
    # three lines for the blocked call); the batch's lines are written together after it.
    events = repeat("t", 21, agent="trial") + repeat("m", 3, agent="main")

    def logged(config):
        caplog.clear()
        with caplog.at_level("INFO", logger="loopwatch"):
            BatchProcessor(engine_for(config)).process(records(events), Store().read)
        return [(r.name, r.levelname, r.getMessage()) for r in caplog.records if r.name != "loopwatch.worker"]

    enforced = logged(LIVE)
    assert ("loopwatch.agents/tools", "ERROR") in {(name, level) for name, level, _ in enforced}
    assert logged(shadow_config()) == enforced


def test_shadow_and_enforce_metrics_carry_their_mode():
    registry = CollectorRegistry()
    p = BatchProcessor(engine_for(shadow_config()), Metrics(registry, process_metrics=False))
    p.process(records(repeat("t", 21, agent="trial") + repeat("m", 11, agent="main")), Store().read)
    g = registry.get_sample_value

    def block(mode):
        return g(
            "loopwatch_decisions_total",
            {"detector": "generic_repeat", "level": "critical", "action": "block", "config": "live", "mode": mode},
        )

    def warn(mode):
        return g(
            "loopwatch_decisions_total",
            {"detector": "generic_repeat", "level": "warning", "action": "warn", "config": "live", "mode": mode},
        )

    assert (block("shadow"), warn("shadow")) == (1, 1)
    assert (block("enforce"), warn("enforce")) == (None, 1)  # the enforce run did 11 calls
    assert g("loopwatch_events_consumed_total", {"type": "tool_call.requested"}) == 32  # events once, whatever the mode


def test_without_shadow_agents_or_candidate_nothing_goes_to_the_shadow_topic():
    p = BatchProcessor(engine_for(LIVE))
    r = p.process(records(repeat("m", 21)), Store().read)
    assert (r.shadow, r.candidate) == ([], [])
    cp = p.runs.checkpoint()
    assert {value[0] for value in cp.writes.values()} == {3}  # the envelope without a candidate section


# -- the candidate config ---------------------------------------------------------------------------


def candidate_processor(live=LIVE, candidate=STRICT, metrics=None) -> BatchProcessor:
    p = BatchProcessor(engine_for(live), metrics)
    p.use_candidate(engine_for(candidate), "c0ffee")
    return p


def test_the_candidate_judges_the_same_events_and_nothing_of_it_reaches_loop_verdicts():
    events = repeat("r", 10, end=True)
    alone = BatchProcessor(engine_for(LIVE)).process(records(events), Store().read)
    p = candidate_processor()
    r = p.process(records(events), Store().read)
    assert [o.value for o in r.verdicts] == [o.value for o in alone.verdicts]  # the live verdicts, unchanged
    assert actions(r.verdicts) == ["allow"] * 10
    # Hand-worked: counts 5-7 warn but the bucket rule hides them (count // 10 is 0); the 9th
    # call sees 8 identical ones and is blocked; it is not recorded, so the 10th is blocked too.
    assert actions(r.candidate) == ["allow"] * 8 + ["block", "block"]
    assert [decode_verdict(o.value) for o in r.candidate] == reference(events, STRICT)
    assert r.sha256["candidate"] == "c0ffee"


def test_a_run_whose_outcome_would_change_is_counted_when_it_ends():
    registry = CollectorRegistry()
    p = candidate_processor(metrics=Metrics(registry, process_metrics=False))
    events = repeat("changed", 10, end=True) + repeat("same", 3, end=True) + repeat("open", 10)
    p.process(records(events), Store().read)
    g = registry.get_sample_value
    assert g("loopwatch_candidate_outcome_changes_total", {"live": "none", "candidate": "block"}) == 1
    assert changed_runs(registry) == 1  # "same" did not change, "open" has not ended
    assert (
        g(
            "loopwatch_decisions_total",
            {
                "detector": "generic_repeat",
                "level": "critical",
                "action": "block",
                "config": "candidate",
                "mode": "enforce",
            },
        )
        == 4
    )  # calls 9, 10 of two runs


def test_the_candidate_state_is_stored_with_the_run_and_survives_a_restart():
    events = repeat("r", 6) + repeat("r", 6, start=6)
    first = candidate_processor()
    store = Store()
    first.process(records(events[:12]), store.read)
    store.apply(first.runs.checkpoint())
    envelope = unpack_state(store[(0, b"run:r")])
    assert envelope.compared is not None and envelope.compared & COMPARED_FROM_START
    assert envelope.candidate is not None and len(envelope.candidate) == 6
    # A new worker (nothing in memory) reads both states from the store.
    second = candidate_processor()
    r = second.process(records(events[12:], start=12), store.read)
    assert actions(r.candidate) == ["allow"] * 2 + ["block"] * 4  # calls 7-8, then 9-12: from the stored history
    whole = candidate_processor().process(records(events), Store().read)
    assert [o.value for o in r.candidate] == [o.value for o in whole.candidate][6:]


def test_a_worker_without_candidate_ignores_and_drops_a_stored_candidate_section():
    events = repeat("r", 6)
    store = Store()
    p = candidate_processor()
    p.process(records(events), store.read)
    store.apply(p.runs.checkpoint())
    assert store[(0, b"run:r")][0] == 4
    plain = BatchProcessor(engine_for(LIVE))
    r = plain.process(records(repeat("r", 15, start=6), start=12), store.read)
    assert actions(r.verdicts) == ["allow"] * 4 + ["warn"] + ["allow"] * 9 + [
        "block"
    ]  # calls 11, 21: the history was read
    store.apply(plain.runs.checkpoint())
    assert store[(0, b"run:r")][0] == 3 and unpack_state(store[(0, b"run:r")]).candidate is None


def test_a_run_the_candidate_joined_late_is_judged_but_not_compared():
    registry = CollectorRegistry()
    store = Store()
    plain = BatchProcessor(engine_for(LIVE))
    plain.process(records(repeat("r", 4)), store.read)
    store.apply(plain.runs.checkpoint())
    p = candidate_processor(metrics=Metrics(registry, process_metrics=False))
    r = p.process(records(repeat("r", 9, start=4, end=True), start=8), store.read)
    # The candidate's history starts at call 5: its 9th call, call 13, is its first block;
    # the live config warned at call 11.  The outcomes differ, but the candidate did not see
    # the run's start, so the run is not compared.
    assert actions(r.candidate) == ["allow"] * 8 + ["block"]
    assert actions(r.verdicts) == ["allow"] * 6 + ["warn"] + ["allow"] * 2
    assert changed_runs(registry) == 0


def test_a_candidate_that_fails_never_touches_the_live_run(monkeypatch):
    registry = CollectorRegistry()
    p = candidate_processor(metrics=Metrics(registry, process_metrics=False))
    failing = p.candidate

    def explode(state, event, validated=False):
        raise RuntimeError("candidate bug")

    monkeypatch.setattr(failing, "handle", explode)
    events = repeat("r", 21)
    r = p.process(records(events), Store().read)
    assert [decode_verdict(o.value) for o in r.verdicts] == reference(events, LIVE)
    assert r.candidate == [] and r.dead_letters == []
    assert registry.get_sample_value("loopwatch_processing_errors_total", {"stage": "candidate"}) == 42


@pytest.mark.parametrize("mode", ["enforce", "shadow"])
def test_candidate_metrics_carry_the_candidates_mode(mode):
    registry = CollectorRegistry()
    candidate = {**STRICT, "loopwatch": {"mode": mode}}
    p = candidate_processor(candidate=candidate, metrics=Metrics(registry, process_metrics=False))
    r = p.process(records(repeat("r", 10)), Store().read)
    assert actions(r.candidate)[-2:] == ["block", "block"]  # to the shadow topic whatever its mode
    assert (
        registry.get_sample_value(
            "loopwatch_decisions_total",
            {"detector": "generic_repeat", "level": "critical", "action": "block", "config": "candidate", "mode": mode},
        )
        == 2
    )


# -- the envelope with a candidate section -----------------------------------------------------


def test_the_candidate_envelope_round_trips_and_reads_like_version_3():
    from streams.app.run_store import MAX_STATE_BYTES, idle_since_ms, pack_state, pack_within_limit, unpack_header

    live, candidate = RunDriver(engine_for(LIVE)), RunDriver(engine_for(STRICT))
    for event in repeat("r", 9):
        live.handle(event)
        candidate.handle(event)
    state, judged = live.states["run:r"], candidate.states["run:r"]
    seen = bytes(range(16))
    plain = pack_state(state, 41, 7000, seen, "main")
    both = pack_state(state, 41, 7000, seen, "main", judged, COMPARED_FROM_START | 2 << 2)
    assert both[0] == 4 and unpack_header(both) == (41, 7000) and idle_since_ms(both) == 7000
    env = unpack_state(both)
    assert (env.offset, env.seen, env.owner, env.state, env.candidate, env.compared) == (
        41,
        seen,
        "main",
        state,
        judged,
        COMPARED_FROM_START | 2 << 2,
    )
    assert both.endswith(plain[21:])  # digests, owner and live state exactly as version 3 has them
    empty = unpack_state(pack_state(state, 41, 7000, seen, "main", None, 0))
    assert (empty.candidate, empty.compared, empty.state) == (None, 0, state)
    # Over the size limit, both histories lose their oldest records.
    big = {"tools": {"loopDetection": {"enabled": True, "historySize": 1000}}}
    drivers = RunDriver(engine_for(big)), RunDriver(engine_for(big))
    for i in range(1000):
        for d in drivers:
            d.handle(
                requested_event(
                    f"e{i}", "t" * 200, {"i": i}, run_id="big", session_key="s", tool_call_id="x" * 505 + str(i)
                )
            )
    value, trimmed = pack_within_limit(drivers[0].states["run:big"], 1, 2, b"", None, drivers[1].states["run:big"], 0)
    assert trimmed is not None and len(value) <= MAX_STATE_BYTES < trimmed[0]
    env = unpack_state(value)
    assert len(env.state) == len(env.candidate) < 1000


def test_a_run_touched_while_a_checkpoint_encodes_it_keeps_its_candidate_state_apart():
    p = candidate_processor()
    store = Store()
    p.process(records(repeat("r", 5)), store.read)
    p.runs.begin_checkpoint()  # frozen, not encoded yet
    p.process(records(repeat("r", 5, start=5), start=10), store.read)  # changes the run meanwhile
    cp = p.runs.end_checkpoint()
    p.runs.checkpoint_written()
    assert len(unpack_state(cp.writes[(0, b"run:r")]).candidate) == 5  # as frozen
    store.apply(cp)
    store.apply(p.runs.checkpoint())
    directly = RunDriver(engine_for(STRICT))
    for event in repeat("r", 10):
        directly.handle(event)
    assert unpack_state(store[(0, b"run:r")]).candidate == directly.states["run:r"]
