"""The rolling-history detectors, in upstream order (spec §2.7–§2.12; profile latest:
openclaw-latest.md §5).

``detect`` (configurable-final) and ``detect_latest`` see the run's history *before* the
current call is recorded and return the first matching ``Detection`` (or None), exactly as
upstream's ``detectToolCallLoop`` of each profile.  ``detect_cycle`` is loopwatch's own,
opt-in ``cycle`` detector: the engine's extensions ask it only where an agent's
config turns it on (``streams.engine.extensions``), so neither profile's path changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, cast

import msgspec

from schemas.names import (
    ARGUMENT_CHURN,
    CRITICAL,
    CYCLE,
    GENERIC_REPEAT,
    GLOBAL_CIRCUIT_BREAKER,
    KNOWN_POLL_NO_PROGRESS,
    PING_PONG,
    UNKNOWN_TOOL_REPEAT,
    WARNING,
)

from .config import DetectorSettings
from .state import (
    AWAITING,
    MUTATION,
    NO_PROGRESS,
    NO_PROGRESS_PLAIN,
    OBSERVED,
    TERMINAL_FAILURE,
    VETO,
    LatestState,
    RunState,
)

# A kind with the guard's OBSERVED flag (LatestState.observed): scans look for both forms.
_OBSERVED_TERMINAL = TERMINAL_FAILURE | OBSERVED
_OBSERVED_MUTATION = MUTATION | OBSERVED
_OBSERVED_NO_PROGRESS = NO_PROGRESS_PLAIN | OBSERVED

__all__ = [
    "CycleDetection",
    "Detection",
    "Finding",
    "LatestDetection",
    "detect",
    "detect_cycle",
    "detect_latest",
    "ping_pong_key",
    "write_churn",
]


class Warned(Protocol):
    """What the bucket rule reads of a warning (``LoopEngine.warning_bucket``)."""

    @property
    def count(self) -> int: ...
    @property
    def warning_key(self) -> str: ...


class Finding(Warned, Protocol):
    """What the engine reads of a finding to decide, publish and log it: a ``Detection``, or
    one of loopwatch's own findings that reads the same (``streams.engine.fleet.RingDetection``)."""

    @property
    def level(self) -> str: ...
    @property
    def detector(self) -> str: ...
    @property
    def paired_tool_name(self) -> str | None: ...
    @property
    def liveness_signal(self) -> str | None: ...
    @property
    def message(self) -> str: ...
    @property
    def log(self) -> tuple[str, str] | None: ...


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
    def liveness_signal(self) -> str | None:
        """Profile latest: ``argument_churn`` when the call also continues an argument churn.
        (A field of ``LatestDetection`` only: configurable-final's detections, built on every
        warning of a loop, do without the extra field.)"""
        return None

    @property
    def message(self) -> str:
        tool, n = self.tool, self.count
        kind = self.detector
        if kind == UNKNOWN_TOOL_REPEAT:
            return (
                f"CRITICAL: attempted unavailable tool {self.unknown_name or tool} {n} times. "
                "Stop retrying that missing tool and answer without it."
            )
        if kind == GLOBAL_CIRCUIT_BREAKER:
            return (
                f"CRITICAL: {tool} has repeated identical no-progress outcomes {n} times. "
                "Session execution blocked by global circuit breaker to prevent runaway loops."
            )
        if kind == KNOWN_POLL_NO_PROGRESS:
            if self.level == CRITICAL:
                return (
                    f"CRITICAL: Called {tool} with identical arguments and no progress {n} times. "
                    "This appears to be a stuck polling loop. Session execution blocked to prevent resource waste."
                )
            return (
                f"WARNING: You have called {tool} {n} times with identical arguments and no progress. "
                "Stop polling and either (1) increase wait time between checks, or (2) report the task as "
                "failed if the process is stuck."
            )
        if kind == PING_PONG:
            if self.level == CRITICAL:
                return (
                    f"CRITICAL: You are alternating between repeated tool-call patterns ({n} consecutive "
                    "calls) with no progress. This appears to be a stuck ping-pong loop. Session execution "
                    "blocked to prevent resource waste."
                )
            return (
                f"WARNING: You are alternating between repeated tool-call patterns ({n} consecutive "
                "calls). This looks like a ping-pong loop; stop retrying and report the task as failed."
            )
        if self.level == CRITICAL:
            return (
                f"CRITICAL: Called {tool} with identical arguments and identical outcomes {n} times. "
                "Session execution blocked to prevent runaway loops."
            )
        return (
            f"WARNING: You have called {tool} {n} times with identical arguments. "
            "If this is not making progress, stop retrying and report the task as failed."
        )

    @property
    def warning_key(self) -> str:
        kind = self.detector
        if kind == UNKNOWN_TOOL_REPEAT:
            return f"unknown-tool:{self.tool}:{self.unknown_name or 'unknown'}"
        if kind == PING_PONG:
            # (a ping-pong detection always names the signature it alternates with)
            return ping_pong_key(self.sig, cast(str, self.paired_sig))
        if kind == GENERIC_REPEAT and self.level == WARNING:
            return f"generic:{self.tool}:{self.sig}"
        prefix = {GLOBAL_CIRCUIT_BREAKER: "global", KNOWN_POLL_NO_PROGRESS: "poll"}.get(kind, "generic")
        return f"{prefix}:{self.tool}:{self.sig}:{self.latest or 'none'}"

    @property
    def log(self) -> tuple[str, str] | None:
        """The detector's own log line (level, text) on ``agents/loop-detection``."""
        tool, n, kind, critical = self.tool, self.count, self.detector, self.level == CRITICAL
        if kind == UNKNOWN_TOOL_REPEAT:
            return None
        if kind == GLOBAL_CIRCUIT_BREAKER:
            return "error", f"Global circuit breaker triggered: {tool} repeated {n} times with no progress"
        if kind == KNOWN_POLL_NO_PROGRESS:
            if critical:
                return "error", f"Critical polling loop detected: {tool} repeated {n} times"
            return "warn", f"Polling loop warning: {tool} repeated {n} times"
        if kind == PING_PONG:
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
    pair: Sequence[str]
    if sig_a.isascii() and sig_b.isascii():  # code points and UTF-16 units order alike
        pair = (sig_a, sig_b) if sig_a <= sig_b else (sig_b, sig_a)
    else:
        pair = sorted((sig_a, sig_b), key=_utf16)
    return f"pingpong:{pair[0]}|{pair[1]}"


