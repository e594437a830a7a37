"""loopwatch's opt-in early warning (``loopwatch.detectors.earlyWarning``): the entropy of the
run's last calls against the run's own baseline.  The expected entropies, baselines and warned
calls are worked out by hand in each test's docstring; where the detector must change nothing,
the reference is the engine without it (which the golden traces check against upstream)."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.config import validate, warnings
from streams.edge.events import completed_event, requested_event
from streams.engine import LoopEngine, RunDriver, engine_for
from streams.engine.config import EarlyWarningSettings
from streams.engine.early_warning import observe, window_entropy
from streams.engine.state import EntropyWindow, RunState, copy_state, decode_state, encode_state

ENABLED = {"tools": {"loopDetection": {"enabled": True}}}
FIELDS = dict(run_id="r1", session_key="agent:main:r1", agent_id="main")
SMALL = {"window": 4, "ratio": 0.5, "minCalls": 5}


def early(options=True, base=ENABLED):
    return {**base, "loopwatch": {"detectors": {"earlyWarning": options}}}


def drive(config, actions, *, obey=True):
    """Each action (a letter: the query of one ``search`` call) requested, gated, then completed
    unless blocked; the decisions, in order."""
    runs = RunDriver(engine_for(config))
    decisions = []
    for n, a in enumerate(actions):
        args = {"q": a}
        decision = runs.handle(
            requested_event(f"e{n}", "search", args, tool_call_id=f"c{n}", gate=True, **FIELDS)
        ).decision
        decisions.append(decision)
        if obey and decision.action == "block":
            continue
        runs.handle(completed_event(f"d{n}", "search", args, tool_call_id=f"c{n}", result=f"r{a}", **FIELDS))
    return decisions


def test_window_entropy_by_hand():
    """Four distinct actions: log2 4 = 2 bits.  Two of one, one each of two others:
    p = 1/2, 1/4, 1/4, H = 1/2*1 + 2 * 1/4*2 = 1.5.  Three of one and one other: p = 3/4, 1/4,
    H = 3/4*log2(4/3) + 1/4*2 = 0.311278 + 0.5 = 0.811278.  One action: 0."""
    assert window_entropy([1, 2, 3, 4]) == 2.0
    assert window_entropy([1, 1, 2, 3]) == 1.5
    assert window_entropy([1, 1, 1, 2]) == pytest.approx(0.811278, abs=1e-6)
    assert window_entropy([7, 7, 7, 7]) == 0.0


def test_a_collapse_warns_once_and_rearms_when_the_entropy_recovers():
    """Window 4, ratio 0.5, minCalls 5; calls A B C D E X X X X F G X X X (1-based):

    call 4  [A B C D] H 2       (before minCalls)     baseline sum 2,    1 window
    call 5  [B C D E] H 2       2 >= 0.5 * 2          sum 4,    2
    call 6  [C D E X] H 2       2 >= 0.5 * 2          sum 6,    3
    call 7  [D E X X] H 1.5     1.5 >= 0.5 * 2        sum 7.5,  4
    call 8  [E X X X] H 0.811   < 0.5 * 7.5/4 = 0.9375: WARN (collapse; kept out of the baseline)
    call 9  [X X X X] H 0       in the collapse; re-arms at (1 + 0.5)/2 * 1.875 = 1.406
    call 10 [X X X F] H 0.811   still in it
    call 11 [X X F G] H 1.5     >= 1.406: re-armed    sum 9,    5 (baseline 1.8)
    call 12 [X F G X] H 1.5     >= 0.9                sum 10.5, 6 (1.75)
    call 13 [F G X X] H 1.5     >= 0.875              sum 12,   7 (1.714)
    call 14 [G X X X] H 0.811   < 0.5 * 1.714 = 0.857: WARN again"""
    decisions = drive(early(SMALL), "ABCDEXXXXFGXXX")
    found = [(n + 1, d.action, d.level, d.detector, d.count) for n, d in enumerate(decisions) if d.detector]
    assert found == [(8, "warn", "warning", "early_warning", 8), (14, "warn", "warning", "early_warning", 14)]
    assert decisions[7].message == (
        "WARNING: Your last 4 tool calls are much less varied than earlier in this run (action entropy 0.81 bits "
        "against 1.88 before). This often comes before a loop: check that your recent calls are making progress, "
        "or change approach."
    )
    assert decisions[13].message.startswith(
        "WARNING: Your last 4 tool calls are much less varied than earlier in this run (action entropy 0.81 bits "
        "against 1.71 before)."
    )
    assert not decisions[7].notify_model  # shown to the model only with surfaceWarnings
    surfaced = drive({**early(SMALL), "loopwatch": {"surfaceWarnings": True, **early(SMALL)["loopwatch"]}}, "ABCDEXXX")
    assert surfaced[7].notify_model


def test_min_calls_holds_the_warning_back_and_the_early_windows_teach_the_baseline():
    """The same calls, minCalls 10: windows of calls 4..9 (H 2, 2, 2, 1.5, 0.811, 0) all join the
    baseline, 8.311/6 = 1.385 at call 10, whose H 0.811 is not below 0.693; then H 1.5, 1.5, 1.5
    (baseline 13.622/10 = 1.362 after call 13) and call 14's 0.811 is not below 0.681: no warning."""
    assert not any(d.detector for d in drive(early({**SMALL, "minCalls": 10}), "ABCDEXXXXFGXXX"))


