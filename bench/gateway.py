"""``make bench-gateway``: what ``loopwatch mcp-gateway`` adds to an MCP tool call (issue 27).

One run, on the local broker with a real worker, holds four paths open at once and alternates
them in rounds (the order rotates each round, so the shared machine's swings hit all alike):

* **direct**: the ``mcp`` SDK's client calls ``bench/mcp_upstream.py`` (stdio) itself;
* **passthrough**: the same call through ``bench/mcp_passthrough.py``, a pure pass-through proxy
  on the same SDK and the gateway's stdio transport, without loopwatch: the floor of any proxy,
  so what a gateway row adds beyond it is loopwatch's;
* **advisory**: the same call through a gateway in advisory mode (stdio on both sides: the
  relay, ``streams/integrations/mcp/relay.py``);
* **gate**: the same call through a gateway in gate mode;
* **advisory-sdk**, **gate-sdk**: the same gateways with ``--sdk-proxy`` (the SDK's server and
  client back to back, as before the relay, and as HTTP and several upstreams are served);
* **decision**: loopwatch's decision round trip alone: ``LoopwatchClient.before_tool_call`` in
  gate mode (publish the request, the worker decides, the verdict comes back), no MCP at all;
  each request takes the previous call's completion along, as a gate-mode gateway's does.

Every call has new arguments (a healthy run: nothing is blocked).  Targets: advisory adds at
most 1 ms at p50 and 3 ms at p99 over direct; gate adds at most 2 ms at p99 beyond direct plus
the decision round trip; and at least 2,000 calls/s through one gateway process (advisory,
``--concurrency`` calls in flight from one agent), with the CPU time each proxy process (the
upstream's, for direct) spent per call.

The throughput runs have two more rows, **advisory-http**: one gateway process in advisory mode
serving streamable HTTP (``--http``), ``--http-sessions`` agents each with a session of its own
(handshake-era, ``Mcp-Session-Id``: one run each) and one call in flight each, in front of the
same stdio upstream; and its floor, **passthrough-http**: the pass-through proxy serving the
same sessions over the SDK's streamable HTTP.  The throughput runs are alternated too: ``--throughput-rounds`` rounds,
the order rotating, each path's rate its calls over its time summed over the rounds.

The **capacity** rows take the SDK out of both ends, whose own CPU per call (0.3 ms the agent's,
0.6-1 ms the upstream's) would otherwise be the limit on two cores: a wire-level agent here
pipelines ``--concurrency`` ``tools/call`` lines and ``bench/mcp_raw_upstream.py`` answers
them.  **direct-raw** is the two ends alone; **advisory-raw** and **gate-raw** put one gateway
process between them: the 2,000 calls/s target is read there.  The same three are also timed
one call at a time in the alternated latency rounds: what the gateway adds to a call when the
ends cost next to nothing.

**Placement** (``--placement``): by default the broker and the worker are pinned to the last CPU
and everything timed (this process's agents, the gateways, the upstreams) to the others
(``bench/placement.py``), as in a deployment, where loopwatch's side runs on machines of its
own; ``shared`` leaves every process on every CPU, as runs before 2026-12-03 did.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from bench.core import steal_jiffies
from bench.kafka import cpu_model
from bench.placement import listening_pid, restore, split
from harness import REPO, WorkerNames, WorkerProcess, free_port, write_config
from streams.client import LoopwatchClient

CONFIG = {"tools": {"loopDetection": {"enabled": True}}}
UPSTREAM = [sys.executable, "-m", "bench.mcp_upstream"]
PASSTHROUGH = [sys.executable, "-m", "bench.mcp_passthrough", *UPSTREAM]
RAW_UPSTREAM = [sys.executable, "-m", "bench.mcp_raw_upstream"]
PATHS = ("direct", "passthrough", "advisory", "gate", "advisory-sdk", "gate-sdk")
RAW_PATHS = ("direct-raw", "advisory-raw", "gate-raw")
HTTP_PATHS = ("passthrough-http", "advisory-http")
ROWS = (*PATHS, *RAW_PATHS, *HTTP_PATHS, "decision", "advisory-base", "gate-base", "advisory-raw-base", "gate-raw-base")
LOOPWATCH = str(Path(sys.executable).parent / "loopwatch")
TARGETS = {"advisory_p50_ms": 1.0, "advisory_p99_ms": 3.0, "gate_beyond_decision_p99_ms": 2.0, "calls_per_s": 2000}


def _bootstrap() -> str:
    out = subprocess.run([str(REPO / "scripts" / "kafka.sh"), "env"], capture_output=True, text=True, check=True).stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return env["KAFKA_BOOTSTRAP"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def process_cpu(marker: str) -> float:
    """CPU seconds (user + system) of the one process whose command line ends with ``marker``
    (each path's proxy, or the direct path's upstream, is told apart by its last argument)."""
    tick = os.sysconf("SC_CLK_TCK")
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
            if argv and argv[-1].decode(errors="replace") == marker:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                found.append((int(fields[11]) + int(fields[12])) / tick)
        except OSError:
            continue
    if len(found) != 1:
        raise RuntimeError(f"{len(found)} processes end with {marker!r}")
    return found[0]


def gateway_args(
    names: WorkerNames, broker: str, mode: str, run_id: str, *extra: str, upstream: list[str] = UPSTREAM
) -> list[str]:
    # the last argument (the agent id) tells the process apart (process_cpu)
    return [
        "mcp-gateway",
        "--bootstrap",
        broker,
        "--tool-calls-topic",
        names.tool_calls,
        "--verdicts-topic",
        names.verdicts,
        "--mode",
        mode,
        "--run-id",
        run_id,
        "--timeout",
        "10",
        "--upstream",
        " ".join(upstream),
        "--log-level",
        "warning",
        *extra,
        "--agent-id",
        run_id,
    ]


def gateway(names: WorkerNames, broker: str, mode: str, run_id: str, tree: str | None = None, *extra: str) -> Client:
    args = gateway_args(names, broker, mode, run_id, *extra)
    env = {**os.environ, **({"PYTHONPATH": tree} if tree else {})}  # --baseline: another checkout's gateway
    return Client(
        StdioServerParameters(command=LOOPWATCH, args=args, cwd=tree or str(REPO), env=env), read_timeout_seconds=60
    )


async def timed_calls(client: Client, start: int, n: int) -> list[float]:
    out = []
    for i in range(start, start + n):
        t0 = time.perf_counter()
        result = await client.call_tool("echo", {"n": i})
        out.append((time.perf_counter() - t0) * 1000)
        if result.is_error:
            raise RuntimeError(f"call {i} failed: {result.content}")
    return out


async def timed_decisions(run, start: int, n: int) -> list[float]:
    """The decision round trips of ``n`` calls published as a gateway in gate mode publishes them
    (``runs.GuardedRun``): each request carries the previous call's completion in its produce
    request, so the worker reads both before it decides, in this row as in the gate rows."""
    out, held = [], []
    for i in range(start, start + n):
        t0 = time.perf_counter()
        await run.before_tool_call("echo", {"n": i}, tool_call_id=f"d{i}", completions=held)
        out.append((time.perf_counter() - t0) * 1000)
        held = [
            {
                "tool": "echo",
                "args": {"n": i},
                "tool_call_id": f"d{i}",
                "result": {"content": [{"type": "text", "text": str(i)}]},
            }
        ]
    await run.after_tool_call(**held[0])
    return out


async def throughput(clients: list[Client], total: int, concurrency: int, offset: int) -> float:
    """Seconds for ``total`` calls, ``concurrency`` in flight, spread over ``clients`` (the
    sessions) in turn."""
    counter = iter(range(offset, offset + total))

    async def agent(client: Client) -> None:
        for i in counter:
            result = await client.call_tool("echo", {"n": i})
            if result.is_error:
                raise RuntimeError(f"call {i} failed")

    t0 = time.perf_counter()
    await asyncio.gather(*(agent(clients[n % len(clients)]) for n in range(concurrency)))
    return time.perf_counter() - t0


@contextlib.asynccontextmanager
async def raw_process(argv: list[str], log: Path, tree: str | None = None):
    """A stdio process the wire-level agent talks to (``tree``: run from another checkout, as
    ``gateway``'s); its stdin closed (then killed) at the end."""
    env = {**os.environ, **({"PYTHONPATH": tree} if tree else {})}
    with open(log, "ab") as err:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=tree or str(REPO),
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            limit=1 << 24,
        )
    try:
        yield proc
    finally:
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def raw_call(i: int) -> bytes:
    """Call ``i`` of the wire-level agent: ``echo`` with new arguments, one JSON-RPC line."""
    return b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"n":%d}}}\n' % (i, i)


