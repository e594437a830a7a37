"""The per-call cost of ``loopwatch hook claude-code`` (or ``codex``, ``gemini``): the wall time of one
hook command, as the CLI runs it (a process per call, the hook JSON on stdin), against a running
``loopwatch hook --serve`` and a real worker on the broker.  Every call has new arguments, so
loopwatch allows them all; a before-tool hook waits for the gate's decision over Kafka, an
after-tool hook publishes the completion.

    PYTHONPATH=$PWD python -m bench.hook_call [--cli claude-code|codex|gemini] [--calls 200] [--broker 127.0.0.1:19092]
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
# Each CLI's hook input: (before event, after event, its tool, its call id field or None, a response).
HOOKS = {
    "claude-code": ("PreToolUse", "PostToolUse", "Bash", "tool_use_id", {"stdout": ""}),
    "codex": ("PreToolUse", "PostToolUse", "Bash", "tool_use_id", ""),
    "gemini": ("BeforeTool", "AfterTool", "run_shell_command", None, {"llmContent": "Output: (empty)"}),
}


def timed(command: list[str], payload: dict, env: dict) -> tuple[float, str]:
    data = json.dumps(payload).encode()
    started = time.perf_counter()
    out = subprocess.run(command, input=data, capture_output=True, env=env, check=True).stdout
    return (time.perf_counter() - started) * 1000, out.decode()


def main() -> int:
    p = argparse.ArgumentParser(prog="bench.hook_call")
    p.add_argument("--cli", choices=tuple(HOOKS), default="claude-code")
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
            "python -S call.py (by path)": [sys.executable, "-S", call.__file__, args.cli, "--socket", sock],
            f"python -m streams.cli hook {args.cli}": [
                sys.executable, "-m", "streams.cli", "hook", args.cli, "--socket", sock,
            ],
            "baseline: python -S -c pass": [sys.executable, "-S", "-c", "pass"],
        }  # fmt: skip
        session = f"bench-{names.tag}"
        before, after, tool, id_field, response = HOOKS[args.cli]
        for label, command in commands.items():
            pre, post = [], []
            for i in range(args.calls + 10):
                base = {"session_id": session, "tool_name": tool, "tool_input": {"command": f"ls {label} {i}"}}
                if id_field:
                    base[id_field] = f"toolu_{label[:6]}_{i}"
                ms, out = timed(command, {**base, "hook_event_name": before}, env)
                assert out == "", out  # allowed: no output
                ms2, _ = timed(command, {**base, "hook_event_name": after, "tool_response": response}, env)
                if i >= 10:  # warm-up: the first calls position the run's verdict partitions
                    pre.append(ms)
                    post.append(ms2)
            q = lambda xs, f: sorted(xs)[int(f * (len(xs) - 1))]  # noqa: E731
            print(
                f"{label}: {before} p50 {statistics.median(pre):.1f} ms p95 {q(pre, 0.95):.1f} ms; "
                f"{after} p50 {statistics.median(post):.1f} ms p95 {q(post, 0.95):.1f} ms ({args.calls} calls each)"
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
