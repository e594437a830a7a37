"""``loopwatch mcp-gateway`` against real MCP servers, the real broker and a real worker, driven
by the ``mcp`` SDK's own client, over stdio and over streamable HTTP.

The tests whose subject is the gateway's handling of a call (not the wire) run it in this
process (``gateway_in_memory``): the SDK proxy's ``Server`` reached in memory, in front of tools
written here (an in-process ``MCPServer``), verdicts still over the real broker from the real
worker.  The rest start ``loopwatch mcp-gateway`` as the MCP client would.

Servers: ``mcp-server-time`` (PyPI; ``convert_time`` answers the same every call,
``get_current_time`` changes every second), ``@modelcontextprotocol/server-everything`` (npm,
installed by ``make mcp-servers``; ``echo``, over stdio and streamable HTTP), and
``tests/mcp_gateway/fault_server.py`` (the SDK's own server, with tools that crash, hang or answer
malformed).

Expected verdicts are not written here: they are what the engine alone
(``harness.reference_verdicts``) decides on the records the gateway actually published, read
back from the topic; the test checks that the agent saw exactly those (the block's message as
an ``isError`` result, a surfaced warning as an extra text block) and nothing else.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import mcp_types as types  # the gateway's extra, loopwatch[mcp]: make install installs it
import pytest
from gateway_in_memory import gateway_in_memory
from mcp import Client, StdioServerParameters
from mcp.server import Server
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError

from bench.placement import listening_pid
from harness import REPO, collect, free_port, reference_verdicts, write_config
from schemas.events import RunEnded, ToolCallCompleted, ToolCallRequested, decode_event
from streams.integrations.mcp.upstream import UpstreamSpec

pytestmark = pytest.mark.kafka

CONFIG = {"tools": {"loopDetection": {"enabled": True}}, "loopwatch": {"surfaceWarnings": True}}
BIN = Path(sys.executable).parent
LOOPWATCH = str(BIN / "loopwatch")
TIME_SERVER = str(BIN / "mcp-server-time")
FAULT_SERVER = [sys.executable, str(REPO / "tests" / "mcp_gateway" / "fault_server.py")]
NPM_SERVERS = Path(os.environ.get("LOOPWATCH_MCP_SERVERS", Path.home() / ".cache" / "loopwatch" / "mcp-servers"))
EVERYTHING = NPM_SERVERS / "node_modules" / ".bin" / "mcp-server-everything"
CONVERT = {"source_timezone": "Europe/Berlin", "time": "12:00", "target_timezone": "Asia/Tokyo"}
CALLS = 23


@pytest.fixture(scope="module")
def worker(lw_module):
    path = lw_module.tmp / "loop-detection.json"
    write_config(path, CONFIG)
    lw_module.worker(config=path).start().wait_ready(90)
    return lw_module


@pytest.fixture(scope="module")
def everything() -> Path:
    if not EVERYTHING.exists():
        pytest.fail(f"{EVERYTHING} is missing: run `make mcp-servers` (make test does)")
    return EVERYTHING


def gateway_args(lw, run_id: str, *upstreams: str, agent_id: str = "mcp-test", **flags) -> list[str]:
    args = [
        "mcp-gateway",
        "--bootstrap",
        lw.broker,
        "--tool-calls-topic",
        lw.names.tool_calls,
        "--verdicts-topic",
        lw.names.verdicts,
        "--run-id",
        run_id,
        "--agent-id",
        agent_id,
        "--timeout",
        "10",
    ]  # a verdict takes milliseconds; 10 s only rides out a slow CI machine
    for upstream in upstreams:
        args += ["--upstream", upstream]
    for flag, value in flags.items():
        args += [f"--{flag.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return args


def over_stdio(lw, run_id: str, *upstreams: str, **flags) -> Client:
    params = StdioServerParameters(
        command=LOOPWATCH, args=gateway_args(lw, run_id, *upstreams, **flags), env={**os.environ}
    )
    return Client(params, read_timeout_seconds=60)


class Process:
    """A server subprocess in its own process group, always killed at the end."""

    def __init__(self, argv: list[str], *, env: dict | None = None, log: Path) -> None:
        self.log = open(log, "ab")
        self.proc = subprocess.Popen(
            argv,
            env={**os.environ, **(env or {})},
            stdout=self.log,
            stderr=self.log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.log.close()


async def wait_http(url: str, timeout: float = 60.0) -> None:
    """Until ``url``'s port accepts connections."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            _, writer = await asyncio.open_connection(host, int(port))
            writer.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"nothing listens on {url} after {timeout:.0f}s") from None
            await asyncio.sleep(0.2)


def text_of(result: types.CallToolResult) -> list[str]:
    return [block.text for block in result.content if isinstance(block, types.TextContent)]


async def published(lw, run_id: str, n_calls: int) -> list:
    """The gateway's events of ``run_id`` on the topic, once every call's completion is there."""

    def events(records):
        decoded = (decode_event(r.value) for r in records)
        return [e for e in decoded if e.run_id == run_id]

    def done(records):
        return sum(isinstance(e, ToolCallCompleted) for e in events(records)) >= n_calls

    records = await collect(lw.broker, lw.names.tool_calls, until=done, timeout=60, settle=0.3)
    return events(records)


def engine_answers(events) -> list:
    """The engine's decision of each requested call, in call order (None: no decision)."""
    decisions = {v.cause_event_id: v for v in reference_verdicts(events, CONFIG) if v.__class__.__name__ == "Decision"}
    return [decisions.get(e.event_id) for e in events if isinstance(e, ToolCallRequested)]