# -- loopwatch's cycle detector -----------------------------------------------------

CYCLE_PERIODS = (3, 4, 5)
"""Cycles the detector looks for; a cycle of 2 is ping-pong, upstream's."""


class CycleDetection(Detection, gc=False):
    """A cycle of ``period`` calls: read, edit, test, read, edit, test, ...  Messages in
    ping-pong's style; the warning key names the cycle's signatures (sorted, each once), so
    every call of one cycle shares a warning bucket, as both sides of a ping-pong do."""

    period: int = 3
    signatures: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        n, p = self.count, self.period
        if self.level == CRITICAL:
            return (
                f"CRITICAL: You are repeating a cycle of {p} tool calls ({n} consecutive calls) with no progress. "
                "This appears to be a stuck cycle loop. Session execution blocked to prevent resource waste."
            )
        return (
            f"WARNING: You are repeating a cycle of {p} tool calls ({n} consecutive calls) with identical "
            "outcomes. This looks like a cycle loop; stop retrying and report the task as failed."
        )

    @property
    def warning_key(self) -> str:
        return "cycle:" + "|".join(sorted(set(self.signatures), key=_utf16))

    @property
    def log(self) -> tuple[str, str] | None:
        n, p, tool = self.count, self.period, self.tool
        if self.level == CRITICAL:
            return "error", f"Critical cycle loop detected: period={p} count={n} currentTool={tool}"
        return "warn", f"Cycle loop warning: period={p} count={n} currentTool={tool}"


