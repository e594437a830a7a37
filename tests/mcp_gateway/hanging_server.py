"""An MCP server over stdio (JSON-RPC by hand) that answers ``echo`` calls until it has answered
``K`` of them (its first argument), then reads on and answers nothing more: a server hung for
good.  Each start appends its pid to the file named by its second argument, so a test can count
how often it was started."""

from __future__ import annotations

import json
import os
import sys


def answer(request_id, **body) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, **body}) + "\n")
    sys.stdout.flush()


def main() -> None:
    budget, starts = int(sys.argv[1]), sys.argv[2]
    with open(starts, "a") as out:
        out.write(f"{os.getpid()}\n")
    for line in sys.stdin:
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            continue  # a notification
        if method == "initialize":
            answer(
                request_id,
                result={
                    "protocolVersion": message["params"]["protocolVersion"],
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "hanging", "version": "1"},
                },
            )
        elif method == "tools/list":
            answer(request_id, result={"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]})
        elif method == "tools/call":
            if budget <= 0:
                continue  # hung: reads on, answers nothing
            budget -= 1
            text = json.dumps(message["params"].get("arguments"), sort_keys=True)
            answer(request_id, result={"content": [{"type": "text", "text": text}], "isError": False})
        elif method == "ping":
            answer(request_id, result={})
        else:
            answer(request_id, error={"code": -32601, "message": f"Method not found: {method}"})


if __name__ == "__main__":
    main()
