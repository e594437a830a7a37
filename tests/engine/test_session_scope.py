"""``loopwatch.scope: session`` (issue 17): one history per session key across its runs.
Expected answers are worked out by hand from the traces (8 identical reads per run)."""

from schemas.keys import session_scope_key, state_key
from streams.edge.events import compaction_event, completed_event, requested_event, run_ended_event
from streams.engine import RunDriver, engine_for
from streams.offline.scenarios import session_loop

ENABLED = {"tools": {"loopDetection": {"enabled": True}}}
SESSION = {**ENABLED, "loopwatch": {"scope": "session"}}


def decisions_of(config, events):
    runs = RunDriver(engine_for(config))
    return [(e.event_id, s.decision) for e, s in runs.steps(events) if s.decision is not None], runs


def test_a_loop_split_over_three_runs_is_caught_under_session_and_not_under_run():
    events = session_loop(gate=True)  # 3 runs x 8 identical reads, run.ended between them
    by_run, runs = decisions_of(ENABLED, events)
    assert not any(d.detector for _, d in by_run)
    assert runs.states == {}  # every run ended and was freed

    by_session, runs = decisions_of(SESSION, events)
    found = [(i, d.action, d.count, d.run_id) for i, (_, d) in enumerate(by_session) if d.detector]
    # The 11th call (index 10, the 3rd of run 2) has 10 identical reads before it: warned.
    assert found[0] == (10, "warn", 10, "agent:main:support-42/run-2")
    # The 21st (index 20, the 5th of run 3) has 20 identical outcomes before it: blocked.
    blocks = [f for f in found if f[1] == "block"]
    assert blocks[0] == (20, "block", 20, "agent:main:support-42/run-3")
    assert list(runs.states) == ["scope:session:agent:main:support-42|"]  # run.ended does not free it
    # Verdicts stay the run's: keyed (by the worker) and routed (by runners) per run.
    assert all(state_key(d) == f"run:{d.run_id}" for _, d in by_session)


def test_keys():
    in_session = requested_event("e", "read", {}, run_id="r1", session_key="s1")
    assert session_scope_key(in_session) == "scope:session:s1|"
    assert session_scope_key(requested_event("e", "read", {}, run_id="r1")) == "scope:run:r1"
    assert engine_for(SESSION).key_of(in_session) == "scope:session:s1|"
    assert engine_for(ENABLED).key_of(in_session) == "run:r1"


def test_an_abort_ends_its_run_and_the_session_goes_on():
    """abortAfterCriticalBlocks 1: the first block aborts run 2; its late calls are refused
    (with the abort's detector); run 3 of the session continues the shared history with a
    fresh block count (so it is blocked, and aborted, at its own first block)."""
    config = {**ENABLED, "loopwatch": {"scope": "session", "abortAfterCriticalBlocks": 1}}
    runs = RunDriver(engine_for(config))
    common = {"session_key": "s1", "agent_id": "main"}
    aborts = []
    n = 0

    def call(run_id):
        nonlocal n
        n += 1
        step = runs.handle(
            requested_event(f"e{n}", "read", {"path": "/x"}, tool_call_id=f"c{n}", gate=True, run_id=run_id, **common)
        )
        if step.abort is not None:
            aborts.append((run_id, step.abort.detector))
        if step.decision.action != "block":
            runs.handle(
                completed_event(
                    f"d{n}", "read", {"path": "/x"}, tool_call_id=f"c{n}", result="same", run_id=run_id, **common
                )
            )
        return step.decision

    answers = [call("run-1") for _ in range(15)] + [call("run-2") for _ in range(6)]
    assert answers[20].action == "block" and aborts == [("run-2", "critical_block_limit")]
    late = call("run-2")
    assert (late.action, late.detector) == ("block", "critical_block_limit")
    assert late.message.startswith("CRITICAL: this run was aborted by loopwatch (critical_block_limit)")
    fresh = call("run-3")  # the shared history still holds 20 identical reads
    assert (fresh.action, fresh.detector, fresh.count) == ("block", "generic_repeat", 20)
    assert aborts == [("run-2", "critical_block_limit"), ("run-3", "critical_block_limit")]
    state = runs.states["scope:session:s1|"]
    assert state.aborted is None and dict(state.aborted_runs) == {
        "run-2": "critical_block_limit",
        "run-3": "critical_block_limit",
    }


def test_the_post_compaction_guard_watches_the_next_run():
    """A compaction arms the guard in run 1; the identical outcomes that follow in run 2 (the
    run the compaction started) abort run 2 after the window (3), as upstream's per-session
    guard would."""
    runs = RunDriver(engine_for(SESSION))
    common = {"session_key": "s1", "agent_id": "main"}
    runs.handle(compaction_event("c", run_id="run-1", **common))
    runs.handle(run_ended_event("end-1", run_id="run-1", **common))
    aborts = []
    for n in range(3):
        runs.handle(requested_event(f"e{n}", "gateway", {"a": 1}, tool_call_id=f"c{n}", run_id="run-2", **common))
        step = runs.handle(
            completed_event(f"d{n}", "gateway", {"a": 1}, tool_call_id=f"c{n}", result="same", run_id="run-2", **common)
        )
        if step.abort is not None:
            aborts.append((n, step.abort.run_id, step.abort.detector, step.abort.count))
    assert aborts == [(2, "run-2", "compaction_loop_persisted", 3)]


def test_events_without_a_session_key_keep_their_run():
    runs = RunDriver(engine_for(SESSION))
    runs.handle(requested_event("e", "read", {}, run_id="r1"))
    assert list(runs.states) == ["scope:run:r1"]
    runs.handle(run_ended_event("end", run_id="r1"))
    assert runs.states == {}  # a run-scoped state is freed by its end, as before
