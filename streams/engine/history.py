"""A run's rolling history: recording calls and attaching outcomes (spec §2.4)."""

from __future__ import annotations

from dataclasses import dataclass
from sys import intern
from typing import Iterable

from .state import CallRecord, LatestState, RunState

__all__ = [
    "LATEST_HISTORY_SIZE",
    "ToolCallStats",
    "latest_columns",
    "record_call",
    "record_call_latest",
    "record_outcome",
    "record_outcome_latest",
    "tool_call_stats",
    "trim",
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


def record_call(state: RunState, tool: str, args_hash: str, tool_call_id: str | None, ts_ms: int, size: int | float) -> None:
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
            if results[i] is None and sigs[i] == args_hash and state.tools[i] == tool and (
                not tool_call_id or call_ids[i] == tool_call_id
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


def latest_columns(state: RunState) -> LatestState:
    """The state's latest columns, aligned with its history.  A run that configurable-final
    recorded before (its profile changed on a config reload) gets them, all absent."""
    latest = state.latest
    n = len(state.sigs)
    if latest is None:
        latest = state.latest = LatestState([None] * n, [None] * n, [False] * n, [None] * n)
    elif len(latest.kinds) != n:
        latest.kinds, latest.failure_ids, latest.no_progress, latest.targets = [None] * n, [None] * n, [False] * n, [None] * n
    return latest


def _trim_latest(state: RunState, latest: LatestState) -> None:
    excess = len(state.sigs) - LATEST_HISTORY_SIZE
    if excess > 0:
        del state.tools[:excess], state.sigs[:excess], state.call_ids[:excess], state.results[:excess]
        del state.unknowns[:excess], state.stamps[:excess]
        del latest.kinds[:excess], latest.failure_ids[:excess], latest.no_progress[:excess], latest.targets[:excess]


def record_call_latest(
    state: RunState, latest: LatestState, tool: str, args_hash: str, tool_call_id: str | None, ts_ms: int,
    target: str | None,
) -> None:
    """Append a pending record (with its write target) before the tool runs, then trim."""
    _append(state, tool, args_hash, tool_call_id, None, None, ts_ms)
    latest.kinds.append(None)
    latest.failure_ids.append(None)
    latest.no_progress.append(False)
    latest.targets.append(target)
    _trim_latest(state, latest)


def record_outcome_latest(
    state: RunState,
    latest: LatestState,
    tool: str,
    args_hash: str,
    tool_call_id: str | None,
    result_hash: str | None,
    unknown_tool_name: str | None,
    kind: str | None,
    failure_id: str | None,
    no_progress: bool,
    target: str | None,
    ts_ms: int,
) -> int:
    """record_outcome under profile latest: a record is pending while it has neither a
    result hash nor an outcome kind (a veto record is not pending); a match keeps its
    write target.  Returns the record's index (after trimming)."""
    sigs, results, kinds, call_ids = state.sigs, state.results, latest.kinds, state.call_ids
    found = -1
    if args_hash in sigs:
        for i in range(len(sigs) - 1, -1, -1):
            if (results[i] is None and kinds[i] is None and sigs[i] == args_hash and state.tools[i] == tool
                    and (not tool_call_id or call_ids[i] == tool_call_id)):
                found = i
                break
    if found >= 0:
        results[found] = result_hash
        state.unknowns[found] = unknown_tool_name
        kinds[found] = kind
        latest.failure_ids[found] = failure_id
        latest.no_progress[found] = no_progress
        return found
    _append(state, tool, intern(args_hash), tool_call_id, result_hash, unknown_tool_name, ts_ms)
    kinds.append(kind)
    latest.failure_ids.append(failure_id)
    latest.no_progress.append(no_progress)
    latest.targets.append(target)
    _trim_latest(state, latest)
    return len(sigs) - 1


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