def detect_cycle(
    state: RunState, tool: str, sig: str, warning_threshold: int | float, critical_threshold: int | float
) -> CycleDetection | None:
    """A cycle of 3 to 5 calls that the proposed call ``sig`` continues, else None.

    The cycle is the longest tail of the history, the proposed call included, in which every
    call repeats the call ``period`` positions before it: the same signature, and (for the
    calls that ran) the same outcome, present.  Identical outcomes at each position are part
    of the pattern, not only of the block's evidence as in ping-pong: a read, edit, test cycle
    whose test results change is a run making progress.  So every cycle found has upstream's
    no-progress evidence, and it blocks at ``critical_threshold`` calls; it warns from
    ``warning_threshold``.  The tail must hold the cycle twice, and its calls must not all be
    one call, nor (period 4) a ping-pong.  Of several periods the longest tail wins."""
    sigs, results = state.sigs, state.results
    n = len(sigs)
    best: tuple[int, int, tuple[str, ...]] | None = None
    for period in CYCLE_PERIODS:
        if n + 1 < 2 * period or sigs[n - period] != sig:
            continue
        block = sigs[n + 1 - period :]
        block.append(sig)
        if block.count(sig) == period or (period == 4 and block[0] == block[2] and block[1] == block[3]):
            continue  # a repeat or a ping-pong, not a cycle of this period
        i = n - 1
        while (
            i >= period and sigs[i] == sigs[i - period] and results[i] is not None and results[i] == results[i - period]
        ):
            i -= 1
        count = n - i + period
        if count >= 2 * period and (best is None or count > best[0]):
            best = (count, period, tuple(block))
    if best is None:
        return None
    count, period, signatures = best
    if count >= critical_threshold:
        return CycleDetection(CRITICAL, CYCLE, count, tool, sig, period=period, signatures=signatures)
    if count >= warning_threshold:
        return CycleDetection(WARNING, CYCLE, count, tool, sig, period=period, signatures=signatures)
    return None


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
    at_last, at_other = sigs[n - 1 :: -2], sigs[n - 2 :: -2]
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
    outcomes = state.results[n - tail :]
    of_last, of_other = outcomes[-1::-2], outcomes[-2::-2]
    evidence = all(outcomes) and len(set(of_last)) == 1 and len(set(of_other)) == 1
    return tail + 1, state.tools[-1], last_sig, evidence


def _unknown_streak(state: RunState, tool: str) -> tuple[int, str | None]:
    """Unknown-tool streak (spec §2.9): consecutive at the tail, same called tool, same
    missing name.  The caller has checked that the newest record has a missing name."""
    unknowns, tools = state.unknowns, state.tools
    newest = unknowns[-1]
    if unknowns.count(newest) == len(unknowns) and tools.count(tool) == len(tools):
        return len(unknowns), newest  # the whole history is the streak
    count = 0
    name = None
    for i in range(len(unknowns) - 1, -1, -1):
        current = unknowns[i]
        if tools[i] != tool or not current:
            break
        if name is None:
            name = current
        elif current != name:
            break
        count += 1
    return count, name