async def timed_raw_calls(proc: asyncio.subprocess.Process, start: int, n: int) -> list[float]:
    out = []
    for i in range(start, start + n):
        t0 = time.perf_counter()
        proc.stdin.write(raw_call(i))
        await proc.stdin.drain()
        line = await proc.stdout.readline()
        out.append((time.perf_counter() - t0) * 1000)
        if not line or b'"isError":true' in line:
            raise RuntimeError(f"call {i} failed: {line[:300]!r}")
    return out


async def raw_throughput(proc: asyncio.subprocess.Process, total: int, concurrency: int, offset: int) -> float:
    """Seconds for ``total`` ``tools/call`` lines written to ``proc`` and answered, at most
    ``concurrency`` in flight: a wire-level agent, no SDK."""
    room = asyncio.Semaphore(concurrency)

    async def write() -> None:
        for i in range(offset, offset + total):
            await room.acquire()
            proc.stdin.write(raw_call(i))
            await proc.stdin.drain()

    async def read() -> None:
        for _ in range(total):
            line = await proc.stdout.readline()
            if not line:
                raise RuntimeError("the wire-level path closed its output")
            if b'"isError":true' in line:
                raise RuntimeError(f"a call failed: {line[:300]!r}")
            room.release()

    t0 = time.perf_counter()
    await asyncio.gather(write(), read())
    return time.perf_counter() - t0


