"""An MCP server over stdio that speaks JSON-RPC by hand (no SDK), so it can answer what no SDK
would write: ``deep`` answers a result nested 100,000 levels deep, ``bad_code`` a JSON-RPC error
whose code is a string, ``no_message`` an error without a message, ``not_object`` an error that
is a string, ``huge`` a result of 65 MiB with its id last (as JavaScript SDKs write it); ``echo``
answers its arguments as text.  Requests other than initialize,
tools/list, tools/call and ping get -32601; notifications are ignored."""

from __future__ import annotations

import json
import sys

DEPTH = 100_000
TOOLS = ["echo", "deep", "bad_code", "no_message", "not_object", "huge"]
HUGE = 65 * 1024 * 1024
ERRORS = {
    "bad_code": {"code": "x", "message": "a code that is a string"},
    "no_message": {"code": -32000},
    "not_object": "just a string",
}


def answer(request_id, **body) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, **body}) + "\n")
    sys.stdout.flush()


def main() -> None:
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
                    "serverInfo": {"name": "bad-answers", "version": "1"},
                },
            )
        elif method == "ping":
            answer(request_id, result={})
        elif method == "tools/list":
            answer(request_id, result={"tools": [{"name": n, "inputSchema": {"type": "object"}} for n in TOOLS]})
        elif method == "tools/call":
            name = message["params"]["name"]
            if name == "deep":
                head = f'{{"jsonrpc":"2.0","id":{json.dumps(request_id)},"result":{{"content":[],"structuredContent":{{"a":'
                sys.stdout.write(head + "[" * DEPTH + "]" * DEPTH + "}}}\n")
                sys.stdout.flush()
            elif name == "huge":
                text = json.dumps({"content": [{"type": "text", "text": "x" * HUGE}], "isError": False})
                sys.stdout.write(f'{{"jsonrpc":"2.0","result":{text},"id":{json.dumps(request_id)}}}\n')
                sys.stdout.flush()
            elif name in ERRORS:
                answer(request_id, error=ERRORS[name])
            else:
                text = json.dumps(message["params"].get("arguments"), sort_keys=True)
                answer(request_id, result={"content": [{"type": "text", "text": text}], "isError": False})
        else:
            answer(request_id, error={"code": -32601, "message": f"Method not found: {method}"})


if __name__ == "__main__":
    main()
