"""A stdio peer for the relay's byte-for-byte test: it appends every line it reads to the file
``$RECORD`` (one JSON string per line, the line's exact text) and answers each request with a
line formatted as no JSON encoder would (spacing, key order, escapes), so that a relay which
re-encoded anything would be caught.  ``tools/call`` of ``emit`` also sends the client a request
and a notification of its own first; ``crash`` exits at once (exit code 3)."""

from __future__ import annotations

import json
import os
import sys

RECORD = os.environ["RECORD"]


def main() -> None:
    for raw in sys.stdin.buffer:
        with open(RECORD, "a", encoding="utf-8") as log:
            log.write(json.dumps(raw.decode("utf-8")) + "\n")
        message = json.loads(raw)
        if "method" not in message or "id" not in message:
            continue  # a notification, or the client's answer to our request
        rid = json.dumps(message["id"])
        if message["method"] == "tools/call":
            name = message["params"]["name"]
            if name == "crash":
                os._exit(3)
            if name == "emit":
                out(' {"method" :"roots/list","jsonrpc":"2.0" , "id":"srv-1"}')
                out('{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"caf\\u00e9"}}')
            out(
                f'{{"id" : {rid}, "result":{{"isError":false, "content":[{{"text":"called \\u0041 {name}","type":"text"}}]}},"jsonrpc":"2.0"}}'
            )
        elif message["method"] == "initialize":
            out(
                f'{{"jsonrpc":"2.0","id":{rid},"result":{{"protocolVersion":"2025-06-18","capabilities":{{"tools":{{}}}},'
                f'"serverInfo":{{"name":"recorder","version":"1"}}}}}}'
            )
        else:
            out(f'{{"result" :{{"echo": {json.dumps(message["method"])}, "n": 1.50}},  "id":{rid} ,"jsonrpc":"2.0"}}')


def out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
