"""The five rolling-history detectors, in upstream order (spec §2.7–§2.12).

``detect`` sees the run's history *before* the current call is recorded and returns the
first matching ``Detection`` (or None), exactly as
upstream's ``detectToolCallLoop``.
"""

from __future__ import annotations

import msgspec

from .config import DetectorSettings
from .state import RunState

__all__ = ["Detection", "detect", "ping_pong_key"]

CRITICAL = "critical"
WARNING = "warning"


class Detection(msgspec.Struct, gc=False):
    """One detector's finding.  Messages, warning keys and log lines are upstream's exact
    strings, built only when read: most detections on a busy loop are warnings the bucket
    rule hides, and nobody reads their text."""

    level: str
    detector: str
    count: int
    tool: str
    sig: str
    latest: str | None = None
    paired_tool_name: str | None = None
    paired_sig: str | None = None
    unknown_name: str | None = None

    @property
    def critical(self) -> bool:
        return self.level == CRITICAL

    @property
    def message(self) -> str:
        tool, n = self.tool, self.count
        kind = self.detector
        if kind == "unknown_tool_repeat":
            return (f"CRITICAL: attempted unavailable tool {self.unknown_name or tool} {n} times. "
                    "Stop retrying that missing tool and answer without it.")
        if kind == "global_circuit_breaker":
            return (f"CRITICAL: {tool} has repeated identical no-progress outcomes {n} times. "
                    "Session execution blocked by global circuit breaker to prevent runaway loops.")
        if kind == "known_poll_no_progress":
            if self.level == CRITICAL:
                return (f"CRITICAL: Called {tool} with identical arguments and no progress {n} times. "
                        "This appears to be a stuck polling loop. Session execution blocked to prevent resource waste.")
            return (f"WARNING: You have called {tool} {n} times with identical arguments and no progress. "
                    "Stop polling and either (1) increase wait time between checks, or (2) report the task as "
                    "failed if the process is stuck.")
        if kind == "ping_pong":
            if self.level == CRITICAL:
                return (f"CRITICAL: You are alternating between repeated tool-call patterns ({n} consecutive "
                        "calls) with no progress. This appears to be a stuck ping-pong loop. Session execution "
                        "blocked to prevent resource waste.")
            return (f"WARNING: You are alternating between repeated tool-call patterns ({n} consecutive "
                    "calls). This looks like a ping-pong loop; stop retrying and report the task as failed.")
        if self.level == CRITICAL:
            return (f"CRITICAL: Called {tool} with identical arguments and identical outcomes {n} times. "
                    "Session execution blocked to prevent runaway loops.")
        return (f"WARNING: You have called {tool} {n} times with identical arguments. "
                "If this is not making progress, stop retrying and report the task as failed.")

    @property
    def warning_key(self) -> str:
        kind = self.detector
        if kind == "unknown_tool_repeat":
            return f"unknown-tool:{self.tool}:{self.unknown_name or 'unknown'}"
        if kind == "ping_pong":
            return ping_pong_key(self.sig, self.paired_sig)
        if kind == "generic_repeat" and self.level == WARNING:
            return f"generic:{self.tool}:{self.sig}"
        prefix = {"global_circuit_breaker": "global", "known_poll_no_progress": "poll"}.get(kind, "generic")
        return f"{prefix}:{self.tool}:{self.sig}:{self.latest or 'none'}"

    @property
    def log(self) -> tuple[str, str] | None:
        """The detector's own log line (level, text) on ``agents/loop-detection``."""
        tool, n, kind, critical = self.tool, self.count, self.detector, self.level == CRITICAL
        if kind == "unknown_tool_repeat":
            return None
        if kind == "global_circuit_breaker":
            return "error", f"Global circuit breaker triggered: {tool} repeated {n} times with no progress"
        if kind == "known_poll_no_progress":
            if critical:
                return "error", f"Critical polling loop detected: {tool} repeated {n} times"
            return "warn", f"Polling loop warning: {tool} repeated {n} times"
        if kind == "ping_pong":
            if critical:
                return "error", f"Critical ping-pong loop detected: alternating calls count={n} currentTool={tool}"
            return "warn", f"Ping-pong loop warning: alternating calls count={n} currentTool={tool}"
        if critical:
            return "error", f"Critical generic loop detected: {tool} repeated {n} times"
        return "warn", f"Loop warning: {tool} called {n} times with identical arguments"


def _utf16(text: str) -> bytes:
    return text.encode("utf-16-be", "surrogatepass")


def ping_pong_key(sig_a: str, sig_b: str) -> str:
    """``pingpong:`` + both signatures sorted as JavaScript sorts strings (UTF-16 units)."""
    if sig_a.isascii() and sig_b.isascii():  # code points and UTF-16 units order alike
        pair = (sig_a, sig_b) if sig_a <= sig_b else (sig_b, sig_a)
    else:
        pair = sorted((sig_a, sig_b), key=_utf16)
    return f"pingpong:{pair[0]}|{pair[1]}"


