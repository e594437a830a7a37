"""loopwatch's opt-in ``cycle`` detector (issue 17): cycles of 3 to 5 calls repeated with
identical outcomes.  Expected counts and messages are worked out by hand from the traces;
where the detector must change nothing, the reference is the engine without it (which the
golden traces check against upstream)."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.edge.events import completed_event, requested_event
from streams.engine import LoopEngine, RunDriver, engine_for
from streams.engine.detectors import CycleDetection, detect_cycle
from streams.engine.state import RunState
from streams.offline.scenarios import run_events

# The last test reads what the property test before it saw: both run in one process, in order.
pytestmark = pytest.mark.xdist_group("tests/engine/test_cycle.py")

ENABLED = {"tools": {"loopDetection": {"enabled": True}}}
CYCLE = {**ENABLED, "loopwatch": {"detectors": {"cycle": True}}}
FIELDS = dict(run_id="r1", session_key="agent:main:r1", agent_id="main")

READ = ("read", {"path": "/src/app.py"}, "def main(): ...")
EDIT = ("edit", {"path": "/src/app.py", "new": "x = 2"}, "no change")
TEST = ("exec", {"command": "pytest"}, "1 failed")
LIST = ("list", {"dir": "/src"}, "app.py")
GREP = ("grep", {"pattern": "main"}, "app.py:1")


def drive(config, calls, *, obey=True):
    """Each call requested (gated) then completed unless blocked; the decisions, in order."""
    runs = RunDriver(engine_for(config))
    decisions = []
    for n, (tool, args, result) in enumerate(calls):
        decision = runs.handle(requested_event(f"e{n}", tool, args, tool_call_id=f"c{n}", gate=True, **FIELDS)).decision
        decisions.append(decision)
        if obey and decision.action == "block":
            continue
        runs.handle(completed_event(f"d{n}", tool, args, tool_call_id=f"c{n}", result=result, **FIELDS))
    return decisions


def test_a_read_edit_test_cycle_warns_at_10_calls_and_blocks_at_20():
    decisions = drive(CYCLE, [(READ, EDIT, TEST)[n % 3] for n in range(21)])
    # The 10th call (index 9) continues a cycle whose tail, itself included, is 10 calls long.
    found = [(n, d.action, d.detector, d.count) for n, d in enumerate(decisions) if d.detector]
    assert found[0] == (9, "warn", "cycle", 10)
    assert [f[1] for f in found[1:10]] == ["allow"] * 9  # counts 11..19 share warning bucket 1
    assert found[10] == (19, "block", "cycle", 20)
    block = decisions[19]
    assert block.level == "critical" and block.notify_model
    assert block.message == (
        "CRITICAL: You are repeating a cycle of 3 tool calls (20 consecutive calls) with no progress. "
        "This appears to be a stuck cycle loop. Session execution blocked to prevent resource waste."
    )
    assert decisions[9].message == (
        "WARNING: You are repeating a cycle of 3 tool calls (10 consecutive calls) with identical outcomes. "
        "This looks like a cycle loop; stop retrying and report the task as failed."
    )
    # Every call of the cycle shares one warning key: its signatures, sorted, each once.
    keys = {d.warning_key for d in decisions if d.detector}
    assert len(keys) == 1 and keys.pop().startswith("cycle:edit:")
    # The blocked call is not recorded, so the next identical call is blocked again.
    retried = drive(CYCLE, [(READ, EDIT, TEST)[n % 3] for n in range(19)] + [EDIT, EDIT])
    assert [d.action for d in retried[-2:]] == ["block", "block"]


def test_off_by_default_and_the_default_engine_is_upstreams():
    calls = [(READ, EDIT, TEST)[n % 3] for n in range(30)]
    assert type(engine_for(ENABLED)) is LoopEngine
    assert not any(d.detector == "cycle" for d in drive(ENABLED, calls))


@pytest.mark.parametrize("period", [4, 5])
def test_periods_4_and_5(period):
    block = (READ, EDIT, TEST, LIST, GREP)[:period]
    decisions = drive(CYCLE, [block[n % period] for n in range(20)])
    first = next(n for n, d in enumerate(decisions) if d.detector)
    assert (first, decisions[first].detector, decisions[first].count) == (9, "cycle", 10)
    assert f"a cycle of {period} tool calls" in decisions[first].message
    assert decisions[19].action == "block"


def test_a_cycle_whose_outcomes_change_makes_progress_and_is_left_alone():
    calls = []
    for n in range(30):
        tool, args, result = (READ, EDIT, TEST)[n % 3]
        calls.append((tool, args, f"{result} #{n // 3}" if tool == "exec" else result))  # the test result moves
    assert not any(d.detector for d in drive(CYCLE, calls))


def test_ping_pong_stays_upstreams_and_wins():
    """A ping-pong (a cycle of two), and a period-4 pattern that is a ping-pong (ABAB): the
    cycle detector changes nothing of what upstream answers."""
    pingpong = [(READ, LIST)[n % 2] for n in range(30)]
    assert drive(CYCLE, pingpong) == drive(ENABLED, pingpong)
    assert any(d.detector == "ping_pong" for d in drive(CYCLE, pingpong))
    state = RunState()
    for tool, args, _ in pingpong[:12]:
        state.tools.append(tool)
        state.sigs.append(requested_event("x", tool, args).args_hash)
        state.results.append("same")
    assert detect_cycle(state, "read", state.sigs[-2], 1, 2) is None  # a repeat, not a cycle


def test_a_repeat_of_one_call_is_not_a_cycle():
    calls = [READ] * 30
    assert drive(CYCLE, calls) == drive(ENABLED, calls)


def test_upstream_block_is_never_weakened_to_a_cycle_warning():
    """15 identical reads, then a read-edit-test cycle: upstream's generic repeat blocks the
    read once it has 20 identical outcomes; a cycle warning at the same call gives way."""
    calls = [READ] * 15 + [(READ, EDIT, TEST)[n % 3] for n in range(18)]
    with_cycle, without = drive(CYCLE, calls), drive(ENABLED, calls)
    for a, b in zip(with_cycle, without):
        if b.action == "block":
            assert a == b


def test_the_cycle_loop_scenario():
    events = list(run_events("cycle_loop", "cyc", gate=True, length=24))
    verdicts = RunDriver(engine_for(CYCLE)).verdicts(events)
    cycle = [v for v in verdicts if getattr(v, "detector", None) == "cycle"]
    assert (cycle[0].action, cycle[0].count) == ("warn", 10)
    assert any(v.action == "block" and v.count == 20 for v in cycle)
    assert not any(getattr(v, "detector", None) == "cycle" for v in RunDriver(engine_for(ENABLED)).verdicts(events))


SEVERITY = {"allow": 0, "warn": 1, "block": 2}
TOOLS = [READ, EDIT, TEST, LIST, GREP, ("read", {"path": "/other"}, "other")]


PICK = st.sampled_from(range(len(TOOLS)))
CYCLES_SEEN = [0]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(PICK, max_size=15),
    st.lists(PICK, min_size=1, max_size=6),
    st.integers(1, 12),
    st.lists(PICK, max_size=10),
    st.integers(0, 3),
    st.sampled_from(["configurable-final", "latest"]),
)
def test_with_cycle_on_every_answer_is_upstreams_or_a_cycle_at_least_as_severe(
    prefix, block, repeats, suffix, noise, profile
):
    """On sequences of calls with a repeated block in them: with the detector on, the answers
    are upstream's own up to the first that differs, and that one is a cycle decision at
    least as severe where upstream does not block.  (From there on the two engines' states
    differ: warning buckets, a blocked call not recorded.)"""
    picks = prefix + block * repeats + suffix
    rng = random.Random(noise)
    calls = []
    for i in picks:
        tool, args, result = TOOLS[i]
        calls.append((tool, args, result if rng.random() > noise / 10 else f"{result}?"))
    profile_root = {"loopwatch": {"profile": profile}}
    cycle_root = {**ENABLED, "loopwatch": {"profile": profile, "detectors": {"cycle": True}}}
    with_cycle = drive(cycle_root, calls, obey=False)
    upstream = drive({**ENABLED, **profile_root}, calls, obey=False)
    CYCLES_SEEN[0] += any(a.detector == "cycle" for a in with_cycle)
    for a, b in zip(with_cycle, upstream):
        if a != b:
            assert a.detector == "cycle"
            assert SEVERITY[a.action] >= SEVERITY[b.action] and b.action != "block"
            break


def test_the_property_above_saw_cycles():
    """(Runs after it: the property is not vacuous.)"""
    assert CYCLES_SEEN[0] > 0


def test_the_detection_object():
    found = CycleDetection(
        "warning", "cycle", 12, "read", "read:" + "0" * 64, period=3, signatures=("b:1", "a:1", "b:1")
    )
    assert found.warning_key == "cycle:a:1|b:1"
    assert found.log == ("warn", "Cycle loop warning: period=3 count=12 currentTool=read")
