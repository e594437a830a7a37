"""Judges: a model's opinion of whether a run is stuck, for the peer rules that ask one (Gemini
CLI's LLM check, docs/peer-profiles.md).  Off by default: with no judge, the check never runs.

The engine only keeps Gemini's cadence and says when a check is due
(``streams.engine.peers.gemini_llm_check_due``); the engine's caller asks its judge then and
hands the answer back (``gemini_judged``).  ``streams.engine.drive.RunDriver`` does so when given
a judge.  A judge does its own I/O (a model call, Gemini's double check with the main model);
none is shipped yet: tests use fakes.
"""

from __future__ import annotations

import math
from typing import Protocol

import msgspec

__all__ = ["Judge", "RunContext", "checked_confidence"]


class RunContext(msgspec.Struct, frozen=True):
    """What a judge is asked about: the run, and the prompt's turn that started the check."""

    run_id: str | None
    """None for a run without an id (its session stands for it)."""
    session_key: str | None
    agent_id: str | None
    turn: int
    """The prompt's turn (``turnsInCurrentPrompt``) whose check this is."""


class Judge(Protocol):
    def __call__(self, context: RunContext) -> float | None:
        """The deciding model's ``unproductive_state_confidence`` (0 to 1; after Gemini's double
        check, the main model's), or None when no model answered (the check then changes nothing,
        as Gemini's does)."""
        ...


def checked_confidence(value: object) -> float | None:
    """A judge's answer as the engine takes it: a finite number in [0, 1], else None (a bad
    answer counts as no answer, as Gemini's ``queryLoopDetectionModel`` returns null)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        return None
    return value
