"""A scripted stand-in for the Gemini API, as Gemini CLI calls it (``GOOGLE_GEMINI_BASE_URL``,
``POST /v1beta/models/<model>:streamGenerateContent?alt=sse``): every answer streams (SSE) one
``functionCall`` of the same shell command until the script's calls are spent, then a final
text.  It keeps every request of the agent's loop (those that offer tools), so a test reads
what reached the model (the function responses, the hook's context)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOOL = "run_shell_command"
COMMAND = "ls"


class ScriptedGemini:
    def __init__(self, calls: int, command: str = COMMAND) -> None:
        self.calls = calls
        self.command = command
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self._lock = threading.Lock()
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self._json({})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                with model._lock:
                    model.paths.append(self.path)
                if ":countTokens" in self.path:
                    self._json({"totalTokens": 10})
                    return
                answer = model.answer(body)
                if ":streamGenerateContent" not in self.path:
                    self._json(answer)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                self.wfile.write(f"data: {json.dumps(answer)}\r\n\r\n".encode())
                self.wfile.flush()
                self.close_connection = True

            def _json(self, value: Any) -> None:
                data = json.dumps(value).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedGemini:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        contents = body.get("contents") or []
        turns = sum(1 for c in contents if c.get("role") == "model")
        with self._lock:
            if body.get("tools"):  # the agent's own loop (not a side request of the CLI)
                self.requests.append(body)
        if body.get("tools") and turns < self.calls:
            parts: list[dict[str, Any]] = [
                {"functionCall": {"name": TOOL, "args": {"command": self.command, "description": "Run it"}}}
            ]
        else:
            parts = [{"text": "Done."}]
        return {
            "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
            "modelVersion": body.get("model", "gemini-2.5-flash"),
        }


def function_responses(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``functionResponse`` parts of a request's last user content."""
    for content in reversed(request.get("contents") or []):
        if content.get("role") == "user":
            return [p["functionResponse"] for p in content.get("parts") or [] if "functionResponse" in p]
    return []