def _ping_pong(state: RunState, current_sig: str) -> tuple[int, str | None, str | None, bool]:
    """(count, paired tool, paired signature, no-progress evidence) — spec §2.11.

    The caller has checked that ``current_sig`` is in the history and is not the newest.
    """
    sigs = state.sigs
    n = len(sigs)
    if n < 2:
        return 0, None, None, False
    last_sig = sigs[-1]
    # The current call must continue the alternation: it must be `other`, the newest
    # signature before `last` that differs from it.
    other_index = -1
    for i in range(n - 2, -1, -1):
        if sigs[i] != last_sig:
            other_index = i
            break
    if other_index < 0:
        return 0, None, None, False
    other_sig, other_tool = sigs[other_index], state.tools[other_index]
    if not other_sig or not other_tool or current_sig != other_sig:
        return 0, None, None, False
    # The alternating tail: newest first, `last` at even distances, `other` at odd ones.
    # A steady ping-pong fills the whole history, which two C-level counts confirm.
    at_last, at_other = sigs[n - 1::-2], sigs[n - 2::-2]
    if at_last.count(last_sig) == len(at_last) and at_other.count(other_sig) == len(at_other):
        tail = n
    else:
        tail = 0
        for i in range(n - 1, -1, -1):
            if sigs[i] != (last_sig if tail % 2 == 0 else other_sig):
                break
            tail += 1
        if tail < 2:
            return 0, None, None, False
    # No-progress evidence: every outcome in the tail present, and one outcome per side.
    outcomes = state.results[n - tail:]
    of_last, of_other = outcomes[-1::-2], outcomes[-2::-2]
    evidence = all(outcomes) and len(set(of_last)) == 1 and len(set(of_other)) == 1
    return tail + 1, state.tools[-1], last_sig, evidence


def detect(state: RunState, tool: str, sig: str, known_poll: bool, cfg: DetectorSettings) -> Detection | None:
    """Upstream's ``detectToolCallLoop`` on one run's history (callers check ``enabled``)."""
    sigs = state.sigs
    unknowns = state.unknowns
    # Unknown-tool streak: consecutive at the tail, same called tool, same missing name.
    if unknowns and unknowns[-1]:
        tools = state.tools
        newest = unknowns[-1]
        if unknowns.count(newest) == len(unknowns) and tools.count(tool) == len(tools):
            unknown_count, unknown_name = len(unknowns), newest  # the whole history is the streak
        else:
            unknown_count = 0
            unknown_name = None
            for i in range(len(sigs) - 1, -1, -1):
                name = unknowns[i]
                if tools[i] != tool or not name:
                    break
                if unknown_name is None:
                    unknown_name = name
                elif name != unknown_name:
                    break
                unknown_count += 1
        if unknown_count >= cfg.unknown_tool_threshold:
            return Detection(CRITICAL, "unknown_tool_repeat", unknown_count, tool, sig, unknown_name=unknown_name)

    # The occurrence count R.  A validated signature begins with its tool's name
    # (schemas.events.check_event), so equal signatures mean equal tools and upstream's
    # separate tool comparison is implied.
    occurrences = sigs.count(sig)
    if not occurrences:
        # A call not in the history: every remaining detector needs an earlier occurrence
        # (thresholds are positive; ping-pong needs the call to continue an alternation).
        return None

    # The no-progress streak N: identical outcomes of this signature, newest first, pending
    # and vetoed calls skipped.
    streak = 0
    latest = None
    results = state.results
    # Outcomes of this signature, oldest first (None: pending or vetoed).
    outcomes = results if occurrences == len(sigs) else [r for s, r in zip(sigs, results) if s == sig]
    distinct = set(outcomes)
    distinct.discard(None)
    if len(distinct) == 1:  # a steady loop: every outcome is the same
        latest = distinct.pop()
        streak = len(outcomes) - outcomes.count(None)
    elif distinct:
        for result in reversed(outcomes):
            if result is None:
                continue
            if latest is None:
                latest = result
            elif result != latest:
                break
            streak += 1
    if streak >= cfg.global_circuit_breaker_threshold:
        return Detection(CRITICAL, "global_circuit_breaker", streak, tool, sig, latest)
    if known_poll and cfg.known_poll_no_progress:
        if streak >= cfg.critical_threshold:
            return Detection(CRITICAL, "known_poll_no_progress", streak, tool, sig, latest)
        if streak >= cfg.warning_threshold:
            return Detection(WARNING, "known_poll_no_progress", streak, tool, sig, latest)
    if cfg.ping_pong and sigs[-1] != sig:
        count, paired_tool, paired_sig, evidence = _ping_pong(state, sig)
        if count:
            if count >= cfg.critical_threshold and evidence:
                return Detection(CRITICAL, "ping_pong", count, tool, sig, None, paired_tool, paired_sig)
            if count >= cfg.warning_threshold:
                return Detection(WARNING, "ping_pong", count, tool, sig, None, paired_tool, paired_sig)
    if not known_poll and cfg.generic_repeat:
        if streak >= cfg.critical_threshold:
            return Detection(CRITICAL, "generic_repeat", streak, tool, sig, latest)
        if occurrences >= cfg.warning_threshold:
            return Detection(WARNING, "generic_repeat", occurrences, tool, sig, latest)
    return None
