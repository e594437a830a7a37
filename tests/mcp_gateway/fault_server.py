"""A real MCP server (the ``mcp`` SDK's own, over stdio) whose tools misbehave on request, for
the gateway's upstream-fault tests: ``ok`` answers, ``crash`` kills the process, ``hang`` never
answers, ``malformed`` answers with a result that is not a tool result; and ``ask``, a
multi-round call: it asks the client for a name (``InputRequiredResult``), then greets it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import mcp_types as types
from mcp.server import Server

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's bench/
from bench.mcp_upstream import serve  # noqa: E402

# The wire itself: stdio_server diverts fd 1 to stderr while it serves, so anything printed
# goes to the log; a malformed answer has to be written past it.
WIRE = os.dup(1)
TOOLS = [types.Tool(name=name, input_schema={"type": "object"}) for name in ("ok", "crash", "hang", "malformed", "ask")]


async def list_tools(ctx, params):
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx, params):
    if params.name == "ok":
        return types.CallToolResult(content=[types.TextContent(type="text", text="fine")])
    if params.name == "ask":
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
    if params.name == "crash":
        os._exit(3)
    if params.name == "malformed":
        line = json.dumps({"jsonrpc": "2.0", "id": ctx.request_id, "result": {"content": "not a list"}})
        os.write(WIRE, line.encode() + b"\n")
    await anyio.sleep_forever()  # hang (and malformed: its real answer never comes)


if __name__ == "__main__":
    serve(Server("fault-server", on_list_tools=list_tools, on_call_tool=call_tool))
