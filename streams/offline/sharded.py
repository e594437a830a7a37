"""Work over a stream of ``tool-calls`` records split by state key across processes.

Runs are independent: a run's verdicts depend on its own events only, in their order.  So a
stream can be cut into ``jobs`` shards by state key, every run whole in one shard and its
events in their order, each shard worked through in a process of its own, and the shards'
results merged by the caller.  ``loopwatch backtest --jobs`` does this
(``streams.offline.backtest.Backtest.run``); so can any other command that drives the engine over
recorded traffic.

``run_sharded`` reads the stream in the calling process (a file's lines, a topic's records)
and sends each record, numbered by its place in the whole stream, to its shard's process in
batches; the number lets a merge put back whatever depends on the order across runs (which
run ended first, the stream's first and last event).  The processes are forked, so the work
function and what it closes over (engines, configs) need no pickling; the work's result is
pickled back.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import msgspec

from schemas.errors import LoopwatchError
from schemas.keys import state_key

__all__ = ["ShardError", "available_cores", "run_split", "run_sharded", "shard_of", "value_state_key"]

T = TypeVar("T")
BATCH = 1024
"""Records per message to a shard's process (one pickle and one pipe write per batch)."""


class ShardError(LoopwatchError):
    """A shard's work failed; the message is one line (the exception's type and text)."""


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, not the machine's count)."""
    count = getattr(os, "process_cpu_count", None)  # Python >= 3.13
    if count is not None:
        return max(1, count() or 1)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class _RunFields(msgspec.Struct):
    """The fields a state key is made of, read from a record's JSON without the rest."""

    run_id: Any = None
    session_key: Any = None
    session_id: Any = None


_run_fields = msgspec.json.Decoder(_RunFields)


def value_state_key(value: bytes | None) -> bytes | None:
    """The state key (``schemas.keys.state_key``, UTF-8) of the event in a record's value, read
    from its run fields alone; None when the value is not a JSON object.  Any value the
    worker accepts as an event has these very fields, so every event of a run gets the same
    key; a value it would refuse goes to some shard, where it is refused and counted."""
    if value is None:
        return None
    try:
        fields = _run_fields.decode(value)
        return state_key(fields).encode("utf-8", "surrogatepass")
    except Exception:  # noqa: BLE001 - not an event: the shard's own checks say why
        return None


def shard_of(key: bytes | None, jobs: int) -> int:
    """The shard of a state key (stable across processes and runs: CRC-32, not ``hash``)."""
    return zlib.crc32(key) % jobs if key else 0


def run_sharded(
    items: Iterable[tuple[bytes | None, Any]],
    work: Callable[[Iterator[tuple[int, Any]]], T],
    jobs: int,
    *,
    batch: int = BATCH,
    cpu_s: list[float] | None = None,
) -> list[T]:
    """``work`` in ``jobs`` processes, each over the items of its shard.

    ``items`` are ``(state key, payload)`` in the stream's order; each payload (picklable)
    goes, as ``(its number in the stream, payload)`` and in order, to the process of
    ``shard_of(key)``.  ``work(numbered payloads)`` runs in each process and returns its
    picklable result; the results come back in shard order.  A failure in a shard raises
    ``ShardError`` once the stream has been read; a failure reading ``items`` stops the
    processes and propagates.  ``cpu_s``, if given, gets each shard's CPU seconds (for the
    benchmarks: what the work would take with a core per process, whatever the neighbours).
    """
    if jobs < 1:
        raise ValueError("jobs must be at least 1")
    context = multiprocessing.get_context("fork")
    inputs, outputs, processes = [], [], []
    try:
        for _ in range(jobs):
            receive, send = context.Pipe(duplex=False)
            result_in, result_out = context.Pipe(duplex=False)
            # The parent's ends of the earlier shards' pipes are closed in the child, so that
            # a parent that dies leaves no child waiting on a pipe a sibling holds open.
            process = context.Process(
                target=_serve, args=(work, receive, result_out, [*inputs, send, result_in]), daemon=True
            )
            process.start()
            receive.close()
            result_out.close()
            inputs.append(send)
            outputs.append(result_in)
            processes.append(process)
        buffers: list[list] = [[] for _ in range(jobs)]
        crc32 = zlib.crc32
        for seq, (key, payload) in enumerate(items):
            shard = crc32(key) % jobs if key else 0
            buffer = buffers[shard]
            buffer.append((seq, payload))
            if len(buffer) >= batch:
                inputs[shard].send(buffer)
                buffers[shard] = []
        for shard, buffer in enumerate(buffers):
            if buffer:
                inputs[shard].send(buffer)
            inputs[shard].send(None)
        results = []
        for shard, output in enumerate(outputs):
            try:
                results.append(output.recv())
            except EOFError:
                results.append(_ended_without_result(shard, processes[shard]))
        for process in processes:
            process.join()
    except BaseException:
        _kill_all(processes)
        raise
    finally:
        for conn in (*inputs, *outputs):
            conn.close()
    return _unwrap(results, cpu_s)


