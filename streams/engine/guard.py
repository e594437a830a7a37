"""The post-compaction loop guard (spec §4): after a compaction-then-retry, abort the run
when the next ``windowSize`` tool outcomes are all the same (tool, args, result) triple."""

from __future__ import annotations

from dataclasses import dataclass

from .canonical import js_number
from .config import GuardSettings
from .state import GuardWindow

__all__ = ["GuardVerdict", "arm", "observe", "COMPACTION_LOOP_PERSISTED"]

COMPACTION_LOOP_PERSISTED = "compaction_loop_persisted"
SUBSYSTEM = "agents/post-compaction-guard"


@dataclass(frozen=True, slots=True)
class GuardVerdict:
    should_abort: bool
    armed: bool
    remaining_attempts: int | float
    detector: str | None = None
    count: int | None = None
    tool_name: str | None = None
    message: str | None = None


DORMANT = GuardVerdict(False, False, 0)
"""The verdict of a guard that is disabled or not armed."""


def arm(guard: GuardWindow, settings: GuardSettings) -> str | None:
    """Open a fresh window; returns the info log line (only when the guard is enabled)."""
    guard.remaining = settings.window_size
    guard.window_size = settings.window_size
    guard.length = 0
    guard.uniform = True
    guard.first = None
    if settings.enabled:
        return f"post-compaction guard armed for {js_number(settings.window_size)} attempts"
    return None


def observe(
    guard: GuardWindow, enabled: bool, tool: str, args_hash: str, result_hash: str
) -> tuple[GuardVerdict, str | None]:
    """Feed one hashed outcome; returns the verdict and the error log line on abort."""
    if not enabled or guard.remaining <= 0:
        return DORMANT, None
    guard.remaining -= 1
    triple = (tool, args_hash, result_hash)
    if guard.length == 0:
        guard.first = triple
    elif guard.uniform and tuple(guard.first) != triple:
        guard.uniform = False
    guard.length += 1
    armed = guard.remaining > 0
    # matches >= windowSize happens only when every entry of a full window is this triple.
    if guard.uniform and guard.length >= guard.window_size:
        count = guard.length
        message = (
            f"CRITICAL: tool {tool} repeated {count} times with identical arguments and identical results "
            f"within {js_number(guard.window_size)} attempts after auto-compaction. The compaction did not "
            "break the loop. Aborting to prevent runaway resource use."
        )
        log = f"post-compaction loop persisted: tool={tool} repeated {count} times with identical args+result post-compaction"
        return GuardVerdict(True, armed, guard.remaining, COMPACTION_LOOP_PERSISTED, count, tool, message), log
    return GuardVerdict(False, armed, guard.remaining), None
