"""The five rolling-history detectors, in upstream order (spec §2.7–§2.12).

``detect`` sees the run's history *before* the current call is recorded and returns the
first matching ``Detection`` (or None) plus the detector's own log line, exactly as
upstream's ``detectToolCallLoop``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import DetectorSettings
from .state import RunState

__all__ = ["Detection", "detect", "ping_pong_key"]

CRITICAL = "critical"
WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Detection:
    level: str
    detector: str
    count: int
    message: str
    warning_key: str
    paired_tool_name: str | None = None
    log_level: str | None = None
    log_message: str | None = None

    @property
    def critical(self) -> bool:
        return self.level == CRITICAL


def _utf16(text: str) -> bytes:
    return text.encode("utf-16-be", "surrogatepass")


def ping_pong_key(sig_a: str, sig_b: str) -> str:
    """``pingpong:`` + both signatures sorted as JavaScript sorts strings (UTF-16 units)."""
    pair = sorted((sig_a, sig_b), key=_utf16)
    return f"pingpong:{pair[0]}|{pair[1]}"


def _ping_pong(state: RunState, current_sig: str) -> tuple[int, str | None, str | None, bool]:
    """(count, paired tool, paired signature, no-progress evidence) — spec §2.11."""
    sigs = state.sigs
    n = len(sigs)
    if n < 2:
        return 0, None, None, False
    last_sig = sigs[-1]
    # The current call must continue the alternation: it must be `other`, the newest
    # signature before `last` that differs from it.  Cheap exits first.
    if current_sig == last_sig or current_sig not in sigs:
        return 0, None, None, False
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
    tail = 0
    for i in range(n - 1, -1, -1):
        if sigs[i] != (last_sig if tail % 2 == 0 else other_sig):
            break
        tail += 1
    if tail < 2:
        return 0, None, None, False
    results = state.results
    hash_a = hash_b = None
    evidence = True
    for i in range(n - tail, n):
        result = results[i]
        if not result:
            evidence = False
            break
        if sigs[i] == last_sig:
            if hash_a is None:
                hash_a = result
            elif hash_a != result:
                evidence = False
                break
        elif hash_b is None:
            hash_b = result
        elif hash_b != result:
            evidence = False
            break
    if hash_a is None or hash_b is None:
        evidence = False
    return tail + 1, state.tools[-1], last_sig, evidence


def detect(state: RunState, tool: str, sig: str, known_poll: bool, cfg: DetectorSettings) -> Detection | None:
    """Upstream's ``detectToolCallLoop`` on one run's history (callers check ``enabled``)."""
    sigs = state.sigs
    tools = state.tools
    unknowns = state.unknowns
    # Unknown-tool streak: consecutive at the tail, same called tool, same missing name.
    unknown_count = 0
    unknown_name = None
    if unknowns and unknowns[-1]:
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
        return Detection(
            CRITICAL, "unknown_tool_repeat", unknown_count,
            f"CRITICAL: attempted unavailable tool {unknown_name or tool} {unknown_count} times. "
            "Stop retrying that missing tool and answer without it.",
            f"unknown-tool:{tool}:{unknown_name or 'unknown'}",
        )

    # The no-progress streak N (identical outcomes of this signature, newest first; pending
    # and vetoed calls skipped) and the occurrence count R.  A validated signature begins
    # with its tool's name (schemas.events.check_event), so equal signatures mean equal
    # tools and upstream's separate tool comparison is implied.
    occurrences = sigs.count(sig)
    streak = 0
    latest = None
    if occurrences:
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
    latest_text = latest or "none"

    if streak >= cfg.global_circuit_breaker_threshold:
        return Detection(
            CRITICAL, "global_circuit_breaker", streak,
            f"CRITICAL: {tool} has repeated identical no-progress outcomes {streak} times. "
            "Session execution blocked by global circuit breaker to prevent runaway loops.",
            f"global:{tool}:{sig}:{latest_text}",
            log_level="error",
            log_message=f"Global circuit breaker triggered: {tool} repeated {streak} times with no progress",
        )
    if known_poll and cfg.known_poll_no_progress:
        if streak >= cfg.critical_threshold:
            return Detection(
                CRITICAL, "known_poll_no_progress", streak,
                f"CRITICAL: Called {tool} with identical arguments and no progress {streak} times. "
                "This appears to be a stuck polling loop. Session execution blocked to prevent resource waste.",
                f"poll:{tool}:{sig}:{latest_text}",
                log_level="error",
                log_message=f"Critical polling loop detected: {tool} repeated {streak} times",
            )
        if streak >= cfg.warning_threshold:
            return Detection(
                WARNING, "known_poll_no_progress", streak,
                f"WARNING: You have called {tool} {streak} times with identical arguments and no progress. "
                "Stop polling and either (1) increase wait time between checks, or (2) report the task as "
                "failed if the process is stuck.",
                f"poll:{tool}:{sig}:{latest_text}",
                log_level="warn",
                log_message=f"Polling loop warning: {tool} repeated {streak} times",
            )

    if cfg.ping_pong:
        count, paired_tool, paired_sig, evidence = _ping_pong(state, sig)
        if count:
            if count >= cfg.critical_threshold and evidence:
                return Detection(
                    CRITICAL, "ping_pong", count,
                    f"CRITICAL: You are alternating between repeated tool-call patterns ({count} consecutive "
                    "calls) with no progress. This appears to be a stuck ping-pong loop. Session execution "
                    "blocked to prevent resource waste.",
                    ping_pong_key(sig, paired_sig),
                    paired_tool,
                    log_level="error",
                    log_message=f"Critical ping-pong loop detected: alternating calls count={count} currentTool={tool}",
                )
            if count >= cfg.warning_threshold:
                return Detection(
                    WARNING, "ping_pong", count,
                    f"WARNING: You are alternating between repeated tool-call patterns ({count} consecutive "
                    "calls). This looks like a ping-pong loop; stop retrying and report the task as failed.",
                    ping_pong_key(sig, paired_sig),
                    paired_tool,
                    log_level="warn",
                    log_message=f"Ping-pong loop warning: alternating calls count={count} currentTool={tool}",
                )

    if not known_poll and cfg.generic_repeat:
        if streak >= cfg.critical_threshold:
            return Detection(
                CRITICAL, "generic_repeat", streak,
                f"CRITICAL: Called {tool} with identical arguments and identical outcomes {streak} times. "
                "Session execution blocked to prevent runaway loops.",
                f"generic:{tool}:{sig}:{latest_text}",
                log_level="error",
                log_message=f"Critical generic loop detected: {tool} repeated {streak} times",
            )
        if occurrences >= cfg.warning_threshold:
            return Detection(
                WARNING, "generic_repeat", occurrences,
                f"WARNING: You have called {tool} {occurrences} times with identical arguments. "
                "If this is not making progress, stop retrying and report the task as failed.",
                f"generic:{tool}:{sig}",
                log_level="warn",
                log_message=f"Loop warning: {tool} called {occurrences} times with identical arguments",
            )
    return None
