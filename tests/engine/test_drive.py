"""Driving the engine over many runs (``RunDriver``) and what a step publishes
(``Step.published_decision``, ``published``), against hand-worked runs."""

from schemas.config import validate
from schemas.verdicts import Decision, RunAborted
from streams.edge.events import compaction_event, completed_event, requested_event, run_ended_event
from streams.engine import ConfigSet, RunDriver, engine_for, outcome, published, shadow_answer
from streams.engine.drive import ABORT, BLOCK, NONE, WARN

ENABLED = {"tools": {"loopDetection": {"enabled": True}}}
SAME = "same"


def loop(run_id: str, n: int, *, gate: bool, start: int = 0):
    """``n`` identical reads of one run, each completed with the same result (upstream's
    generic repeat: calls 10-19 warn, once per bucket, and the 21st identical call blocks)."""
    fields = dict(run_id=run_id, session_key=f"s-{run_id}", agent_id="main")
    for i in range(start, start + n):
        yield requested_event(f"{run_id}-{i}q", "read", {"p": 1}, tool_call_id=f"c{i}", gate=gate, **fields)
        yield completed_event(f"{run_id}-{i}c", "read", {"p": 1}, result=SAME, tool_call_id=f"c{i}", **fields)


def test_what_each_step_publishes():
    runs = RunDriver(engine_for(ENABLED))
    shown = []
    for _event, step in runs.steps(loop("r", 21, gate=False)):
        shown.append([(type(v).__name__, getattr(v, "action", None)) for v in published(step)])
    requests = shown[0::2]
    assert shown[1::2] == [[]] * 21  # completions publish nothing
    assert requests[:10] == [[]] * 10  # allows nobody waits for
    assert requests[10] == [("Decision", "warn")]  # call 11: the warning the bucket rule shows
    assert requests[11:20] == [[]] * 9  # the same warning, hidden by the bucket rule (action allow)
    assert requests[20] == [("Decision", "block")]


def test_a_gated_call_gets_every_decision():
    runs = RunDriver(engine_for(ENABLED))
    actions = [[v.action for v in published(step)] for event, step in runs.steps(loop("r", 21, gate=True))][0::2]
    assert actions == [["allow"]] * 10 + [["warn"]] + [["allow"]] * 9 + [["block"]]


def test_a_block_that_ends_the_run_publishes_the_decision_then_the_abort():
    root = {"tools": {"loopDetection": {"enabled": True}}, "loopwatch": {"abortAfterCriticalBlocks": 1}}
    steps = [step for _event, step in RunDriver(engine_for(root)).steps(loop("r", 21, gate=False))]
    verdicts = published(steps[40])  # the 21st request
    assert [type(v) for v in verdicts] == [Decision, RunAborted]
    assert (verdicts[0].action, verdicts[1].detector) == ("block", "critical_block_limit")
    assert verdicts[1].verdict_id == f"{verdicts[0].cause_event_id}/abort"


def test_a_loop_that_survives_a_compaction_publishes_its_abort():
    runs = RunDriver(engine_for(ENABLED))
    fields = dict(run_id="r", session_key="s", agent_id="main")
    runs.handle(compaction_event("arm", **fields))
    out = []
    for i in range(3):  # the guard's window: three identical outcomes
        runs.handle(requested_event(f"q{i}", "gateway", {"a": 1}, tool_call_id=f"c{i}", **fields))
        out.append(
            published(
                runs.handle(completed_event(f"c{i}", "gateway", {"a": 1}, result=SAME, tool_call_id=f"c{i}", **fields))
            )
        )
    assert out[:2] == [[], []]
    assert [(type(v), v.detector) for v in out[2]] == [(RunAborted, "compaction_loop_persisted")]


