"""The agent-facing stdio wire: this process's stdin and stdout as pipes the event loop reads and
writes itself, for the relay (``relay.py``) as they are, for the SDK's ``stdio_server`` wrapped.

``stdio_server()`` without arguments reads stdin and writes stdout through worker threads
(``anyio.wrap_file``): two thread hand-offs per message, the larger part of what the gateway
added to a call in ``make bench-gateway`` (docs/benchmarks.md).  It takes any
async line source and writer instead, so it gets asyncio's own pipe transports here; a stdin
the event loop cannot poll (a regular file) falls back to the SDK's threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator

from .jsonrpc import LINE_LIMIT, Oversize, read_line, refusal, too_big

__all__ = ["agent_pipes", "agent_stdio"]

log = logging.getLogger("loopwatch.mcp")


class _Lines:
    """The agent's lines for the SDK's server; one over ``LINE_LIMIT`` is answered here (a
    request gets its JSON-RPC error) and never reaches it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    def __aiter__(self) -> _Lines:
        return self

    async def __anext__(self) -> str:
        while True:
            line = await read_line(self._reader)
            if not isinstance(line, Oversize):
                break
            answer = refusal(line)
            if answer is None:
                log.warning("a message of the agent was dropped: %s", too_big(line.size))
            else:
                self._writer.write(answer)
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", "replace")


class _Writer:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    async def write(self, text: str) -> None:
        self._writer.write(text.encode("utf-8"))

    async def flush(self) -> None:
        await self._writer.drain()


@contextlib.asynccontextmanager
async def agent_pipes() -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter] | None]:
    """``(reader, writer)`` over this process's stdin and stdout, or None when stdin is not a
    pipe, socket or terminal the event loop can poll.  While it is open, fd 1 points at stderr,
    so stray output cannot corrupt the wire."""
    loop = asyncio.get_running_loop()
    wire_in, wire_out = os.dup(0), os.dup(1)
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    try:
        read_transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(wire_in, "rb", buffering=0)
        )
    except (OSError, ValueError):
        os.close(wire_in)
        os.close(wire_out)
        yield None
        return
    write_transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(wire_out, "wb", buffering=0)
    )
    writer = asyncio.StreamWriter(write_transport, protocol, None, loop)
    saved_stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        yield reader, writer
    finally:
        os.dup2(saved_stdout, 1)
        os.close(saved_stdout)
        write_transport.close()
        read_transport.close()


@contextlib.asynccontextmanager
async def agent_stdio() -> AsyncIterator[tuple]:
    """``(read_stream, write_stream)`` for the SDK's ``Server.run`` over stdin and stdout."""
    from mcp.server.stdio import stdio_server

    async with agent_pipes() as pipes:
        if pipes is None:  # not pollable: the SDK's own threads
            async with stdio_server() as streams:
                yield streams
            return
        reader, writer = pipes
        async with stdio_server(_Lines(reader, writer), _Writer(writer)) as streams:
            yield streams
