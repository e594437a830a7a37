"""A run's rolling history: recording calls and attaching outcomes (spec §2.4)."""

from __future__ import annotations

from .state import CallRecord

__all__ = ["record_call", "record_outcome", "trim"]


def trim(history: list[CallRecord], size: int | float) -> None:
    """Keep the newest ``size`` records (oldest are dropped first)."""
    excess = len(history) - size
    if excess > 0:
        del history[: int(excess)]


def record_call(
    history: list[CallRecord], tool: str, args_hash: str, tool_call_id: str | None, ts_ms: int, size: int | float
) -> CallRecord:
    """Append a pending record before the tool runs, then trim."""
    record = CallRecord(tool, args_hash, tool_call_id, timestamp=ts_ms)
    history.append(record)
    trim(history, size)
    return record


def record_outcome(
    history: list[CallRecord],
    tool: str,
    args_hash: str,
    tool_call_id: str | None,
    result_hash: str,
    unknown_tool_name: str | None,
    ts_ms: int,
    size: int | float,
) -> CallRecord:
    """Attach an outcome to the newest matching pending record, else append a complete one.

    A record matches when its tool and signature are equal, it has no outcome yet and,
    if the outcome names a (non-empty) call id, its call id is that one.
    """
    record = None
    for i in range(len(history) - 1, -1, -1):
        candidate = history[i]
        if tool_call_id and candidate.tool_call_id != tool_call_id:
            continue
        if candidate.result_hash is None and candidate.args_hash == args_hash and candidate.tool_name == tool:
            record = candidate
            record.result_hash = result_hash
            record.unknown_tool_name = unknown_tool_name
            break
    if record is None:
        record = CallRecord(tool, args_hash, tool_call_id, result_hash, unknown_tool_name, ts_ms)
        history.append(record)
    trim(history, size)
    return record
