"""A scripted stand-in for the OpenAI Responses API, as Codex CLI calls it (a custom model
provider's ``base_url``, ``POST /v1/responses``, streamed): every answer streams (SSE) one
``function_call`` of ``exec_command`` with the same shell command until the script's calls are
spent, then a final message.  It keeps every request of the agent's loop, so a test reads what
reached the model (the function call outputs, the hook's context)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOOL = "exec_command"
COMMAND = "ls"


class ScriptedResponses:
    def __init__(self, calls: int, command: str = COMMAND) -> None:
        self.calls = calls
        self.command = command
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self._send("application/json", b'{"object": "list", "data": []}')

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if not self.path.rstrip("/").endswith("/responses"):
                    self._send("application/json", b"{}")
                    return
                events = model.answer(body)
                data = b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)
                self._send("text/event-stream", data)

            def _send(self, kind: str, data: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedResponses:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        items = [i for i in body.get("input") or [] if isinstance(i, dict)]
        calls = sum(1 for i in items if i.get("type") == "function_call")
        with self._lock:
            self.requests.append(body)
        n = calls + 1
        if calls < self.calls:
            item: dict[str, Any] = {
                "type": "function_call",
                "id": f"fc_{n:04d}",
                "call_id": f"call_{n:04d}",
                "name": TOOL,
                "arguments": json.dumps({"cmd": self.command}),
                "status": "completed",
            }
        else:
            item = {
                "type": "message",
                "id": f"msg_{n:04d}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Done.", "annotations": []}],
            }
        usage = {
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 15,
        }
        rid = f"resp_{n:04d}"
        return [
            {"type": "response.created", "response": {"id": rid, "object": "response", "status": "in_progress"}},
            {"type": "response.output_item.added", "output_index": 0, "item": item},
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            {
                "type": "response.completed",
                "response": {"id": rid, "object": "response", "status": "completed", "output": [item], "usage": usage},
            },
        ]


def call_outputs(request: dict[str, Any]) -> dict[str, str]:
    """Every ``function_call_output`` of a request's input, by call id."""
    return {
        i["call_id"]: i.get("output") if isinstance(i.get("output"), str) else json.dumps(i.get("output"))
        for i in request.get("input") or []
        if isinstance(i, dict) and i.get("type") == "function_call_output"
    }


def around_call(request: dict[str, Any], call_id: str) -> str:
    """The input items from ``call_id``'s function call up to the next call, as JSON text:
    its output and what Codex CLI put beside it (a hook's context is a developer message)."""
    items = [i for i in request.get("input") or [] if isinstance(i, dict)]
    at = next(n for n, i in enumerate(items) if i.get("type") == "function_call" and i.get("call_id") == call_id)
    end = next((n for n in range(at + 1, len(items)) if items[n].get("type") == "function_call"), len(items))
    return json.dumps(items[at + 1 : end])
