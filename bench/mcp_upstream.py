"""The upstream MCP server of ``make bench-gateway``: the ``mcp`` SDK's own low-level server over
stdio with one tool, ``echo``, that answers at once, so a call's time is the protocol's and the
gateway's, not the tool's."""

from __future__ import annotations

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server

ECHO = types.Tool(name="echo", input_schema={"type": "object", "properties": {"n": {"type": "integer"}}})


async def list_tools(ctx, params):
    return types.ListToolsResult(tools=[ECHO])


async def call_tool(ctx, params):
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"echo {params.arguments}")])


def serve(server: Server) -> None:
    """Serve ``server`` over this process's stdio until stdin closes (also the gateway tests'
    fault server's)."""

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)


if __name__ == "__main__":
    serve(Server("bench-echo", on_list_tools=list_tools, on_call_tool=call_tool))
