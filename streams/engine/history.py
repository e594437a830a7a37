"""A run's rolling history: recording calls and attaching outcomes (spec §2.4)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from sys import intern

from .state import AWAITING, OBSERVED, PLAIN, REREAD_MEMORY, CallRecord, LatestState, RunState

__all__ = [
    "LATEST_HISTORY_SIZE",
    "ToolCallStats",
    "latest_columns",
    "record_call",
    "append_latest",
    "observe",
    "record_outcome",
    "record_outcome_latest",
    "tool_call_stats",
    "trim",
    "trim_latest",
]

LATEST_HISTORY_SIZE = 30


def trim(state: RunState, size: int | float) -> None:
    """Keep the newest ``size`` records (oldest are dropped first)."""
    excess = len(state.sigs) - size
    if excess > 0:
        n = int(excess)
        del state.tools[:n], state.sigs[:n], state.call_ids[:n], state.results[:n], state.unknowns[:n], state.stamps[:n]


def _append(state: RunState, tool, sig, call_id, result, unknown, ts_ms) -> None:
    state.tools.append(tool)
    state.sigs.append(sig)
    state.call_ids.append(call_id)
    state.results.append(result)
    state.unknowns.append(unknown)
    state.stamps.append(ts_ms)


def record_call(
    state: RunState, tool: str, args_hash: str, tool_call_id: str | None, ts_ms: int, size: int | float
) -> None:
    """Append a pending record before the tool runs, then trim."""
    # ``_append`` spelled out: this runs for every requested call, _append only when an
    # outcome matches no pending record.
    state.tools.append(tool)
    state.sigs.append(args_hash)
    state.call_ids.append(tool_call_id)
    state.results.append(None)
    state.unknowns.append(None)
    state.stamps.append(ts_ms)
    if len(state.sigs) > size:
        if len(state.sigs) == size + 1:  # a full history: drop the oldest (trim, inlined)
            del state.tools[0], state.sigs[0], state.call_ids[0], state.results[0], state.unknowns[0], state.stamps[0]
        else:
            trim(state, size)


def record_outcome(
    state: RunState,
    tool: str,
    args_hash: str,
    tool_call_id: str | None,
    result_hash: str,
    unknown_tool_name: str | None,
    ts_ms: int,
    size: int | float,
) -> CallRecord:
    """Attach an outcome to the newest matching pending record, else append a complete one;
    then trim.  Returns the record (as upstream, even if trimming dropped it).

    A record matches when its tool and signature are equal, it has no outcome yet and,
    if the outcome names a (non-empty) call id, its call id is that one.
    """
    sigs, results, call_ids = state.sigs, state.results, state.call_ids
    found = -1
    n = len(sigs)
    if n and results[-1] is None and sigs[-1] == args_hash and (not tool_call_id or call_ids[-1] == tool_call_id):
        found = n - 1  # the usual case: the outcome of the call just recorded
    elif args_hash in sigs:
        for i in range(len(sigs) - 1, -1, -1):
            if (
                results[i] is None
                and sigs[i] == args_hash
                and state.tools[i] == tool
                and (not tool_call_id or call_ids[i] == tool_call_id)
            ):
                found = i
                break
    if found >= 0:
        results[found] = result_hash
        state.unknowns[found] = unknown_tool_name
    else:
        _append(state, tool, intern(args_hash), tool_call_id, result_hash, unknown_tool_name, ts_ms)
        found = len(sigs) - 1
    record = state.record(found)
    if len(sigs) > size:
        trim(state, size)
    return record


# -- profile latest (openclaw-latest.md §3) ----------------------------------------------------
# Own functions rather than branches in the ones above: configurable-final's record path
# runs for every event and stays as it is.


def latest_columns(state: RunState, checker: object = None) -> LatestState:
    """The state's latest columns, aligned with its history.  A run that configurable-final
    recorded before (its agent's profile changed) gets them, all absent.  ``checker`` (the
    engine) is remembered as having checked them."""
    latest = state.latest
    n = len(state.sigs)
    if latest is None or len(latest.flags) != n:
        flags = bytearray(AWAITING if result is None else PLAIN for result in state.results)
        if latest is None:
            latest = state.latest = LatestState(flags)
        else:
            latest.flags, latest.digests = flags, {}
            latest.forget_observations()
    latest.checked_by = checker
    return latest


def append_latest(
    state: RunState,
    latest: LatestState,
    tool: str,
    args_hash: str,
    tool_call_id: str | None,
    ts_ms: int,
    target: str | None,
    result_hash: str | None = None,
    unknown_tool_name: str | None = None,
    flags: int = AWAITING,
    failure_id: str | None = None,
) -> None:
    """Append a record and trim the history to 30, oldest first.  Without outcome fields this
    is upstream's record_call under profile latest: a pending record with its write target."""
    sigs = state.sigs
    state.tools.append(tool)
    sigs.append(args_hash)
    state.call_ids.append(tool_call_id)
    state.results.append(result_hash)
    state.unknowns.append(unknown_tool_name)
    state.stamps.append(ts_ms)
    latest.flags.append(flags)
    if failure_id is not None:
        latest.digests[latest.first + len(sigs) - 1] = failure_id
    elif target is not None:
        latest.digests[latest.first + len(sigs) - 1] = target
    if len(sigs) > LATEST_HISTORY_SIZE:
        trim_latest(state, latest)


