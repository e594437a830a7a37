"""``make bench-backtest``: ``loopwatch backtest`` over a recorded fleet file, on one core.

Generates (outside the timed region) a fleet as obedient runners publish it under the
baseline config (``streams.offline.scenarios.fleet_trace``: half the runs healthy, the rest looping
in every way upstream detects, every run ended), writes it as JSONL and as JSONL.gz, then
times the backtest over each file in turn (``--repeat`` passes of each, alternating): the
baseline config against a candidate that differs for every agent (stricter thresholds), so
every event runs through both engines.  Times are CPU seconds of this process (the backtest
is single-threaded: one core), and wall seconds beside them.

The fleet's runs belong to ``--agents`` agents (run by run).  A second figure: the same
JSONL with a candidate that changes one agent only (the backtest judges the others once).
For scale it also times the part no config can make cheaper: reading the file and the
worker's record checks (``check_record``) alone.  Issue 16's target: at least 100,000
events/s from a file, with a candidate that differs for every agent.

Then ``--jobs`` (issue 30): the same JSONL with the runs split over 1 and over ``--jobs``
processes (``Backtest.run(..., jobs=N)``, as ``loopwatch backtest --jobs N``), alternated
pass by pass (1, N, then N, 1, ...), in wall time (the work is in the child processes; the
wall clock is what a user waits for), the reports compared with the one-process report.
Issue 30's target: at least 100,000 events/s with 2 processes (median of the passes).  Beside
the wall time, what the run would take on the cores alone: the larger of the busiest
process's CPU seconds and all processes' CPU seconds over the cores (the neighbours on a
shared machine lengthen the wall time, not these).
"""

from __future__ import annotations

import argparse
import gc
import gzip
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgspec

from bench.core import steal_jiffies
from bench.jobs import alternate_jobs, print_scaling
from bench.kafka import cpu_model
from harness.fleets import BASELINE, CANDIDATE
from schemas.events import encode_event
from streams.engine import engine_for
from streams.engine.intake import check_record
from streams.offline.backtest import Backtest, FileSource
from streams.offline.scenarios import fleet_trace
from streams.offline.sharded import available_cores

TARGET_RATE = 100_000


ONE_AGENT = {**BASELINE, "agents": {"list": [{"id": "agent-0", "tools": CANDIDATE["tools"]}]}}
"""A candidate that changes agent-0 only."""


def timed(path: Path, candidate: dict = CANDIDATE) -> tuple[float, float, Backtest]:
    """One backtest over ``path``: (CPU seconds, wall seconds, the backtest)."""
    backtest = Backtest(engine_for(BASELINE), engine_for(candidate))
    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    backtest.run(FileSource([path]).records(), keyed=False)
    return time.process_time() - cpu, time.perf_counter() - wall, backtest


def timed_jobs(path: Path, jobs: int) -> tuple[float, float, Backtest]:
    """One backtest over ``path`` in ``jobs`` processes: (wall seconds, the wall seconds it would
    take on this machine's cores alone, the backtest).  The second is the larger of the busiest
    process's CPU seconds and all processes' CPU seconds over the cores: on a shared machine
    the wall clock measures the neighbours too."""
    backtest = Backtest(engine_for(BASELINE), engine_for(CANDIDATE))
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    backtest.run(FileSource([path]).records(), keyed=False, jobs=jobs)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    shards = backtest.shard_cpu_s if jobs > 1 else []
    return wall, max(cpu, *shards, (cpu + sum(shards)) / available_cores()), backtest


