"""``loopwatch mcp-gateway`` fails open (or closed, as configured) per call from its start: with
Kafka out of reach it still serves the upstream's tools, and once Kafka can be reached it
guards the calls again.  An upstream that exits at start ends the relay with one line and a
non-zero status.

Kafka out of reach is the real broker behind ``KafkaCutProxy`` (every connection refused
while cut, relayed once restored); the upstream is ``mcp-server-time``, driven by the ``mcp``
SDK's own client; what the gateway published is read back from the topic.  The relay runs as
``loopwatch mcp-gateway``; the SDK proxy in this process (``gateway_in_memory``), its runner
client on the same cut broker.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gateway_in_memory import gateway_in_memory
from kafka_proxy import KafkaCutProxy
from mcp import Client, StdioServerParameters

from harness import REPO, collect, write_config
from schemas.events import ToolCallRequested, decode_event

pytestmark = pytest.mark.kafka

BIN = Path(sys.executable).parent
CONVERT = {"source_timezone": "Europe/Berlin", "time": "12:00", "target_timezone": "Asia/Tokyo"}
FRONT_ENDS = {"relay": [], "sdk-proxy": ["--sdk-proxy"]}
ON_THE_WIRE = ["relay"]  # the SDK proxy's cases: the *_in_memory tests
TIME_SERVER = str(BIN / "mcp-server-time")


@pytest.fixture(scope="module")
def worker(lw_module):
    path = lw_module.tmp / "loop-detection.json"
    write_config(path, {"tools": {"loopDetection": {"enabled": True}}})
    lw_module.worker(config=path).start().wait_ready(90)
    return lw_module


@pytest.fixture
def cut_broker(worker):
    proxy = KafkaCutProxy(worker.broker).start()
    proxy.cut()
    yield proxy
    proxy.stop()


def gateway(lw, bootstrap: str, run_id: str, *flags: str) -> StdioServerParameters:
    args = [
        "mcp-gateway",
        "--upstream",
        str(BIN / "mcp-server-time"),
        "--bootstrap",
        bootstrap,
        "--tool-calls-topic",
        lw.names.tool_calls,
        "--verdicts-topic",
        lw.names.verdicts,
        "--run-id",
        run_id,
        "--timeout",
        "10",
        *flags,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWATCH_")}
    return StdioServerParameters(command=str(BIN / "loopwatch"), args=args, env=env)


def requested_ids(records: list, run_id: str) -> list[str]:
    events = [decode_event(r.value) for r in records]
    return [e.tool_call_id for e in events if type(e) is ToolCallRequested and e.run_id == run_id]


async def served_then_guarded(worker, cut_broker, run_id: str, client: Client) -> list[str]:
    """Calls through ``client`` while Kafka is cut, then once it is restored: the ids the gateway
    published."""
    tools = await client.list_tools()
    assert "convert_time" in {t.name for t in tools.tools}
    unguarded = await client.call_tool("convert_time", CONVERT)
    assert not unguarded.is_error, unguarded
    cut_broker.restore()
    # The gateway tries again every few seconds: calls go on (each its own, not a loop),
    # and are published once it is back.
    for minute in range(60):
        result = await client.call_tool("convert_time", {**CONVERT, "time": f"12:{minute:02d}"})
        assert not result.is_error, result
        records = await collect(
            worker.broker,
            worker.names.tool_calls,
            until=lambda rs: bool(requested_ids(rs, run_id)),
            timeout=1.0,
        )
        if requested_ids(records, run_id):
            return requested_ids(records, run_id)
    raise AssertionError("the gateway never published once Kafka was back")


@pytest.mark.parametrize("front_end", ON_THE_WIRE)
def test_without_kafka_the_tools_are_served_and_guarded_once_it_is_back(worker, cut_broker, front_end):
    run_id = f"fail-open-{front_end}"

    async def scenario() -> list[str]:
        async with Client(
            gateway(worker, cut_broker.address, run_id, *FRONT_ENDS[front_end]), read_timeout_seconds=60
        ) as client:
            return await served_then_guarded(worker, cut_broker, run_id, client)

    published = asyncio.run(scenario())
    assert "mcp-1" not in published  # the call made while Kafka was cut was not published
    assert published  # and the calls once it was back were


def test_sdk_proxy_without_kafka_the_tools_are_served_and_guarded_once_it_is_back_in_memory(worker, cut_broker):
    run_id = "fail-open-in-memory"

    async def scenario() -> list[str]:
        # own_client=False: the gateway makes a new runner client per attempt while Kafka is cut
        async with gateway_in_memory(
            worker, run_id, TIME_SERVER, bootstrap_servers=cut_broker.address, own_client=False
        ) as client:
            return await served_then_guarded(worker, cut_broker, run_id, client)

    published = asyncio.run(scenario())
    assert "mcp-1" not in published  # the call made while Kafka was cut was not published
    assert published  # and the calls once it was back were


def assert_refused_for_kafka(result, cut_broker) -> None:
    assert result.is_error
    text = result.content[0].text
    assert f"loopwatch is unavailable (Kafka at {cut_broker.address} cannot be reached)" in text
    assert "the call was not run" in text


@pytest.mark.parametrize("front_end", ON_THE_WIRE)
def test_failing_closed_without_kafka_refuses_each_call_with_the_reason(worker, cut_broker, front_end):
    async def scenario():
        params = gateway(worker, cut_broker.address, "fail-closed", "--fail-closed", *FRONT_ENDS[front_end])
        async with Client(params, read_timeout_seconds=60) as client:
            tools = await client.list_tools()
            assert "convert_time" in {t.name for t in tools.tools}
            return await client.call_tool("convert_time", CONVERT)

    assert_refused_for_kafka(asyncio.run(scenario()), cut_broker)


def test_sdk_proxy_failing_closed_without_kafka_refuses_each_call_with_the_reason_in_memory(worker, cut_broker):
    async def scenario():
        options = {"bootstrap_servers": cut_broker.address, "fail_closed": True, "own_client": False}
        async with gateway_in_memory(worker, "fail-closed-in-memory", TIME_SERVER, **options) as client:
            tools = await client.list_tools()
            assert "convert_time" in {t.name for t in tools.tools}
            return await client.call_tool("convert_time", CONVERT)

    assert_refused_for_kafka(asyncio.run(scenario()), cut_broker)


def test_an_upstream_that_exits_at_start_ends_the_relay_with_one_line(worker, tmp_path):
    crash = f"{sys.executable} -c 'import sys; sys.exit(3)'"
    with open(tmp_path / "stderr", "w+") as err_file:
        proc = subprocess.Popen(
            [str(BIN / "loopwatch"), "mcp-gateway", "--upstream", crash, "--bootstrap", worker.broker]
            + ["--tool-calls-topic", worker.names.tool_calls, "--verdicts-topic", worker.names.verdicts],
            stdin=subprocess.PIPE,  # the agent's side stays open: the relay must end by itself
            stdout=subprocess.DEVNULL,
            stderr=err_file,
            cwd=REPO,
            env={k: v for k, v in os.environ.items() if not k.startswith("LOOPWATCH_")},
        )
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdin.close()
        err_file.seek(0)
        err = err_file.read()
    assert proc.returncode == 1, err
    assert err.strip().count("\n") == 0, err
    assert err.strip() == (
        f"loopwatch mcp-gateway: upstream MCP server '{os.path.basename(sys.executable)}' "
        f"({sys.executable} -c 'import sys; sys.exit(3)') exited with status 3 at start, before answering anything"
    )