def trim_latest(state: RunState, latest: LatestState) -> None:
    """Trim a history that has grown past 30 back to 30, oldest first (``append_latest``;
    the engine's request path appends a pending record itself and calls this)."""
    sigs = state.sigs
    excess = len(sigs) - LATEST_HISTORY_SIZE
    if excess == 1:  # a full history: drop the oldest
        if latest.flags[0] & OBSERVED:
            latest.observed = observed = latest.observed - 1
            if observed < REREAD_MEMORY:
                _keep_dropped(latest, sigs[0])
        del state.tools[0], sigs[0], state.call_ids[0], state.results[0], state.unknowns[0], state.stamps[0]
        del latest.flags[0]
        latest.first = first = latest.first + 1
        if first & 15:
            return
    elif excess > 1:
        for i in range(excess):
            if latest.flags[i] & OBSERVED:
                latest.observed -= 1
                if latest.observed < REREAD_MEMORY:
                    _keep_dropped(latest, sigs[i])
        del state.tools[:excess], sigs[:excess], state.call_ids[:excess], state.results[:excess]
        del state.unknowns[:excess], state.stamps[:excess]
        del latest.flags[:excess]
        latest.first = first = latest.first + excess
    else:
        return
    # Every 16 records dropped: housekeeping of the structures that only grow otherwise.
    digests = latest.digests
    if len(digests) > LATEST_HISTORY_SIZE:  # stale keys (below first)
        latest.digests = {k: v for k, v in digests.items() if k >= first}
    ring = latest.ring
    if ring is not None and len(ring) > REREAD_MEMORY:  # observations beyond the last 16
        del ring[:-REREAD_MEMORY]


def _keep_dropped(latest: LatestState, sig: str) -> None:
    """An observed record leaves the history while fewer than 16 observed ones remain: it
    stays among the guard's last 16 observations."""
    if latest.ring is None:
        dropped = latest.dropped
        dropped.append(sig)
        if len(dropped) > REREAD_MEMORY:
            del dropped[0]


def observe(state: RunState, latest: LatestState, at: int) -> None:
    """The post-compaction guard observed record ``at``'s outcome (LatestState.observed)."""
    flags = latest.flags
    if latest.ring is None:
        if at == len(flags) - 1 or not any(f & OBSERVED for f in flags[at + 1 :]):
            flags[at] |= OBSERVED
            latest.observed += 1
            return
        # A newer record was observed first: record order is no longer observation order.
        latest.ring = latest.recent_observations(state.sigs)
    latest.ring.append(state.sigs[at])


def record_outcome_latest(
    state: RunState,
    latest: LatestState,
    tool: str,
    args_hash: str,
    tool_call_id: str | None,
    result_hash: str | None,
    unknown_tool_name: str | None,
    flags: int,
    failure_id: str | None,
    target: str | None,
    ts_ms: int,
) -> int:
    """record_outcome under profile latest: a record is pending (AWAITING) while it has
    neither a result hash nor an outcome kind (a veto record is not pending); a match keeps
    its write target.  ``flags`` are the outcome's (PLAIN … MUTATION, | NO_PROGRESS).
    Returns the record's index (after trimming)."""
    sigs, kinds, call_ids = state.sigs, latest.flags, state.call_ids
    found = -1
    n = len(sigs)
    if n and kinds[-1] == AWAITING and sigs[-1] == args_hash and (not tool_call_id or call_ids[-1] == tool_call_id):
        found = n - 1  # the usual case: the outcome of the call just recorded
    elif AWAITING in kinds and args_hash in sigs:
        for i in range(n - 1, -1, -1):
            if (
                kinds[i] == AWAITING
                and sigs[i] == args_hash
                and state.tools[i] == tool
                and (not tool_call_id or call_ids[i] == tool_call_id)
            ):
                found = i
                break
    if found < 0:
        append_latest(
            state,
            latest,
            tool,
            intern(args_hash),
            tool_call_id,
            ts_ms,
            target,
            result_hash,
            unknown_tool_name,
            flags,
            failure_id,
        )
        return len(sigs) - 1
    state.results[found] = result_hash
    state.unknowns[found] = unknown_tool_name
    kinds[found] = flags
    if failure_id is not None:  # (a pending record has no failure identity to clear)
        latest.digests[latest.first + found] = failure_id
    return found


@dataclass(frozen=True)
class ToolCallStats:
    """Upstream's ``getToolCallStats`` debug helper (spec §2.13)."""

    total_calls: int
    unique_patterns: int
    most_frequent: tuple[str, int] | None
    """(tool name, count) of the most repeated signature; the first seen wins a tie."""


def tool_call_stats(records: Iterable[CallRecord]) -> ToolCallStats:
    counts: dict[str, int] = {}
    names: dict[str, str] = {}
    total = 0
    for record in records:
        total += 1
        counts[record.args_hash] = counts.get(record.args_hash, 0) + 1
        names[record.args_hash] = record.tool_name
    most = None
    for sig, n in counts.items():
        if most is None or n > most[1]:
            most = (names[sig], n)
    return ToolCallStats(total, len(counts), most)