def assert_agent_saw_the_engine(results, answers, upstream_text):
    """Each result is what the engine's decision says the agent gets: the block's message alone
    with isError, or the upstream's answer plus a surfaced warning, or the answer alone."""
    assert len(results) == len(answers)
    for n, (result, decision) in enumerate(zip(results, answers), 1):
        if decision is not None and decision.action == "block":
            assert result.is_error and text_of(result) == [decision.message], f"call {n}"
        elif decision is not None and decision.action == "warn" and decision.notify_model:
            assert not result.is_error and text_of(result) == [*upstream_text(result), decision.message], f"call {n}"
        else:
            assert not result.is_error and text_of(result) == upstream_text(result), f"call {n}"


def assert_each_call_requested_then_completed_in_order(events, calls: int) -> None:
    kinds = [(type(e).__name__, e.tool_call_id) for e in events if not isinstance(e, RunEnded)]
    assert kinds == [
        (kind, f"mcp-{n}") for n in range(1, calls + 1) for kind in ("ToolCallRequested", "ToolCallCompleted")
    ]


def first(answers, action: str) -> int | None:
    return next((n for n, d in enumerate(answers, 1) if d is not None and d.action == action), None)


def in_process_tools() -> MCPServer:
    """The in-memory tests' upstream: tools written here, served from this process."""
    tools = MCPServer("in-process-tools")

    @tools.tool()
    def convert_time(source_timezone: str, time: str, target_timezone: str) -> str:
        return f"{time} in {source_timezone}: {target_timezone} time"  # the same answer every call

    @tools.tool()
    def get_current_time(timezone: str) -> str:
        return datetime.now(ZoneInfo(timezone)).isoformat()

    @tools.tool()
    def echo(message: str) -> str:
        return f"Echo: {message}"

    return tools


def in_process(server: MCPServer | Server, name: str = "tools") -> UpstreamSpec:
    return UpstreamSpec(name=name, server=server)


# -- identical calls: the warning, then the block ---------------------------------------------------


# Over stdio with one upstream command the gateway relays messages (relay.py); --sdk-proxy serves
# them through the SDK's server and client instead (gateway.py, as HTTP and several upstreams do).
# The relay's cases run the gateway's process; the SDK proxy's, where the wire is not the subject,
# its Server in memory (the *_in_memory tests).
PROXIES = [pytest.param({}, id="relay"), pytest.param({"sdk_proxy": True}, id="sdk-proxy")]
RELAY = PROXIES[:1]


def assert_warned_then_blocked_once_hashed(events, results, answer) -> None:
    answers = engine_answers(events)
    assert_agent_saw_the_engine(results, answers, lambda r: answer)
    # the spec's defaults (warning 10, critical 20) on calls that each repeat the one before
    warn, block = first(answers, "warn"), first(answers, "block")
    assert (answers[warn - 1].detector, answers[warn - 1].count) == ("generic_repeat", 10)
    assert (answers[block - 1].detector, answers[block - 1].count) == ("generic_repeat", 20)
    assert (warn, block) == (11, 21)  # 10 (20) identical calls before it
    assert all(a is not None and a.action == "block" for a in answers[block - 1 :])
    # gate mode holds a call's completion for the next request's produce request: still each one
    # is on the topic, between its request and the next
    assert_each_call_requested_then_completed_in_order(events, CALLS)
    # one run, hashed: no argument or result text in any record
    raw = b"".join(str(e).encode() for e in events)
    assert b"Europe/Berlin" not in raw and answer[0][:20].encode() not in raw
    assert isinstance(events[-1], RunEnded)  # the session closed: the run ended


async def test_sdk_proxy_identical_calls_warn_then_block_in_memory(worker):
    run_id = f"{worker.names.tag}-time-loop-in-memory"
    async with gateway_in_memory(worker, run_id, in_process(in_process_tools())) as agent:
        names = {t.name for t in (await agent.list_tools()).tools}
        assert {"convert_time", "get_current_time"} <= names
        results = [await agent.call_tool("convert_time", CONVERT) for _ in range(CALLS)]
    events = await published(worker, run_id, CALLS)
    assert text_of(results[0]) == ["12:00 in Europe/Berlin: Asia/Tokyo time"]
    assert_warned_then_blocked_once_hashed(events, results, text_of(results[0]))


@pytest.mark.parametrize("proxy", RELAY)
async def test_stdio_pypi_time_server_identical_calls_warn_then_block(worker, proxy):
    run_id = f"{worker.names.tag}-time-loop-{len(proxy)}"
    async with over_stdio(worker, run_id, TIME_SERVER, **proxy) as agent:
        names = {t.name for t in (await agent.list_tools()).tools}
        assert {"convert_time", "get_current_time"} <= names
        results = [await agent.call_tool("convert_time", CONVERT) for _ in range(CALLS)]
    events = await published(worker, run_id, CALLS)
    assert_warned_then_blocked_once_hashed(events, results, text_of(results[0]))


async def test_stdio_advisory_mode_never_blocks_and_publishes_each_call_in_order(worker):
    """Advisory mode: no call waits on the broker (events are queued, lingering for one produce
    request per call); still, the topic holds every call's request then its completion, in call
    order, then run.ended; nothing is blocked, and any notice the model got is one the engine
    gave (a warning with notify_model, or a block) appended after the upstream's answer."""
    run_id = f"{worker.names.tag}-advisory"
    async with over_stdio(worker, run_id, TIME_SERVER, mode="advisory") as agent:
        results = [await agent.call_tool("convert_time", CONVERT) for _ in range(CALLS)]
    events = await published(worker, run_id, CALLS)
    assert_each_call_requested_then_completed_in_order(events, CALLS)
    assert isinstance(events[-1], RunEnded) and events[-1].reason == "session closed"
    assert not any(e.gate for e in events if isinstance(e, ToolCallRequested))
    answers = engine_answers(events)
    assert first(answers, "block") == 21  # the engine would block; advisory mode only tells
    notices = {d.message for d in answers if d is not None and (d.action == "block" or d.notify_model)}
    answer = text_of(results[0])
    for n, result in enumerate(results, 1):
        assert not result.is_error and text_of(result)[: len(answer)] == answer, f"call {n}"
        assert set(text_of(result)[len(answer) :]) <= notices, f"call {n}"


