"""The peer profiles, ``openhands`` and ``gemini-cli``: another agent family's loop rules in the
same engine, for the agents whose config names them (``loopwatch.profile``, at the root or per
agent, as the two OpenClaw profiles are chosen).

A config in which no agent uses one gets ``LoopEngine`` (or its latest or extensions engine)
unchanged: their paths carry no check of the peer profiles (``choose.engine_for``).  A config
that uses one gets the same engine class with ``_PeerProfiles`` mixed in before it: each event
first looks up its agent's profile, and an agent under a peer profile never reaches OpenClaw's
detectors.  What each system decides, and how its answers map onto warn, block and abort:
docs/peer-profiles.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from schemas.config import GEMINI_CLI, OPENHANDS
from schemas.events import (
    AgentMessage,
    CompactionRetried,
    ModelText,
    RunEnded,
    ToolCallCompleted,
    ToolCallRequested,
    check_event,
)
from schemas.keys import normalize_run_id
from schemas.names import (
    CRITICAL,
    GEMINI_CONTENT_LOOP,
    GEMINI_LLM_LOOP,
    GEMINI_TOOL_CALL_LOOP,
    OPENHANDS_ACTION_ERROR,
    WARNING,
)
from schemas.verdicts import Decision

from . import gemini as gm
from . import gemini_content as gc
from . import openhands as oh
from .engine import LoopEngine, Step, build_decision, build_run_aborted, end_run, refused_after_abort
from .peer_state import PeerState
from .state import RunState

__all__ = ["gemini_due_state", "gemini_judged", "gemini_llm_check_due", "peer_engine_class"]

_CLASSES: dict[type[LoopEngine], type[LoopEngine]] = {}


def peer_engine_class(base: type[LoopEngine]) -> type[LoopEngine]:
    """``base`` (the engine a config would get without peer profiles) with them."""
    cls = _CLASSES.get(base)
    if cls is None:
        # (``type`` answers a plain ``type``: this one subclasses ``base``, a LoopEngine)
        built = type(f"Peer{base.__name__.lstrip('_')}", (_PeerProfiles, base), {})
        cls = _CLASSES[base] = cast("type[LoopEngine]", built)
    return cls


class _PeerProfiles(LoopEngine):
    """Routes each event of an agent under a peer profile to that profile's rules.  (Mixed in
    before an engine class: a ``LoopEngine`` only so that its methods are typed, the class it
    is mixed into keeps its place in the MRO.)"""

    def handle(self, state: RunState | None, event: Any, validated: bool = False) -> Step:
        settings = self.settings_for(event.agent_id)
        rules = _RULES.get(settings.peer)
        if rules is None:
            return super().handle(state, event, validated)
        if not validated:
            check_event(event)
        kind = type(event)
        if kind is RunEnded:
            return Step(None)
        if state is None:
            state = RunState(run_id=normalize_run_id(event.run_id))
        step = rules(state, event, kind)
        if event.ts_ms > state.last_event_ms:
            state.last_event_ms = event.ts_ms
        return step


# -- openhands ----------------------------------------------------------------------------------


def _window(state: RunState) -> oh.OpenHandsWindow:
    peer = state.peer
    if peer is None:
        peer = state.peer = PeerState()
    if peer.openhands is None:
        peer.openhands = oh.OpenHandsWindow()
    return peer.openhands


def _openhands(state: RunState, event: Any, kind: type) -> Step:
    if state.aborted is not None:
        # OpenHands stopped the agent: a late call is refused, anything else changes nothing.
        return refused_after_abort(state, event, state.aborted) if kind is ToolCallRequested else Step(state)
    if kind is ModelText:
        return Step(state)  # Gemini CLI's content detector reads it; OpenHands has no such event
    w = _window(state)
    if kind is ToolCallRequested:
        w.append(oh.ACTION, _action_key(event))
        w.pending += 1
        return Step(state, event)  # OpenHands never gates a call: allow
    if kind is ToolCallCompleted:
        w.pending = max(0, w.pending - 1)
        if event.loop_veto:
            return Step(state)  # no such outcome under this profile (it never blocks)
        if event.is_error:
            w.append(oh.ERROR, event.result_hash or "")
        else:
            w.append(oh.OBSERVATION, f"{event.tool_name}|{event.result_hash or ''}")
        if w.pending:
            return Step(state)  # the step's other calls are still running: OpenHands has not looked yet
    elif kind is AgentMessage:
        w.pending = 0  # a reply without tool calls ends the step
        if event.source == "user":
            w.append(oh.USER_MESSAGE)
        else:
            w.append(oh.AGENT_MESSAGE)
            if not event.empty:
                # A reply with content finishes the agent (status FINISHED), and OpenHands' run
                # loop exits before its next check: this reply is never judged.
                return Step(state)
            w.append(oh.FRAMEWORK_MESSAGE)  # OpenHands' agent answers an empty reply with its corrective feedback
    elif kind is CompactionRetried:
        w.append(oh.CONDENSATION)
    return _check(state, w, event)


def _action_key(event: ToolCallRequested) -> str:
    thought = event.thought_hash
    return event.args_hash if type(thought) is not str else f"{event.args_hash}|{thought}"


def _check(state: RunState, w: oh.OpenHandsWindow, event: Any) -> Step:
    """OpenHands' check before the agent's next step (``_check_stuck_or_nudge``): the nudge
    first (it is a framework message in the history), else the stuck patterns."""
    at = oh.action_error_nudge(w)
    if at is not None:
        args_hash = w.keys[at].partition("|")[0]
        w.append(oh.FRAMEWORK_MESSAGE)  # (the window may drop its oldest event: ``at`` is read first)
        return Step(state, built_decision=_nudge(event, args_hash))
    pattern = oh.stuck_pattern(w)
    if pattern is None:
        return Step(state)
    end_run(state, pattern)
    message = (
        f"CRITICAL: OpenHands' stuck detection ({pattern}) ended this run: "
        f"{_PATTERN_TEXT[pattern]}. The agent is stopped."
    )
    args_hash = next((k for k, kind in zip(reversed(w.keys), reversed(w.kinds)) if kind == oh.ACTION), "")
    tool = args_hash.partition("|")[0][:-65]
    return Step(state, abort=build_run_aborted(event, pattern, _PATTERN_COUNT[pattern], tool, message))


_PATTERN_TEXT = {
    oh.OPENHANDS_ACTION_OBSERVATION: "the same action had the same observation 4 times in a row",
    oh.OPENHANDS_ACTION_ERROR: "the same action ended in an error 4 times in a row",
    oh.OPENHANDS_MONOLOGUE: "the agent sent 3 messages in a row with no action or user message between them",
    oh.OPENHANDS_ALTERNATING: "two actions and their observations alternated over 6 steps",
}
_PATTERN_COUNT = {
    oh.OPENHANDS_ACTION_OBSERVATION: oh.DEFAULTS.action_observation,
    oh.OPENHANDS_ACTION_ERROR: oh.DEFAULTS.action_error + 1,
    oh.OPENHANDS_MONOLOGUE: oh.DEFAULTS.monologue,
    oh.OPENHANDS_ALTERNATING: oh.DEFAULTS.alternating_pattern,
}


def _nudge(event: Any, args_hash: str) -> Decision:
    """OpenHands' nudge after 3 identical failing calls, as a warning shown to the model.  (Its
    text quotes the error, which never leaves the runner: here it says so instead.)"""
    tool = args_hash[:-65]
    n = oh.DEFAULTS.action_error
    return Decision(
        verdict_id=f"{event.event_id}/decision",
        cause_event_id=event.event_id,
        run_id=event.run_id,
        session_key=event.session_key,
        agent_id=event.agent_id,
        ts_ms=event.ts_ms,
        tool_call_id=getattr(event, "tool_call_id", None),
        tool_name=tool,
        args_hash=args_hash,
        action="warn",
        level=WARNING,
        detector=OPENHANDS_ACTION_ERROR,
        count=n,
        warning_emitted=True,
        notify_model=True,
        message=(
            f"You've called `{tool}` with the same arguments {n} times in a row and gotten the same error "
            "each time. Repeating the exact same call again will not work — review the error message and "
            "either correct the arguments or try a different approach."
        ),
    )


# -- gemini-cli ---------------------------------------------------------------------------------


def _gemini(state: RunState, event: Any, kind: type) -> Step:
    """``GeminiClient.sendMessageStream`` around ``LoopDetectionService.addAndCheck``: a loop
    found the first time in a prompt stops the call before it runs and sends the model Gemini's
    feedback (a block); the second time the turn ends (a block and the run's abort).  A user
    prompt starts over; outcomes, messages of the model and compactions change nothing."""
    if state.aborted is not None:
        return refused_after_abort(state, event, state.aborted) if kind is ToolCallRequested else Step(state)
    peer = state.peer
    if peer is None:
        peer = state.peer = PeerState()
    g = peer.gemini
    if g is None:
        g = peer.gemini = gm.GeminiState()
    if kind is ModelText:
        return _gemini_text(state, g, event)
    if kind is AgentMessage:
        if event.source == "user":  # a new prompt id: LoopDetectionService.reset
            g.calls = []
            g.strikes = 0
            g.turns = 0  # resetLlmCheckTracking
            g.llm_interval = gm.DEFAULT_LLM_CHECK_INTERVAL
            g.last_check_turn = 0
            if g.content is not None:  # resetContentTracking
                gc.reset(g.content)
        return Step(state)
    if kind is not ToolCallRequested:
        return Step(state)
    if g.content is not None:  # "content chanting only happens in one single stream": addAndCheck resets it
        gc.reset(g.content)
    gm.turn_started(g)  # the LLM check's cadence only: a judge, if any, answers beside the engine
    key = event.call_key if type(event.call_key) is str else event.args_hash
    if not gm.tool_call_loop(g, key):
        return Step(state, event)
    return _gemini_strike(
        state,
        g,
        event,
        GEMINI_TOOL_CALL_LOOP,
        (f"Repeated tool call: {event.tool_name} with the same arguments."),
        "the same tool calls repeated after its feedback",
    )


def _gemini_strike(state: RunState, g: gm.GeminiState, event: Any, detector: str, detail: str, again: str) -> Step:
    """A detection in the prompt: the first blocks the call with Gemini's feedback, the second
    blocks it and ends the run."""
    g.strikes += 1
    if g.strikes == 1:
        message = (
            f"System: Potential loop detected. Details: {detail} Please take a step back and confirm you're making "
            "forward progress. If not, take a step back, analyze your previous actions and rethink how you're "
            "approaching the problem. Avoid repeating the same tool calls or responses without new results."
        )
        decision = build_decision(
            event, "block", None, None, True, level=CRITICAL, detector=detector, count=1, message=message
        )
        return Step(state, event, built_decision=decision, action="block", notify=True, vetoed=True)
    end_run(state, detector)
    if state.aborted is not None:
        g.content = None  # the run is over: nothing will read its text again
    message = f"CRITICAL: Gemini CLI's loop detection ended this turn: {again}."
    decision = build_decision(
        event, "block", None, None, True, level=CRITICAL, detector=detector, count=g.strikes, message=message
    )
    abort = build_run_aborted(event, detector, g.strikes, event.tool_name, message)
    return Step(state, event, built_decision=decision, action="block", notify=True, vetoed=True, abort=abort)


def _gemini_text(state: RunState, g: gm.GeminiState, event: ModelText) -> Step:
    """A chunk of the model's streamed text (``addAndCheck``'s Content case).  The client's
    answer to a content loop: the first in a prompt breaks the stream and sends the model
    Gemini's feedback in a new turn of the same prompt (``_recoverFromLoop``: the content
    tracking is kept), here a warning shown to the model (there is no call to block); a
    second detection of any kind ends the turn: the run's abort."""
    c = g.content
    if c is None:
        c = g.content = gc.ContentState()
    if not gc.content_loop(c, event.reset, event.skipped, event.truncated, event.length, event.windows):
        return Step(state)
    g.strikes += 1
    if g.strikes == 1:
        # Gemini's detail quotes the repeated text, which never leaves the runner.
        message = (
            "System: Potential loop detected. Details: Repeating content detected. Please take a step back and "
            "confirm you're making forward progress. If not, take a step back, analyze your previous actions and "
            "rethink how you're approaching the problem. Avoid repeating the same tool calls or responses without "
            "new results."
        )
        decision = Decision(
            verdict_id=f"{event.event_id}/decision",
            cause_event_id=event.event_id,
            run_id=event.run_id,
            session_key=event.session_key,
            agent_id=event.agent_id,
            ts_ms=event.ts_ms,
            tool_name="",
            args_hash="",
            action="warn",
            level=WARNING,
            detector=GEMINI_CONTENT_LOOP,
            count=1,
            warning_emitted=True,
            notify_model=True,
            message=message,
        )
        return Step(state, built_decision=decision)
    end_run(state, GEMINI_CONTENT_LOOP)
    if state.aborted is not None:
        g.content = None  # the run is over: nothing will read its text again
    message = (
        "CRITICAL: Gemini CLI's loop detection ended this turn: the model's text repeated itself after its feedback."
    )
    return Step(state, abort=build_run_aborted(event, GEMINI_CONTENT_LOOP, g.strikes, "", message))