def run_split(
    work: Callable[[int], T],
    jobs: int,
    *,
    cpu_s: list[float] | None = None,
    poll: Callable[[], None] | None = None,
    every_s: float = 0.5,
) -> list[T]:
    """``work(shard)`` in ``jobs`` forked processes, shard 0 to ``jobs - 1``, each reading its
    own input (no record passes through this process: ``streams.offline.backtest`` hands each shard
    the file to read and keep its runs' lines of); the results come back in shard order.
    ``poll`` is called about every ``every_s`` seconds while the shards work (progress).
    A failure in a shard raises ``ShardError``; ``cpu_s`` as for ``run_sharded``."""
    if jobs < 1:
        raise ValueError("jobs must be at least 1")
    context = multiprocessing.get_context("fork")
    outputs, processes = [], []
    try:
        for shard in range(jobs):
            result_in, result_out = context.Pipe(duplex=False)
            process = context.Process(target=_serve_split, args=(work, shard, result_out, list(outputs)), daemon=True)
            process.start()
            result_out.close()
            outputs.append(result_in)
            processes.append(process)
        results: list[Any] = [None] * jobs
        waiting = dict(enumerate(outputs))
        while waiting:
            ready = multiprocessing.connection.wait(list(waiting.values()), timeout=every_s if poll else None)
            if poll is not None:
                poll()
            for shard, output in list(waiting.items()):
                if output not in ready:
                    continue
                del waiting[shard]
                try:
                    results[shard] = output.recv()
                except EOFError:
                    results[shard] = _ended_without_result(shard, processes[shard])
        for process in processes:
            process.join()
    except BaseException:
        _kill_all(processes)
        raise
    finally:
        for conn in outputs:
            conn.close()
    return _unwrap(results, cpu_s)


def _serve_split(work: Callable[[int], Any], shard: int, result_out: Any, inherited: list) -> None:
    """A shard's process of ``run_split``: ``work(shard)``, then its result."""
    for conn in inherited:
        conn.close()
    try:
        result: tuple[bool, Any] = (True, work(shard))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as one line
        result = (False, " ".join(f"{type(exc).__name__}: {exc}".split()))
    result_out.send((*result, time.process_time()))
    result_out.close()


def _serve(work: Callable[[Iterator[tuple[int, Any]]], Any], receive: Any, result_out: Any, inherited: list) -> None:
    """A shard's process: ``work`` over the batches until the end (None), then its result."""
    for conn in inherited:
        conn.close()

    def numbered() -> Iterator[tuple[int, Any]]:
        while True:
            chunk = receive.recv()
            if chunk is None:
                return
            yield from chunk

    stream = numbered()
    try:
        result: tuple[bool, Any] = (True, work(stream))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as one line
        result = (False, " ".join(f"{type(exc).__name__}: {exc}".split()))
    for _rest in stream:  # read to the end, so the parent never blocks on a full pipe
        pass
    result_out.send((*result, time.process_time()))
    result_out.close()


def _ended_without_result(shard: int, process: Any) -> tuple[bool, str, float]:
    process.join(5)
    return (False, f"shard {shard}'s process ended without its result (exit code {process.exitcode})", 0.0)


def _kill_all(processes: list[Any]) -> None:
    for process in processes:
        if process.is_alive():
            process.kill()
        process.join()


def _unwrap(results: list[Any], cpu_s: list[float] | None) -> list[Any]:
    """The shards' results in shard order; the first failure raises ``ShardError``."""
    for ok, result, _cpu in results:
        if not ok:
            raise ShardError(result)
    if cpu_s is not None:
        cpu_s[:] = [cpu for _ok, _result, cpu in results]
    return [result for _ok, result, _cpu in results]
