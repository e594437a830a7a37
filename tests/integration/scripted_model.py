"""A scripted stand-in for the Anthropic Messages API, as Claude Code calls it
(``ANTHROPIC_BASE_URL``): every answer streams (SSE) one ``tool_use`` of the same Bash command
until the script's calls are spent, then a final text.  It keeps every request it was sent, so
a test reads what reached the model (the tool results, the hook's context)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

COMMAND = "ls"


class ScriptedModel:
    def __init__(self, calls: int, command: str | None = None) -> None:
        self.calls = calls
        self.command = COMMAND if command is None else command  # COMMAND read now: tests patch it
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
                self.send_response(200)
                self.end_headers()

            def do_GET(self) -> None:  # noqa: N802
                self._json({})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if not self.path.startswith("/v1/messages") or "count_tokens" in self.path:
                    self._json({"input_tokens": 1})
                    return
                self._stream(model.answer(body))

            def _json(self, value: Any) -> None:
                data = json.dumps(value).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, events: list[dict[str, Any]]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()
                for event in events:
                    self.wfile.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedModel:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        messages = body.get("messages") or []
        turns = sum(1 for m in messages if m.get("role") == "assistant")
        with self._lock:
            if body.get("tools"):  # the agent's own loop (not a side request of the CLI)
                self.requests.append(body)
        if body.get("tools") and turns < self.calls:
            block = {"type": "tool_use", "id": f"toolu_{turns + 1:04d}", "name": "Bash", "input": {}}
            args = json.dumps({"command": self.command, "description": "List files"})
            deltas = [{"type": "input_json_delta", "partial_json": args}]
            stop = "tool_use"
        else:
            block = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": "Done."}]
            stop = "end_turn"
        usage = {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        return [
            {
                "type": "message_start",
                "message": {
                    "id": f"msg_{turns + 1:04d}",
                    "type": "message",
                    "role": "assistant",
                    "model": body.get("model", "claude-sonnet-4-5"),
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": usage,
                },
            },
            {"type": "content_block_start", "index": 0, "content_block": block},
            *({"type": "content_block_delta", "index": 0, "delta": d} for d in deltas),
            {"type": "content_block_stop", "index": 0},
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 5},
            },
            {"type": "message_stop"},
        ]


def tool_results(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``tool_result`` blocks of a request's last user message."""
    for message in reversed(request.get("messages") or []):
        if message.get("role") == "user" and isinstance(message.get("content"), list):
            return [b for b in message["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
    return []


def text_of(value: Any) -> str:
    """All the text in a message part (strings, text blocks, nested content)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(text_of(v) for v in value)
    if isinstance(value, dict):
        return "\n".join(text_of(v) for k, v in value.items() if k in ("text", "content"))
    return ""


def seen_per_call(requests: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
    """Per call, in order (each request after the first answers the call before it): the tool
    result the model got, and all the text of the message that carried it."""
    seen = []
    for n, request in enumerate(requests[1:], start=1):
        results = tool_results(request)
        assert [r.get("tool_use_id") for r in results] == [f"toolu_{n:04d}"], results
        last_user = next(m for m in reversed(request["messages"]) if m.get("role") == "user")
        seen.append((results[0], text_of(last_user["content"])))
    return seen