@pytest.mark.parametrize("proxy", RELAY)
async def test_gate_mode_publishes_a_held_completion_with_no_next_call(worker, proxy):
    """The completion gate mode holds for the run's next request goes out on its own when no
    request comes (after runs.BATCH_WAIT_MS), not only when the session closes."""
    run_id = f"{worker.names.tag}-held-{len(proxy)}"
    async with over_stdio(worker, run_id, TIME_SERVER, **proxy) as agent:
        result = await agent.call_tool("get_current_time", {"timezone": "UTC"})
        events = await published(worker, run_id, 1)  # the session is still open
        assert not result.is_error
        assert [type(e).__name__ for e in events] == ["ToolCallRequested", "ToolCallCompleted"]


async def test_sdk_proxy_gate_mode_publishes_a_held_completion_with_no_next_call_in_memory(worker):
    """As above, through the SDK proxy."""
    run_id = f"{worker.names.tag}-held-in-memory"
    async with gateway_in_memory(worker, run_id, in_process(in_process_tools())) as agent:
        result = await agent.call_tool("get_current_time", {"timezone": "UTC"})
        events = await published(worker, run_id, 1)  # the session is still open
        assert not result.is_error
        assert [type(e).__name__ for e in events] == ["ToolCallRequested", "ToolCallCompleted"]


async def test_stdio_healthy_run_of_get_current_time_is_never_blocked(worker):
    run_id = f"{worker.names.tag}-time-healthy"
    results = []
    async with over_stdio(worker, run_id, TIME_SERVER) as agent:
        for _ in range(CALLS):
            results.append(await agent.call_tool("get_current_time", {"timezone": "UTC"}))
            await asyncio.sleep(0.35)  # the answer changes every second: a run that makes progress
    events = await published(worker, run_id, CALLS)
    answers = engine_answers(events)
    assert first(answers, "block") is None
    assert not any(r.is_error for r in results)
    completed = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert len({e.result_hash for e in completed}) >= CALLS * 0.35 // 1  # the answers did change


async def test_http_gateway_in_front_of_npm_everything_over_http(worker, everything):
    """Both sides streamable HTTP: server-everything serves HTTP, the gateway too."""
    upstream_port, gateway_port = free_port(), free_port()
    server = Process(
        [str(everything), "streamableHttp"], env={"PORT": str(upstream_port)}, log=worker.tmp / "everything-http.log"
    )
    run_id = f"{worker.names.tag}-echo-http"
    gateway = None
    try:
        await wait_http(f"http://127.0.0.1:{upstream_port}/mcp")
        gateway = Process(
            [
                LOOPWATCH,
                *gateway_args(
                    worker,
                    f"{run_id}-default",
                    f"everything=http://127.0.0.1:{upstream_port}/mcp",
                    prefix="everything=ev_",
                    http=gateway_port,
                ),
            ],
            log=worker.tmp / "gateway-http.log",
        )
        url = f"http://127.0.0.1:{gateway_port}/mcp"
        await wait_http(url)
        async with Client(url, read_timeout_seconds=60) as agent:
            tools = {t.name for t in (await agent.list_tools()).tools}
            assert {"ev_echo", "ev_get-sum"} <= tools and "echo" not in tools  # prefixed per upstream
            meta = {"io.loopwatch/runId": run_id}  # HTTP has no session: the run is named per request
            results = [await agent.call_tool("ev_echo", {"message": "same"}, meta=meta) for _ in range(CALLS)]
    finally:
        if gateway is not None:
            gateway.kill()
        server.kill()
    events = await published(worker, run_id, CALLS)
    answers = engine_answers(events)
    assert_agent_saw_the_engine(results, answers, lambda r: ["Echo: same"])
    assert (first(answers, "warn"), first(answers, "block")) == (11, 21)
    assert {e.tool_name for e in events if isinstance(e, ToolCallRequested)} == {"ev_echo"}


# -- identity over streamable HTTP: the session, the trace, the idle expiry ---------------------------


async def runs_of_agent(lw, agent_id: str, until) -> dict[str, list]:
    """The events of every run the gateway published for ``agent_id``, by run id, once
    ``until(runs)`` holds."""

    def runs(records) -> dict[str, list]:
        out: dict[str, list] = {}
        for event in (decode_event(r.value) for r in records):
            if event.agent_id == agent_id:
                out.setdefault(event.run_id, []).append(event)
        return out

    records = await collect(lw.broker, lw.names.tool_calls, until=lambda rs: until(runs(rs)), timeout=60, settle=0.3)
    return runs(records)


def calls_in(events) -> int:
    return sum(isinstance(e, ToolCallCompleted) for e in events)


class HttpGateway:
    """``loopwatch mcp-gateway --http`` in front of ``mcp-server-time`` (stdio)."""

    def __init__(self, lw, name: str, **flags) -> None:
        self.port = free_port()
        self.agent_id = f"{lw.names.tag}-{name}"
        self.default_run = f"{lw.names.tag}-{name}-default"
        self.process = Process(
            [
                LOOPWATCH,
                *gateway_args(lw, self.default_run, TIME_SERVER, agent_id=self.agent_id, http=self.port, **flags),
            ],
            log=lw.tmp / f"gateway-{name}.log",
        )
        self.url = f"http://127.0.0.1:{self.port}/mcp"


