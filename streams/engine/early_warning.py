"""``loopwatch.detectors.earlyWarning``: a warning, never a block, when the variety of a run's
recent calls collapses against the run's own earlier calls.

An agent that is about to loop tends to narrow its actions first (Duan, Shieh, Wu, Dou,
"Detecting and controlling action looping in LLM agents via entropy collapse"): the same few
calls come back before one of them repeats outright.  So each requested call is an **action**,
its tool and its arguments (``args_hash``), and after each call:

* the window's entropy ``H`` is the Shannon entropy, in bits, of the last ``window`` actions
  (``-sum p log2 p`` over the distinct actions, ``p`` each one's share of the window);
* the **baseline** is the mean of ``H`` over the run's earlier full windows, those that ended
  before this call, leaving out the windows of a collapse (so a long loop does not lower the bar
  it is judged against);
* from the run's ``min_calls``-th call on, ``H < ratio * baseline`` is a **collapse**: one
  warning, and no other until the run recovers, ``H`` back at ``(1 + ratio) / 2 * baseline``
  (halfway between the warning's level and the baseline, so a window on the edge does not
  warn on every other call).

A run whose every window has entropy 0 (one action, again and again) has no baseline to fall
from: that is a loop, the repeat detectors' business, not a warning's.
"""

from __future__ import annotations

import math
from collections import Counter
from hashlib import blake2b

from schemas.names import EARLY_WARNING, WARNING

from .config import EarlyWarningSettings
from .detectors import Detection
from .state import EntropyWindow

__all__ = ["EntropyCollapse", "EntropyWindow", "action_id", "observe", "window_entropy"]


class EntropyCollapse(Detection, gc=False):
    """The warning: the window's entropy against the run's baseline."""

    entropy: float = 0.0
    baseline: float = 0.0
    window: int = 0

    @property
    def message(self) -> str:
        return (
            f"WARNING: Your last {self.window} tool calls are much less varied than earlier in this run "
            f"(action entropy {self.entropy:.2f} bits against {self.baseline:.2f} before). This often comes "
            "before a loop: check that your recent calls are making progress, or change approach."
        )

    @property
    def warning_key(self) -> str:
        return EARLY_WARNING

    @property
    def log(self) -> tuple[str, str] | None:
        return (
            "warn",
            f"Early loop warning: window={self.window} entropy={self.entropy:.3f} baseline={self.baseline:.3f} "
            f"count={self.count} currentTool={self.tool}",
        )


def action_id(tool: str, args_hash: str) -> int:
    """An action as 64 bits: the same for the same tool and arguments in any process (a state
    outlives its worker), and a collision within one window as likely as none."""
    digest = blake2b(f"{tool}\0{args_hash}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def window_entropy(actions: list[int]) -> float:
    """The Shannon entropy, in bits, of the actions' empirical distribution."""
    n = len(actions)
    return -sum(c / n * math.log2(c / n) for c in Counter(actions).values()) + 0.0


def observe(early: EntropyWindow, tool: str, args_hash: str, settings: EarlyWarningSettings) -> EntropyCollapse | None:
    """Add one requested call to the run's window; the warning when it starts a collapse."""
    actions = early.actions
    actions.append(action_id(tool, args_hash))
    window = settings.window
    if len(actions) > window:
        del actions[: len(actions) - window]
    early.calls += 1
    if len(actions) < window:
        return None
    entropy = window_entropy(actions)
    found = None
    if early.windows and early.calls >= settings.min_calls:
        baseline = early.entropy_sum / early.windows
        if early.collapsed:
            early.collapsed = entropy < (1 + settings.ratio) / 2 * baseline
        elif entropy < settings.ratio * baseline:
            early.collapsed = True
            found = EntropyCollapse(
                WARNING, EARLY_WARNING, early.calls, tool, args_hash, entropy=entropy, baseline=baseline, window=window
            )
    if not early.collapsed:
        early.entropy_sum += entropy
        early.windows += 1
    return found