def detect(state: RunState, tool: str, sig: str, known_poll: bool, cfg: DetectorSettings) -> Detection | None:
    """Upstream's ``detectToolCallLoop`` on one run's history (callers check ``enabled``)."""
    sigs = state.sigs
    unknowns = state.unknowns
    if unknowns and unknowns[-1]:
        unknown_count, unknown_name = _unknown_streak(state, tool)
        if unknown_count >= cfg.unknown_tool_threshold:
            return Detection(CRITICAL, UNKNOWN_TOOL_REPEAT, unknown_count, tool, sig, unknown_name=unknown_name)

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
        return Detection(CRITICAL, GLOBAL_CIRCUIT_BREAKER, streak, tool, sig, latest)
    if known_poll and cfg.known_poll_no_progress:
        if streak >= cfg.critical_threshold:
            return Detection(CRITICAL, KNOWN_POLL_NO_PROGRESS, streak, tool, sig, latest)
        if streak >= cfg.warning_threshold:
            return Detection(WARNING, KNOWN_POLL_NO_PROGRESS, streak, tool, sig, latest)
    if cfg.ping_pong and sigs[-1] != sig:
        count, paired_tool, paired_sig, evidence = _ping_pong(state, sig)
        if count:
            if count >= cfg.critical_threshold and evidence:
                return Detection(CRITICAL, PING_PONG, count, tool, sig, None, paired_tool, paired_sig)
            if count >= cfg.warning_threshold:
                return Detection(WARNING, PING_PONG, count, tool, sig, None, paired_tool, paired_sig)
    if not known_poll and cfg.generic_repeat:
        if streak >= cfg.critical_threshold:
            return Detection(CRITICAL, GENERIC_REPEAT, streak, tool, sig, latest)
        if occurrences >= cfg.warning_threshold:
            return Detection(WARNING, GENERIC_REPEAT, occurrences, tool, sig, latest)
    return None


# -- profile latest (openclaw-latest.md §5) -----------------------------------------------------

LATEST_WARNING = 10
LATEST_CRITICAL = 20
LATEST_GLOBAL = 30
LATEST_UNKNOWN = 10


class LatestDetection(Detection, gc=False):
    """A finding under profile latest: two reworded critical messages, and argument churn."""

    liveness_signal: str | None = None
    variant_count: int = 0
    write_target: str | None = None
    """Write-mutation churn: the target's hash ("unknown" in the key when None)."""
    write_mutation: bool = False
    """Argument churn of the write-mutation kind (else stable-outcome)."""

    @property
    def message(self) -> str:
        kind, tool, n = self.detector, self.tool, self.count
        if kind == ARGUMENT_CHURN:
            if self.write_mutation:
                return (
                    f"WARNING: {tool} has changed the same target with {self.variant_count} distinct argument "
                    "variants and no intervening verification. Continued rewriting is treated as stalled run "
                    "activity, but this tool call remains allowed. Read or verify the current result before "
                    "rewriting it again."
                )
            return (
                f"WARNING: {tool} has cycled through {self.variant_count} repeated argument patterns with the "
                f"same stable outcome {n} times. Continued churn is treated as stalled run activity, but this "
                "tool call remains allowed."
            )
        if kind == GLOBAL_CIRCUIT_BREAKER:
            return (
                f"CRITICAL: {tool} repeated identical no-progress outcomes {n} times. "
                "Session execution blocked by global circuit breaker to prevent runaway loops."
            )
        if kind == GENERIC_REPEAT and self.level == CRITICAL:
            return (
                f"CRITICAL: Called {tool} with identical outcomes {n} times. "
                "Session execution blocked to prevent runaway loops."
            )
        return super().message

    @property
    def warning_key(self) -> str:
        if self.detector == ARGUMENT_CHURN:
            if self.write_mutation:
                return f"argument-churn:{self.tool}:write-mutation:{self.write_target or 'unknown'}"
            return f"argument-churn:{self.tool}"
        return super().warning_key

    @property
    def log(self) -> tuple[str, str] | None:
        if self.detector == ARGUMENT_CHURN:
            return "warn", f"Argument churn warning: {self.tool} cycled through stable argument patterns"
        return super().log