def test_a_run_of_one_action_has_no_baseline_to_fall_from():
    """Every window holds only X: H 0, baseline 0, and 0 < 0.5 * 0 never holds."""
    state, cfg = EntropyWindow(), EarlyWarningSettings(4, 0.5, 5)
    assert not any(observe(state, "search", "X", cfg) for _ in range(50))
    assert state.windows == 47 and state.entropy_sum == 0.0


def test_an_action_is_the_tool_and_its_arguments():
    """The same arguments hash under two tools alternating, A B A B...: two actions, H 1 per
    window of 4 from the start, never a collapse.  Were the tool left out they would be one
    action (H 0 throughout); the distinct calls before them (H 2) would make 0 a collapse."""
    cfg = EarlyWarningSettings(4, 0.5, 5)
    state = EntropyWindow()
    calls = [("t", f"a{n}") for n in range(8)] + [("read" if n % 2 else "grep", "same") for n in range(12)]
    assert not any(observe(state, tool, args, cfg) for tool, args in calls)


def test_off_by_default_and_the_default_engine_is_upstreams():
    assert type(engine_for(ENABLED)) is LoopEngine
    assert not any(d.detector for d in drive(ENABLED, "ABCDEXXXXFGXXX"))
    assert not any(d.detector for d in drive(early(False), "ABCDEXXXXFGXXX"))


def test_detection_off_leaves_it_off():
    off = early(SMALL, {"tools": {"loopDetection": {"enabled": False}}})
    assert not any(d.detector for d in drive(off, "ABCDEXXXXFGXXX"))


def test_true_takes_the_defaults():
    """Window 10, ratio 0.5, minCalls 20: 20 distinct calls (H log2 10 = 3.32 for each of the
    11 full windows, calls 10..20), then X: call 21's window holds 9 distinct and one X (3.32),
    call 26 six X of 10 (H = 0.6*log2(1/0.6) + 4*0.1*log2(10) = 0.442 + 1.329 = 1.771, not
    below 1.661), call 27 seven (0.360 + 0.997 = 1.357 < 1.661): warned at call 27."""
    actions = [chr(0x100 + n) for n in range(20)] + ["X"] * 10
    found = [(n + 1, d.detector) for n, d in enumerate(drive(early(True), actions)) if d.detector]
    assert found[0] == (27, "early_warning")


def test_another_detectors_finding_wins_and_the_collapse_still_counts_once():
    """generic_repeat at warningThreshold 2 finds the 3rd X (call 8: two identical calls with
    identical results before it; a warning the bucket rule hides, count 2 // 10 = 0).  The
    collapse of call 8 (by hand above) falls on that call, so the repeat's finding stands, and
    the collapse does not warn on the later calls of the same collapse.  At threshold 3 the
    repeat finds nothing on call 8 and the early warning shows."""
    config = early(SMALL, {"tools": {"loopDetection": {"enabled": True, "warningThreshold": 2}}})
    decisions = drive(config, "ABCDEXXXX")
    assert [(d.detector, d.action) for d in decisions[5:]] == [
        (None, "allow"),
        (None, "allow"),
        ("generic_repeat", "allow"),
        ("generic_repeat", "allow"),
    ]
    config = early(SMALL, {"tools": {"loopDetection": {"enabled": True, "warningThreshold": 3}}})
    assert [d.detector for d in drive(config, "ABCDEXXXX")[5:]] == [None, None, "early_warning", "generic_repeat"]


