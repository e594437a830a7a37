"""The per-call cost of ``loopwatch hook claude-code`` (or ``codex``, ``gemini``): the wall time of one
hook command, as the CLI runs it (a process per call, the hook JSON on stdin), against a running
``loopwatch hook --serve`` and a real worker on the broker.  Every call has new arguments, so
loopwatch allows them all; a before-tool hook waits for the gate's decision over Kafka, an
after-tool hook publishes the completion.

    PYTHONPATH=$PWD python -m bench.hook_call [--cli claude-code|codex|gemini] [--calls 200] [--broker 127.0.0.1:19092]

The ways take turns call by call, so that a change of the machine's load falls on all of them:
the native relay ``hook install`` writes when a C compiler is found (``relay.c``, built here into
the run's temp directory), the Python relay it writes without one (``python -I -S relay.py``),
the stdlib command that came before (``python -S call.py``), and an interpreter that does nothing
(``python -I -S -c pass``); with ``--module``, ``python -m streams.cli hook <cli>`` too.

``--http`` (Claude Code only) times Claude Code's HTTP hook instead: the same payloads POSTed to
``loopwatch hook --serve --http`` over one kept-alive connection (as Claude Code's client does),
alternating call by call with the native and the Python relay in the same run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from harness import REPO, WorkerNames, WorkerProcess, write_config
from streams.integrations.hooks import call, install, relay

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


def q(xs: list[float], f: float) -> float:
    return sorted(xs)[int(f * (len(xs) - 1))]


def run_by(command: list[str], env: dict) -> Callable[[dict], tuple[float, str]]:
    return lambda payload: timed(command, payload, env)


TOKEN = "bench-" + os.urandom(16).hex()
AUTH = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}


def posted(conn: http.client.HTTPConnection, path: str, payload: dict) -> tuple[float, str]:
    data = json.dumps(payload).encode()
    started = time.perf_counter()
    conn.request("POST", path, body=data, headers=AUTH)
    response = conn.getresponse()
    body = response.read()
    ms = (time.perf_counter() - started) * 1000
    assert response.status == 200, (response.status, body)
    return ms, "" if body == b"{}" else body.decode()


def main() -> int:
    p = argparse.ArgumentParser(prog="bench.hook_call")
    p.add_argument("--cli", choices=tuple(HOOKS), default="claude-code")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--http", action="store_true", help="Claude Code's HTTP hook against the per-call command")
    p.add_argument("--module", action="store_true", help="also time python -m streams.cli hook <cli> (slow)")
    p.add_argument("--broker", default=os.environ.get("LOOPWATCH_BOOTSTRAP", "127.0.0.1:19092"))
    args = p.parse_args()
    if args.http and args.cli != "claude-code":
        p.error("--http: only Claude Code has HTTP hooks")
    tmp = Path(tempfile.mkdtemp(prefix="lw-hookbench-"))
    compiler = install.find_compiler()
    if compiler is None:
        p.error("no C compiler (cc, gcc or clang; or set CC): the native relay cannot be built")
    native = str(install.build_native_relay(compiler, cache=tmp / "relay"))
    names = WorkerNames(prefix="lwbh")
    write_config(tmp / "config.json", CONFIG)
    worker = WorkerProcess(args.broker, names, data_dir=tmp / "data", config=tmp / "config.json").start()
    sock = str(tmp / "hook.sock")
    env = dict(os.environ, PYTHONPATH=str(REPO), LOOPWATCH_HOOK_TOKEN=TOKEN)
    serve = None
    try:
        worker.wait_ready(120)
        serve = subprocess.Popen(
            [sys.executable, "-m", "streams.cli", "hook", "--serve", "--socket", sock, "--bootstrap", args.broker,
             "--tool-calls-topic", names.tool_calls, "--verdicts-topic", names.verdicts, "--timeout", "5",
             *(["--http", "0"] if args.http else [])],
            cwd=REPO, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        first = serve.stdout.readline().strip()
        print(first)
        if args.http:
            url = urlsplit(first.split(" and ", 1)[1].split(" ", 1)[0])
            conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)
            conn.connect()
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            command = [sys.executable, "-I", "-S", relay.__file__, args.cli, "--socket", sock]
            ways = {
                "HTTP hook (POST, kept-alive)": lambda payload: posted(conn, url.path, payload),
                "native relay": run_by([native, args.cli, "--socket", sock], env),
                "python -I -S relay.py": run_by(command, env),
            }
            report(ways, args, names.tag, alternate=True)
            floor = []
            for _ in range(args.calls):  # parsed and refused (400) before any handler: HTTP and JSON alone
                started = time.perf_counter()
                conn.request("POST", url.path, body=b"[]", headers=AUTH)
                response = conn.getresponse()
                response.read()
                floor.append((time.perf_counter() - started) * 1000)
                assert response.status == 400, response.status
            print(f"HTTP round trip alone (a 400): p50 {statistics.median(floor):.2f} ms p95 {q(floor, 0.95):.2f} ms")
            print(
                f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.platform()}"
            )
            return 0
        commands = {
            "native relay (hook install's with a C compiler)": [native, args.cli, "--socket", sock],
            "python -I -S relay.py (hook install's without one)": [sys.executable, "-I", "-S", relay.__file__, args.cli, "--socket", sock],
            "python -S call.py (by path)": [sys.executable, "-S", call.__file__, args.cli, "--socket", sock],
            "baseline: python -I -S -c pass": [sys.executable, "-I", "-S", "-c", "pass"],
        }  # fmt: skip
        if args.module:
            commands[f"python -m streams.cli hook {args.cli}"] = [
                sys.executable, "-m", "streams.cli", "hook", args.cli, "--socket", sock,
            ]  # fmt: skip
        report({label: run_by(command, env) for label, command in commands.items()}, args, names.tag, alternate=True)
        print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    finally:
        if serve is not None and serve.poll() is None:
            os.killpg(serve.pid, 15)
            serve.wait(timeout=20)
        worker.stop()
    return 0


def report(ways: dict[str, Callable[[dict], tuple[float, str]]], args: Any, tag: str, *, alternate: bool) -> None:
    """Each way's before and after hook, ``args.calls`` times after a warm-up; ``alternate``: the
    ways take turns call by call (so that a change of load falls on both), else one after another."""
    session = f"bench-{tag}"
    before, after, tool, id_field, response = HOOKS[args.cli]
    times: dict[str, tuple[list[float], list[float]]] = {label: ([], []) for label in ways}

    def one(label: str, i: int) -> None:
        base: dict[str, Any] = {"session_id": session, "tool_name": tool, "tool_input": {"command": f"ls {label} {i}"}}
        if id_field:
            base[id_field] = f"toolu_{label[:6]}_{i}"
        ms, out = ways[label]({**base, "hook_event_name": before})
        assert out == "", out  # allowed: no output
        ms2, _ = ways[label]({**base, "hook_event_name": after, "tool_response": response})
        if i >= 10:  # warm-up: the first calls position the run's verdict partitions
            times[label][0].append(ms)
            times[label][1].append(ms2)

    if alternate:
        for i in range(args.calls + 10):
            for label in ways:
                one(label, i)
    else:
        for label in ways:
            for i in range(args.calls + 10):
                one(label, i)
    for label, (pre, post) in times.items():
        print(
            f"{label}: {before} p50 {statistics.median(pre):.2f} ms p90 {q(pre, 0.9):.2f} ms "
            f"p95 {q(pre, 0.95):.2f} ms; {after} p50 {statistics.median(post):.2f} ms p90 {q(post, 0.9):.2f} ms "
            f"p95 {q(post, 0.95):.2f} ms ({args.calls} calls each)"
        )


if __name__ == "__main__":
    sys.exit(main())
