"""Profile ``openhands``: OpenHands' stuck detection (``StuckDetector`` and
``StuckDetectionThresholds`` in the ``openhands-sdk`` package), on edge-hashed events.

OpenHands judges the last 20 events of its conversation (``MAX_EVENTS_TO_SCAN_FOR_STUCK_DETECTION``)
after the last user message in them, before each step of the agent.  A run's state here is the
same window, one byte of kind and one key per event: the keys are what OpenHands compares
(``_event_eq``), as hashes.

* an action: its call signature and its thought (``args_hash``, ``thought_hash``);
* an observation: the tool and the result (``result_hash``); an agent error (a completed call
  with ``is_error``): the error (its ``error:`` hash);
* messages of the agent, of the user and of the framework (OpenHands' corrective feedback after
  an empty reply, its nudge after repeated errors), and condensations, by kind only: OpenHands
  never compares them.

What is checked when (``check``), the mapping of OpenHands' answers onto verdicts
(``streams.engine.peers``) and what is not reproduced: docs/peer-profiles.md.
"""

from __future__ import annotations

import msgspec

from schemas.names import (
    OPENHANDS_ACTION_ERROR,
    OPENHANDS_ACTION_OBSERVATION,
    OPENHANDS_ALTERNATING,
    OPENHANDS_MONOLOGUE,
)

__all__ = [
    "ACTION",
    "AGENT_MESSAGE",
    "CONDENSATION",
    "ERROR",
    "FRAMEWORK_MESSAGE",
    "OBSERVATION",
    "SCAN",
    "USER_MESSAGE",
    "OpenHandsThresholds",
    "OpenHandsWindow",
    "action_error_nudge",
    "stuck_pattern",
]

SCAN = 20
"""``MAX_EVENTS_TO_SCAN_FOR_STUCK_DETECTION``: the window OpenHands reads."""

# Event kinds, as OpenHands' event classes.
ACTION = 1
"""``ActionEvent``."""
OBSERVATION = 2
"""``ObservationEvent``."""
ERROR = 3
"""``AgentErrorEvent`` (an observation too: ``ObservationBaseEvent``)."""
AGENT_MESSAGE = 4
"""``MessageEvent`` with source agent."""
USER_MESSAGE = 5
"""``MessageEvent`` with source user: the window starts after the last one."""
FRAMEWORK_MESSAGE = 6
"""``MessageEvent`` with source environment (OpenHands' feedback and nudges): neither ends nor
counts towards a monologue."""
CONDENSATION = 7
"""``Condensation``: ends a monologue like any event that is not a message."""


class OpenHandsThresholds(msgspec.Struct, frozen=True):
    """``StuckDetectionThresholds``' defaults (the profile has no knobs: OpenHands' own)."""

    action_observation: int = 4
    action_error: int = 3
    monologue: int = 3
    alternating_pattern: int = 6


DEFAULTS = OpenHandsThresholds()


class OpenHandsWindow(msgspec.Struct, array_like=True, gc=False):
    """One run's last ``SCAN`` events, oldest first."""

    kinds: bytearray = msgspec.field(default_factory=bytearray)
    keys: list[str] = []
    appended: int = 0
    """Events appended so far: event i of the window is number ``appended - len(kinds) + i``."""
    pending: int = 0
    """Requested calls without an outcome yet: OpenHands checks only between the agent's steps."""
    nudged: int = -1
    """The number of the error event last nudged for (``_last_nudged_error_event_id``)."""

    def append(self, kind: int, key: str = "") -> None:
        kinds = self.kinds
        kinds.append(kind)
        self.keys.append(key)
        self.appended += 1
        if len(kinds) > SCAN:
            del kinds[0]
            del self.keys[0]


def _start(w: OpenHandsWindow) -> int:
    """Where the events after the window's last user message begin."""
    return w.kinds.rfind(USER_MESSAGE) + 1


