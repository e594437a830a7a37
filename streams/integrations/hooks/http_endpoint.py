"""``loopwatch hook --serve --http PORT``: Claude Code's HTTP hooks (``"type": "http"``), answered
by the serve process itself with the same handlers as the Unix socket.

Claude Code POSTs the hook input JSON to the hook's URL and reads the hook output from a 2xx
answer's body (an empty body is no output).  A non-2xx answer, an unreachable endpoint or a
timeout is, to Claude Code, a non-blocking hook error: the call runs.  So every decision of
loopwatch, including a fail-closed deny, is a 200; a 4xx is only for a request that is not a hook
input.  Codex CLI and Gemini CLI run command hooks only, so only Claude Code has a path here.

HTTP/1.1 with keep-alive (Claude Code's client reuses its connection), ``Content-Length``
bodies only, at most ``MAX_BODY`` bytes; an error is one line of text.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING

from .call import MAX_LINE, unavailable_output
from .sessions import PayloadError

if TYPE_CHECKING:
    from .serve import HookServer

log = logging.getLogger("loopwatch.hook")

ROUTES = {"/hooks/claude-code": "claude-code"}
"""The path of each CLI that has HTTP hooks, to the CLI's handler in ``HookServer.clis``."""
MAX_BODY = MAX_LINE
"""A hook input carries the tool's whole output: the same bound as the socket's request line."""
MAX_HEAD = 16 * 1024
IDLE_S = 120.0
"""A kept-alive connection that sends nothing for this long is closed."""
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 411: "Length Required"}
_REASONS |= {413: "Content Too Large", 431: "Request Header Fields Too Large", 500: "Internal Server Error"}


class HttpHookEndpoint:
    def __init__(self, hooks: HookServer, host: str, port: int, *, fail_closed: bool = False) -> None:
        self.hooks = hooks
        self.host = host
        self.port = port
        self.fail_closed = fail_closed
        self._server: asyncio.AbstractServer | None = None
        self._open: set[asyncio.StreamWriter] = set()

    @property
    def address(self) -> str:
        """``host:port`` as bound (the port the system chose for ``--http 0``)."""
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, self.host, self.port, limit=MAX_HEAD)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._open):  # kept-alive connections end with the server
                writer.close()
            await self._server.wait_closed()

    async def answer(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        """The status and body for one request."""
        cli = ROUTES.get(path.split("?", 1)[0])
        if cli is None:
            return 404, _line(f"no hook at {path[:80]!r}; Claude Code's is POST /hooks/claude-code")
        if method != "POST":
            return 405, _line(f"{method[:10]} {path[:80]}: a hook is a POST")
        from .serve import read_json

        payload: dict = {}
        try:
            payload = read_json(body)
            if not isinstance(payload, dict):
                raise PayloadError("the hook input is not a JSON object")
            output = await self.hooks.handle(cli, payload)
        except (PayloadError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
            return 400, _line(f"not a {cli} hook input: {exc}")
        except RecursionError:
            return 400, _line(f"not a {cli} hook input: nested too deep to read")
        except Exception as exc:  # noqa: BLE001 - Claude Code runs the call on a 5xx: only a 200 denies
            log.exception("HTTP hook request failed")
            if self.fail_closed:
                reason = f"loopwatch hook --serve failed: {type(exc).__name__}"
                output = unavailable_output(cli, payload, reason)
                return 200, json.dumps(output or {}, separators=(",", ":")).encode()
            return 500, _line(f"loopwatch hook --serve failed: {type(exc).__name__}")
        return 200, json.dumps(output or {}, separators=(",", ":")).encode()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        try:
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_S)
                except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                    return
                except (asyncio.LimitOverrunError, ValueError):
                    await _respond(writer, 431, _line(f"request head longer than {MAX_HEAD} bytes"), close=True)
                    return
                try:
                    method, path, version, headers = _parse_head(head)
                except _BadRequest as bad:
                    await _respond(writer, 400, _line(str(bad)), close=True)
                    return
                if "chunked" in headers.get("transfer-encoding", "").lower():
                    await _respond(writer, 411, _line("a hook body needs a Content-Length"), close=True)
                    return
                try:
                    length = int(headers.get("content-length", "0"))
                    if length < 0:
                        raise ValueError
                except ValueError:
                    await _respond(writer, 400, _line("Content-Length is not a length"), close=True)
                    return
                if length > MAX_BODY:
                    await _respond(writer, 413, _line(f"a hook body is at most {MAX_BODY} bytes"), close=True)
                    return
                try:
                    body = await asyncio.wait_for(reader.readexactly(length), IDLE_S)
                except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                    return
                status, out = await self.answer(method, path, body)
                connection = headers.get("connection", "").lower()
                close = connection == "close" or (version == "HTTP/1.0" and connection != "keep-alive")
                await _respond(writer, status, out, close=close, json_body=status == 200)
                if close:
                    return
        except Exception:  # noqa: BLE001 - one broken connection must not end the server
            log.exception("HTTP hook connection failed")
        finally:
            self._open.discard(writer)
            writer.close()


def _line(text: str) -> bytes:
    return (" ".join(text.split())[:300] + "\n").encode()


class _BadRequest(PayloadError):
    """A request head that is not HTTP/1.1: one line."""


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    """``(method, path, version, headers)`` (header names lower case)."""
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, path, version = lines[0].split(" ")
    except ValueError:
        raise _BadRequest("not an HTTP/1.1 request line") from None
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise _BadRequest(f"{version[:20]!r}: HTTP/1.1 only")
    headers = {}
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                raise _BadRequest(f"not a header line: {line[:60]!r}")
            headers[name.strip().lower()] = value.strip()
    return method, path, version, headers


async def _respond(
    writer: asyncio.StreamWriter, status: int, body: bytes, *, close: bool = False, json_body: bool = False
) -> None:
    kind = "application/json" if json_body else "text/plain; charset=utf-8"
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nContent-Type: {kind}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: {'close' if close else 'keep-alive'}\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