def http_client(headers: dict | None = None, seen_session_ids: list | None = None):
    """The SDK's own HTTP client, with extra headers; the ``Mcp-Session-Id`` the server assigns is
    read off its responses (``seen_session_ids``): the test's source of the expected run id."""
    from mcp.shared._httpx_utils import create_mcp_http_client

    client = create_mcp_http_client(headers=headers)
    if seen_session_ids is not None:

        async def record(response) -> None:
            sid = response.headers.get("mcp-session-id")
            if sid and sid not in seen_session_ids:
                seen_session_ids.append(sid)

        client.event_hooks["response"] = [record]
    return client


async def test_http_each_mcp_session_is_one_run_and_ends_when_idle(worker):
    """Handshake-era clients (``mode="legacy"``): the server assigns each session an
    ``Mcp-Session-Id``; each session is its own run, named by it, whatever it calls; a session
    idle past ``--run-idle-timeout`` ends its run (``run.ended``, reason ``idle``)."""
    from mcp.client.streamable_http import streamable_http_client

    gw = HttpGateway(worker, "sessions", run_idle_timeout=2)
    ids_a, ids_b = [], []
    try:
        await wait_http(gw.url)
        # no DELETE at close (that would end the runs: the test above): the idle expiry ends them
        transport_a = streamable_http_client(
            gw.url, http_client=http_client(seen_session_ids=ids_a), terminate_on_close=False
        )
        transport_b = streamable_http_client(
            gw.url, http_client=http_client(seen_session_ids=ids_b), terminate_on_close=False
        )
        async with (
            Client(transport_a, mode="legacy", read_timeout_seconds=60) as a,
            Client(transport_b, mode="legacy", read_timeout_seconds=60) as b,
        ):
            for n in range(3):  # interleaved: the gateway tells the sessions apart per request
                assert not (await a.call_tool("convert_time", CONVERT)).is_error
                if n < 2:
                    assert not (await b.call_tool("get_current_time", {"timezone": "UTC"})).is_error
        assert len(ids_a) == 1 and len(ids_b) == 1 and ids_a != ids_b, (ids_a, ids_b)
        started = time.monotonic()
        runs = await runs_of_agent(
            worker, gw.agent_id, until=lambda rs: sum(isinstance(e, RunEnded) for evs in rs.values() for e in evs) >= 2
        )
        ended_after = time.monotonic() - started
    finally:
        gw.process.kill()
    assert set(runs) == {ids_a[0], ids_b[0]}  # one run per session, none in the gateway's own
    a_events, b_events = runs[ids_a[0]], runs[ids_b[0]]
    assert calls_in(a_events) == 3 and calls_in(b_events) == 2
    assert {e.tool_name for e in a_events if isinstance(e, ToolCallRequested)} == {"convert_time"}
    assert {e.tool_name for e in b_events if isinstance(e, ToolCallRequested)} == {"get_current_time"}
    for events in (a_events, b_events):
        assert isinstance(events[-1], RunEnded) and events[-1].reason == "idle"
        assert sum(isinstance(e, RunEnded) for e in events) == 1
        assert {e.session_key for e in events} == {f"mcp:{gw.agent_id}:{events[0].run_id}"}
    assert ended_after < 30  # the sweeper ran, while the gateway was still up (not its stop)


def ended(events) -> list[str]:
    return [e.reason for e in events if isinstance(e, RunEnded)]


async def test_http_closing_a_session_ends_its_run_and_only_its_run(worker):
    """A handshake-era client that closes its session (the SDK's ``DELETE`` with the
    ``Mcp-Session-Id``, ``terminate_on_close``) ends that session's run: ``run.ended``, reason
    ``session closed``, while a concurrent session's run goes on until it closes in turn.  The
    idle expiry is an hour here, so it cannot be what ended them; a session still open when the
    gateway stops (SIGTERM) ends its run with ``gateway stopped``."""
    from mcp.client.streamable_http import streamable_http_client

    gw = HttpGateway(worker, "closing", run_idle_timeout=3600)
    ids_a, ids_b, ids_c = [], [], []
    try:
        await wait_http(gw.url)
        transport_b = streamable_http_client(gw.url, http_client=http_client(seen_session_ids=ids_b))
        async with Client(transport_b, mode="legacy", read_timeout_seconds=60) as b:
            transport_a = streamable_http_client(gw.url, http_client=http_client(seen_session_ids=ids_a))
            async with Client(transport_a, mode="legacy", read_timeout_seconds=60) as a:
                for n in range(3):
                    assert not (await a.call_tool("convert_time", CONVERT)).is_error
                    if n < 2:
                        assert not (await b.call_tool("get_current_time", {"timezone": "UTC"})).is_error
            # a closed, b still open: a's run ended, b's did not
            runs = await runs_of_agent(worker, gw.agent_id, until=lambda rs: ended(rs.get(ids_a[0], [])))
            assert ended(runs[ids_a[0]]) == ["session closed"] and ended(runs[ids_b[0]]) == []
            assert calls_in(runs[ids_a[0]]) == 3
            assert not (await b.call_tool("get_current_time", {"timezone": "UTC"})).is_error  # b's run goes on
        # c: closed without DELETE, so its session is still open when the gateway stops
        transport_c = streamable_http_client(
            gw.url, http_client=http_client(seen_session_ids=ids_c), terminate_on_close=False
        )
        async with Client(transport_c, mode="legacy", read_timeout_seconds=60) as c:
            assert not (await c.call_tool("convert_time", CONVERT)).is_error
        runs = await runs_of_agent(
            worker, gw.agent_id, until=lambda rs: ended(rs.get(ids_b[0], [])) and calls_in(rs.get(ids_c[0], [])) == 1
        )
        assert ended(runs[ids_c[0]]) == []
        gw.process.proc.send_signal(signal.SIGTERM)
        assert gw.process.proc.wait(30) == 0
        runs = await runs_of_agent(worker, gw.agent_id, until=lambda rs: ended(rs.get(ids_c[0], [])))
    finally:
        gw.process.kill()
    assert len({*ids_a, *ids_b, *ids_c}) == 3 and set(runs) == {ids_a[0], ids_b[0], ids_c[0]}, (ids_a, ids_b, ids_c)
    a_events, b_events, c_events = runs[ids_a[0]], runs[ids_b[0]], runs[ids_c[0]]
    assert (calls_in(a_events), calls_in(b_events), calls_in(c_events)) == (3, 3, 1)
    for events, reason in ((a_events, "session closed"), (b_events, "session closed"), (c_events, "gateway stopped")):
        assert ended(events) == [reason] and isinstance(events[-1], RunEnded)  # once, and last
        assert {e.session_key for e in events} == {f"mcp:{gw.agent_id}:{events[0].run_id}"}


