"""The gateway's side towards one upstream MCP server: its spec (a stdio command or a URL) and a
connection that survives the server crashing.

An ``mcp.Client`` must be entered and left in the same task (anyio's cancel scopes), so each
upstream's client lives in a task of its own (``_hold``); the gateway's request handlers only
borrow ``session`` and ask for a reconnect when the connection broke.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from mcp import Client, StdioServerParameters

from schemas.errors import LoopwatchError

log = logging.getLogger("loopwatch.mcp")

__all__ = ["Upstream", "UpstreamSpec", "UpstreamUnavailable", "unavailable"]


class UpstreamUnavailable(LoopwatchError):
    """The upstream server cannot be reached (not started, crashed, or unreachable)."""


@dataclass(frozen=True)
class UpstreamSpec:
    """One upstream server: ``command`` (argv, over stdio) or ``url`` (streamable HTTP)."""

    name: str
    command: tuple[str, ...] = ()
    url: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    prefix: str = ""
    """Put before each of its tool and prompt names towards the agent (``""``: none)."""

    def __post_init__(self) -> None:
        if bool(self.command) == bool(self.url):
            raise ValueError(f"upstream {self.name!r}: give a command or a url, not both or neither")

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

    def target(self) -> StdioServerParameters | str:
        if self.url:
            return self.url
        # The server inherits the gateway's environment (PATH, HOME), as an MCP host's servers do.
        return StdioServerParameters(
            command=self.command[0], args=list(self.command[1:]), env={**os.environ, **self.env}, cwd=self.cwd
        )


class Upstream:
    """A held connection to one upstream server, reconnected on demand."""

    def __init__(
        self, spec: UpstreamSpec, *, connect_timeout: float, on_notification: Callable[[Any], Any] | None = None
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
            async with Client(self.spec.target(), message_handler=self._message) as client:
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
        async with self._lock:
            await self._stop_holder()

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
    where = spec.url or shlex.join(spec.command)
    reason = _describe(error) if error is not None else "not connected"
    return f"upstream MCP server {spec.name!r} ({where}) is unavailable: {reason}"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return str(exc) or type(exc).__name__
