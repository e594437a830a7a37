"""``loopwatch mcp-gateway`` over stdio against hostile input, driven line by line (no SDK client
would send these lines): a message 100,000 levels deep from the agent, an upstream answering a
result that deep, and upstream errors that are not JSON-RPC error objects.  Each fails the one
request it came with; the next ordinary call still works.

Upstreams: ``mcp-server-time`` (PyPI) and ``tests/mcp_gateway/bad_answers_server.py`` (JSON-RPC
written by hand, so it can answer what an SDK would never write).  The real broker takes the
gateway's records (advisory mode: no verdict is waited for, so no worker is needed).  Where the
agent's side is an ordinary SDK call and the subject is what the gateway makes of the upstream's
lines, the SDK proxy runs in this process (``gateway_in_memory``), the upstream still a process
on the wire.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import sys
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from gateway_in_memory import gateway_in_memory
from mcp.shared.exceptions import MCPError

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
RELAY = PROXIES[:1]


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
        started = asyncio.get_running_loop().time()
        failed = await gateway.request("tools/call", {"name": "deep", "arguments": {}})
        assert asyncio.get_running_loop().time() - started < 4, "failed at once, not after the call timed out"
        assert failed["result"]["isError"] is True, failed
        assert "malformed answer: nested deeper than 128 levels" in failed["result"]["content"][0]["text"]
        echoed = await gateway.request("tools/call", {"name": "echo", "arguments": {"n": 1}})
        assert echoed["result"]["content"][0]["text"] == '{"n": 1}'
        assert gateway.alive()


def assert_valid_jsonrpc_error(answer: dict) -> dict:
    """The error object of ``answer``, once it is one JSON-RPC allows: an object with an integer
    code and a string message (JSON-RPC 2.0, section 5.1)."""
    error = answer.get("error")
    assert isinstance(error, dict), answer
    assert isinstance(error.get("code"), int) and not isinstance(error["code"], bool), answer
    assert isinstance(error.get("message"), str) and error["message"], answer
    return error


@pytest.mark.parametrize("proxy", RELAY)
@pytest.mark.parametrize("tool", ["bad_code", "no_message", "not_object"])
async def test_an_invalid_upstream_error_reaches_the_agent_as_a_valid_one(topics, proxy, tool):
    async with Gateway(topics, f"bad-answers={BAD_SERVER}", *proxy, "--upstream-timeout", "20") as gateway:
        started = asyncio.get_running_loop().time()
        error = assert_valid_jsonrpc_error(await gateway.request("tools/call", {"name": tool, "arguments": {}}))
        assert asyncio.get_running_loop().time() - started < 10, "answered at once, not after the call timed out"
        assert error["code"] == -32603, error  # Internal error: what the gateway got was no error object
        assert "'bad-answers'" in error["message"], error  # the upstream that sent it
        assert "invalid JSON-RPC error" in error["message"], error
        echoed = await gateway.request("tools/call", {"name": "echo", "arguments": {"n": 1}})
        assert echoed["result"]["content"][0]["text"] == '{"n": 1}'
        assert gateway.alive()


@pytest.mark.parametrize("tool", ["bad_code", "no_message", "not_object"])
async def test_sdk_proxy_an_invalid_upstream_error_reaches_the_agent_as_a_valid_one_in_memory(topics, tool):
    """As above, through the SDK proxy: the agent's SDK client takes the error as a JSON-RPC
    error (an MCPError with an integer code and a message), not a malformed answer."""
    run_id = f"{topics.names.tag}-hostile-{tool}"
    options = {"mode": "advisory", "upstream_timeout": 20}
    async with gateway_in_memory(topics, run_id, f"bad-answers={BAD_SERVER}", **options) as agent:
        started = asyncio.get_running_loop().time()
        with pytest.raises(MCPError) as raised:
            await agent.call_tool(tool, {})
        assert asyncio.get_running_loop().time() - started < 10, "answered at once, not after the call timed out"
        error = raised.value.error
        assert isinstance(error.code, int) and not isinstance(error.code, bool), error
        assert isinstance(error.message, str) and error.message, error
        assert error.code == -32603, error  # Internal error: what the gateway got was no error object
        assert "'bad-answers'" in error.message, error  # the upstream that sent it
        assert "invalid JSON-RPC error" in error.message, error
        echoed = await agent.call_tool("echo", {"n": 1})
        assert [block.text for block in echoed.content] == ['{"n": 1}']


HANGING_SERVER = REPO / "tests" / "mcp_gateway" / "hanging_server.py"


@pytest.mark.parametrize("proxy", PROXIES)
async def test_an_upstream_that_stops_answering_is_restarted(topics, proxy, tmp_path):
    starts = tmp_path / "starts"
    upstream = "hanging=" + shlex.join([sys.executable, str(HANGING_SERVER), "2", str(starts)])
    flags = ["--upstream-timeout", "1", "--restart-after-timeouts", "2", "--restart-after-silence", "600"]
    async with Gateway(topics, upstream, *proxy, *flags) as gateway:
        for n in (1, 2):  # its budget: answered
            echoed = await gateway.request("tools/call", {"name": "echo", "arguments": {"n": n}})
            assert echoed["result"]["content"][0]["text"] == json.dumps({"n": n}), echoed
        for n in (3, 4):  # hung: each times out, the second in a row restarts it
            timed_out = await gateway.request("tools/call", {"name": "echo", "arguments": {"n": n}})
            assert timed_out["result"]["isError"] is True, timed_out
        deadline = asyncio.get_running_loop().time() + 20
        while len(starts.read_text().split()) < 2:
            assert asyncio.get_running_loop().time() < deadline, "the hung upstream was never started again"
            await asyncio.sleep(0.1)
        echoed = await gateway.request("tools/call", {"name": "echo", "arguments": {"n": 5}})
        assert echoed["result"]["content"][0]["text"] == json.dumps({"n": 5}), echoed
        assert gateway.alive()
    assert len(starts.read_text().split()) == 2
    log = gateway.log.read_text()
    assert "upstream hanging: restarted because 2 calls in a row timed out (restarts 1, timeouts 2" in log, log[-3000:]


# -- streamable HTTP: the sessions are bounded -------------------------------------------------------


async def open_session(client, url: str):
    """A raw ``initialize`` POST without a session id: the response that opens a session (or not)."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "flood", "version": "1"},
        },
    }
    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    return await client.post(url, json=body, headers=headers)


