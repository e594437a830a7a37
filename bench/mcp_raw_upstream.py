"""The wire-level upstream of ``make bench-gateway``'s capacity rows: a stdio peer that answers
every ``tools/call`` with a one-block text result (what ``bench/mcp_upstream.py``'s ``echo``
answers) and every other request with an empty result, straight from the JSON lines, without an
MCP SDK.  The SDK's own server costs about 0.6-1 ms of CPU per call (docs/benchmarks.md), more
than the gateway: with it at the far end, a throughput row measures the server, not the
gateway in between."""

from __future__ import annotations

import sys

import msgspec

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


def main() -> None:
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        message = _decode(line)
        if not isinstance(message, dict) or "id" not in message or "method" not in message:
            continue
        if message["method"] == "tools/call":
            text = f"echo {message['params'].get('arguments')}"
            result = {"content": [{"type": "text", "text": text}], "isError": False}
        else:
            result = {}
        out.write(_encode({"jsonrpc": "2.0", "id": message["id"], "result": result}) + b"\n")
        out.flush()


if __name__ == "__main__":
    main()
