"""``UpstreamSpec``: a command, a URL or a server object in the same process, exactly one; an
in-process server is reached in memory (no process, no socket, no Kafka here)."""

from __future__ import annotations

import asyncio

import mcp_types as types
import pytest
from mcp.server import Server
from mcp.server.mcpserver import MCPServer

from streams.integrations.mcp.upstream import Upstream, UpstreamSpec, unavailable


def adder() -> MCPServer:
    server = MCPServer("adder")

    @server.tool()
    def add(a: int, b: int) -> int:
        return a + b

    return server


NEITHER_OR_BOTH = "upstream 'u': give a command or a url, not both or neither"
SERVER_ALONE = "upstream 'u': give a server object alone, without a command or a url"


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({}, NEITHER_OR_BOTH),
        ({"command": ("srv",), "url": "http://127.0.0.1:1/mcp"}, NEITHER_OR_BOTH),
        ({"command": ("srv",), "server": Server("s")}, SERVER_ALONE),
        ({"url": "http://127.0.0.1:1/mcp", "server": Server("s")}, SERVER_ALONE),
    ],
    ids=["none", "command-and-url", "command-and-server", "url-and-server"],
)
def test_exactly_one_kind_of_upstream_is_given(given, message):
    # the first message is what a file of upstreams gets, which cannot hold a server object
    with pytest.raises(ValueError) as raised:
        UpstreamSpec(name="u", **given)
    assert str(raised.value) == message


def test_a_server_object_that_is_no_mcp_server_is_refused_in_one_line():
    with pytest.raises(ValueError) as raised:
        UpstreamSpec(name="u", server="python -m srv")  # type: ignore[arg-type]
    assert str(raised.value) == "upstream 'u': the server object must be an mcp Server or MCPServer, not str"


def test_an_in_process_server_is_named_as_such_when_unavailable():
    spec = UpstreamSpec(name="tools", server=adder())
    assert unavailable(spec, None) == (
        "upstream MCP server 'tools' (in-process MCPServer) is unavailable: not connected"
    )
    low = UpstreamSpec(name="low", server=Server("low"))
    assert low.where == "in-process Server"


def test_an_in_process_upstream_lists_and_calls_its_tools_in_memory():
    async def scenario() -> tuple[list[str], types.CallToolResult]:
        upstream = Upstream(UpstreamSpec(name="tools", server=adder()), connect_timeout=30)
        await upstream.start()
        try:
            names = [tool.name for tool in await upstream.list_tools()]
            result = await (await upstream.session()).call_tool("add", {"a": 2, "b": 3})
        finally:
            await upstream.close()
        return names, result

    names, result = asyncio.run(scenario())
    assert names == ["add"]
    assert not result.is_error and [block.text for block in result.content] == ["5"]
