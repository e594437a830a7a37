"""A real worker's memory under many runs of one agent: ``--rounds`` bursts of ``--runs`` new
runs (one ungated call each) of agent ``main``, on the real broker, with the per-agent cap
(``LOOPWATCH_MAX_RUNS_PER_AGENT``) at ``--cap``.

After each burst is consumed it waits for the idle sweep (every 60 s with the default idle
timeout, which no run reaches here: only the cap can delete runs) and reads the worker's RSS
(``VmRSS``), peak RSS (``VmHWM``), ``loopwatch_runs_tracked`` and
``loopwatch_runs_evicted_total``.  ``--cap 1000000000`` never evicts: what an uncapped worker
keeps.  Prints one JSON object.

    .venv/bin/python -m bench.agent_runs --cap 20000
    .venv/bin/python -m bench.agent_runs --cap 1000000000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from harness import WorkerNames, WorkerProcess, delete_topics, encode_all, produce, write_config
from streams.edge.events import requested_event

CONFIG = {"tools": {"loopDetection": {"enabled": True}}}
SWEEP_WAIT_S = 75.0
"""Longer than the sweep interval (60 s with the default idle timeout)."""


class BenchFailed(RuntimeError):
    pass


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    raise BenchFailed(f"/proc/{pid}/status has no {field} line")


def burst(round_: int, runs: int) -> list:
    now = int(time.time() * 1000)
    return encode_all(
        requested_event(
            f"b{round_}-{i}",
            "read",
            {"path": f"/f/{i}"},
            run_id=f"r{round_}-{i}",
            session_key=f"agent:main:r{round_}-{i}",
            agent_id="main",
            gate=False,
            ts_ms=now,
        )
        for i in range(runs)
    )


async def measure(broker: str, cap: int, runs: int, rounds: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="lwbench-agent-runs-"))
    names = WorkerNames(prefix="lwbench")
    config = tmp / "loop-detection.json"
    write_config(config, CONFIG)
    env = {"LOOPWATCH_PARTITIONS": "4", "LOOPWATCH_MAX_RUNS_PER_AGENT": str(cap)}
    worker = WorkerProcess(
        broker, names, data_dir=tmp / "data", config=config, env=env, label="agent-runs", log_dir=tmp
    )
    worker.start()
    out: dict = {"cap": cap, "runs_per_round": runs, "rounds": []}
    try:
        worker.wait_ready(180)
        pid = worker.pid
        assert pid is not None
        await asyncio.sleep(2)
        out["ready_rss_mib"] = rss_mib(pid)
        for round_ in range(rounds):
            await produce(broker, names.tool_calls, burst(round_, runs))
            deadline = time.monotonic() + 900
            while worker.metric("loopwatch_events_consumed_total") < (round_ + 1) * runs:
                if not worker.running:
                    raise BenchFailed(f"worker exited:\n{worker.log_tail()}")
                if time.monotonic() > deadline:
                    raise BenchFailed("the worker did not consume the burst within 15 minutes")
                await asyncio.sleep(1)
            consumed = {"rss_mib": rss_mib(pid), "runs_tracked": worker.metric("loopwatch_runs_tracked")}
            await asyncio.sleep(SWEEP_WAIT_S)
            out["rounds"].append(
                {
                    "consumed": consumed,
                    "after_sweep": {
                        "rss_mib": rss_mib(pid),
                        "peak_rss_mib": rss_mib(pid, "VmHWM"),
                        "runs_tracked": worker.metric("loopwatch_runs_tracked"),
                        "runs_evicted": worker.metric("loopwatch_runs_evicted_total"),
                    },
                }
            )
    finally:
        worker.stop(30)
        await delete_topics(broker, [names.app_id])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", default=os.environ.get("LOOPWATCH_TEST_BROKER") or "127.0.0.1:29092")
    parser.add_argument("--cap", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    try:
        result = asyncio.run(measure(args.broker, args.cap, args.runs, args.rounds))
    except BenchFailed as exc:
        print(f"agent_runs: {exc}", file=sys.stderr)
        return 1
    result.update(
        started=started,
        machine=f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()}",
        command="python -m bench.agent_runs " + " ".join(argv if argv is not None else sys.argv[1:]),
    )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
