"""Profile ``gemini-cli``: Gemini CLI's tool-call loop rule (``LoopDetectionService`` in
``@google/gemini-cli-core`` 0.61.0, packages/core/src/services/loopDetectionService.ts), on
edge-hashed calls.

Gemini keeps the keys of the prompt's last 25 tool calls (``TOOL_CALL_LOOP_THRESHOLD`` 5 times the
longest cycle, 5) and finds a loop when the newest ``k * 5`` keys are one cycle of ``k`` keys
repeated 5 times, for some ``k`` from 1 to 5.  A new user prompt starts over.  What the client
does with a detection (feedback first, then the end of the turn) is ``streams.engine.peers``'s.
"""

from __future__ import annotations

import math

import msgspec

from .gemini_content import ContentState

__all__ = [
    "CYCLES",
    "LLM_CHECK_AFTER_TURNS",
    "LLM_CONFIDENCE_THRESHOLD",
    "REPEATS",
    "GeminiState",
    "llm_answer",
    "llm_check_due",
    "tool_call_loop",
    "turn_started",
]

REPEATS = 5
"""``TOOL_CALL_LOOP_THRESHOLD``."""
CYCLES = 5
"""The longest cycle looked for."""

# Gemini's LLM check (``turnStarted`` / ``checkForLoopWithLLM`` / ``updateCheckInterval``).
LLM_CHECK_AFTER_TURNS = 30
DEFAULT_LLM_CHECK_INTERVAL = 10
MIN_LLM_CHECK_INTERVAL = 5
MAX_LLM_CHECK_INTERVAL = 15
LLM_CONFIDENCE_THRESHOLD = 0.9


class GeminiState(msgspec.Struct, array_like=True, gc=False):
    calls: list[str] = []
    """The prompt's last 25 call keys, oldest first."""
    strikes: int = 0
    """Detections in this prompt (``detectedCount``): the first gets feedback, the second ends the turn."""
    turns: int = 0
    """``turnsInCurrentPrompt``: the prompt's requested calls (a loopwatch turn: docs/peer-profiles.md).
    Bounded by ``int`` only; a prompt of 2**63 calls is not a concern."""
    llm_interval: int = DEFAULT_LLM_CHECK_INTERVAL
    """``llmCheckInterval``: 5 to 15."""
    last_check_turn: int = 0
    """``lastCheckTurn``: the turn of the prompt's last LLM check (0: none yet)."""
    content: ContentState | None = None
    """The content loop detector's tracking (``streams.engine.gemini_content``); None until the
    run's first ``model.text`` (last: states stored before it decode unchanged)."""


def tool_call_loop(g: GeminiState, key: str) -> bool:
    """``checkToolCallLoop``: records the call, then whether the newest calls are a cycle
    repeated ``REPEATS`` times."""
    calls = g.calls
    calls.append(key)
    if len(calls) > CYCLES * REPEATS:
        del calls[0]
    n = len(calls)
    for k in range(1, CYCLES + 1):
        span = k * REPEATS
        if n < span:
            break
        # a cycle of k repeated: every key equals the one k places later
        if calls[n - span : n - k] == calls[n - span + k : n]:
            return True
    return False


def turn_started(g: GeminiState) -> None:
    """``turnStarted``'s cadence: counts the turn and, from the 30th, starts a check every
    ``llm_interval`` turns (``llm_check_due`` is then true until the next turn).  The check
    itself is a judge's, outside the engine (``streams.engine.judge``); with none, nothing follows."""
    g.turns += 1
    if g.turns >= LLM_CHECK_AFTER_TURNS and g.turns - g.last_check_turn >= g.llm_interval:
        g.last_check_turn = g.turns


def llm_check_due(g: GeminiState) -> bool:
    """Whether the turn just counted started an LLM check."""
    return g.turns >= LLM_CHECK_AFTER_TURNS and g.last_check_turn == g.turns


def llm_answer(g: GeminiState, confidence: float | None) -> bool:
    """``checkForLoopWithLLM`` given the deciding model's confidence: a loop at 0.9 or more;
    below, the interval becomes ``round(5 + 10 * (1 - confidence))`` (JavaScript's
    ``Math.round``: halves up, not Python's to-even); None (the model gave no answer) changes
    nothing."""
    if confidence is None:
        return False
    if confidence >= LLM_CONFIDENCE_THRESHOLD:
        return True
    span = MAX_LLM_CHECK_INTERVAL - MIN_LLM_CHECK_INTERVAL
    g.llm_interval = math.floor(MIN_LLM_CHECK_INTERVAL + span * (1 - confidence) + 0.5)
    return False