def _signature_streak(state: RunState, sig: str, kinds: bytearray, occurrences: int) -> tuple[int, str | None]:
    """The no-progress streak's signature walk (openclaw-latest.md §5.3): identical outcomes
    of this signature, newest first, pending calls skipped, the detector's own vetoes counted
    once an outcome anchors them (alone, when none does)."""
    sigs, results = state.sigs, state.results
    n = len(sigs)
    outcomes: list[str | None]
    own_kinds: bytearray | list[int] | None
    if occurrences == n:
        outcomes, own_kinds = results, kinds
        distinct = set(results)
        distinct.discard(None)
        if len(distinct) == 1:
            # A steady loop filling the history: from the oldest outcome (the last anchor) on,
            # every record counts but a pending one; counted at memchr speed in the kinds.
            anchor = distinct.pop()
            oldest = results.index(anchor)
            return n - oldest - kinds.count(AWAITING, oldest), anchor
    else:
        # The signature's records, oldest first, as C-level slices where they have a shape
        # (a loop's tail of the history, or every other record: a ping-pong), else filtered.
        first = sigs.index(sig)
        if n - first == occurrences:
            outcomes, own_kinds = results[first:], kinds[first:]
        elif (n - first + 1) // 2 == occurrences and sigs[first::2].count(sig) == occurrences:
            outcomes, own_kinds = results[first::2], kinds[first::2]
        else:
            outcomes = [r for s, r in zip(sigs, results) if s == sig]
            own_kinds = [k for s, k in zip(sigs, kinds) if s == sig] if VETO in kinds else None
        distinct = set(outcomes)
        distinct.discard(None)
        if len(distinct) == 1:
            anchor = distinct.pop()
            streak = len(outcomes) - outcomes.count(None)
            if own_kinds is not None:
                streak += own_kinds[outcomes.index(anchor) :].count(VETO)
            return streak, anchor
    if not distinct:
        return (0 if own_kinds is None else own_kinds.count(VETO)), None  # vetoes alone
    streak = vetoes = 0
    anchor = None
    for i in range(len(outcomes) - 1, -1, -1):
        if own_kinds is not None and own_kinds[i] == VETO:
            vetoes += 1
            continue
        result = outcomes[i]
        if result is None:
            continue
        if anchor is None:
            anchor = result
        elif result != anchor:
            break
        streak += vetoes + 1
        vetoes = 0
    return streak, anchor


def _terminal_streak(state: RunState, sig: str, kinds: bytearray, latest: LatestState) -> tuple[int, str | None]:
    """The terminal walk (tool exec): the contiguous tail of exec records, across changing
    commands, while they are terminal failures with identical results or one failure
    identity; after passing another command it ends at an older record of this one."""
    tools, sigs, results = state.tools, state.sigs, state.results
    streak = vetoes = 0
    anchor = anchor_identity = None
    crossed = False
    for i in range(len(sigs) - 1, -1, -1):
        if tools[i] != "exec":
            break
        kind = kinds[i]
        if kind == VETO:
            vetoes += 1
            continue
        result = results[i]
        if result is None:
            continue
        if kind & 7 != TERMINAL_FAILURE:
            break
        if anchor is None:
            anchor, anchor_identity = result, latest.digest(i)  # (on exec records: failure identities)
            crossed = sigs[i] != sig
            streak = vetoes + 1
            vetoes = 0
            continue
        if sigs[i] != sig:
            crossed = True
        elif crossed:
            break
        identity = latest.digest(i)
        if result != anchor and (identity is None or identity != anchor_identity):
            break
        streak += vetoes + 1
        vetoes = 0
    return (streak, anchor) if anchor is not None else (0, None)


def _stable_outcome_churn(state: RunState, tool: str, sig: str, flags: bytearray) -> tuple[int, int]:
    """(count, variant count) of stable-outcome argument churn (§5.4), else (0, 0): the same
    tool failing the same way (or no-op writing) while cycling 2+ argument variants, each
    seen 3+ times, the proposed call continuing one of them."""
    tools, sigs, results = state.tools, state.sigs, state.results
    variants: dict[str, list] = {}
    for i in range(len(sigs) - 1, -1, -1):
        if tools[i] != tool:
            break
        result = results[i]
        if result is None:
            continue  # pending, or a veto
        if not flags[i] & NO_PROGRESS:
            break
        variant = variants.get(sigs[i])
        if variant is None:
            variants[sigs[i]] = [result, 1]
        elif variant[0] != result:
            break
        else:
            variant[1] += 1
    own = variants.get(sig)
    if own is None or own[1] < 3 or len(variants) < 2:
        return 0, 0
    if any(count < 3 or result != own[0] for result, count in variants.values()):
        return 0, 0
    return sum(count for _, count in variants.values()), len(variants)