def test_runs_keep_their_own_state_and_lose_it_when_they_end():
    runs = RunDriver(engine_for(ENABLED))
    a, b = list(loop("a", 12, gate=False)), list(loop("b", 3, gate=False))
    for event in a[:12] + b + a[12:]:  # b in the middle of a
        runs.handle(event)
    assert set(runs.states) == {"run:a", "run:b"}
    assert (len(runs.states["run:a"]), len(runs.states["run:b"])) == (12, 3)
    runs.handle(run_ended_event("end-b", run_id="b", session_key="s-b"))
    assert set(runs.states) == {"run:a"}


def test_apply_keeps_the_same_states_as_handle():
    events = [*loop("a", 25, gate=False), *loop("b", 5, gate=True)]
    one, bulk = RunDriver(engine_for(ENABLED)), RunDriver(engine_for(ENABLED))
    for event in events:
        one.handle(event)
    bulk.apply(events, [f"run:{e.run_id}" for e in events])
    assert bulk.states == one.states


def test_verdicts_are_what_the_steps_publish_in_order():
    events = [*loop("a", 21, gate=False), *loop("b", 2, gate=True)]
    expected = []
    for _event, step in RunDriver(engine_for(ENABLED)).steps(events):
        expected += published(step)
    assert RunDriver(engine_for(ENABLED)).verdicts(events) == expected
    assert [v.action for v in expected] == ["warn", "block", "allow", "allow"]


# -- outcomes and shadow mode ---------------------------------------------------------------


def test_outcome_ranks_what_each_step_publishes():
    steps = [step for _event, step in RunDriver(engine_for(ENABLED)).steps(loop("r", 21, gate=True))]
    # Gated: every request publishes a decision; only the shown warning and the block count.
    assert [outcome(s) for s in steps[0::2]] == [NONE] * 10 + [WARN] + [NONE] * 9 + [BLOCK]
    assert {outcome(s) for s in steps[1::2]} == {NONE}
    root = {"tools": {"loopDetection": {"enabled": True}}, "loopwatch": {"abortAfterCriticalBlocks": 1}}
    ending = [step for _event, step in RunDriver(engine_for(root)).steps(loop("r", 21, gate=False))]
    assert outcome(ending[40]) == ABORT  # the block that ends the run: the abort outranks it


def test_a_shadow_runner_gets_an_allow_for_a_gated_call_and_nothing_else():
    steps = [step for _event, step in RunDriver(engine_for(ENABLED)).steps(loop("r", 21, gate=True))]
    answers = [shadow_answer(s) for s in steps]
    assert answers[1::2] == [None] * 21  # completions
    for step, answer in zip(steps[0::2], answers[0::2]):
        assert (answer.action, answer.detector, answer.level, answer.message, answer.notify_model) == (
            "allow",
            None,
            None,
            None,
            False,
        )
        assert answer.verdict_id == step.published_decision.verdict_id  # the id the runner waits for
    assert steps[40].published_decision.action == "block"  # what the shadow topic gets instead
    ungated = [step for _event, step in RunDriver(engine_for(ENABLED)).steps(loop("u", 21, gate=False))]
    assert [shadow_answer(s) for s in ungated] == [None] * 42


def test_mode_is_the_agents_over_the_roots_and_enforce_by_default():
    root = {
        "loopwatch": {"mode": "shadow"},
        "agents": {"list": [{"id": "live", "loopwatch": {"mode": "enforce"}}, {"id": "other"}]},
    }
    config = ConfigSet(root)
    assert [config.mode_for(a) for a in (None, "live", "other", "unlisted")] == [
        "shadow",
        "enforce",
        "shadow",
        "shadow",
    ]
    assert config.uses_shadow()
    assert not ConfigSet({"agents": {"list": [{"id": "a"}]}}).uses_shadow()
    assert ConfigSet({"agents": {"list": [{"id": "a", "loopwatch": {"mode": "shadow"}}]}}).mode_for("a") == "shadow"
    assert validate(root) == []
    [issue] = validate({"agents": {"list": [{"id": "a", "loopwatch": {"mode": "dry-run"}}]}})
    assert str(issue) == "agents.list[0].loopwatch.mode: Invalid option: expected one of 'enforce' | 'shadow'"
