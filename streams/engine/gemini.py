"""Profile ``gemini-cli``: Gemini CLI's tool-call loop rule (``LoopDetectionService`` in
``@google/gemini-cli-core`` 0.61.0, packages/core/src/services/loopDetectionService.ts), on
edge-hashed calls.

Gemini keeps the keys of the prompt's last 25 tool calls (``TOOL_CALL_LOOP_THRESHOLD`` 5 times the
longest cycle, 5) and finds a loop when the newest ``k * 5`` keys are one cycle of ``k`` keys
repeated 5 times, for some ``k`` from 1 to 5.  A new user prompt starts over.  What the client
does with a detection (feedback first, then the end of the turn) is ``streams.engine.peers``'s.
"""

from __future__ import annotations

import msgspec

__all__ = ["CYCLES", "REPEATS", "GeminiState", "tool_call_loop"]

REPEATS = 5
"""``TOOL_CALL_LOOP_THRESHOLD``."""
CYCLES = 5
"""The longest cycle looked for."""


class GeminiState(msgspec.Struct, array_like=True, gc=False):
    calls: list[str] = []
    """The prompt's last 25 call keys, oldest first."""
    strikes: int = 0
    """Detections in this prompt (``detectedCount``): the first gets feedback, the second ends the turn."""


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