async def test_http_a_run_two_sessions_name_ends_when_the_last_of_them_closes(worker):
    """Two sessions that name the same run (``X-Loopwatch-Run-Id``) share it: closing the first
    leaves it open, closing the second ends it, once."""
    from mcp.client.streamable_http import streamable_http_client

    gw = HttpGateway(worker, "shared", run_idle_timeout=3600)
    run_id = f"{worker.names.tag}-shared-run"
    headers = {"X-Loopwatch-Run-Id": run_id}
    try:
        await wait_http(gw.url)
        async with Client(
            streamable_http_client(gw.url, http_client=http_client(headers)), mode="legacy", read_timeout_seconds=60
        ) as second:
            async with Client(
                streamable_http_client(gw.url, http_client=http_client(headers)), mode="legacy", read_timeout_seconds=60
            ) as first:
                assert not (await first.call_tool("convert_time", CONVERT)).is_error
                assert not (await second.call_tool("convert_time", CONVERT)).is_error
            assert not (await second.call_tool("convert_time", CONVERT)).is_error  # after first's DELETE
            runs = await runs_of_agent(worker, gw.agent_id, until=lambda rs: calls_in(rs.get(run_id, [])) == 3)
            assert ended(runs[run_id]) == []  # the second session still holds it
        runs = await runs_of_agent(worker, gw.agent_id, until=lambda rs: ended(rs.get(run_id, [])))
    finally:
        gw.process.kill()
    assert set(runs) == {run_id}
    assert calls_in(runs[run_id]) == 3 and ended(runs[run_id]) == ["session closed"]
    assert isinstance(runs[run_id][-1], RunEnded)


async def test_http_traceparent_names_the_run_when_nothing_else_does(worker):
    """Sessionless (2026-07-28) clients: a W3C ``traceparent`` header's trace id names the run
    (``trace-<32 hex>``); two traces are two runs; without one, the gateway's own run."""
    from mcp.client.streamable_http import streamable_http_client

    trace_a, trace_b = "4bf92f3577b34da6a3ce929d0e0e4736", "0af7651916cd43dd8448eb211c80319c"
    gw = HttpGateway(worker, "traces")
    try:
        await wait_http(gw.url)
        for trace, calls in ((trace_a, 3), (trace_b, 2)):
            headers = {"traceparent": f"00-{trace}-00f067aa0ba902b7-01"}
            async with Client(
                streamable_http_client(gw.url, http_client=http_client(headers)), read_timeout_seconds=60
            ) as agent:
                for _ in range(calls):
                    assert not (await agent.call_tool("get_current_time", {"timezone": "UTC"})).is_error
        async with Client(gw.url, read_timeout_seconds=60) as agent:
            assert not (await agent.call_tool("get_current_time", {"timezone": "UTC"})).is_error
        runs = await runs_of_agent(worker, gw.agent_id, until=lambda rs: sum(map(calls_in, rs.values())) >= 6)
    finally:
        gw.process.kill()
    assert {k: calls_in(v) for k, v in runs.items()} == {
        f"trace-{trace_a}": 3,
        f"trace-{trace_b}": 2,
        gw.default_run: 1,
    }


async def call_an_unknown_tool_12_times(agent) -> list[tuple[str, Any]]:
    assert "echo" in {t.name for t in (await agent.list_tools()).tools}
    errors: list[tuple[str, Any]] = []
    for n in range(12):
        try:
            result = await agent.call_tool("no_such_tool", {"n": n})  # args change: the detector ignores them
            errors.append(("result", result))
        except MCPError as exc:
            errors.append(("error", exc))
    return errors


async def blocked_at_the_11th_unknown_call(worker, run_id: str) -> tuple[list, int]:
    """The run's completions are unknown-tool outcomes, and its 11th call is blocked."""
    events = await published(worker, run_id, 12)
    completed = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert completed[0].unknown_tool_name == "no_such_tool" and completed[0].is_error
    answers = engine_answers(events)
    block = first(answers, "block")
    assert answers[block - 1].detector == "unknown_tool_repeat" and block == 11  # unknownToolThreshold 10
    return answers, block


