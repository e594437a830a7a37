"""``loopwatch demo`` / ``make run``: the whole product on this machine, as a tour.

Starts the local Kafka broker if needed (or uses ``--bootstrap``'s), a loopwatch worker with
``examples/getting-started.yaml``, and a simulated fleet of runners (healthy runs and every
kind of loop, ``streams.offline.scenarios``) that talk to it with the runner client in gate
mode and obey its verdicts.  Decisions show live; a summary follows, with what each line
means and what the latency figures measure.  The worker is stopped at the end unless
``--keep-worker`` (``make run KEEP=1``): then it keeps serving its metrics, and the demo says
where they and the dashboards are.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from ..app.broker_options import add_broker_options, broker_overrides
from ..app.processes import stop_group, wait_http_ok
from ..app.settings import Settings, SettingsError, env_name
from ..client import LoopBlocked, LoopwatchClient, RunAbortedError
from .scenarios import SCENARIOS, scenario_calls

REPO = Path(__file__).resolve().parents[2]
"""The repository: ``loopwatch demo`` runs from a clone (its broker script, example config and state)."""
COLORS = {
    "warn": "\033[33m",
    "block": "\033[31m",
    "abort": "\033[35m",
    "ok": "\033[32m",
    "dim": "\033[2m",
    "end": "\033[0m",
}


def paint(kind: str, text: str) -> str:
    if not sys.stdout.isatty():
        return text
    return f"{COLORS[kind]}{text}{COLORS['end']}"


def ensure_broker() -> str:
    script = REPO / "scripts" / "kafka.sh"
    subprocess.run(["bash", str(script), "start"], check=True)
    out = subprocess.run(["bash", str(script), "env"], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("KAFKA_BOOTSTRAP="):
            return line.split("=", 1)[1].strip()
    return "127.0.0.1:19092"


EXPLAINED = {
    "healthy": "varied work, nothing repeated: no warning and no block (a false alarm would show here)",
    "polling_loop": "polls a background process whose output never changes: known_poll_no_progress",
    "ping_pong": "alternates two calls whose results never change: ping_pong, then generic_repeat",
    "generic_repeat": "the same search with the same answer, again and again: generic_repeat",
    "unknown_tool": "calls a tool that does not exist, again and again: unknown_tool_repeat blocks it",
    "post_compaction": "the same lookup again after its context was compacted: compaction_loop_persisted ends the run",
    "send_loop": "sends the same message again and again: generic_repeat",
    "cycle_loop": (
        "read, edit, test, read, ... with the test failing the same way: 0 under upstream's rules, which "
        "count identical calls (none of the three repeats often enough in one run to reach the warning "
        "threshold) and two-call alternation (ping_pong), not longer cycles; loopwatch's opt-in cycle "
        "detector catches it (loopwatch: {detectors: {cycle: true}}, docs/configuration.md)"
    ),
}
"""What each scenario line of the summary is, and which detector answers it."""

DASHBOARDS = ("helm/loopwatch/dashboards/loopwatch-fleet.json", "helm/loopwatch/dashboards/loopwatch-agent.json")
ALERTS = "helm/loopwatch/files/alerts.rules.yml"


def start_worker(
    bootstrap: str, web_port: int, metrics_port: int, config: Path, log_path: Path, kafka_env: dict[str, str]
) -> subprocess.Popen:
    env = {
        **os.environ,
        **kafka_env,
        "LOOPWATCH_BOOTSTRAP": bootstrap,
        "LOOPWATCH_CONFIG": str(config),
        "LOOPWATCH_WEB_PORT": str(web_port),
        "LOOPWATCH_METRICS_PORT": str(metrics_port),
        "LOOPWATCH_DATA_DIR": os.environ.get("LOOPWATCH_DATA_DIR") or str(REPO / ".loopwatch-state" / "demo"),
    }
    log = open(log_path, "ab")
    return subprocess.Popen(
        [sys.executable, "-m", "streams.app.worker"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=REPO,
    )


async def simulate_run(client: LoopwatchClient, kind: str, run_id: str, length: int, stats: dict, pace: float) -> None:
    run = client.run(run_id, session_key=f"agent:main:{run_id}", agent_id="main")
    rng = random.Random(run_id)
    outcome = "completed"
    for n, call in enumerate(scenario_calls(kind, rng, length)):
        await asyncio.sleep(rng.uniform(0, pace))
        if call == "compaction":
            await run.compaction_retried()
            print(paint("dim", f"  {run_id:22} context compacted, retrying"))
            continue
        call_id = f"call_{n}"
        started = time.perf_counter()
        try:
            decision = await run.before_tool_call(call.tool, call.args, tool_call_id=call_id)
        except LoopBlocked as blocked:
            stats[kind]["blocks"] += 1
            _timed(stats, time.perf_counter() - started, first=n == 0)
            d = blocked.decision
            print(paint("block", f"  {run_id:22} BLOCK {d.tool_name} ({d.detector}, count {d.count})"))
            continue  # not executed (the client has completed it with the blocked result)
        except RunAbortedError as aborted:
            stats[kind]["aborts"] += 1
            print(paint("abort", f"  {run_id:22} ABORT {aborted.detector}: {aborted}"))
            outcome = "aborted"
            break
        _timed(stats, time.perf_counter() - started, first=n == 0)
        stats[kind]["calls"] += 1
        if decision is not None and decision.action == "warn":
            stats[kind]["warns"] += 1
            print(
                paint("warn", f"  {run_id:22} WARN  {decision.tool_name} ({decision.detector}, count {decision.count})")
            )
        kwargs = {"error": call.error} if call.error is not None else {"result": call.result}
        await run.after_tool_call(call.tool, call.args, tool_call_id=call_id, **kwargs)
        if run.aborted is not None:
            await asyncio.sleep(0)
    # An abort can arrive after the last call; give it a moment, then end the run.
    await asyncio.sleep(0.3)
    if outcome != "aborted" and run.aborted is not None:
        stats[kind]["aborts"] += 1
        print(paint("abort", f"  {run_id:22} ABORT {run.aborted.detector}: {run.aborted.message}"))
        outcome = "aborted"
    await run.end(outcome)
    stats[kind]["runs"] += 1
    if outcome == "completed" and kind == "healthy":
        print(paint("ok", f"  {run_id:22} finished cleanly ({length} calls)"))


def new_stats() -> dict:
    """What ``simulate_run`` counts into: per scenario its calls, warns, blocks, aborts and
    runs; ``latency`` (every gated call's round trip, seconds) and ``warm_latency`` (those of
    calls after a run's first)."""
    stats: dict = defaultdict(Counter)
    stats["latency"] = []
    stats["warm_latency"] = []
    return stats


def _timed(stats: dict, seconds: float, *, first: bool) -> None:
    """A decision's round trip; a run's first call also waits for its cold start."""
    stats["latency"].append(seconds)
    if not first:
        stats["warm_latency"].append(seconds)


async def run_fleet(
    bootstrap: str,
    runs_per_kind: int,
    length: int,
    pace: float,
    kafka_options: dict | None = None,
    topics: dict[str, str] | None = None,
) -> dict:
    stats = new_stats()
    topics = topics or {}
    async with LoopwatchClient(bootstrap, mode="gate", timeout=5.0, **topics, **(kafka_options or {})) as client:
        tasks = [
            simulate_run(client, kind, f"{kind}-{n + 1}", length, stats, pace)
            for kind in SCENARIOS
            for n in range(runs_per_kind)
        ]
        await asyncio.gather(*tasks)
        stats["duplicates"] = client.duplicates_dropped
    return stats


def print_summary(stats: dict, elapsed: float) -> None:
    print()
    print(f"{'scenario':18} {'runs':>5} {'calls':>6} {'warns':>6} {'blocks':>7} {'aborts':>7}")
    for kind in SCENARIOS:
        s = stats[kind]
        print(f"{kind:18} {s['runs']:5} {s['calls']:6} {s['warns']:6} {s['blocks']:7} {s['aborts']:7}")
    print("\nwhat the lines mean:")
    for kind in SCENARIOS:
        print(f"  {kind:16} {EXPLAINED[kind]}")
    print(
        "  calls are the tool calls that ran; a blocked call does not run, so a loop can show more blocks than\n"
        "  calls; aborts are runs loopwatch ended (abortAfterCriticalBlocks in the config)"
    )
    lat = sorted(stats["latency"])
    if lat:
        print(
            f"\ndecision round trip (runner -> Kafka -> loopwatch -> Kafka -> runner): "
            f"p50 {_quantile(lat, 0.5):.1f} ms, p99 {_quantile(lat, 0.99):.1f} ms over {len(lat)} calls in {elapsed:.1f} s"
        )
        warm = sorted(stats["warm_latency"])
        if warm:
            print(
                "  the p99 is the cold start: a run's first call also waits while the client starts reading the\n"
                "  run's verdict partition and the fresh worker takes its first batches; without each run's first\n"
                f"  call: p50 {_quantile(warm, 0.5):.1f} ms, p99 {_quantile(warm, 0.99):.1f} ms over {len(warm)} calls "
                "(docs/benchmarks.md has the figures of a warm worker)"
            )


def _quantile(ordered: list[float], q: float) -> float:
    """Milliseconds at quantile ``q`` of ``ordered`` seconds (the nearest rank below)."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def print_tour(web_port: int, metrics_port: int) -> None:
    """Where to look while the worker keeps running."""
    print(
        "\nthe worker and the broker keep running (Ctrl-C stops the worker; `make kafka-stop` the broker):\n"
        f"  metrics     http://127.0.0.1:{metrics_port}/metrics  (the loopwatch_* series: docs/metrics.md)\n"
        f"  health      http://127.0.0.1:{web_port}/readyz\n"
        f"  dashboards  {DASHBOARDS[0]}, {DASHBOARDS[1]}\n"
        "              (Grafana JSON: import them, with a Prometheus that scrapes the metrics URL above)\n"
        f"  alerts      {ALERTS}",
        flush=True,
    )


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_demo(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="loopwatch demo", description=__doc__)
    parser.add_argument("--runs-per-scenario", type=int, default=2)
    parser.add_argument("--calls", type=int, default=26, help="tool calls per run")
    parser.add_argument("--pace", type=float, default=0.05, help="max seconds a runner thinks between calls")
    parser.add_argument(
        "--config",
        default=str(REPO / "examples" / "getting-started.yaml"),
        help="the worker's config (default: examples/getting-started.yaml)",
    )
    parser.add_argument("--web-port", type=int, default=6066)
    parser.add_argument("--metrics-port", type=int, default=9108)
    parser.add_argument(
        "--keep-worker",
        action="store_true",
        help="leave the worker running and show where its metrics and dashboards are (Ctrl-C stops it)",
    )
    add_broker_options(parser)
    args = parser.parse_args(argv)
    try:
        overrides = broker_overrides(args, "loopwatch demo")
        settings = Settings.from_env(**overrides)
    except SettingsError as exc:
        print(f"loopwatch demo: {exc}", file=sys.stderr)
        return 2
    # The worker reads the same broker settings: the flags given, as its variables.
    kafka_env = {env_name(name): str(value) for name, value in overrides.items() if value is not None}
    if overrides["broker"] is None and not (os.environ.get(env_name("broker")) or os.environ.get("LOOPWATCH_BROKER")):
        print("loopwatch demo: starting the local Kafka broker (cached after the first run)…", flush=True)
        bootstrap = ensure_broker()
    else:
        bootstrap = settings.broker
    log_path = REPO / ".loopwatch-state" / "demo-worker.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    print(f"starting a loopwatch worker (log: {log_path.relative_to(REPO)})…", flush=True)
    # A kill (SIGTERM) or a closed terminal (SIGHUP) stops the demo as Ctrl-C does, with its
    # worker: the worker runs in a session of its own, and would otherwise outlive the demo.
    for stop_signal in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop_signal, _interrupted)
    worker = start_worker(bootstrap, args.web_port, args.metrics_port, Path(args.config), log_path, kafka_env)
    try:
        wait_http_ok(f"http://127.0.0.1:{args.web_port}/readyz", worker, what="the worker", timeout=120, interval=0.5)
        print(f"worker ready: http://127.0.0.1:{args.web_port}/readyz, metrics on :{args.metrics_port}/metrics")
        print(f"simulating {args.runs_per_scenario * len(SCENARIOS)} runs ({', '.join(SCENARIOS)}):\n", flush=True)
        started = time.monotonic()
        stats = asyncio.run(
            run_fleet(
                bootstrap,
                args.runs_per_scenario,
                args.calls,
                args.pace,
                settings.kafka_client_options(),
                {"tool_calls_topic": settings.tool_calls_topic, "verdicts_topic": settings.verdicts_topic},
            )
        )
        print_summary(stats, time.monotonic() - started)
        if args.keep_worker:
            print_tour(args.web_port, args.metrics_port)
            worker.wait()
        else:
            print(
                "\nthe worker stops now; `make run KEEP=1` (loopwatch demo --keep-worker) keeps it and its metrics up"
            )
    except KeyboardInterrupt:
        pass
    except (RuntimeError, TimeoutError) as exc:
        print(f"loopwatch demo: {exc}; see {log_path}", file=sys.stderr)
        return 1
    finally:
        stop_group(worker, timeout=20)
    return 0
