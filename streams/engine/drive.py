"""Driving the engine over many runs, and what loopwatch publishes for a step.

``LoopEngine.handle`` takes one run's state and one event.  Every driver that is not the
worker keeps its runs' states the same way: by the event's state key, dropped when a run
ends.  ``RunDriver`` is that, once: ``loopwatch replay``, the conformance hook cases, the
scenarios' obedient runner, the test harness's reference answers and the benchmarks use it.
(The worker keeps its states in RocksDB and ``streams.app.live_runs.LiveRuns`` instead.)

``published`` is what goes on ``loop-verdicts`` for a step, for the worker and every
reference answer alike: ``Step.published_decision`` (the decision of a gated call, every
warning the bucket rule lets through, every block), then the abort, if any.  For an agent in
shadow mode (``loopwatch.mode: shadow``) those go to the shadow topic instead, and its runner
gets ``shadow_answer`` on ``loop-verdicts``: an ``allow`` for a gated call, which it waits for.

``outcome`` ranks what a step published (``schemas.names.OUTCOMES``: none, warn, block,
abort); a run's outcome under a config is the highest rank of its steps.  The worker's
candidate config and ``loopwatch backtest`` compare configs by it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from schemas.events import ToolCallEvent
from schemas.verdicts import Decision, Verdict

from .engine import LoopEngine, Step, allow_decision
from .peers import gemini_due_state, gemini_judged, gemini_llm_check_due
from .state import RunState

__all__ = ["ABORT", "BLOCK", "NONE", "RunDriver", "WARN", "outcome", "published", "shadow_answer"]

NONE, WARN, BLOCK, ABORT = range(4)
"""Outcome ranks, indexes of ``schemas.names.OUTCOMES``."""


def published(step: Step) -> list[Verdict]:
    """Every verdict loopwatch publishes for the step, in order: its decision
    (``Step.published_decision``), then its abort."""
    out: list[Verdict] = []
    decision = step.published_decision
    if decision is not None:
        out.append(decision)
    if step.abort is not None:
        out.append(step.abort)
    return out


def shadow_answer(step: Step) -> Decision | None:
    """What a runner of an agent in shadow mode gets on ``loop-verdicts`` for the step: an
    ``allow`` for a gated call (the runner waits for a decision), nothing otherwise.  Never a
    warning, a block or an abort: whatever detection decides goes to the shadow topic."""
    request = step.request
    if request is None or not request.gate:
        return None
    return allow_decision(request)


def outcome(step: Step) -> int:
    """The rank of what the step publishes (``published``): ``ABORT`` with an abort, else
    ``BLOCK`` or ``WARN`` by its decision's action, else ``NONE`` (an allow, a warning the
    bucket rule hid, nothing)."""
    if step.abort is not None:
        return ABORT
    if step.action == "allow" and step.built_decision is None:
        return NONE  # most steps: no decision but an allow was made (the backtest ranks every step)
    decision = step.published_decision
    if decision is None:
        return NONE
    action = decision.action
    return BLOCK if action == "block" else WARN if action == "warn" else NONE


class RunDriver:
    """The engine over a stream of events of many runs, each run's state kept by its state
    key (``schemas.keys.state_key``; by session under ``loopwatch.scope: session``, the
    engine's ``key_of``) and dropped when the run ends.

    Like the engine, it has no I/O and no clock.  A ``Step`` describes its run as of that
    event: read it before the run's next event is handled.
    """

    def __init__(self, engine: LoopEngine, judge: Any = None) -> None:
        self.engine = engine
        self.judge = judge
        """A ``streams.engine.judge.Judge`` for Gemini's LLM check, or None (the default: no check)."""
        self.states: dict[str, RunState] = {}
        """State key -> the run's state."""

    def handle(self, event: ToolCallEvent, key: str | None = None, validated: bool = False) -> Step:
        """Apply one event to its run (``key``: its state key, when the caller has it)."""
        if key is None:
            key = self.engine.key_of(event)
        step = self.engine.handle(self.states.get(key), event, validated)  # (positional: see LoopEngine.handle)
        if self.judge is not None and gemini_llm_check_due(step):
            step = self._judged(step, event)
        if step.state is None:
            self.states.pop(key, None)
        else:
            self.states[key] = step.state
        return step

    def _judged(self, step: Step, event: ToolCallEvent) -> Step:
        from streams.engine.judge import RunContext, checked_confidence  # (outside the engine package)

        state, gemini = gemini_due_state(step)
        context = RunContext(
            run_id=state.run_id,
            session_key=event.session_key,
            agent_id=event.agent_id,
            turn=gemini.turns,
        )
        return gemini_judged(step, checked_confidence(self.judge(context)))

    def steps(
        self, events: Iterable[ToolCallEvent], *, validated: bool = False
    ) -> Iterator[tuple[ToolCallEvent, Step]]:
        """``(event, step)`` for each event, lazily."""
        handle = self.handle
        for event in events:
            yield event, handle(event, validated=validated)

    def apply(self, events: Iterable[ToolCallEvent], keys: Iterable[str], *, validated: bool = False) -> None:
        """Apply every event (its state key beside it), keeping nothing but the states: the
        engine's own throughput, with no per-event cost of the driver's (``bench/core.py``)."""
        handle = self.engine.handle
        states = self.states
        get = states.get
        for key, event in zip(keys, events):
            step = handle(get(key), event, validated)
            if step.state is None:
                states.pop(key, None)
            else:
                states[key] = step.state

    def verdicts(self, events: Iterable[ToolCallEvent], *, validated: bool = False) -> list[Verdict]:
        """What loopwatch publishes for these events, in order (``published``)."""
        out: list[Verdict] = []
        for _event, step in self.steps(events, validated=validated):
            out.extend(published(step))
        return out
