"""An MCP server over streamable HTTP (the SDK's own) that answers ``K`` ``echo`` calls (its
second argument) after each client's handshake (``initialize`` or ``server/discover``), then
hangs: a server stuck for a client until that client connects again.  Serves on the port given
first."""

from __future__ import annotations

import asyncio
import json
import sys

import mcp_types as types
import uvicorn
from mcp.server import Server

BUDGET = int(sys.argv[2])
answered = [0]


async def list_tools(ctx, params) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[types.Tool(name="echo", input_schema={"type": "object"})])


async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    answered[0] += 1
    if answered[0] > BUDGET:
        await asyncio.Event().wait()  # hung: never answers
    text = json.dumps(params.arguments, sort_keys=True)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


def handshakes_reset(app):
    """The ASGI app, reading each POST's body first: a handshake gives the budget back."""

    async def asgi(scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if b'"initialize"' in body or b'"server/discover"' in body:
            answered[0] = 0
        replayed = False

        async def again():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await app(scope, again, send)

    return asgi


def main() -> None:
    server = Server("hanging-http", version="1", on_list_tools=list_tools, on_call_tool=call_tool)
    app = handshakes_reset(server.streamable_http_app(host="127.0.0.1"))
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", lifespan="on")


if __name__ == "__main__":
    main()