def write_churn(state: RunState, sig: str, target: str, skip: int = -1) -> int:
    """Write-mutation churn (§5.4): distinct args of the consecutive newest writes that
    changed ``target``, if the proposed ``sig`` is not one of them; else 0.  ``skip`` leaves
    one record out (the outcome-time check of §6.3 judges a record against the others)."""
    tools, sigs = state.tools, state.sigs
    latest = cast(LatestState, state.latest)  # (profile latest's paths: see detect_latest)
    kinds, digest = latest.flags, latest.digest  # (on write records: the targets)
    variants: list[str] = []
    for i in range(len(sigs) - 1, -1, -1):
        if i == skip:
            continue
        if tools[i] != "write" or kinds[i] & 7 != MUTATION or digest(i) != target:
            break
        variant = sigs[i]
        if variant in variants:
            del variants[variants.index(variant) + 1 :]
            break
        variants.append(variant)
    return 0 if sig in variants else len(variants)


_CHURN_NEWEST = frozenset((AWAITING, VETO, NO_PROGRESS_PLAIN, _OBSERVED_NO_PROGRESS, MUTATION, _OBSERVED_MUTATION))
"""The newest record's kinds that let an argument-churn walk get anywhere (_may_churn)."""


def _may_churn(state: RunState, tool: str, occurrences: int, target: str | None) -> bool:
    """Whether argument churn of 10 or more is possible at all, judged from the newest record
    and two counts, before any walk.  Stable-outcome churn needs the proposed call to continue
    a variant seen 3+ times, its walk to get past the newest record (same tool; pending,
    vetoed or no-progress) and 10 no-progress records; write churn needs the newest record
    to be a write mutation, and 10 of them."""
    flags = cast(LatestState, state.latest).flags  # (profile latest's paths: see detect_latest)
    if not flags:
        return False
    newest = flags[-1] & ~OBSERVED
    if (
        occurrences >= 3
        and (newest == NO_PROGRESS_PLAIN or newest == AWAITING or newest == VETO)
        and state.tools[-1] == tool
        and flags.count(NO_PROGRESS_PLAIN) + flags.count(_OBSERVED_NO_PROGRESS) >= LATEST_WARNING
    ):
        return True
    return (
        target is not None
        and newest == MUTATION
        and flags.count(MUTATION) + flags.count(_OBSERVED_MUTATION) >= LATEST_WARNING
    )


def _argument_churn(
    state: RunState, tool: str, sig: str, target: str | None, occurrences: int
) -> LatestDetection | None:
    """Argument churn of 10 or more (every reader compares it with 10), else None.
    (Upstream computes write churn only when stable-outcome churn is 0; both are never
    non-zero at once: the first needs the newest record with a result to be a no-progress
    one, the second a write mutation.)"""
    latest = cast(LatestState, state.latest)  # (profile latest's paths: see detect_latest)
    if occurrences >= 3:
        count, variants = _stable_outcome_churn(state, tool, sig, latest.flags)
        if count >= LATEST_WARNING:
            return LatestDetection(
                WARNING, ARGUMENT_CHURN, count, tool, sig, liveness_signal=ARGUMENT_CHURN, variant_count=variants
            )
    if target is not None:
        count = write_churn(state, sig, target)
        if count >= LATEST_WARNING:
            return LatestDetection(
                WARNING,
                ARGUMENT_CHURN,
                count,
                tool,
                sig,
                liveness_signal=ARGUMENT_CHURN,
                variant_count=count,
                write_target=target,
                write_mutation=True,
            )
    return None


def _liveness(state: RunState, tool: str, sig: str, target: str | None, occurrences: int) -> str | None:
    if not _may_churn(state, tool, occurrences, target):
        return None
    return ARGUMENT_CHURN if _argument_churn(state, tool, sig, target, occurrences) is not None else None


