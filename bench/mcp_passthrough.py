"""The floor of ``make bench-gateway``: a pure pass-through MCP proxy on the same SDK, without
loopwatch.  The agent-facing side is the gateway's own stdio transport
(``streams.integrations.mcp.stdio.agent_stdio``) and the upstream side the SDK's ``Client`` over stdio,
as in the gateway, so what the gateway adds beyond this row is loopwatch's.  With ``--http PORT``
first, the agent-facing side is the SDK's streamable HTTP app under uvicorn, as the gateway's
``--http`` serves it."""

from __future__ import annotations

import asyncio
import sys

from mcp import Client, StdioServerParameters
from mcp.server import Server

from streams.integrations.mcp.stdio import agent_stdio


async def main(argv: list[str]) -> None:
    port = None
    if argv[:1] == ["--http"]:
        port, argv = int(argv[1]), argv[2:]
    async with Client(StdioServerParameters(command=argv[0], args=argv[1:]), read_timeout_seconds=60) as upstream:
        session = upstream.session

        async def list_tools(ctx, params):
            return await session.list_tools()

        async def call_tool(ctx, params):
            return await session.call_tool(params.name, params.arguments)

        server = Server("bench-passthrough", on_list_tools=list_tools, on_call_tool=call_tool)
        if port is not None:
            import uvicorn

            config = uvicorn.Config(
                server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning", lifespan="on"
            )
            await uvicorn.Server(config).serve()
            return
        async with agent_stdio() as (read, write):
            await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    # the upstream's command line; a last argument "@name" only names this process (bench.gateway's CPU reading)
    asyncio.run(main([a for a in sys.argv[1:] if not a.startswith("@")]))