def test_the_state_round_trips_and_a_state_without_it_is_stored_as_before():
    engine = engine_for(early(SMALL))
    state = RunState(run_id="r1")
    for n, a in enumerate("ABCDEXX"):
        engine.handle(state, requested_event(f"e{n}", "search", {"q": a}, **FIELDS))
    assert state.early is not None and state.early.calls == 7
    decoded = decode_state(encode_state(state))
    assert decoded.early == state.early
    copy = copy_state(state)
    engine.handle(state, requested_event("e9", "search", {"q": "X"}, **FIELDS))
    assert copy.early.calls == 7 and len(copy.early.actions) == 4  # the copy is not the original's
    plain = RunState(run_id="r1", tools=["search"], sigs=["search:" + "0" * 64], call_ids=[None])
    plain.results, plain.unknowns, plain.stamps = [None], [None], [0]
    assert decode_state(encode_state(plain)).early is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"window": 1}, "loopwatch.detectors.earlyWarning.window: Too small: expected number to be >=2"),
        ({"window": 1001}, "loopwatch.detectors.earlyWarning.window: Too big: expected number to be <=1000"),
        ({"ratio": 1}, "loopwatch.detectors.earlyWarning.ratio: Invalid input: expected a number above 0 and below 1"),
        ({"ratio": "x"}, "loopwatch.detectors.earlyWarning.ratio: Invalid input: expected number, received string"),
        (
            {"window": 20},
            "loopwatch.detectors.earlyWarning.minCalls: loopwatch.detectors.earlyWarning.minCalls must exceed window "
            "(the run needs earlier windows for its baseline).",
        ),
        (
            {"size": 3},
            'loopwatch.detectors.earlyWarning: Unrecognized key: "size"; expected one of: minCalls, ratio, window',
        ),
        ("yes", "loopwatch.detectors.earlyWarning: Invalid input: expected boolean, received string"),
    ],
)
def test_bad_options_are_one_line_errors(options, message):
    issues = validate(early(options))
    assert [f"{i.path}: {i.message}" for i in issues] == [message]


def test_good_options_validate():
    assert validate(early(True)) == []
    assert validate(early({"window": 20, "ratio": 0.5, "minCalls": 30})) == []
    assert validate({**ENABLED, "loopwatch": {"detectors": {"cycle": True, "earlyWarning": {}}}}) == []


ACTIONS = st.lists(st.sampled_from("ABCDEFX"), min_size=0, max_size=80)


@settings(max_examples=60, deadline=None)
@given(
    actions=ACTIONS,
    window=st.integers(2, 12),
    ratio=st.floats(0.05, 0.95),
    extra=st.integers(1, 20),
    threshold=st.integers(2, 12),
)
def test_it_never_blocks_and_changes_no_other_answer(actions, window, ratio, extra, threshold):
    """Whatever the calls and options: with the early warning, every decision is the one
    without it, except calls the engine without it answers with a plain allow, which may become
    an early warning; and without it no decision names it."""
    base = {
        "tools": {"loopDetection": {"enabled": True, "warningThreshold": threshold, "criticalThreshold": 2 * threshold}}
    }
    options = {"window": window, "ratio": ratio, "minCalls": window + extra}
    off = drive(base, actions)
    on = drive(early(options, base), actions)
    assert not any(d.detector == "early_warning" for d in off)
    for a, b in zip(off, on, strict=True):
        if b.detector == "early_warning":
            assert b.action == "warn" and b.level == "warning" and a.detector is None and a.action == "allow"
        else:
            assert (a.action, a.detector, a.count, a.message) == (b.action, b.detector, b.count, b.message)
    assert sum(d.detector == "early_warning" for d in on) <= max(1, math.ceil(len(actions) / 2))


def test_a_peer_profile_says_it_leaves_the_early_warning_off():
    """Profiles openhands and gemini-cli run their own systems' rules only: no early warning (the
    calls above repeat X 4 times; OpenHands' own rule blocks from the 4th identical pair), and the
    config says so rather than going silently without."""
    root = {**ENABLED, "loopwatch": {"profile": "openhands", "detectors": {"earlyWarning": SMALL}}}
    assert not any(d.detector == "early_warning" for d in drive(root, "ABCDEXXXXFGXXX"))
    assert [f"{n.path}: {n.message}" for n in warnings(root)] == [
        "loopwatch.detectors.earlyWarning: profile openhands runs its own system's rules only: "
        "the early warning is off for its agents"
    ]
    agent = {
        **ENABLED,
        "agents": {"list": [{"id": "g", "loopwatch": {"profile": "gemini-cli", **early()["loopwatch"]}}]},
    }
    assert [n.path for n in warnings(agent)] == ["agents.list[0].loopwatch.detectors.earlyWarning"]
    assert warnings(early(SMALL)) == []