async def test_http_sessions_are_capped_refused_clearly_counted_and_expire_when_idle(topics, tmp_path):
    import httpx

    from harness import free_port

    port = free_port()
    argv = Gateway(topics, TIME_SERVER).argv + [
        "--http",
        str(port),
        "--http-max-sessions",
        "3",
        "--http-session-idle-timeout",
        "3",
    ]
    log = open(tmp_path / "gateway-http.log", "ab")
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    url, status_url = f"http://127.0.0.1:{port}/mcp", f"http://127.0.0.1:{port}/loopwatch/status"
    try:
        async with httpx.AsyncClient(timeout=20) as client:
            deadline = asyncio.get_running_loop().time() + 60
            while True:
                try:
                    await client.get(status_url)
                    break
                except httpx.TransportError:
                    assert asyncio.get_running_loop().time() < deadline, (tmp_path / "gateway-http.log").read_text()
                    await asyncio.sleep(0.2)
            opened = [await open_session(client, url) for _ in range(3)]
            assert [r.status_code for r in opened] == [200, 200, 200]
            assert len({r.headers["mcp-session-id"] for r in opened}) == 3
            refused = await open_session(client, url)
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "5"
            error = refused.json()["error"]
            assert "too many open sessions (3, --http-max-sessions)" in error["message"], error
            status = (await client.get(status_url)).json()
            assert status["sessions"] == {"max": 3, "opened": 3, "refused": 1}, status
            await asyncio.sleep(3 * 2.5)  # idle for over the timeout: the SDK closes them
            again = await open_session(client, url)
            assert again.status_code == 200, again.text
            status = (await client.get(status_url)).json()
            assert status["sessions"] == {"max": 3, "opened": 4, "refused": 1}, status
            gone = await client.post(
                url,
                json={"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}},
                headers={
                    "accept": "application/json, text/event-stream",
                    "mcp-session-id": opened[0].headers["mcp-session-id"],
                    "mcp-protocol-version": "2025-06-18",
                },
            )
            assert gone.status_code == 404, gone.text  # an expired session is gone
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
        log.close()
    assert "refused a new HTTP session: 3 open" in (tmp_path / "gateway-http.log").read_text()


# -- messages over the line limit (64 MiB), both ways -----------------------------------------------


@pytest.mark.parametrize("proxy", PROXIES)
async def test_an_upstream_answer_over_the_line_limit_fails_its_call_at_once(topics, proxy):
    async with Gateway(topics, f"bad-answers={BAD_SERVER}", *proxy, "--upstream-timeout", "60") as gateway:
        started = asyncio.get_running_loop().time()
        failed = await gateway.request("tools/call", {"name": "huge", "arguments": {}})
        assert asyncio.get_running_loop().time() - started < 30, "failed once read past, not after the timeout"
        assert failed["result"]["isError"] is True, failed
        text = failed["result"]["content"][0]["text"]
        size = re.search(
            r"malformed answer: a message of (\d+) bytes, over the gateway's limit of 67108864 bytes", text
        )
        assert size is not None and int(size.group(1)) > 65 * 1024 * 1024, text
        echoed = await gateway.request("tools/call", {"name": "echo", "arguments": {"n": 1}})
        assert echoed["result"]["content"][0]["text"] == '{"n": 1}'
        assert gateway.alive()


@pytest.mark.parametrize("proxy", PROXIES)
async def test_an_agent_message_over_the_line_limit_is_refused_alone(topics, proxy):
    async with Gateway(topics, TIME_SERVER, *proxy) as gateway:
        huge = {"jsonrpc": "2.0", "id": "huge-1", "method": "tools/call"}
        line = json.dumps(huge)[:-1] + ', "params": {"name": "convert_time", "arguments": {"a": "'
        await gateway.send(line + "x" * (65 * 1024 * 1024) + '"}}}')
        refused = await gateway.answer("huge-1", timeout=60)
        assert refused["error"]["code"] == -32600, refused
        assert "over the gateway's limit of 67108864 bytes" in refused["error"]["message"], refused
        assert_converted(await gateway.request("tools/call", {"name": "convert_time", "arguments": CONVERT}))
        assert gateway.alive()


async def test_an_http_upstream_that_stops_answering_is_reconnected(topics, tmp_path):
    from harness import free_port

    port = free_port()
    log = open(tmp_path / "upstream.log", "ab")
    server = await asyncio.create_subprocess_exec(
        sys.executable,
        str(REPO / "tests" / "mcp_gateway" / "hanging_http_server.py"),
        str(port),
        "2",
        stdout=log,
        stderr=log,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                assert asyncio.get_running_loop().time() < deadline, "the upstream never listened"
                await asyncio.sleep(0.2)
        flags = ["--upstream-timeout", "1", "--restart-after-timeouts", "2", "--restart-after-silence", "600"]
        async with Gateway(topics, f"hanging=http://127.0.0.1:{port}/mcp", *flags) as gateway:
            for n in (1, 2):  # this connection's budget: answered
                echoed = await gateway.request("tools/call", {"name": "echo", "arguments": {"n": n}})
                assert echoed["result"]["content"][0]["text"] == json.dumps({"n": n}), echoed
            for n in (3, 4):  # stuck: each times out, the second in a row reconnects
                timed_out = await gateway.request("tools/call", {"name": "echo", "arguments": {"n": n}})
                assert timed_out["result"]["isError"] is True, timed_out
            deadline = asyncio.get_running_loop().time() + 20
            while "reconnected because" not in gateway.log.read_text():
                assert asyncio.get_running_loop().time() < deadline, gateway.log.read_text()[-3000:]
                await asyncio.sleep(0.1)
            echoed = await gateway.request("tools/call", {"name": "echo", "arguments": {"n": 5}})
            assert echoed["result"]["content"][0]["text"] == json.dumps({"n": 5}), echoed
        assert "upstream hanging: reconnected because 2 calls in a row timed out (restarts 1" in gateway.log.read_text()
    finally:
        server.kill()
        await server.wait()
        log.close()