@pytest.mark.parametrize("proxy", RELAY)
async def test_stdio_npm_everything_unknown_tool_is_upstreams_unknown_tool_outcome(worker, everything, proxy):
    """The relay passes on what the server answers (server-everything, at protocol 2025-11-25:
    an isError result naming the tool); the SDK proxy answers a tool no upstream lists itself
    (JSON-RPC -32602).  Either way the completion is the unknown-tool outcome, and the 11th
    call is blocked by unknown_tool_repeat."""
    run_id = f"{worker.names.tag}-unknown-{len(proxy)}"
    async with over_stdio(worker, run_id, f"{everything} stdio", **proxy) as agent:
        errors = await call_an_unknown_tool_12_times(agent)
    answers, block = await blocked_at_the_11th_unknown_call(worker, run_id)
    for n, ((kind, got), decision) in enumerate(zip(errors, answers), 1):
        if n < block and proxy:
            assert kind == "error" and got.code == types.INVALID_PARAMS and "no_such_tool" in got.message
        elif n < block:
            assert (
                kind == "result" and got.is_error and text_of(got) == ["MCP error -32602: Tool no_such_tool not found"]
            )
        else:
            assert kind == "result" and got.is_error and text_of(got) == [decision.message]


async def test_sdk_proxy_unknown_tool_is_its_own_unknown_tool_error_in_memory(worker):
    """The SDK proxy answers a tool no upstream lists itself (JSON-RPC -32602, above); the
    completion is the unknown-tool outcome, and the 11th call is blocked by unknown_tool_repeat."""
    run_id = f"{worker.names.tag}-unknown-in-memory"
    async with gateway_in_memory(worker, run_id, in_process(in_process_tools())) as agent:
        errors = await call_an_unknown_tool_12_times(agent)
    answers, block = await blocked_at_the_11th_unknown_call(worker, run_id)
    for n, ((kind, got), decision) in enumerate(zip(errors, answers), 1):
        if n < block:
            assert kind == "error" and got.code == types.INVALID_PARAMS and "no_such_tool" in got.message
        else:
            assert kind == "result" and got.is_error and text_of(got) == [decision.message]


# -- the docs' in-process snippet, run as written ------------------------------------------------------

SNIPPET = re.compile(r"^<!-- snippet: mcp-in-process -->\n```python\n(.*?)^```$", re.M | re.S)


async def test_docs_in_process_upstream_snippet_runs(worker):
    """docs/mcp-gateway.md §0.1 as written: its tool behind the gateway, the call guarded by the
    real worker (one request, one completion, the run ended) and answered by the tool."""
    found = SNIPPET.findall((REPO / "docs" / "mcp-gateway.md").read_text(encoding="utf-8"))
    assert len(found) == 1, "docs/mcp-gateway.md has no (or more than one) mcp-in-process snippet"
    namespace: dict = {"__name__": "snippet"}
    exec(compile(found[0], "docs/mcp-gateway.md", "exec"), namespace)
    result = await namespace["main"](worker.broker, worker.names.tool_calls, worker.names.verdicts)
    assert not result.is_error and text_of(result) == ["3"]
    runs = await runs_of_agent(worker, "my-app", until=lambda rs: any(ended(evs) for evs in rs.values()))
    (events,) = runs.values()
    assert [type(e).__name__ for e in events] == ["ToolCallRequested", "ToolCallCompleted", "RunEnded"]
    assert events[0].tool_name == "add" and events[0].gate  # gate mode: the call waited for its decision


# -- the stdio relay: every other message passed on as it is ------------------------------------------


RECORDER = [sys.executable, str(REPO / "tests" / "mcp_gateway" / "recording_server.py")]