def _last_actions_and_observations(w: OpenHandsWindow, start: int, need: int) -> tuple[list[int], list[int]]:
    """Indices of the last ``need`` actions and the last ``need`` observations (agent errors
    included), newest first."""
    actions: list[int] = []
    observations: list[int] = []
    kinds = w.kinds
    for i in range(len(kinds) - 1, start - 1, -1):
        kind = kinds[i]
        if kind == ACTION:
            if len(actions) < need:
                actions.append(i)
        elif (kind == OBSERVATION or kind == ERROR) and len(observations) < need:
            observations.append(i)
        if len(actions) >= need and len(observations) >= need:
            break
    return actions, observations


def _same(w: OpenHandsWindow, i: int, j: int) -> bool:
    return w.kinds[i] == w.kinds[j] and w.keys[i] == w.keys[j]


def _error_streak(w: OpenHandsWindow, actions: list[int], observations: list[int]) -> int:
    """How many of the newest (action, observation) pairs repeat the newest action and are errors."""
    if not actions or not observations:
        return 0
    streak = 0
    for a, o in zip(actions, observations):
        if not _same(w, actions[0], a) or w.kinds[o] != ERROR:
            break
        streak += 1
    return streak


def action_error_nudge(w: OpenHandsWindow, t: OpenHandsThresholds = DEFAULTS) -> int | None:
    """``get_action_error_nudge``: the index of the repeated action when its error streak has just
    reached the threshold and this streak's newest error was not nudged for yet, else None.
    Remembers the nudge."""
    start = _start(w)
    actions, observations = _last_actions_and_observations(w, start, t.action_error + 1)
    if _error_streak(w, actions, observations) != t.action_error:
        return None
    error = w.appended - len(w.kinds) + observations[0]
    if error == w.nudged:
        return None
    w.nudged = error
    return actions[0]


def stuck_pattern(w: OpenHandsWindow, t: OpenHandsThresholds = DEFAULTS) -> str | None:
    """``is_stuck``: the first of OpenHands' patterns the window shows (in its order), or None."""
    start = _start(w)
    n = len(w.kinds) - start
    if n < min(t.action_observation, t.action_error, t.monologue):
        return None
    actions, observations = _last_actions_and_observations(w, start, max(t.action_observation, t.action_error + 1))
    need = t.action_observation
    if (
        len(actions) >= need
        and len(observations) >= need
        and all(_same(w, actions[0], a) for a in actions[:need])
        and all(_same(w, observations[0], o) for o in observations[:need])
    ):
        return OPENHANDS_ACTION_OBSERVATION
    if _error_streak(w, actions, observations) > t.action_error:
        return OPENHANDS_ACTION_ERROR
    if n >= t.monologue and _monologue(w, start) >= t.monologue:
        return OPENHANDS_MONOLOGUE
    if n >= t.alternating_pattern and _alternating(w, start, t.alternating_pattern):
        return OPENHANDS_ALTERNATING
    # OpenHands' fifth check, a loop of context-window errors, is a stub that never fires.
    return None


def _monologue(w: OpenHandsWindow, start: int) -> int:
    """Agent messages at the end of the window, with only framework messages between them."""
    count = 0
    kinds = w.kinds
    for i in range(len(kinds) - 1, start - 1, -1):
        kind = kinds[i]
        if kind == AGENT_MESSAGE:
            count += 1
        elif kind != FRAMEWORK_MESSAGE:
            break
    return count


def _alternating(w: OpenHandsWindow, start: int, need: int) -> bool:
    """The newest ``need`` actions and observations each repeat the ones two before them."""
    actions, observations = _last_actions_and_observations(w, start, need)
    if len(actions) != need or len(observations) != need:
        return False
    return all(_same(w, actions[i], actions[i + 2]) for i in range(need - 2)) and all(
        _same(w, observations[i], observations[i + 2]) for i in range(need - 2)
    )
