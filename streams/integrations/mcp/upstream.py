"""The gateway's side towards one upstream MCP server: its spec (a stdio command, a URL, or a
server object in the same process) and a connection that survives the server crashing.

An ``mcp.Client`` must be entered and left in the same task (anyio's cancel scopes), so each
upstream's client lives in a task of its own (``_hold``); the gateway's request handlers only
borrow ``session`` and ask for a reconnect when the connection broke.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
import msgspec
from mcp import Client
from mcp.server import Server
from mcp.server.mcpserver import MCPServer
from mcp.shared.message import SessionMessage

from schemas.errors import LoopwatchError
from streams.edge.canonical import TooDeep

from .health import UpstreamHealth
from .jsonrpc import LINE_LIMIT, Oversize, envelope, healed_error, oversize_id, parse, read_line, too_big

log = logging.getLogger("loopwatch.mcp")

__all__ = ["Upstream", "UpstreamSpec", "UpstreamUnavailable", "unavailable"]


class UpstreamUnavailable(LoopwatchError):
    """The upstream server cannot be reached (not started, crashed, or unreachable)."""


@dataclass(frozen=True)
class UpstreamSpec:
    """One upstream server: ``command`` (argv, over stdio), ``url`` (streamable HTTP), or
    ``server``, an ``mcp`` ``Server`` or ``MCPServer`` object in the gateway's own process
    (connected in memory by ``mcp.Client(server)``: an embedding application's own tools, or a
    test's, behind the gateway without a process or a socket)."""

    name: str
    command: tuple[str, ...] = ()
    url: str | None = None
    server: Server | MCPServer | None = None
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    prefix: str = ""
    """Put before each of its tool and prompt names towards the agent (``""``: none)."""

    def __post_init__(self) -> None:
        if self.server is None and bool(self.command) == bool(self.url):
            raise ValueError(f"upstream {self.name!r}: give a command or a url, not both or neither")
        if self.server is not None and (self.command or self.url):
            raise ValueError(f"upstream {self.name!r}: give a server object alone, without a command or a url")
        if self.server is not None and not isinstance(self.server, (Server, MCPServer)):
            raise ValueError(
                f"upstream {self.name!r}: the server object must be an mcp Server or MCPServer, "
                f"not {type(self.server).__name__}"
            )

    @classmethod
    def parse(cls, text: str, *, name: str | None = None, prefix: str = "") -> UpstreamSpec:
        """``[name=]<url or command line>``: an http(s) URL, otherwise a shell-quoted command."""
        head, sep, rest = text.partition("=")
        if sep and head and head.replace("-", "").replace("_", "").isalnum() and " " not in head:
            name, text = name or head, rest
        text = text.strip()
        if text.startswith(("http://", "https://")):
            return cls(name=name or text, url=text, prefix=prefix)
        argv = tuple(shlex.split(text))
        if not argv:
            raise ValueError(f"upstream {text!r}: an empty command")
        return cls(name=name or os.path.basename(argv[0]), command=argv, prefix=prefix)

    def target(self, health: UpstreamHealth | None = None) -> Any:
        """What ``mcp.Client`` connects to: the URL, the server object, or the command over
        ``healing_stdio``."""
        if self.url:
            return self.url
        if self.server is not None:
            return self.server
        return healing_stdio(self, health or UpstreamHealth(self.name))

    @property
    def where(self) -> str:
        """The server, as a line names it: its URL, its command line, or the object in-process."""
        if self.url:
            return self.url
        if self.server is not None:
            return f"in-process {type(self.server).__name__}"
        return shlex.join(self.command)


MALFORMED = "io.loopwatch/malformedAnswer"
"""``data`` key of the JSON-RPC error ``healing_stdio`` answers in place of an answer too deep or
too big to read: the gateway fails that call as the relay does (an error result)."""

_encode = msgspec.json.Encoder().encode


@contextlib.asynccontextmanager
async def healing_stdio(spec: UpstreamSpec, health: UpstreamHealth) -> AsyncIterator[Any]:
    """The SDK's stdio transport, with the gateway's rules for what the server writes
    (``jsonrpc``): an invalid error object is healed into a JSON-RPC error, an answer nested too
    deep or too big to read is replaced by a JSON-RPC error for the request it answers (the call
    fails at once instead of timing out), a line that is not JSON-RPC is reported and dropped.
    The server inherits the gateway's environment (PATH, HOME), as an MCP host's servers do."""
    try:
        process = await asyncio.create_subprocess_exec(
            *spec.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, **spec.env},
            cwd=spec.cwd,
            limit=LINE_LIMIT,
        )
    except OSError as exc:
        raise UpstreamUnavailable(unavailable(spec, exc)) from None
    to_session, from_server = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    to_server, from_session = anyio.create_memory_object_stream[SessionMessage](0)

    async def read() -> None:
        async with to_session:
            while True:
                try:
                    line = await read_line(process.stdout)
                except (ConnectionError, OSError):
                    return
                if not line:
                    return
                item = _server_message(spec, health, line)
                if item is not None:
                    try:
                        await to_session.send(item)
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        return

    async def write() -> None:
        try:
            async with from_session:
                async for item in from_session:
                    text = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                    process.stdin.write(text.encode() + b"\n")
                    await process.stdin.drain()
        except (ConnectionError, OSError, RuntimeError, anyio.ClosedResourceError, anyio.BrokenResourceError):
            await to_session.aclose()  # the session sees the connection end, not a request hanging

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read)
        tasks.start_soon(write)
        try:
            yield from_server, to_server
        finally:
            with anyio.CancelScope(shield=True):
                await _stop_process(process)
            tasks.cancel_scope.cancel()


