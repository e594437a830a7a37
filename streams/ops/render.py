"""Draw a worker's metrics over a simulated fleet run: the README's picture.

    python -m streams.ops.render [--out docs/img/demo-metrics.png] [--duration 60]

Starts the local Kafka broker if needed (``scripts/kafka.sh start``, left running), one
loopwatch worker on topics of its own (``loop-detection.yaml`` from ``examples/``), and
``loopwatch demo``'s simulated runners (``streams.ops.traffic``) in three phases: a quiet
fleet of mostly healthy runs, a loop storm (most new runs loop: polls without progress,
repeats, ping-pong, unknown tools, loops surviving compaction), and recovery.  It scrapes
the worker's ``/metrics`` every second, as Prometheus would, and plots a 2x2 figure with
matplotlib: decisions per second by action, detections by detector (cumulative), decision
latency p50/p99 from the histogram buckets, and runs tracked.  The worker is stopped and
its topics deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from .scrape import Snapshot, histogram_quantile, scrape

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "docs" / "img" / "demo-metrics.png"
DEFAULT_CONFIG = REPO / "examples" / "loop-detection.yaml"

LOOPS = ("polling_loop", "ping_pong", "generic_repeat", "unknown_tool", "post_compaction", "send_loop")
ACTION_COLORS = {"allow": "#2ca02c", "warn": "#ff7f0e", "block": "#d62728"}
WINDOW_S = 5.0
"""Rates and quantiles are taken over this many seconds of scrapes (Prometheus' ``[5s]``)."""


# -- the run ----------------------------------------------------------------------------------


class Phases:
    """What the simulated fleet does over time: quiet, loop storm, recovery."""

    def __init__(self, duration_s: float) -> None:
        self.storm_start = duration_s * 0.3
        self.storm_end = duration_s * 0.7

    def concurrency(self, t: float) -> int:
        if t < self.storm_start:
            return 6
        if t < self.storm_end:
            return 14
        return 4

    def scenario(self, t: float, rng: random.Random) -> str:
        loop_share = 0.85 if self.storm_start <= t < self.storm_end else 0.2
        return rng.choice(LOOPS) if rng.random() < loop_share else "healthy"


class Recorder:
    """Scrapes ``/metrics`` every ``interval`` seconds in a thread."""

    def __init__(self, port: int, interval: float = 1.0) -> None:
        self.port = port
        self.interval = interval
        self.snapshots: list[Snapshot] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-recorder", daemon=True)

    def start(self) -> Recorder:
        self._thread.start()
        return self

    def stop(self) -> list[Snapshot]:
        self._stop.set()
        self._thread.join(10)
        return self.snapshots

    def _run(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            snap = scrape(self.port)
            if snap is not None:
                self.snapshots.append(snap)
            due += self.interval
            self._stop.wait(max(0.0, due - time.monotonic()))


def delete_topics(broker: str, prefix: str) -> None:
    """Best effort: delete this run's topics (app id prefix) from the shared broker."""
    from harness import delete_topics as delete

    try:
        asyncio.run(asyncio.wait_for(delete(broker, [prefix]), 30))
    except Exception as exc:  # noqa: BLE001
        print(f"render: could not delete topics {prefix}*: {exc!r}", file=sys.stderr)


def record_demo(duration_s: float, config: Path, settle_s: float = 4.0) -> tuple[list[Snapshot], Phases, dict, float]:
    """Run the worker and the fleet; returns (scrapes, phases, fleet stats, fleet start time)."""
    from harness import WorkerNames, WorkerProcess
    from streams.offline.demo import ensure_broker

    from .traffic import drive_fleet

    print("render: starting the local Kafka broker (scripts/kafka.sh start)…", flush=True)
    bootstrap = ensure_broker()
    names = WorkerNames(prefix="lwrender")
    tmp = Path(tempfile.mkdtemp(prefix="lwrender-"))
    worker = WorkerProcess(bootstrap, names, data_dir=tmp / "data", log_dir=tmp, config=config)
    phases = Phases(duration_s)
    try:
        worker.start()
        worker.wait_ready(120)
        print(f"render: worker ready (metrics on :{worker.metrics_port}); fleet for {duration_s:.0f} s…", flush=True)
        recorder = Recorder(worker.metrics_port).start()
        time.sleep(2.0)  # a baseline before the first event
        started = time.time()
        stats = asyncio.run(
            drive_fleet(
                bootstrap,
                duration_s=duration_s,
                tool_calls_topic=names.tool_calls,
                verdicts_topic=names.verdicts,
                concurrency=phases.concurrency,
                mix=phases.scenario,
                run_prefix=f"{names.tag}-",
            )
        )
        time.sleep(settle_s)  # the last runs end; the gauges come back down
        snapshots = recorder.stop()
    except BaseException:
        print(f"render: failed; worker log: {worker.log_path}\n{worker.log_tail(40)}", file=sys.stderr)
        raise
    finally:
        worker.stop()
        delete_topics(bootstrap, names.app_id)
    shutil.rmtree(tmp, ignore_errors=True)
    return snapshots, phases, stats, started


# -- the picture ------------------------------------------------------------------------------


def _window_pairs(snaps: Sequence[Snapshot], window: float) -> list[tuple[Snapshot, Snapshot]]:
    """(earlier, later) scrape pairs about ``window`` seconds apart, one per later scrape."""
    pairs = []
    j = 0
    for i, later in enumerate(snaps):
        while j < i and later.at - snaps[j + 1].at >= window:
            j += 1
        if i > j:
            pairs.append((snaps[j], later))
    return pairs


def series(snaps: Sequence[Snapshot], started: float) -> dict:
    """Everything the four panels plot, computed from the scrapes."""
    pairs = _window_pairs(snaps, WINDOW_S)
    rate_t = [later.at - started for _, later in pairs]
    actions = {}
    for action in ACTION_COLORS:
        actions[action] = [
            (b.value("loopwatch_decisions_total", action=action) - a.value("loopwatch_decisions_total", action=action))
            / (b.at - a.at)
            for a, b in pairs
        ]
    p50, p99 = [], []
    for a, b in pairs:
        before = dict(a.buckets("loopwatch_decision_latency_seconds"))
        delta = [(le, n - before.get(le, 0.0)) for le, n in b.buckets("loopwatch_decision_latency_seconds")]
        p50.append(histogram_quantile(0.5, delta) * 1000)
        p99.append(histogram_quantile(0.99, delta) * 1000)
    t = [s.at - started for s in snaps]
    detectors = sorted({d for s in snaps for d in s.labels("loopwatch_loop_detections_total", "detector")})
    detections = {d: [s.value("loopwatch_loop_detections_total", detector=d) for s in snaps] for d in detectors}
    return {
        "t": t,
        "rate_t": rate_t,
        "actions": actions,
        "p50": p50,
        "p99": p99,
        "detections": detections,
        "runs": [s.value("loopwatch_runs_tracked") for s in snaps],
    }


def plot(data: dict, phases: Phases, out: Path, subtitle: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    plt.rcParams.update({"font.size": 10, "axes.titlesize": 12, "axes.titleweight": "bold"})
    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5), sharex=True)
    (ax_dec, ax_det), (ax_lat, ax_runs) = axes

    def storm(ax, label: bool = False) -> None:
        ax.axvspan(
            phases.storm_start,
            phases.storm_end,
            color="#d62728",
            alpha=0.07,
            lw=0,
            label="loop storm" if label else None,
        )
        ax.grid(True, alpha=0.3)
        ax.set_xlim(data["t"][0], data["t"][-1])

    for action, color in ACTION_COLORS.items():
        ax_dec.plot(data["rate_t"], data["actions"][action], color=color, lw=1.8, label=action)
    ax_dec.set_title("Decisions per second by action")
    ax_dec.set_ylabel(f"decisions / s ({WINDOW_S:.0f} s rate)")
    top = max([v for values in data["actions"].values() for v in values] + [1.0])
    ax_dec.set_ylim(0, top * 1.25)
    storm(ax_dec, label=True)
    ax_dec.legend(loc="upper right", frameon=True, framealpha=0.9, ncol=2)

    for detector, values in data["detections"].items():
        ax_det.plot(data["t"], values, lw=1.8, label=detector)
    ax_det.set_title("Loop detections by detector (cumulative)")
    ax_det.set_ylabel("detections")
    ax_det.set_ylim(bottom=0)
    storm(ax_det)
    ax_det.legend(loc="upper left", frameon=True, framealpha=0.9, fontsize=9)

    ax_lat.plot(data["rate_t"], data["p50"], color="#1f77b4", lw=1.8, label="p50")
    ax_lat.plot(data["rate_t"], data["p99"], color="#9467bd", lw=1.8, label="p99")
    ax_lat.axhline(50, color="#d62728", ls="--", lw=1.2, label="50 ms objective")
    ax_lat.set_yscale("log")
    finite = [v for v in data["p50"] + data["p99"] if math.isfinite(v) and v > 0]
    ax_lat.set_ylim(min(finite + [50.0]) / 1.5, max(finite + [50.0]) * 4)
    ax_lat.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax_lat.set_title("Decision latency (event → verdict)")
    ax_lat.set_ylabel(f"ms ({WINDOW_S:.0f} s window, histogram buckets)")
    ax_lat.set_xlabel("seconds since the fleet started")
    storm(ax_lat)
    ax_lat.legend(loc="upper right", frameon=True, framealpha=0.9, ncol=3)

    ax_runs.plot(data["t"], data["runs"], color="#17becf", lw=1.8, drawstyle="steps-post")
    ax_runs.fill_between(data["t"], data["runs"], step="post", color="#17becf", alpha=0.2)
    ax_runs.set_title("Runs tracked (runs with state on the worker)")
    ax_runs.set_ylabel("runs")
    ax_runs.set_xlabel("seconds since the fleet started")
    ax_runs.set_ylim(bottom=0)
    storm(ax_runs)

    fig.suptitle("loopwatch worker metrics during a simulated fleet run", fontsize=14, fontweight="bold")
    fig.text(0.5, 0.935, subtitle, ha="center", fontsize=10, color="#444444")
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def describe(stats: dict, duration_s: float, snaps: Sequence[Snapshot]) -> str:
    runs = sum(stats["started"].values())
    last = snaps[-1]
    calls = last.value("loopwatch_events_consumed_total", type="tool_call.requested")
    blocks = last.value("loopwatch_decisions_total", action="block")
    aborts = last.value("loopwatch_run_aborts_total")
    return (
        f"{runs} runs of every scenario over {duration_s:.0f} s, one worker, local Kafka; "
        f"{calls:.0f} calls decided, {blocks:.0f} blocked, {aborts:.0f} runs aborted; "
        f"shaded: loop storm"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m streams.ops.render", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"PNG to write (default: {DEFAULT_OUT.relative_to(REPO)})"
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of fleet traffic (default 60)")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="loop-detection config of the worker")
    args = parser.parse_args(argv)

    snaps, phases, stats, started = record_demo(args.duration, args.config)
    if len(snaps) < 10:
        print(f"render: only {len(snaps)} scrapes; nothing to plot", file=sys.stderr)
        return 1
    data = series(snaps, started)
    if not any(math.isfinite(v) for v in data["p99"]):
        print("render: no decision latency observed", file=sys.stderr)
        return 1
    plot(data, phases, args.out, describe(stats, args.duration, snaps))
    print(f"render: wrote {args.out} ({args.out.stat().st_size // 1024} KB, {len(snaps)} scrapes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
