"""Gemini CLI's LLM loop check (issue 29): the engine keeps ``turnStarted``'s cadence and a judge
(``streams.engine.judge``, off by default) answers.  Expected turns are hand-worked from
``@google/gemini-cli-core`` 0.61.0's loopDetectionService.js: a check when
``turnsInCurrentPrompt >= 30`` and ``turnsInCurrentPrompt - lastCheckTurn >= llmCheckInterval``
(10 at first), a loop at confidence >= 0.9, else ``llmCheckInterval =
Math.round(5 + 10 * (1 - confidence))``; a user prompt resets all three."""

from __future__ import annotations

from schemas.names import GEMINI_LLM_LOOP
from streams.edge.events import agent_message_event, requested_event
from streams.engine import RunDriver, engine_for, published
from streams.engine.judge import RunContext, checked_confidence

GEMINI = {"loopwatch": {"profile": "gemini-cli"}}
IDS = {"run_id": "r1", "session_key": "agent:main:s1"}


class FakeJudge:
    def __init__(self, *answers):
        self.answers = list(answers)
        self.asked: list[int] = []

    def __call__(self, context: RunContext):
        self.asked.append(context.turn)
        return self.answers[min(len(self.asked), len(self.answers)) - 1]


def _run(driver, n, start=0):
    """n distinct calls (never a tool-call loop): each call's published verdicts."""
    return [
        published(
            driver.handle(
                requested_event(f"e{start + i}", "read_file", {"n": start + i}, gemini_key=True, gate=True, **IDS)
            )
        )
        for i in range(n)
    ]


def test_no_judge_no_check():
    verdicts = _run(RunDriver(engine_for(GEMINI)), 80)
    assert all([v.action for v in vs] == ["allow"] for vs in verdicts)


def test_confident_judge_feedback_at_turn_30_then_abort_at_turn_40():
    judge = FakeJudge(0.95)
    verdicts = _run(RunDriver(engine_for(GEMINI), judge), 41)
    assert judge.asked == [30, 40]
    assert all([v.action for v in vs] == ["allow"] for i, vs in enumerate(verdicts[:39]) if i != 29)
    first = verdicts[29]
    assert [v.action for v in first] == ["block"] and first[0].detector == GEMINI_LLM_LOOP
    assert first[0].notify_model
    assert first[0].message == (
        "System: Potential loop detected. Details: Repetitive patterns identified. Please take a step back and "
        "confirm you're making forward progress. If not, take a step back, analyze your previous actions and "
        "rethink how you're approaching the problem. Avoid repeating the same tool calls or responses without "
        "new results."
    )
    assert [getattr(v, "action", "abort") for v in verdicts[39]] == ["block", "abort"]
    assert verdicts[39][1].detector == GEMINI_LLM_LOOP
    assert verdicts[40][0].action == "block"  # the run is over


def test_half_confidence_interval_is_10():
    judge = FakeJudge(0.5)  # round(5 + 10 * 0.5) = 10
    verdicts = _run(RunDriver(engine_for(GEMINI), judge), 60)
    assert judge.asked == [30, 40, 50, 60]
    assert all([v.action for v in vs] == ["allow"] for vs in verdicts)


def test_interval_rounds_half_up_like_math_round():
    judge = FakeJudge(0.25)  # 5 + 10 * 0.75 = 12.5 -> Math.round 13 (Python's round would give 12)
    _run(RunDriver(engine_for(GEMINI), judge), 60)
    assert judge.asked == [30, 43, 56]


def test_confidence_0_8_interval_7_then_a_loop():
    judge = FakeJudge(0.8, 0.8, 0.9)  # 5 + 10 * 0.2 = 7; 0.9 is a loop (>= threshold)
    verdicts = _run(RunDriver(engine_for(GEMINI), judge), 45)
    assert judge.asked == [30, 37, 44]
    assert verdicts[43][0].detector == GEMINI_LLM_LOOP and len(verdicts[43]) == 1


def test_no_answer_changes_nothing():
    judge = FakeJudge(None)  # queryLoopDetectionModel null: no loop, interval kept
    _run(RunDriver(engine_for(GEMINI), judge), 50)
    assert judge.asked == [30, 40, 50]


def test_a_user_prompt_resets_the_cadence():
    judge = FakeJudge(0.25)
    driver = RunDriver(engine_for(GEMINI), judge)
    _run(driver, 35)
    driver.handle(agent_message_event("u", "again", source="user", **IDS))
    _run(driver, 45, start=100)
    assert judge.asked == [30, 30, 43]  # the new prompt counts from 1, interval back to 10


def test_bad_answers_count_as_none():
    assert [checked_confidence(x) for x in (0.5, 1, True, "0.9", float("nan"), 1.5, -0.1)] == [
        0.5,
        1.0,
        None,
        None,
        None,
        None,
        None,
    ]
