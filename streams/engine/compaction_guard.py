"""The post-compaction loop guard (spec §4): after a compaction-then-retry, abort the run
when the next ``windowSize`` tool outcomes are all the same (tool, args, result) triple.

Profile latest (openclaw-latest.md §7) fixes the window at 3 and adds instrumentation:
``arm_latest``/``observe_latest`` also count the window's calls that repeat one of the last
16 observations before the compaction, and log a summary when the window closes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from schemas.names import COMPACTION_LOOP_PERSISTED
from streams.edge.canonical import js_number

from .config import GuardSettings
from .state import CompactionRereads, GuardWindow

__all__ = ["GuardVerdict", "SUBSYSTEM", "arm", "arm_latest", "observe", "observe_latest"]

SUBSYSTEM = "agents/post-compaction-guard"
"""The logger upstream's guard logs to (its arming, its abort)."""


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
    # (``first`` is set whenever ``length`` is not 0: the branch above sets it, ``arm`` clears both)
    elif guard.uniform and tuple(cast("tuple[str, str, str]", guard.first)) != triple:
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


def arm_latest(
    guard: GuardWindow, rereads: CompactionRereads, settings: GuardSettings, recent: list[str]
) -> str | None:
    """``arm``, and take ``recent`` (the signatures of the last 16 observations, oldest
    first) as the window's baseline."""
    line = arm(guard, settings)
    if settings.enabled:
        if recent:
            rereads.baseline = tuple(recent)
        rereads.calls = rereads.repeats = 0
        rereads.repeat_tools = ()
    return line


def observe_latest(
    guard: GuardWindow, rereads: CompactionRereads, enabled: bool, tool: str, args_hash: str, result_hash: str
) -> tuple[GuardVerdict, str | None, str | None]:
    """``observe``, and the re-read instrumentation: the verdict, the error line on abort
    and the info line when this observation closes the window without an abort.  (The
    caller keeps the observation for later arms.)"""
    if not enabled:
        return DORMANT, None, None
    armed = guard.remaining > 0
    verdict, error_line = observe(guard, True, tool, args_hash, result_hash) if armed else (DORMANT, None)
    if not armed:
        return verdict, None, None
    rereads.calls += 1
    if args_hash in rereads.baseline:
        rereads.repeats += 1
        if tool not in rereads.repeat_tools:
            rereads.repeat_tools = tuple(sorted((*rereads.repeat_tools, tool), key=_utf16))
    if verdict.should_abort or guard.remaining > 0:
        return verdict, error_line, None
    line = f"post-compaction window closed: toolCalls={rereads.calls} preCompactionRepeats={rereads.repeats}"
    if rereads.repeats:
        line += f" tools={','.join(rereads.repeat_tools)}"
    rereads.baseline = ()
    rereads.calls = rereads.repeats = 0
    rereads.repeat_tools = ()
    return verdict, None, line


def _utf16(text: str) -> bytes:
    return text.encode("utf-16-be", "surrogatepass")  # JavaScript's default sort order