def checks_only(path: Path) -> float:
    """CPU seconds to read ``path`` and check every record, nothing else."""
    cpu = time.process_time()
    for record in FileSource([path]).records():
        check_record(record, keyed=False)
    return time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.backtest", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=4_000)
    parser.add_argument("--calls-per-run", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3, help="timed passes over each file (default 3)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--agents", type=int, default=10, help="agents the runs belong to (default 10)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=max(2, available_cores()),
        help="processes of the parallel passes (default: the cores available, at least 2)",
    )
    args = parser.parse_args(argv)

    load = os.getloadavg()
    print(
        f"machine: {cpu_model()}, {os.cpu_count()} cores (nproc), Python {platform.python_version()}, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(f"start: {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC")
    t0 = time.perf_counter()
    events, _kinds = fleet_trace(args.runs, args.calls_per_run, seed=args.seed, engine=engine_for(BASELINE), end=True)
    events = [
        msgspec.structs.replace(e, agent_id=f"agent-{int(e.run_id.rsplit('-', 1)[1]) % args.agents}") for e in events
    ]
    tmp = Path(tempfile.mkdtemp(prefix="lwbench-backtest-"))
    plain, packed = tmp / "fleet.jsonl", tmp / "fleet.jsonl.gz"
    data = b"".join(encode_event(e) + b"\n" for e in events)
    plain.write_bytes(data)
    packed.write_bytes(gzip.compress(data, compresslevel=6))
    print(
        f"workload: {len(events):,} events over {args.runs:,} interleaved runs, {len(data) / len(events):.0f} B mean; "
        f"{plain.stat().st_size / 2**20:.0f} MiB JSONL, {packed.stat().st_size / 2**20:.0f} MiB gzip; "
        f"generated in {time.perf_counter() - t0:.1f} s"
    )
    events = data = None
    gc.collect()

    rates: dict[str, list[tuple[float, float]]] = {"jsonl": [], "jsonl.gz": [], "jsonl, one agent changed": []}
    steal = steal_jiffies()
    report = None
    for attempt in range(args.repeat):
        for name, path in (("jsonl", plain), ("jsonl.gz", packed))[:: 1 if attempt % 2 == 0 else -1]:
            cpu, wall, backtest = timed(path)
            rates[name].append((backtest.records / cpu, backtest.records / wall))
            report = report or backtest.report().data
            print(
                f"  pass {attempt + 1} {name:8}: {backtest.records:,} records in {cpu:.2f} s CPU "
                f"= {rates[name][-1][0]:,.0f} events/s ({rates[name][-1][1]:,.0f}/s wall)"
            )
        name = "jsonl, one agent changed"
        cpu, wall, backtest = timed(plain, ONE_AGENT)
        rates[name].append((backtest.records / cpu, backtest.records / wall))
        print(f"  pass {attempt + 1} {name}: {rates[name][-1][0]:,.0f} events/s ({rates[name][-1][1]:,.0f}/s wall)")

    def timed_pass(jobs: int) -> tuple[float, float, int, dict]:
        wall, cpu, backtest = timed_jobs(plain, jobs)
        return wall, cpu, backtest.records, backtest.report().data

    parallel, busiest, reports = alternate_jobs(timed_pass, args.jobs, args.repeat, unit="records", per="events/s")
    same_report = all(data == report for both in reports.values() for data in both)
    checks = checks_only(plain)
    steal_after = steal_jiffies()
    n = report["records"]
    print()
    print(
        f"baseline / candidate: {report['verdicts']['baseline']} / {report['verdicts']['candidate']}; "
        f"{len(report['changed_runs']):,} runs change outcome"
    )
    for name, pairs in rates.items():
        cpu_rates = [cpu for cpu, _wall in pairs]
        print(
            f"backtest from {name}: best {max(cpu_rates):,.0f} events/s, median {statistics.median(cpu_rates):,.0f} "
            f"events/s (CPU time, one core)"
        )
    for jobs, wall_rates in parallel.items():
        print(
            f"backtest from jsonl, --jobs {jobs}: best {max(wall_rates):,.0f} events/s, median "
            f"{statistics.median(wall_rates):,.0f} events/s (wall time)"
        )
        print(
            f"backtest from jsonl, --jobs {jobs}, on the cores alone (CPU times): best "
            f"{max(busiest[jobs]):,.0f} events/s, median {statistics.median(busiest[jobs]):,.0f} events/s"
        )
    print_scaling(parallel, busiest, args.jobs)
    print(f"reports identical to one process: {'yes' if same_report else 'NO'}")
    print(f"reading + the worker's record checks alone: {n / checks:,.0f} events/s (JSONL, CPU time)")
    if steal is not None and steal_after is not None:
        print(f"CPU steal during the passes: {steal_after - steal} jiffies (/proc/stat)")
    print(f"end: {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC")
    best = statistics.median(cpu for cpu, _wall in rates["jsonl"])
    print(
        f"target: >= {TARGET_RATE:,} events/s from a file (median, JSONL): {best:,.0f}, "
        f"{'met' if best >= TARGET_RATE else 'NOT MET'}"
    )
    two = statistics.median(parallel[args.jobs])
    print(
        f"target: >= {TARGET_RATE:,} events/s with --jobs {args.jobs} (median, JSONL, wall time): {two:,.0f}, "
        f"{'met' if two >= TARGET_RATE and same_report else 'NOT MET'} (on the cores alone: "
        f"{statistics.median(busiest[args.jobs]):,.0f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