@contextlib.asynccontextmanager
async def http_server(argv: list[str], port: int, log: Path):
    """A process serving streamable HTTP on ``port``: its URL; stopped with SIGTERM at the end."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, cwd=str(REPO), stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{argv[0]} did not come up on {port} (see {log})") from None
                await asyncio.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def started_worker(
    broker: str, prefix: str, env: dict[str, str] | None = None
) -> tuple[WorkerNames, Path, WorkerProcess]:
    """A worker on topics of their own (``prefix``), with loop detection on, started (not yet
    ready); its config, data and logs in a new temporary directory."""
    names = WorkerNames(prefix=prefix)
    tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
    config = tmp / "config.json"
    write_config(config, CONFIG)
    return names, tmp, WorkerProcess(broker, names, config=config, data_dir=tmp / "data", log_dir=tmp, env=env).start()


async def bench(args: argparse.Namespace) -> dict:
    broker = args.broker or _bootstrap()
    names, tmp, worker = started_worker(broker, "lwbg")
    wanted = args.rows.__contains__ if args.rows else (lambda row: True)
    paths_run = tuple(filter(wanted, PATHS + (("advisory-base", "gate-base") if args.baseline else ())))
    raw_paths = tuple(filter(wanted, RAW_PATHS + (("advisory-raw-base", "gate-raw-base") if args.baseline else ())))
    http_paths = tuple(filter(wanted, HTTP_PATHS))
    throughput_paths = (*paths_run, *http_paths, *raw_paths)
    cpus = os.sched_getaffinity(0)
    placement = "shared: every process on every CPU"
    loopwatch_side: list[int] = []
    try:
        worker.wait_ready(120)
        if args.placement == "split":
            broker_pid = listening_pid(int(broker.split(",")[0].rsplit(":", 1)[1]))
            loopwatch_side = [pid for pid in (broker_pid, worker.pid) if pid is not None]
            placement = split(loopwatch_side) + (
                "" if broker_pid else " (the broker is not on this host or not ours: not pinned)"
            )
        paths = {
            "direct": Client(
                StdioServerParameters(command=UPSTREAM[0], args=[*UPSTREAM[1:], "direct"], cwd=str(REPO)),
                read_timeout_seconds=60,
            ),
            "passthrough": Client(
                StdioServerParameters(
                    command=PASSTHROUGH[0], args=[*PASSTHROUGH[1:], "@passthrough"], cwd=str(REPO), env={**os.environ}
                ),
                read_timeout_seconds=60,
            ),
            "advisory": gateway(names, broker, "advisory", f"{names.tag}-advisory"),
            "gate": gateway(names, broker, "gate", f"{names.tag}-gate"),
            "advisory-sdk": gateway(names, broker, "advisory", f"{names.tag}-advisory-sdk", None, "--sdk-proxy"),
            "gate-sdk": gateway(names, broker, "gate", f"{names.tag}-gate-sdk", None, "--sdk-proxy"),
        }
        if args.baseline:
            for mode in ("advisory", "gate"):
                paths[f"{mode}-base"] = gateway(names, broker, mode, f"{names.tag}-{mode}-base", args.baseline)
        paths = {k: v for k, v in paths.items() if k in paths_run}  # a Client starts nothing until entered
        latency_rows = (*paths_run, *raw_paths, *(("decision",) if wanted("decision") else ()))
        samples: dict[str, list[float]] = {k: [] for k in latency_rows}
        markers = {
            "direct": "direct",
            "passthrough": "@passthrough",
            "passthrough-http": "@passthrough-http",
            "direct-raw": "@direct-raw",
            **{k: f"{names.tag}-{k}" for k in ROWS if not k.startswith(("direct", "passthrough"))},
        }
        async with contextlib.AsyncExitStack() as stack:
            clients = {k: await stack.enter_async_context(paths[k]) for k in paths_run}
            http_port = {"passthrough-http": free_port(), "advisory-http": free_port()}
            http_argv = {
                "passthrough-http": [
                    *PASSTHROUGH[:3],
                    "--http",
                    str(http_port["passthrough-http"]),
                    *UPSTREAM,
                    "@passthrough-http",
                ],
                "advisory-http": [
                    LOOPWATCH,
                    *gateway_args(
                        names, broker, "advisory", markers["advisory-http"], "--http", str(http_port["advisory-http"])
                    ),
                ],
            }
            http_argv = {k: v for k, v in http_argv.items() if k in http_paths}
            raw_argv = {
                "direct-raw": [*RAW_UPSTREAM, "@direct-raw"],
                **{
                    f"{mode}-raw": [
                        LOOPWATCH,
                        *gateway_args(names, broker, mode, markers[f"{mode}-raw"], upstream=RAW_UPSTREAM),
                    ]
                    for mode in ("advisory", "gate")
                },
                **{
                    f"{mode}-raw-base": [
                        LOOPWATCH,
                        *gateway_args(names, broker, mode, markers[f"{mode}-raw-base"], upstream=RAW_UPSTREAM),
                    ]
                    for mode in ("advisory", "gate")
                    if args.baseline
                },
            }
            raw_argv = {k: v for k, v in raw_argv.items() if k in raw_paths}
            raw = {
                k: await stack.enter_async_context(
                    raw_process(argv, tmp / f"{k}.log", args.baseline if k.endswith("-base") else None)
                )
                for k, argv in raw_argv.items()
            }
            for proc in raw.values():
                await raw_throughput(proc, 50, 4, 10_000_000)  # warm up
            sessions: dict[str, list[Client]] = {}
            for mode, argv in http_argv.items():
                url = await stack.enter_async_context(http_server(argv, http_port[mode], tmp / f"{mode}.log"))
                sessions[mode] = [
                    await stack.enter_async_context(
                        Client(streamable_http_client(url), mode="legacy", read_timeout_seconds=60)
                    )
                    for _ in range(args.http_sessions)
                ]
                for session in sessions[mode]:
                    await timed_calls(session, 10_000_000, 20)
            if "decision" in latency_rows:  # only then: one more client, one more run
                lw = await stack.enter_async_context(
                    LoopwatchClient(
                        broker,
                        mode="gate",
                        timeout=10,
                        tool_calls_topic=names.tool_calls,
                        verdicts_topic=names.verdicts,
                    )
                )
                run = lw.run(f"{names.tag}-decision", session_key="bench:decision", agent_id="bench")
                await timed_decisions(run, 10_000_000, 20)
            for client in clients.values():  # warm up: imports, connections, the run's partition
                await timed_calls(client, 10_000_000, 20)
            order = list(latency_rows)
            steal0 = steal_jiffies()
            for r in range(args.rounds):
                start = r * args.calls
                for path in order[r % len(order) :] + order[: r % len(order)]:
                    if path == "decision":
                        samples[path] += await timed_decisions(run, start, args.calls)
                    elif path in raw:
                        samples[path] += await timed_raw_calls(raw[path], 30_000_000 + start, args.calls)
                    else:
                        samples[path] += await timed_calls(clients[path], start, args.calls)
                print(f"  round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
            seconds, cpu_s = dict.fromkeys(throughput_paths, 0.0), dict.fromkeys(throughput_paths, 0.0)
            agent_s = dict.fromkeys(throughput_paths, 0.0)  # this process: the agents' own CPU
            per_round = args.throughput // args.throughput_rounds
            for r in range(args.throughput_rounds):
                turn = r % len(throughput_paths)
                for mode in throughput_paths[turn:] + throughput_paths[:turn]:
                    cpu0, agent0 = process_cpu(markers[mode]), time.process_time()
                    if mode in raw:
                        seconds[mode] += await raw_throughput(
                            raw[mode], per_round, args.concurrency, 20_000_000 + r * per_round
                        )
                    elif mode in sessions:  # one call in flight per session
                        seconds[mode] += await throughput(
                            sessions[mode], per_round, len(sessions[mode]), 20_000_000 + r * per_round
                        )
                    else:
                        seconds[mode] += await throughput(
                            [clients[mode]], per_round, args.concurrency, 20_000_000 + r * per_round
                        )
                    cpu_s[mode] += process_cpu(markers[mode]) - cpu0
                    agent_s[mode] += time.process_time() - agent0
                print(f"  throughput round {r + 1}/{args.throughput_rounds}", file=sys.stderr, flush=True)
            calls = per_round * args.throughput_rounds
            rate = {k: calls / seconds[k] for k in throughput_paths}
            cpu = {k: cpu_s[k] / calls * 1000 for k in throughput_paths}  # ms per call
            agent_cpu = {k: agent_s[k] / calls * 1000 for k in throughput_paths}
            steal1 = steal_jiffies()
    finally:
        worker.stop(timeout=15)
        if loopwatch_side:
            restore(loopwatch_side, cpus)
    stats = {k: {"p50": percentile(v, 0.5), "p99": percentile(v, 0.99), "n": len(v)} for k, v in samples.items()}
    return {
        "paths": (*paths_run, *raw_paths),
        "throughput_paths": throughput_paths,
        "stats": stats,
        "rate": rate,
        "cpu": cpu,
        "agent_cpu": agent_cpu,
        "steal": None if steal0 is None else steal1 - steal0,
        "placement": placement,
    }


def report(result: dict, args: argparse.Namespace) -> bool:
    """Print the rows and what can be read from those run (``--rows``): True when every target
    that could be checked is met."""
    s, rate = result["stats"], result["rate"]
    print(
        f"bench-gateway at {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; machine: {cpu_model()}, "
        f"{os.cpu_count()} cores (nproc), Python {platform.python_version()}; CPU steal {result['steal']} jiffies"
    )
    print(f"placement: {result['placement']}")
    print(
        f"{args.rounds} rounds x {args.calls} calls per path, alternated; throughput: {args.throughput} calls "
        f"per path in {args.throughput_rounds} alternated rounds, {args.concurrency} in flight from one session "
        f"(advisory-http: {args.http_sessions} HTTP sessions, one call in flight each)"
    )
    for k in s:
        print(f"  {k:9s} p50 {s[k]['p50']:7.3f} ms   p99 {s[k]['p99']:7.3f} ms   (n={s[k]['n']})")

    def added(row: str, *less: str, q: str) -> float | None:
        """``row``'s percentile ``q`` less those of ``less``; None when one of them was not run."""
        if not all(k in s for k in (row, *less)):
            return None
        return s[row][q] - sum(s[k][q] for k in less)

    ok = True

    def line(label: str, value: float | None, target: float | None = None) -> None:
        nonlocal ok
        if value is None:
            return
        text = f"  {label}: {value:.3f} ms"
        if target is not None:
            met = value <= target
            ok &= met
            text += f" (target <= {target} ms: {'met' if met else 'NOT met'})"
        print(text)

    for q in ("p50", "p99"):
        line(f"the SDK hop alone (passthrough - direct) at {q}", added("passthrough", "direct", q=q))
        line(f"loopwatch's own share (advisory - passthrough) at {q}", added("advisory", "passthrough", q=q))
        line(
            f"loopwatch's own share (gate - passthrough - decision) at {q}",
            added("gate", "passthrough", "decision", q=q),
        )
    line("advisory adds at p50", added("advisory", "direct", q="p50"), TARGETS["advisory_p50_ms"])
    line("advisory adds at p99", added("advisory", "direct", q="p99"), TARGETS["advisory_p99_ms"])
    line(
        "gate adds beyond the decision round trip at p99",
        added("gate", "direct", "decision", q="p99"),
        TARGETS["gate_beyond_decision_p99_ms"],
    )
    line("gate adds beyond the decision round trip at p50", added("gate", "direct", "decision", q="p50"))
    for q in ("p50", "p99"):
        line(f"the baseline: advisory-base adds at {q}", added("advisory-base", "direct", q=q))
        line(f"the baseline: gate-base adds beyond the decision at {q}", added("gate-base", "direct", "decision", q=q))
    for q in ("p50", "p99"):
        for base in ("", "-base"):
            line(f"wire-level ends: advisory-raw{base} adds at {q}", added(f"advisory-raw{base}", "direct-raw", q=q))
            line(
                f"wire-level ends: gate-raw{base} adds beyond the decision at {q}",
                added(f"gate-raw{base}", "direct-raw", "decision", q=q),
            )
        for mode in ("advisory", "gate"):
            line(f"{mode} through the SDK proxy instead (--sdk-proxy) adds at {q}", added(f"{mode}-sdk", "direct", q=q))
    for mode, value in rate.items():
        text = (
            f"  throughput {mode:16s}: {value:,.0f} calls/s, CPU {result['cpu'][mode]:.3f} ms per call "
            f"(the agents': {result['agent_cpu'][mode]:.3f} ms)"
        )
        if mode.startswith(("advisory", "gate")):
            met = value >= TARGETS["calls_per_s"]
            ok &= mode != "advisory-raw" or met
            text += f" (target >= {TARGETS['calls_per_s']:,}: {'met' if met else 'NOT met'})"
        print(text)
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.gateway", description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=300, help="calls per path per round (default 300)")
    p.add_argument("--rounds", type=int, default=8, help="rounds, each path once per round (default 8)")
    p.add_argument("--throughput", type=int, default=4000, help="calls of each throughput run (default 4000)")
    p.add_argument("--concurrency", type=int, default=32, help="calls in flight in the throughput runs (default 32)")
    p.add_argument(
        "--throughput-rounds", type=int, default=4, help="rounds the throughput runs alternate in (default 4)"
    )
    p.add_argument(
        "--http-sessions",
        type=int,
        default=8,
        help="streamable HTTP sessions of the advisory-http throughput row, one call in flight each (default 8)",
    )
    p.add_argument(
        "--baseline",
        metavar="TREE",
        help="also time the gateway of another checkout (its PYTHONPATH), "
        "as rows advisory-base, gate-base, advisory-raw-base and gate-raw-base alternated with the others",
    )
    p.add_argument("--broker", help="bootstrap servers (default: scripts/kafka.sh env)")
    p.add_argument(
        "--rows",
        type=lambda text: text.split(","),
        metavar="ROW,...",
        help=f"only these rows (default: all): {', '.join(ROWS)}.  Fewer rows are fewer processes "
        "taking turns on the CPUs, and fewer verdicts on the partitions a gate row reads",
    )
    p.add_argument(
        "--placement",
        choices=("split", "shared"),
        default="split",
        help="split (default): the broker and the worker pinned to the last CPU, the paths timed to the "
        "others, as in a deployment, where they run elsewhere; shared: every process on every CPU",
    )
    args = p.parse_args(argv)
    if not 1 <= args.throughput_rounds <= args.throughput or args.http_sessions < 1:
        p.error("--throughput-rounds must be between 1 and --throughput, --http-sessions at least 1")
    unknown = sorted(set(args.rows or ()) - set(ROWS))
    if unknown:
        p.error(f"unknown row(s) {', '.join(unknown)}; the rows: {', '.join(ROWS)}")
    if any(row.endswith("-base") for row in args.rows or ()) and not args.baseline:
        p.error("a -base row needs --baseline TREE")
    result = asyncio.run(bench(args))
    report(result, args)
    return 0  # the figures are recorded, met or not (docs/benchmarks.md)


if __name__ == "__main__":
    sys.exit(main())
