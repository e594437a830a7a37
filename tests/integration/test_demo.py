"""``loopwatch demo`` (``make run``) as a tour, run for real on the test broker with its own
topics: every scenario line is explained, the cold-start p99 is told apart from the rest, the
worker stops at the end unless kept, and a kept worker's metrics and dashboards are named (and
its metrics URL answers).

The cycle_loop explanation is checked against the engine itself: no decision under
examples/getting-started.yaml (upstream's rules), decisions of the ``cycle`` detector once the
opt-in detector is on.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from bench.placement import listening_pid
from harness import REPO, WorkerNames, free_port
from streams.engine import RunDriver, engine_for
from streams.offline.demo import DASHBOARDS, EXPLAINED
from streams.offline.scenarios import SCENARIOS, run_events

pytestmark = pytest.mark.kafka

GETTING_STARTED = REPO / "examples" / "getting-started.yaml"


def demo_env(names: WorkerNames, tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWATCH_")}
    return {**env, **names.env(), "LOOPWATCH_DATA_DIR": str(tmp_path / "state"), "PYTHONUNBUFFERED": "1"}


def demo_args(broker: str, web_port: int, metrics_port: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "streams.cli",
        "demo",
        "--bootstrap",
        broker,
        "--runs-per-scenario",
        "1",
        "--pace",
        "0.01",
        "--web-port",
        str(web_port),
        "--metrics-port",
        str(metrics_port),
        *extra,
    ]


def test_the_demo_explains_every_line_and_the_cold_start(kafka_broker, tmp_path):
    names = WorkerNames(prefix="demo")
    proc = subprocess.run(
        demo_args(kafka_broker, free_port(), free_port()),
        env=demo_env(names, tmp_path),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    out = proc.stdout
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "what the lines mean:" in out
    for kind in SCENARIOS:
        assert f"  {kind:16} {EXPLAINED[kind]}" in out
    assert "loopwatch's opt-in cycle detector catches it (loopwatch: {detectors: {cycle: true}}" in out
    assert "a blocked call does not run, so a loop can show more blocks than" in out
    cold = re.search(r"p50 [\d.]+ ms, p99 ([\d.]+) ms over (\d+) calls in", out)
    warm = re.search(r"without each run's first\s+call: p50 [\d.]+ ms, p99 ([\d.]+) ms over (\d+) calls", out)
    assert cold and warm, out
    assert int(warm.group(2)) == int(cold.group(2)) - len(SCENARIOS)  # one first call per run
    assert float(warm.group(1)) <= float(cold.group(1))
    assert "the p99 is the cold start" in out
    assert out.rstrip().endswith("`make run KEEP=1` (loopwatch demo --keep-worker) keeps it and its metrics up")
    # The demo's config is the getting-started one: runs that loop on are ended.
    row = re.search(r"^generic_repeat +1 +\d+ +\d+ +(\d+) +(\d+)$", out, re.MULTILINE)
    assert row and row.groups() == ("3", "1"), out  # ended at its 3rd block (abortAfterCriticalBlocks: 3)


def test_a_kept_worker_serves_its_metrics_and_the_demo_says_where(kafka_broker, tmp_path):
    names = WorkerNames(prefix="demo")
    web_port, metrics_port = free_port(), free_port()
    log = tmp_path / "demo.out"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            demo_args(kafka_broker, web_port, metrics_port, "--keep-worker"),
            env=demo_env(names, tmp_path),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        while "alerts" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        text = log.read_text()
        assert proc.poll() is None, text  # still running: the worker is kept
        assert f"  metrics     http://127.0.0.1:{metrics_port}/metrics" in text
        for path in DASHBOARDS:
            assert path in text and (REPO / path).is_file()
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as answer:
            assert b"loopwatch_" in answer.read()
        # Killed (as a supervisor or a closed terminal would), the demo stops its worker too,
        # which runs in a session of its own: nothing is left listening.
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert listening_pid(web_port) is None and listening_pid(metrics_port) is None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for port in (web_port, metrics_port):  # a worker left behind by a failure above
            if (pid := listening_pid(port)) is not None:
                os.kill(pid, signal.SIGKILL)


def test_cycle_loop_is_caught_only_by_the_opt_in_cycle_detector():
    config = yaml.safe_load(GETTING_STARTED.read_text())
    events = list(run_events("cycle_loop", "cycle-1", length=26))
    upstream = [v for v in RunDriver(engine_for(config)).verdicts(events) if getattr(v, "action", "") != "allow"]
    assert upstream == []
    config["loopwatch"]["detectors"] = {"cycle": True}
    opted_in = [v for v in RunDriver(engine_for(config)).verdicts(events) if getattr(v, "action", "") != "allow"]
    assert opted_in[0].detector == "cycle"
    assert {v.detector for v in opted_in} <= {"cycle", "critical_block_limit"}  # its blocks end the run