def detect_latest(state: RunState, tool: str, sig: str, known_poll: bool, target: str | None) -> LatestDetection | None:
    """Upstream's ``detectToolCallLoop`` at 2a627431 (openclaw-latest.md §5.1) on one run's
    history, whose latest columns are aligned (callers check ``enabled``)."""
    # Aligned columns exist: the engine runs profile latest's paths only after
    # ``history.latest_columns`` (which creates them) has checked them.
    latest = cast(LatestState, state.latest)
    sigs = state.sigs
    unknowns = state.unknowns
    if unknowns and unknowns[-1]:
        unknown_count, unknown_name = _unknown_streak(state, tool)
        if unknown_count >= LATEST_UNKNOWN:
            return LatestDetection(CRITICAL, UNKNOWN_TOOL_REPEAT, unknown_count, tool, sig, unknown_name=unknown_name)
    occurrences = sigs.count(sig)
    if not occurrences:
        # Nothing of this signature: only exec's terminal walk (which needs a terminal
        # failure in the history) and write churn (which needs the newest record to be a
        # write mutation) look further.
        flags = latest.flags
        if target is None:
            if tool != "exec" or (TERMINAL_FAILURE not in flags and _OBSERVED_TERMINAL not in flags):
                return None
        elif not flags or flags[-1] & 7 != MUTATION:
            return None
    kinds = latest.flags
    is_exec = tool == "exec"
    # The signature walk counts records of this signature only, so its streak is at most
    # ``occurrences``: below 10 it reaches no threshold, and its anchor is read only by
    # detections that need a streak (or occurrences) of 10 or more.
    streak, anchor = _signature_streak(state, sig, kinds, occurrences) if occurrences >= LATEST_WARNING else (0, None)
    if is_exec and (TERMINAL_FAILURE in kinds or _OBSERVED_TERMINAL in kinds):
        terminal, terminal_anchor = _terminal_streak(state, sig, kinds, latest)
        if terminal > streak:
            streak, anchor = terminal, terminal_anchor
    if streak >= LATEST_GLOBAL:
        return LatestDetection(CRITICAL, GLOBAL_CIRCUIT_BREAKER, streak, tool, sig, anchor)
    if known_poll:
        if streak >= LATEST_CRITICAL:
            return LatestDetection(CRITICAL, KNOWN_POLL_NO_PROGRESS, streak, tool, sig, anchor)
        if streak >= LATEST_WARNING:
            return LatestDetection(
                WARNING,
                KNOWN_POLL_NO_PROGRESS,
                streak,
                tool,
                sig,
                anchor,
                liveness_signal=_liveness(state, tool, sig, target, occurrences),
            )
    if occurrences and sigs[-1] != sig:
        count, paired_tool, paired_sig, evidence = _ping_pong(state, sig)
        if count >= LATEST_CRITICAL and evidence:
            return LatestDetection(CRITICAL, PING_PONG, count, tool, sig, None, paired_tool, paired_sig)
        if count >= LATEST_WARNING:
            return LatestDetection(
                WARNING,
                PING_PONG,
                count,
                tool,
                sig,
                None,
                paired_tool,
                paired_sig,
                liveness_signal=_liveness(state, tool, sig, target, occurrences),
            )
    if not known_poll and streak >= LATEST_CRITICAL:
        return LatestDetection(CRITICAL, GENERIC_REPEAT, streak, tool, sig, anchor)
    if (
        (occurrences >= 3 or target is not None)
        and kinds
        and kinds[-1] in _CHURN_NEWEST
        and _may_churn(state, tool, occurrences, target)
    ):
        churn = _argument_churn(state, tool, sig, target, occurrences)
        if churn is not None:
            return churn
    if not known_poll and occurrences >= LATEST_WARNING:
        return LatestDetection(WARNING, GENERIC_REPEAT, occurrences, tool, sig, anchor)
    return None
