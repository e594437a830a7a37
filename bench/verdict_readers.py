"""``make bench-verdict-readers``: what the other runners' clients cost a gated call, reading
every verdict partition or only their runs' (``LoopwatchClient(verdict_partitions=...)``).

A fleet has a client per runner (a stdio MCP gateway is one per agent session), and every
verdict used to wake every client, which decoded it and dropped it.  One run here, on the local
broker with a real worker (``--partitions`` for the topics), alternates two rows in rounds:

* **all**: ``--readers`` reader processes, each a client with ``verdict_partitions="all"`` and one
  live run that has published, then idle, as a fleet's other runners between their calls;
* **runs**: the same with ``verdict_partitions="runs"``.

In each round one row's readers are started and ready, this process's client times
``--calls`` gated decisions of a run of its own (new arguments each: all allowed), and the
readers' CPU over those calls is read from ``/proc`` before they are stopped.  Reported per row:
the decision round trip at p50 and p99, and the readers' CPU per timed call (all readers
together): the read cost every verdict puts on the fleet's clients.

Placement as ``bench.gateway``'s default: the broker and the worker on the last CPU, the
readers and this process on the others (``bench/placement.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime

from bench.core import steal_jiffies
from bench.gateway import percentile, started_worker
from bench.kafka import bootstrap, cpu_model, process_cpu_seconds
from bench.placement import listening_pid, restore, split
from harness import REPO, WorkerNames
from streams.client import LoopwatchClient

ROWS = ("all", "runs")


async def reader(args: argparse.Namespace) -> None:
    """One reader process: a client, one run that publishes a call, then idle until stdin closes."""
    async with LoopwatchClient(
        args.broker,
        mode="gate",
        timeout=30,
        tool_calls_topic=args.tool_calls,
        verdicts_topic=args.verdicts,
        verdict_partitions=args.reader,
    ) as client:
        run = client.run(args.run_id, session_key=f"bench:{args.run_id}", agent_id="bench")
        await run.before_tool_call("echo", {"n": 0}, tool_call_id="r0")
        print(f"ready {len(client.reading)}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


def start_readers(
    args: argparse.Namespace, names: WorkerNames, broker: str, row: str, r: int
) -> tuple[list[subprocess.Popen], list[int]]:
    """``--readers`` reader processes of ``row``, each ready; and how many partitions each reads."""
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.verdict_readers",
                "--reader",
                row,
                "--broker",
                broker,
                "--tool-calls",
                names.tool_calls,
                "--verdicts",
                names.verdicts,
                "--run-id",
                f"{names.tag}-{row}-{r}-{i}",
            ],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(args.readers)
    ]
    reading = []
    for proc in procs:
        line = proc.stdout.readline()
        if not line.startswith("ready"):
            raise RuntimeError(f"a {row} reader did not start (exit {proc.poll()})")
        reading.append(int(line.split()[1]))
    return procs, reading


def stop_readers(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.stdin.close()
    for proc in procs:
        if proc.wait(timeout=60) != 0:
            raise RuntimeError(f"a reader exited with {proc.returncode}")


async def timed_decisions(run, start: int, n: int) -> list[float]:
    out = []
    for i in range(start, start + n):
        t0 = time.perf_counter()
        await run.before_tool_call("echo", {"n": i}, tool_call_id=f"t{i}")
        out.append((time.perf_counter() - t0) * 1000)
        await run.queue_after_tool_call(
            "echo", {"n": i}, tool_call_id=f"t{i}", result={"content": [{"type": "text", "text": str(i)}]}
        )
    return out


async def bench(args: argparse.Namespace) -> dict:
    broker = args.broker or bootstrap()
    names, _tmp, worker = started_worker(broker, "lwbr", env={"LOOPWATCH_PARTITIONS": str(args.partitions)})
    cpus = os.sched_getaffinity(0)
    loopwatch_side: list[int] = []
    samples: dict[str, list[float]] = {row: [] for row in ROWS}
    reader_cpu = dict.fromkeys(ROWS, 0.0)
    reading: dict[str, list[int]] = {row: [] for row in ROWS}
    try:
        worker.wait_ready(120)
        broker_pid = listening_pid(int(broker.split(",")[0].rsplit(":", 1)[1]))
        loopwatch_side = [pid for pid in (broker_pid, worker.pid) if pid is not None]
        placement = split(loopwatch_side)
        async with LoopwatchClient(
            broker, mode="gate", timeout=10, tool_calls_topic=names.tool_calls, verdicts_topic=names.verdicts
        ) as client:
            run = client.run(f"{names.tag}-timed", session_key="bench:timed", agent_id="bench")
            await timed_decisions(run, 10_000_000, 20)  # warm up
            steal0 = steal_jiffies()
            for r in range(args.rounds):
                row = ROWS[r % 2] if (r // 2) % 2 == 0 else ROWS[1 - r % 2]  # all runs runs all all runs ...
                procs, read = start_readers(args, names, broker, row, r)
                reading[row] += read
                try:
                    await asyncio.sleep(0.5)  # the readers' start-up settles
                    cpu0 = sum(process_cpu_seconds(p.pid) for p in procs)
                    samples[row] += await timed_decisions(run, r * args.calls, args.calls)
                    reader_cpu[row] += sum(process_cpu_seconds(p.pid) for p in procs) - cpu0
                finally:
                    stop_readers(procs)
                print(f"  round {r + 1}/{args.rounds} ({row})", file=sys.stderr, flush=True)
            steal1 = steal_jiffies()
    finally:
        worker.stop(timeout=15)
        if loopwatch_side:
            restore(loopwatch_side, cpus)
    return {
        "samples": samples,
        "reader_cpu": reader_cpu,
        "reading": reading,
        "placement": placement,
        "steal": None if steal0 is None else steal1 - steal0,
    }


def report(result: dict, args: argparse.Namespace) -> None:
    print(
        f"bench-verdict-readers at {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; machine: {cpu_model()}, "
        f"{os.cpu_count()} cores (nproc), Python {platform.python_version()}; CPU steal {result['steal']} jiffies"
    )
    print(f"placement: {result['placement']}")
    print(
        f"{args.readers} reader processes, {args.partitions} partitions; {args.rounds} rounds x {args.calls} "
        "timed decisions, the rows alternated"
    )
    for row in ROWS:
        values = result["samples"][row]
        per_call = result["reader_cpu"][row] / len(values) * 1000
        print(
            f"  {row:4s} decision p50 {percentile(values, 0.5):7.3f} ms   p99 {percentile(values, 0.99):7.3f} ms   "
            f"readers' CPU {per_call:.3f} ms per timed call   partitions read per reader "
            f"{min(result['reading'][row])}-{max(result['reading'][row])}   (n={len(values)})"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.verdict_readers", description=__doc__.split("\n\n")[0])
    p.add_argument("--readers", type=int, default=12, help="reader processes per round (default 12)")
    p.add_argument("--partitions", type=int, default=12, help="partitions of the worker's topics (default 12)")
    p.add_argument("--calls", type=int, default=300, help="timed decisions per round (default 300)")
    p.add_argument("--rounds", type=int, default=8, help="rounds, the rows alternated (default 8)")
    p.add_argument("--broker", help="bootstrap servers (default: scripts/kafka.sh env)")
    p.add_argument("--reader", choices=ROWS, help=argparse.SUPPRESS)  # a reader process (internal)
    p.add_argument("--tool-calls", help=argparse.SUPPRESS)
    p.add_argument("--verdicts", help=argparse.SUPPRESS)
    p.add_argument("--run-id", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.reader:
        asyncio.run(reader(args))
        return 0
    if args.readers < 1 or args.partitions < 1 or args.calls < 1 or args.rounds < 2:
        p.error("--readers, --partitions and --calls must be at least 1, --rounds at least 2")
    report(asyncio.run(bench(args)), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