def _server_message(spec: UpstreamSpec, health: UpstreamHealth, line: bytes | Oversize) -> Any:
    """What the session gets for one line of the server: a message, an exception to report, or
    None (nothing: a blank line)."""
    if isinstance(line, Oversize):
        request_id, request = oversize_id(line)
        return _malformed(spec, health, None if request else request_id, too_big(line.size))
    if not line.strip():
        return None
    message, fault = parse(line)
    if fault == "deep":
        outer = envelope(line)
        request_id = outer.get("id") if isinstance(outer, dict) and "method" not in outer else None
        return _malformed(spec, health, request_id, TooDeep())
    health.heard()
    if isinstance(message, dict) and "id" in message:
        healed = healed_error(message, f"upstream MCP server {spec.name!r} failed: invalid JSON-RPC error")
        if healed is not None:
            health.invalid_answers += 1
            line = _encode(healed)
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


def _malformed(spec: UpstreamSpec, health: UpstreamHealth, request_id: Any, problem: Any) -> Any:
    health.heard()
    health.invalid_answers += 1
    if not isinstance(request_id, (str, int)) or isinstance(request_id, bool):
        return ValueError(f"upstream {spec.name}: a message was dropped: {problem}")
    error = types.JSONRPCError(
        jsonrpc="2.0",
        id=request_id,
        error=types.ErrorData(
            code=types.INTERNAL_ERROR, message=f"malformed answer: {problem}", data={MALFORMED: True}
        ),
    )
    return SessionMessage(error)


async def _stop_process(process: asyncio.subprocess.Process) -> None:
    """The stdio transport's way: stdin closed, then SIGTERM, then SIGKILL."""
    if process.returncode is not None:
        return
    with contextlib.suppress(Exception):
        process.stdin.close()
    for step in (None, process.terminate, process.kill):
        if step is not None:
            with contextlib.suppress(ProcessLookupError):
                step()
        try:
            await asyncio.wait_for(process.wait(), 2.0)
            return
        except TimeoutError:
            continue


