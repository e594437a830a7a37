"""Where a benchmark's processes run: loopwatch's side (broker, worker) on CPUs of its own.

In a deployment the broker and the worker run on machines of their own, and what a runner's
side costs (an agent, its gateway, its MCP server) is measured without them.  On a bench
machine with a few cores they otherwise share every core with the path being timed: the
worker's work on each call's events then lands in the middle of the next call (on 2 cores it
tripled the gateway's added p99 in docs/benchmarks.md).  ``split`` pins every thread of the
broker and the worker to the last CPU and this process (whose children inherit it) to the
others; ``restore`` gives them all CPUs back.  Linux only (``sched_setaffinity``, ``/proc``).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["listening_pid", "pin", "split", "restore"]


def listening_pid(port: int) -> int | None:
    """The pid of the process listening on TCP ``port`` on this host, if it is one of ours."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return int(pid)
        except OSError:
            continue
    return None


def pin(pid: int, cpus: set[int]) -> int:
    """Pin every thread of ``pid`` and of its descendants to ``cpus`` (a process's affinity is
    per thread, and threads already started do not follow their process's main thread): the
    number of threads pinned."""
    pinned, todo = 0, [pid]
    while todo:
        proc = todo.pop()
        try:
            tids = os.listdir(f"/proc/{proc}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(int(tid), cpus)
                pinned += 1
                todo += map(int, Path(f"/proc/{proc}/task/{tid}/children").read_text().split())
            except OSError:
                continue  # the thread ended meanwhile
    return pinned


def split(loopwatch_side: list[int]) -> str:
    """Pin ``loopwatch_side`` (the broker's and the worker's pids) to the last CPU this process
    may use and this process (its children inherit it) to the others: a line for the report."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return "shared (one CPU: nothing to split)"
    pin(os.getpid(), set(cpus[:-1]))  # first: the worker is one of this process's children
    threads = sum(pin(pid, {cpus[-1]}) for pid in loopwatch_side)
    return (
        f"split: broker and worker ({threads} threads) on CPU {cpus[-1]}; everything timed (agents, gateways, "
        f"upstreams, other clients) on CPU {','.join(map(str, cpus[:-1]))}"
    )


def restore(pids: list[int], cpus: set[int]) -> None:
    """``cpus`` (what ``split`` found) again for ``pids``, their descendants and this process."""
    for pid in (*pids, os.getpid()):
        pin(pid, cpus)
