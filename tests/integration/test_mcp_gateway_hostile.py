"""``loopwatch mcp-gateway`` over stdio against hostile input, driven line by line (no SDK client
would send these lines): a message 100,000 levels deep from the agent, an upstream answering a
result that deep, and upstream errors that are not JSON-RPC error objects.  Each fails the one
request it came with; the next ordinary call still works.

Upstreams: ``mcp-server-time`` (PyPI) and ``tests/mcp_gateway/bad_answers_server.py`` (JSON-RPC
written by hand, so it can answer what an SDK would never write).  The real broker takes the
gateway's records (advisory mode: no verdict is waited for, so no worker is needed).
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from harness import REPO

pytestmark = pytest.mark.kafka

TIME_SERVER = str(Path(sys.executable).parent / "mcp-server-time")
BAD_SERVER = shlex.join([sys.executable, str(REPO / "tests" / "mcp_gateway" / "bad_answers_server.py")])
DEPTH = 100_000
DEEP = "[" * DEPTH + "]" * DEPTH
CONVERT = {"source_timezone": "Europe/Berlin", "time": "12:00", "target_timezone": "Asia/Tokyo"}
# Berlin is UTC+1 and Tokyo UTC+9 in winter and Tokyo has no summer time: 12:00 there is 20:00
# in winter, 19:00 in summer (the server converts on today's date).
TOKYO_TIMES = ("20:00", "19:00")
PROXIES = [pytest.param([], id="relay"), pytest.param(["--sdk-proxy"], id="sdk-proxy")]


@pytest.fixture(scope="module")
def topics(lw_module):
    """The gateway's two topics, made here: no worker is needed to take advisory records."""

    async def create() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=lw_module.broker)
        await admin.start()
        try:
            names = (lw_module.names.tool_calls, lw_module.names.verdicts)
            await admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1) for name in names])
        finally:
            await admin.close()

    asyncio.run(create())
    return lw_module


class Gateway:
    """The gateway as a subprocess, its stdin and stdout the agent's wire."""

    def __init__(self, lw, upstream: str, *extra: str) -> None:
        self.argv = [
            sys.executable,
            "-m",
            "streams.cli",
            "mcp-gateway",
            "--mode",
            "advisory",
            "--bootstrap",
            lw.broker,
            "--tool-calls-topic",
            lw.names.tool_calls,
            "--verdicts-topic",
            lw.names.verdicts,
            "--run-id",
            f"{lw.names.tag}-hostile",
            "--upstream",
            upstream,
            *extra,
        ]
        self.log = lw.tmp / "gateway.log"
        self.ids = iter(range(1, 1_000_000))

    async def __aenter__(self) -> Gateway:
        self.stderr = open(self.log, "ab")
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self.stderr,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            cwd=REPO,
            limit=64 * 1024 * 1024,
        )
        init = await self.request(
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "hostile", "version": "1"}},
        )
        assert "result" in init, init
        await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        listed = await self.request("tools/list", {})
        assert listed["result"]["tools"], listed
        return self

    async def __aexit__(self, *exc) -> None:
        self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 20)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        self.stderr.close()

    async def send(self, message: dict | str) -> None:
        line = message if isinstance(message, str) else json.dumps(message)
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    async def answer(self, request_id, timeout: float = 30) -> dict:
        """The answer to ``request_id`` (notifications and other answers in between are skipped:
        the caller checks those it cares about by id)."""
        while True:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
            assert line, f"the gateway closed its output (exit {self.proc.returncode}): {self.log.read_text()[-2000:]}"
            message = json.loads(line)
            if message.get("id") == request_id and "method" not in message:
                return message

    async def request(self, method: str, params: dict) -> dict:
        request_id = next(self.ids)
        await self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        return await self.answer(request_id)

    def alive(self) -> bool:
        return self.proc.returncode is None


def deep_call(request_id) -> str:
    head = {"jsonrpc": "2.0", "method": "tools/call"} | ({} if request_id is None else {"id": request_id})
    return json.dumps(head)[:-1] + ', "params": {"name": "convert_time", "arguments": {"a": ' + DEEP + "}}}"


def assert_converted(answer: dict) -> None:
    result = answer["result"]
    assert result.get("isError") is not True, answer
    assert any(time in result["content"][0]["text"] for time in TOKYO_TIMES), answer


@pytest.mark.parametrize("proxy", PROXIES)
async def test_a_100000_deep_message_from_the_agent_fails_alone(topics, proxy):
    async with Gateway(topics, TIME_SERVER, *proxy) as gateway:
        assert_converted(await gateway.request("tools/call", {"name": "convert_time", "arguments": CONVERT}))
        await gateway.send(deep_call(None))  # no id: nothing to answer
        await gateway.send(deep_call("deep-1"))
        if not proxy:  # the relay answers it; the SDK's server drops a line it cannot parse
            refused = await gateway.answer("deep-1")
            assert refused["error"]["code"] == -32600, refused
            assert "nested deeper than 128 levels" in refused["error"]["message"], refused
        assert_converted(await gateway.request("tools/call", {"name": "convert_time", "arguments": CONVERT}))
        assert gateway.alive()


async def test_a_message_just_past_the_bound_is_refused_and_one_at_it_is_not(topics):
    # 128 levels: the message, params, arguments and 125 lists; 129: one list more.
    def call(request_id, lists: int) -> dict:
        value: object = "x"
        for _ in range(lists):
            value = [value]
        return {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"v": value}},
        }

    async with Gateway(topics, BAD_SERVER) as gateway:
        await gateway.send(call("at", 125))
        echoed = await gateway.answer("at")
        assert json.loads(echoed["result"]["content"][0]["text"]) == call("at", 125)["params"]["arguments"]
        await gateway.send(call("past", 126))
        refused = await gateway.answer("past")
        assert refused["error"]["code"] == -32600, refused


@pytest.mark.parametrize("proxy", PROXIES)
async def test_a_100000_deep_upstream_result_fails_that_call_only(topics, proxy):
    async with Gateway(topics, BAD_SERVER, *proxy, "--upstream-timeout", "5") as gateway:
        failed = await gateway.request("tools/call", {"name": "deep", "arguments": {}})
        assert failed["result"]["isError"] is True, failed
        if not proxy:  # the SDK's client drops the line it cannot parse: the call times out instead
            assert "malformed answer: nested deeper than 128 levels" in failed["result"]["content"][0]["text"]
        echoed = await gateway.request("tools/call", {"name": "echo", "arguments": {"n": 1}})
        assert echoed["result"]["content"][0]["text"] == '{"n": 1}'
        assert gateway.alive()