class RawAgent:
    """The agent's side of a stdio gateway as bytes: lines written, lines read, nothing parsed."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def send(self, line: str) -> None:
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    async def read(self, n: int) -> list[str]:
        return [(await asyncio.wait_for(self.proc.stdout.readline(), 30)).decode().rstrip("\n") for _ in range(n)]


async def test_stdio_relay_passes_messages_on_byte_for_byte_and_replays_the_handshake(worker, tmp_path):
    """Agent to upstream and back, every message but a guarded call's own refusal arrives as the
    bytes that were sent (spacing, key order, escapes, ids of either side), including the
    upstream's own request to the client and its notification; after the upstream crashes, the
    server started again gets the agent's initialize (under the gateway's id, whose answer the
    agent never sees) and initialized before the next call."""
    record = tmp_path / "record.jsonl"
    run_id = f"{worker.names.tag}-relay-bytes"
    upstream = " ".join(RECORDER)
    proc = await asyncio.create_subprocess_exec(
        LOOPWATCH,
        *gateway_args(worker, run_id, upstream),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "RECORD": str(record)},
    )
    agent = RawAgent(proc)
    sent = [
        '{"jsonrpc":"2.0","id":"init-1","method":"initialize","params":{"protocolVersion":"2025-06-18",'
        '"capabilities":{},"clientInfo":{"name":"raw-agent","version":"0"}}}',
        '{"jsonrpc": "2.0", "method": "notifications/initialized"}',
        '{"id":7,"jsonrpc":"2.0","method":"resources/list","params":{"cursor":null, "x":"\\u00e9"}}',
        '{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"emit","arguments":{"b":1,"a":[1.0,2]}}}',
        '{"jsonrpc":"2.0","id":"srv-1","result":{"roots":[]}}',
        '{"jsonrpc":"2.0","id":9,"method":"ping"}',
        '{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"crash","arguments":{}}}',
    ]
    try:
        await agent.send(sent[0])
        init = await agent.read(1)
        await agent.send(sent[1])
        await agent.send(sent[2])
        listed = await agent.read(1)
        await agent.send(sent[3])
        emitted = await agent.read(2)  # the upstream's roots/list request and its notification
        await agent.send(sent[4])
        called = await agent.read(1)
        await agent.send(sent[5])
        pinged = await agent.read(1)
        await agent.send(sent[6])
        crashed = json.loads((await agent.read(1))[0])
        again = '{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"emit","arguments":{}}}'
        await agent.send(again)
        after = await agent.read(3)
        proc.stdin.close()
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
    assert init == [
        '{"jsonrpc":"2.0","id":"init-1","result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},'
        '"serverInfo":{"name":"recorder","version":"1"}}}'
    ]
    assert listed == ['{"result" :{"echo": "resources/list", "n": 1.50},  "id":7 ,"jsonrpc":"2.0"}']
    assert emitted == [
        ' {"method" :"roots/list","jsonrpc":"2.0" , "id":"srv-1"}',
        '{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"caf\\u00e9"}}',
    ]
    assert called == [
        '{"id" : 8, "result":{"isError":false, "content":[{"text":"called \\u0041 emit","type":"text"}]},"jsonrpc":"2.0"}'
    ]
    assert pinged == ['{"result" :{"echo": "ping", "n": 1.50},  "id":9 ,"jsonrpc":"2.0"}']
    assert crashed["id"] == 10 and crashed["result"]["isError"] is True
    assert crashed["result"]["content"] == [
        {"type": "text", "text": f"upstream MCP server {Path(sys.executable).name!r} failed: Connection closed"}
    ]
    assert after == [emitted[0], emitted[1], called[0].replace('"id" : 8', '"id" : 11')]
    recorded = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
    assert recorded[:7] == [line + "\n" for line in sent]
    replayed = [json.loads(line) for line in recorded[7:9]]
    assert replayed[0]["method"] == "initialize" and replayed[0]["id"].startswith("loopwatch-")
    assert replayed[0]["params"] == json.loads(sent[0])["params"]
    assert replayed[1] == json.loads(sent[1])
    assert recorded[9:] == [again + "\n"]
    events = await published(worker, run_id, 3)
    completed = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert [(e.tool_name, e.is_error) for e in completed] == [("emit", False), ("crash", True), ("emit", False)]
    assert isinstance(events[-1], RunEnded) and events[-1].reason == "session closed"


# -- upstream faults ---------------------------------------------------------------------------------


@pytest.mark.parametrize("proxy", PROXIES)
async def test_upstream_hangs_crashes_answers_malformed_session_stays_up(worker, proxy):
    run_id = f"{worker.names.tag}-faults-{len(proxy)}"
    fault = " ".join(FAULT_SERVER)
    # The call after the crash waits for the server's restart (a Python process) within this
    # timeout: 3 s was too short on a loaded 2-core machine.
    async with over_stdio(worker, run_id, fault, upstream_timeout=8, **proxy) as agent:
        assert text_of(await agent.call_tool("ok", {})) == ["fine"]
        started = time.monotonic()
        hang = await agent.call_tool("hang", {})
        assert hang.is_error and "failed: Request 'tools/call' timed out" in text_of(hang)[0], text_of(hang)
        assert time.monotonic() - started < 30
        malformed = await agent.call_tool("malformed", {})
        assert malformed.is_error and "malformed answer" in text_of(malformed)[0]
        crash = await agent.call_tool("crash", {})
        assert crash.is_error and "Connection closed" in text_of(crash)[0]
        # the server is started again for the next call: the agent's session never noticed
        assert text_of(await agent.call_tool("ok", {})) == ["fine"]
    events = await published(worker, run_id, 5)
    completed = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert [e.is_error for e in completed] == [False, True, True, True, False]


async def test_a_multi_round_call_passes_through_and_is_one_call(worker):
    """The upstream asks the agent for input (InputRequiredResult); the agent's SDK answers and
    retries: the gateway passes both rounds on and publishes one request and one completion."""
    run_id = f"{worker.names.tag}-input"

    async def elicit(context, params):
        return types.ElicitResult(action="accept", content={"name": "ada"})

    params = StdioServerParameters(
        command=LOOPWATCH, args=gateway_args(worker, run_id, " ".join(FAULT_SERVER)), env={**os.environ}
    )
    async with Client(params, read_timeout_seconds=60, elicitation_callback=elicit) as agent:
        assert text_of(await agent.call_tool("ask", {})) == ["hello ada"]
    events = await published(worker, run_id, 1)
    assert [type(e).__name__ for e in events] == ["ToolCallRequested", "ToolCallCompleted", "RunEnded"]
    assert events[0].tool_call_id == events[1].tool_call_id


def asking_server() -> Server:
    """``ask``, a multi-round call: it asks the client for a name (``InputRequiredResult``), then
    greets it (as ``fault_server.py`` does over stdio)."""
    tool = types.Tool(name="ask", input_schema={"type": "object"})

    async def list_tools(ctx, params):
        return types.ListToolsResult(tools=[tool])

    async def call_tool(ctx, params):
        if params.request_state != "asked" or not params.input_responses:
            question = types.ElicitRequest(
                params=types.ElicitRequestFormParams(
                    message="your name?",
                    requested_schema={"type": "object", "properties": {"name": {"type": "string"}}},
                )
            )
            return types.InputRequiredResult(input_requests={"who": question}, request_state="asked")
        answer = params.input_responses["who"]
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"hello {answer.content['name']}")])

    return Server("asking", on_list_tools=list_tools, on_call_tool=call_tool)


async def test_sdk_proxy_a_multi_round_call_passes_through_and_is_one_call_in_memory(worker):
    """As above through the SDK proxy: the retry, with its ``requestState``, is the same call
    (not gated again), completed once with the final result."""
    run_id = f"{worker.names.tag}-input-in-memory"

    async def elicit(context, params):
        return types.ElicitResult(action="accept", content={"name": "ada"})

    agent_options = {"elicitation_callback": elicit}
    async with gateway_in_memory(worker, run_id, in_process(asking_server()), agent=agent_options) as agent:
        assert text_of(await agent.call_tool("ask", {})) == ["hello ada"]
    events = await published(worker, run_id, 1)
    assert [type(e).__name__ for e in events] == ["ToolCallRequested", "ToolCallCompleted", "RunEnded"]
    assert events[0].tool_call_id == events[1].tool_call_id


async def test_unreachable_upstream_each_call_gets_a_clear_error(worker, everything):
    upstream_port = free_port()
    server = Process(
        [str(everything), "streamableHttp"], env={"PORT": str(upstream_port)}, log=worker.tmp / "everything-gone.log"
    )
    run_id = f"{worker.names.tag}-unreachable"
    try:
        await wait_http(f"http://127.0.0.1:{upstream_port}/mcp")
        async with gateway_in_memory(
            worker,
            run_id,
            f"ev=http://127.0.0.1:{upstream_port}/mcp",
            f"down=http://127.0.0.1:{free_port()}/mcp",
            upstream_timeout=3,
            connect_timeout=3,
        ) as agent:
            assert "echo" in {t.name for t in (await agent.list_tools()).tools}  # the reachable one serves
            assert text_of(await agent.call_tool("echo", {"message": "hi"})) == ["Echo: hi"]
            server.kill()  # now it is unreachable too
            for _ in range(2):
                started = time.monotonic()
                gone = await agent.call_tool("echo", {"message": "hi"})
                assert gone.is_error and "'ev'" in text_of(gone)[0], text_of(gone)
                assert time.monotonic() - started < 30
    finally:
        server.kill()


# -- abort -------------------------------------------------------------------------------------------


async def test_after_an_abort_every_further_call_is_refused_with_its_message(lw):
    """abortAfterCriticalBlocks 1: the first block also ends the run; MCP cannot end the agent's
    run, so every call after it is refused with the abort's message."""
    path = lw.tmp / "abort.json"
    write_config(path, {**CONFIG, "loopwatch": {"surfaceWarnings": True, "abortAfterCriticalBlocks": 1}})
    lw.worker(config=path).start().wait_ready(90)
    run_id = f"{lw.names.tag}-abort"
    async with over_stdio(lw, run_id, TIME_SERVER) as agent:
        results = [await agent.call_tool("convert_time", CONVERT) for _ in range(21)]
        assert results[-1].is_error  # the block
        await asyncio.sleep(1.0)  # the abort follows the block on the verdicts topic
        later = [await agent.call_tool("get_current_time", {"timezone": "UTC"}) for _ in range(3)]
    events = await published(lw, run_id, 21)
    aborts = [
        v
        for v in reference_verdicts(events, {**CONFIG, "loopwatch": {"abortAfterCriticalBlocks": 1}})
        if v.__class__.__name__ == "RunAborted"
    ]
    assert len(aborts) == 1
    for result in later:
        assert result.is_error and text_of(result) == [aborts[0].message]
    assert sum(isinstance(e, ToolCallRequested) for e in events) == 21  # refused calls are not published


