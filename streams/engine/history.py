"""A run's rolling history: recording calls and attaching outcomes (spec §2.4)."""

from __future__ import annotations

from dataclasses import dataclass
from sys import intern
from typing import Iterable

from .state import CallRecord, RunState

__all__ = ["ToolCallStats", "record_call", "record_outcome", "tool_call_stats", "trim"]



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
