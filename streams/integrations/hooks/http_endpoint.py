"""``loopwatch hook --serve --http PORT``: Claude Code's HTTP hooks (``"type": "http"``), answered
by the serve process itself with the same handlers as the Unix socket.

Claude Code POSTs the hook input JSON to the hook's URL and reads the hook output from a 2xx
answer's body (an empty body is no output).  A non-2xx answer, an unreachable endpoint or a
timeout is, to Claude Code, a non-blocking hook error: the call runs.  So every decision of
loopwatch, including a fail-closed deny, is a 200; a 4xx is only for a request that is not a hook
input.  Codex CLI and Gemini CLI run command hooks only, so only Claude Code has a path here.

HTTP/1.1 with keep-alive (Claude Code's client reuses its connection), ``Content-Length``
bodies only, at most ``MAX_BODY`` bytes; an error is one line of text.

Every request must carry ``Authorization: Bearer <token>`` (``http_token``): a loopback port is
open to every local process, unlike the user's own socket.  Anything else is a 401, logged in
one line, and the connection is closed.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import secrets
import stat
from typing import TYPE_CHECKING

from .call import MAX_LINE, TOKEN_ENV, default_token_file, unavailable_output
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
MIN_TOKEN = 16
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed"}
_REASONS |= {
    411: "Length Required",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}


class TokenError(PayloadError):
    """A bearer token that cannot be used: one line."""


def http_token(path: str | None = None) -> tuple[str, str]:
    """The endpoint's bearer token and where it came from: the file ``path`` when given, else
    ``$LOOPWATCH_HOOK_TOKEN``, else the per-user file ``default_token_file()``.  A file that does
    not exist is made (mode 0600) with a fresh random token; one that exists must be the user's
    own and unreadable by others, since the runtime directory may be ``/tmp``."""
    if path is None:
        env = os.environ.get(TOKEN_ENV)
        if env:
            return _checked(env.strip(), f"${TOKEN_ENV}"), f"${TOKEN_ENV}"
        path = default_token_file()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return _read_token_file(path), path
    except OSError as exc:
        raise TokenError(f"cannot make the token file {path}: {exc.strerror or exc}") from None
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(token + "\n")
    return token, path


def _read_token_file(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise TokenError(f"cannot read the token file {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise TokenError(f"the token file {path} must be a file of this user's that only it can read (chmod 600)")
        raw = f.read(4096)
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        text = ""
    return _checked(text, path)


def _checked(token: str, where: str) -> str:
    if len(token) < MIN_TOKEN or not token.isprintable() or not token.isascii() or " " in token:
        raise TokenError(f"the token in {where} must be at least {MIN_TOKEN} printable ASCII characters, no spaces")
    return token


class HttpHookEndpoint:
    def __init__(self, hooks: HookServer, host: str, port: int, *, token: str, fail_closed: bool = False) -> None:
        """``token``: the bearer token every request must carry."""
        self.hooks = hooks
        self._token = token.encode("ascii")
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

    def refusal(self, authorization: str) -> str | None:
        """Why a request with this ``Authorization`` header is refused, or None."""
        scheme, _, credentials = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            return "no bearer token"
        # In constant time, so that the answer's timing does not give the token away bit by bit.
        if not hmac.compare_digest(credentials.strip().encode("latin-1"), self._token):
            return "wrong bearer token"
        return None

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
                refused = self.refusal(headers.get("authorization", ""))
                if refused is not None:
                    peer = writer.get_extra_info("peername")
                    log.warning("refused an HTTP hook request from %s: %s (401)", _peer(peer), refused)
                    await _respond(writer, 401, _line(f"{refused}: {_AUTH_HINT}"), close=True)
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


_AUTH_HINT = f"send Authorization: Bearer <token> (hook --serve's ${TOKEN_ENV} or token file)"


def _peer(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


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
        + ("WWW-Authenticate: Bearer\r\n" if status == 401 else "")
        + f"Content-Length: {len(body)}\r\nConnection: {'close' if close else 'keep-alive'}\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