# -- no decision: fail open, or closed -------------------------------------------------------------


async def test_no_decision_fails_open_by_default_and_closed_when_asked(worker):
    """Topics nobody answers on: the call runs after the timeout, or is refused with
    --fail-closed (the runner client's defaults and error)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    calls, verdicts = f"{worker.names.app_id}-idle-calls", f"{worker.names.app_id}-idle-verdicts"
    admin = AIOKafkaAdminClient(bootstrap_servers=worker.broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 2, 1) for name in (calls, verdicts)])
    finally:
        await admin.close()
    idle = dict(tool_calls_topic=calls, verdicts_topic=verdicts, timeout=0.5)
    async with over_stdio(worker, f"{worker.names.tag}-open", TIME_SERVER, **idle) as agent:
        opened = await agent.call_tool("get_current_time", {"timezone": "UTC"})
        assert not opened.is_error and "UTC" in text_of(opened)[0]
    async with over_stdio(worker, f"{worker.names.tag}-closed", TIME_SERVER, fail_closed=True, **idle) as agent:
        closed = await agent.call_tool("get_current_time", {"timezone": "UTC"})
        assert closed.is_error and text_of(closed) == [
            "no loopwatch decision for get_current_time within 0.5s (fail-closed); the call was not run"
        ]


# -- the benchmark runs (tiny; its figures are make bench-gateway's) ---------------------------------


def _thread_affinities(pid: int) -> dict[int, set[int]]:
    return {int(tid): os.sched_getaffinity(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


def test_bench_gateway_runs(kafka_broker):
    broker_pid = listening_pid(int(kafka_broker.rsplit(":", 1)[1]))
    before = _thread_affinities(broker_pid) if broker_pid else {}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.gateway",
            "--broker",
            kafka_broker,
            "--calls",
            "3",
            "--rounds",
            "1",
            "--throughput",
            "16",
            "--concurrency",
            "4",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in (
        "direct    p50",
        "passthrough p50",
        "advisory  p50",
        "gate      p50",
        "decision  p50",
        "advisory-sdk p50",
        "gate-sdk  p50",
        "throughput advisory-raw",
        "throughput gate-raw",
        "throughput direct-raw",
        "throughput advisory-sdk",
        "throughput advisory",
        "throughput passthrough",
        "throughput passthrough-http",
        "throughput advisory-http",
        "CPU",
    ):
        assert line in proc.stdout, proc.stdout
    if len(os.sched_getaffinity(0)) >= 2 and broker_pid:
        assert "placement: split: broker and worker" in proc.stdout, proc.stdout
        after = _thread_affinities(broker_pid)  # the broker has every CPU it had again
        assert {tid: after[tid] for tid in before if tid in after} == {
            tid: cpus for tid, cpus in before.items() if tid in after
        }