class Upstream:
    """A held connection to one upstream server, reconnected on demand."""

    def __init__(
        self,
        spec: UpstreamSpec,
        *,
        connect_timeout: float,
        on_notification: Callable[[Any], Any] | None = None,
        health: UpstreamHealth | None = None,
    ) -> None:
        self.spec = spec
        self.connect_timeout = connect_timeout
        self._on_notification = on_notification
        self.client: Client | None = None
        self.error: BaseException | None = None
        self.tools: dict[str, types.Tool] = {}
        """The server's own tool names (unprefixed), as last listed."""
        self._ready = asyncio.Event()
        self._release = asyncio.Event()
        self._holder: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self.health = health or UpstreamHealth(spec.name)
        self.in_flight = 0
        """Calls sent to it and not answered yet."""
        self._restarting: asyncio.Task | None = None

    @property
    def capabilities(self) -> types.ServerCapabilities | None:
        return self.client.server_capabilities if self.client is not None else None

    async def start(self) -> None:
        """Connect (within ``connect_timeout``); ``UpstreamUnavailable`` when it cannot."""
        async with self._lock:
            await self._connect()
        if self.client is None:
            raise UpstreamUnavailable(self.describe())

    async def _connect(self) -> None:
        if self._holder is not None and not self._holder.done():
            return
        self._ready.clear()
        self._release.clear()
        self.client, self.error = None, None
        self._holder = asyncio.create_task(self._hold(), name=f"mcp-upstream-{self.spec.name}")
        try:
            await asyncio.wait_for(self._ready.wait(), self.connect_timeout)
        except TimeoutError:
            self.error = TimeoutError(f"no answer within {self.connect_timeout:g}s")
            await self._stop_holder()

    async def _hold(self) -> None:
        try:
            async with Client(self.spec.target(self.health), message_handler=self._message) as client:
                self.client = client
                self._ready.set()
                await self._release.wait()
        except BaseException as exc:  # noqa: BLE001 - told to the caller, never raised here
            if not isinstance(exc, asyncio.CancelledError):
                self.error = exc
                log.warning("upstream %s: %s", self.spec.name, _describe(exc))
        finally:
            self.client = None
            self._ready.set()

    async def _message(self, message: Any) -> None:
        # Exceptions the transport reports (a line that is not JSON-RPC) are logged, not forwarded.
        if isinstance(message, Exception):
            log.warning("upstream %s: %s", self.spec.name, _describe(message))
        elif self._on_notification is not None:
            await self._on_notification(self, message)

    async def session(self):
        """The live client session, reconnecting first when the connection is gone."""
        if self.client is None or self._holder is None or self._holder.done():
            async with self._lock:
                if self.client is None or self._holder is None or self._holder.done():
                    await self._stop_holder()
                    await self._connect()
        if self.client is None:
            raise UpstreamUnavailable(self.describe())
        return self.client.session

    async def broken(self) -> None:
        """The connection failed under a call: drop it, the next call reconnects."""
        async with self._lock:
            await self._stop_holder()

    async def _stop_holder(self) -> None:
        holder, self._holder = self._holder, None
        if holder is None:
            return
        self._release.set()
        try:
            await asyncio.wait_for(asyncio.shield(holder), 5.0)
        except (TimeoutError, Exception):  # noqa: BLE001 - a server that will not close is killed
            holder.cancel()
            await asyncio.gather(holder, return_exceptions=True)
        self.client = None

    async def close(self) -> None:
        if self._restarting is not None:
            self._restarting.cancel()
            await asyncio.gather(self._restarting, return_exceptions=True)
        async with self._lock:
            await self._stop_holder()

    def timed_out(self) -> None:
        """A call to it timed out: restart it in the background once ``health`` says so."""
        reason = self.health.timed_out()
        if reason is not None and (self._restarting is None or self._restarting.done()):
            self._restarting = asyncio.ensure_future(self._restart(reason))

    async def _restart(self, reason: str) -> None:
        async with self._lock:
            delay = self.health.restarting(reason, "restarted" if self.spec.command else "reconnected")
            await self._stop_holder()
            if delay:
                await asyncio.sleep(delay)
            await self._connect()

    async def list_tools(self) -> list[types.Tool]:
        session = await self.session()
        tools: list[types.Tool] = []
        cursor = None
        while True:
            page = await session.list_tools(cursor=cursor) if cursor else await session.list_tools()
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        self.tools = {tool.name: tool for tool in tools}
        return tools

    def describe(self) -> str:
        return unavailable(self.spec, self.error)


def unavailable(spec: UpstreamSpec, error: BaseException | None) -> str:
    """Why a call could not reach the upstream server ``spec``: one line."""
    reason = _describe(error) if error is not None else "not connected"
    return f"upstream MCP server {spec.name!r} ({spec.where}) is unavailable: {reason}"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return str(exc) or type(exc).__name__
