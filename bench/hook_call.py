"""The per-call cost of ``loopwatch hook claude-code``: the wall time of one hook command, as
Claude Code runs it (a process per call, the hook JSON on stdin), against a running
``loopwatch hook --serve`` and a real worker on the broker.  Every call has new arguments, so
loopwatch allows them all; a PreToolUse waits for the gate's decision over Kafka, a
PostToolUse publishes the completion.

    PYTHONPATH=$PWD python -m bench.hook_call [--calls 200] [--broker 127.0.0.1:19092]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import REPO, WorkerNames, WorkerProcess, write_config
from streams.integrations.hooks import call

CONFIG = {"tools": {"loopDetection": {"enabled": True}}}


def timed(command: list[str], payload: dict, env: dict) -> tuple[float, str]:
    data = json.dumps(payload).encode()
    started = time.perf_counter()
    out = subprocess.run(command, input=data, capture_output=True, env=env, check=True).stdout
    return (time.perf_counter() - started) * 1000, out.decode()


def main() -> int:
    p = argparse.ArgumentParser(prog="bench.hook_call")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--broker", default=os.environ.get("LOOPWATCH_BOOTSTRAP", "127.0.0.1:19092"))
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lw-hookbench-"))
    names = WorkerNames(prefix="lwbh")
    write_config(tmp / "config.json", CONFIG)
    worker = WorkerProcess(args.broker, names, data_dir=tmp / "data", config=tmp / "config.json").start()
    sock = str(tmp / "hook.sock")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    serve = None
    try:
        worker.wait_ready(120)
        serve = subprocess.Popen(
            [sys.executable, "-m", "streams.cli", "hook", "--serve", "--socket", sock, "--bootstrap", args.broker,
             "--tool-calls-topic", names.tool_calls, "--verdicts-topic", names.verdicts, "--timeout", "5"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        print(serve.stdout.readline().strip())
        commands = {
            "python -S call.py (by path)": [sys.executable, "-S", call.__file__, "claude-code", "--socket", sock],
            "python -m streams.cli hook claude-code": [
                sys.executable, "-m", "streams.cli", "hook", "claude-code", "--socket", sock,
            ],
            "baseline: python -S -c pass": [sys.executable, "-S", "-c", "pass"],
        }  # fmt: skip
        session = f"bench-{names.tag}"
        for label, command in commands.items():
            pre, post = [], []
            for i in range(args.calls + 10):
                base = {"session_id": session, "tool_name": "Bash", "tool_input": {"command": f"ls {label} {i}"}}
                base["tool_use_id"] = f"toolu_{label[:6]}_{i}"
                ms, out = timed(command, {**base, "hook_event_name": "PreToolUse"}, env)
                assert out == "", out  # allowed: no output
                ms2, _ = timed(
                    command, {**base, "hook_event_name": "PostToolUse", "tool_response": {"stdout": ""}}, env
                )
                if i >= 10:  # warm-up: the first calls position the run's verdict partitions
                    pre.append(ms)
                    post.append(ms2)
            q = lambda xs, f: sorted(xs)[int(f * (len(xs) - 1))]  # noqa: E731
            print(
                f"{label}: PreToolUse p50 {statistics.median(pre):.1f} ms p95 {q(pre, 0.95):.1f} ms; "
                f"PostToolUse p50 {statistics.median(post):.1f} ms p95 {q(post, 0.95):.1f} ms ({args.calls} calls each)"
            )
        print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    finally:
        if serve is not None and serve.poll() is None:
            os.killpg(serve.pid, 15)
            serve.wait(timeout=20)
        worker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
