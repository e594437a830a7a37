"""``make bench-evaluate``: ``loopwatch import`` and ``loopwatch evaluate`` throughput on one
core, in tool calls per CPU second of this process (both are single-threaded).

Import is timed on transcripts of three shapes: a generated OpenAI-chat (tau-bench format)
file of short calls and results (what chat agents' logs look like: a few hundred bytes a
call), a generated Claude Code session of the same calls (JSONL, read a line at a time), and,
with ``--data DIR`` (the directory ``make evaluate`` reads), the recorded mini-swe-agent set
(about 5 KB of JSON a call: its shell outputs) and the tau-bench set.  The figure includes
reading, decoding, the edge hashing and writing the gzip events file.

Evaluate is timed on the events of the generated chat runs (or, with ``--data``, of the
mini-swe-agent set): reading and the worker's record checks alone, then each row alone
(a config through the engine, a peer's rule), then all rows together.  Per config it reports
the calls/s of that row alone (reading included) and the calls/s its share costs on top of the
reading (marginal).  Issue 28's target: 50,000 tool calls/s per config, import and evaluate.

Then ``--jobs`` (issue 30): all rows over the generated chat events in one process and in
``--jobs`` processes (``Evaluation.run(..., jobs=N)``, as ``loopwatch evaluate --jobs N``),
alternated pass by pass, in wall time and on the cores alone (the larger of the busiest
process's CPU seconds and all processes' CPU seconds over the cores: on a shared machine the
wall clock measures the neighbours too), and whether the reports are identical.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tarfile
import tempfile
import time
from pathlib import Path

from bench.jobs import alternate_jobs, print_scaling
from bench.kafka import cpu_model
from streams.cli import UPSTREAM_DEFAULTS
from streams.engine import engine_for
from streams.engine.config import with_profile
from streams.importers import import_files, open_output
from streams.offline.backtest import FileSource
from streams.offline.evaluate import REFERENCE_ROWS, EngineRow, Evaluation
from streams.offline.sharded import available_cores

TARGET = 50_000
REPO = Path(__file__).resolve().parents[1]


def chat_runs(runs: int, calls: int, seed: int = 7) -> list[dict]:
    """tau-bench-shaped runs: short JSON arguments and results, a few loops among them."""
    rnd = random.Random(seed)
    tools = ["search_flights", "get_reservation", "get_user", "update_booking", "cancel"]
    out = []
    for task in range(runs):
        traj = [{"role": "system", "content": "policy"}, {"role": "user", "content": f"task {task}"}]
        i = 0
        while i < calls:
            name = rnd.choice(tools)
            args = {"id": f"R{rnd.randrange(500)}", "date": f"2024-05-{rnd.randrange(1, 29):02d}"}
            result = json.dumps({"status": rnd.choice(["ok", "not found"]), "n": rnd.randrange(100)})
            repeat = 6 if rnd.random() < 0.05 else 1
            for _ in range(min(repeat, calls - i)):
                traj.append(
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": f"c{i}",
                                "type": "function",
                                "function": {"name": name, "arguments": json.dumps(args)},
                            }
                        ],
                    }
                )
                traj.append({"role": "tool", "tool_call_id": f"c{i}", "content": result})
                i += 1
        out.append({"task_id": task, "trial": 0, "reward": float(rnd.random() < 0.5), "traj": traj})
    return out


def claude_session(doc: list[dict], path: Path) -> None:
    """The same calls as one Claude Code session per run, a file per run."""
    for run in doc:
        lines = [
            {
                "type": "user",
                "sessionId": f"s{run['task_id']}",
                "uuid": "u0",
                "message": {"role": "user", "content": "go"},
            }
        ]
        for m in run["traj"]:
            if m.get("tool_calls"):
                tc = m["tool_calls"][0]
                lines.append(
                    {
                        "type": "assistant",
                        "uuid": tc["id"],
                        "message": {
                            "role": "assistant",
                            "content": [
                                {
                                    "type": "tool_use",
                                    "id": tc["id"],
                                    "name": tc["function"]["name"],
                                    "input": json.loads(tc["function"]["arguments"]),
                                }
                            ],
                        },
                    }
                )
            elif m["role"] == "tool":
                lines.append(
                    {
                        "type": "user",
                        "uuid": "r" + m["tool_call_id"],
                        "message": {
                            "role": "user",
                            "content": [
                                {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
                            ],
                        },
                    }
                )
        (path / f"s{run['task_id']}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def time_import(
    files: list[Path], out: Path, fmt: str | None = None, labels=None, repeat: int = 3
) -> tuple[float, int, int]:
    """(median CPU seconds, calls, input bytes) of importing ``files`` into ``out``."""
    times = []
    calls = 0
    for _ in range(repeat):
        fh, finish = open_output(out)
        cpu = time.process_time()
        summary = import_files(files, fh, fmt=fmt, labels=labels)
        finish(True)
        times.append(time.process_time() - cpu)
        calls = summary.calls
    return statistics.median(times), calls, sum(f.stat().st_size for f in files)


def time_evaluate(events: Path, rows: list, repeat: int = 3) -> tuple[float, int]:
    times = []
    calls = 0
    for _ in range(repeat):
        evaluation = Evaluation(rows)
        cpu = time.process_time()
        evaluation.run(FileSource([events]).records())
        times.append(time.process_time() - cpu)
        calls = evaluation.calls
    return statistics.median(times), calls


def timed_jobs(events: Path, rows: list, jobs: int) -> tuple[float, float, Evaluation]:
    """All ``rows`` over ``events`` in ``jobs`` processes: (wall seconds, the seconds it would
    take on this machine's cores alone, the evaluation)."""
    evaluation = Evaluation(rows)
    wall, cpu = time.perf_counter(), time.process_time()
    evaluation.run(FileSource([events]).records(), jobs=jobs)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    shards = evaluation.shard_cpu_s if jobs > 1 else []
    return wall, max(cpu, *shards, (cpu + sum(shards)) / available_cores()), evaluation


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="the directory make evaluate reads (the recorded sets)")
    parser.add_argument("--runs", type=int, default=400, help="generated runs (default 400)")
    parser.add_argument("--calls", type=int, default=100, help="calls per generated run (default 100)")
    parser.add_argument("--repeat", type=int, default=3, help="passes of each measurement; the median is shown")
    parser.add_argument(
        "--jobs",
        type=int,
        default=max(2, available_cores()),
        help="processes to compare with one (default: the cores available, at least 2)",
    )
    args = parser.parse_args(argv)
    print(
        f"bench.evaluate  {time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime())}  {platform.node()}  "
        f"{cpu_model()}  {os.cpu_count()} CPUs  python {platform.python_version()}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-evaluate-") as tmp:
        tmpdir = Path(tmp)
        doc = chat_runs(args.runs, args.calls)
        chat = tmpdir / "chat.json"
        chat.write_text(json.dumps(doc))
        sessions = tmpdir / "sessions"
        sessions.mkdir()
        claude_session(doc, sessions)
        sets: list[tuple[str, list[Path], str | None, object]] = [
            ("generated chat (openai-chat, one file)", [chat], "openai-chat", None),
            ("generated Claude Code sessions (JSONL)", sorted(sessions.glob("*.jsonl")), "claude-code", None),
        ]
        mini_events = None
        if args.data:
            tarball = args.data / "mini-swe-agent-gemini-3-pro-swebench-verified.tar.gz"
            if tarball.exists():
                unpacked = tmpdir / "mini"
                with tarfile.open(tarball) as tar:
                    tar.extractall(unpacked, filter="data")
                from streams.importers import load_labels

                sets.append(
                    (
                        "recorded mini-swe-agent set (500 runs)",
                        sorted(unpacked.glob("trajs/*/*.traj.json")),
                        "mini-swe-agent",
                        load_labels(unpacked / "results_summary.json"),
                    )
                )
            tau = args.data / "tau-bench-gpt-4o-airline.json.gz"
            if tau.exists():
                sets.append(("recorded tau-bench airline set (200 runs)", [tau], "openai-chat", None))
        print(f"\nimport (CPU seconds, median of {args.repeat}; gzip output)")
        print(f"{'input':<44}{'calls':>9}{'MB in':>9}{'CPU s':>8}{'calls/s':>10}{'MB/s':>7}  target")
        chat_events = tmpdir / "chat.jsonl.gz"
        for name, files, fmt, labels in sets:
            out = tmpdir / (name.split()[1] + ".jsonl.gz")
            if "chat (openai" in name:
                out = chat_events
            if "mini-swe-agent" in name:
                mini_events = out
            cpu, calls, size = time_import(files, out, fmt, labels, args.repeat)
            rate = calls / cpu
            print(
                f"{name:<44}{calls:>9,}{size / 1e6:>9.1f}{cpu:>8.2f}{rate:>10,.0f}{size / 1e6 / cpu:>7.1f}  "
                f"{'met' if rate >= TARGET else 'NOT met'}"
            )

        rows = [
            EngineRow("upstream defaults", engine_for(UPSTREAM_DEFAULTS)),
            EngineRow("profile latest", engine_for(with_profile(UPSTREAM_DEFAULTS, "latest"))),
            EngineRow("recommended", engine_for(_yaml(REPO / "examples" / "recommended.yaml"))),
            *REFERENCE_ROWS,
        ]
        for label, events in (("generated chat events", chat_events), ("mini-swe-agent events", mini_events)):
            if events is None:
                continue
            base, calls = time_evaluate(events, [], args.repeat)
            print(
                f"\nevaluate: {label}, {calls:,} calls ({events.stat().st_size / 1e6:.1f} MB gzip); reading and "
                f"record checks alone {base:.2f} s ({calls / base:,.0f} calls/s)"
            )
            print(f"{'row':<44}{'CPU s':>8}{'calls/s':>10}{'marginal':>11}  target")
            for row in rows:
                cpu, _ = time_evaluate(events, [row], args.repeat)
                rate = calls / cpu
                extra = cpu - base
                # below 10 ms the row's share is within the timer's and the machine's noise
                marginal = f"{calls / extra:>11,.0f}" if extra > 0.01 else f"{'(noise)':>11}"
                print(
                    f"{row.name[:43]:<44}{cpu:>8.2f}{rate:>10,.0f}{marginal}  {'met' if rate >= TARGET else 'NOT met'}"
                )
            cpu, _ = time_evaluate(events, rows, args.repeat)
            print(
                f"{f'all {len(rows)} rows together':<44}{cpu:>8.2f}{calls * len(rows) / cpu:>10,.0f}"
                f"{'':>11}  (calls x rows / s)"
            )
        print(
            f"\nevaluate --jobs: all {len(rows)} rows over the generated chat events, --jobs 1 and --jobs {args.jobs} "
            f"alternated (tool calls per second)"
        )

        def timed(jobs: int) -> tuple[float, float, int, dict]:
            wall, alone, evaluation = timed_jobs(chat_events, rows, jobs)
            return wall, alone, evaluation.calls, evaluation.report()

        wall_rates, alone_rates, reports = alternate_jobs(timed, args.jobs, args.repeat, unit="calls", per="calls/s")
        for jobs in (1, args.jobs):
            print(
                f"--jobs {jobs}: median {statistics.median(wall_rates[jobs]):,.0f} calls/s wall time, "
                f"{statistics.median(alone_rates[jobs]):,.0f} calls/s on the cores alone"
            )
        print_scaling(wall_rates, alone_rates, args.jobs)
        same = all(report == reports[1][0] for both in reports.values() for report in both)
        print(f"reports identical to one process: {'yes' if same else 'NO'}")
    return 0


def _yaml(path: Path):
    from schemas.config import load_config_file

    return load_config_file(str(path))


if __name__ == "__main__":
    raise SystemExit(main())