def gemini_due_state(step: Step) -> tuple[RunState, gm.GeminiState]:
    """The run's state and its Gemini state, for a step whose LLM check is due."""
    # ``gemini_llm_check_due`` said so only for a step with a state that has a Gemini state.
    state = cast(RunState, step.state)
    return state, cast(gm.GeminiState, cast(PeerState, state.peer).gemini)


def gemini_llm_check_due(step: Step) -> bool:
    """Whether Gemini's LLM check is due at this step (a requested call of an agent under
    ``gemini-cli`` whose turn started one) and nothing else already answered the call: the
    caller then asks its judge, if it has one (``streams.engine.judge``), and hands the answer to
    ``gemini_judged``."""
    state = step.state
    if state is None or step.request is None or step.vetoed or step.abort is not None or state.aborted is not None:
        return False
    peer = state.peer
    g = peer.gemini if peer is not None else None
    return g is not None and gm.llm_check_due(g)


def gemini_judged(step: Step, confidence: float | None) -> Step:
    """The step once the judge answered its due check (``gemini_llm_check_due``): a loop at
    confidence 0.9 or more, handled like the tool-call loop (the prompt's first detection blocks
    the call with feedback, its second ends the run); below, the next check's interval."""
    state, g = gemini_due_state(step)
    if not gm.llm_answer(g, confidence):
        return step
    event = step.request
    # Gemini's feedback quotes the model's analysis, which the judge keeps: its fallback text
    return _gemini_strike(
        state,
        g,
        event,
        GEMINI_LLM_LOOP,
        "Repetitive patterns identified.",
        "a judge model found the conversation still unproductive after its feedback",
    )


_RULES: dict[str | None, Callable[[RunState, Any, type], Step]] = {OPENHANDS: _openhands, GEMINI_CLI: _gemini}
"""Each peer profile's rules, by ``Settings.peer`` (None: no peer profile, no rules)."""
