"""A TCP proxy in front of the test broker that a test can cut and restore.

Kafka clients connect to the bootstrap address only to learn the cluster: the metadata
response names each broker by its advertised address (here the broker's own
``127.0.0.1:<port>``), and every later connection (fetches, produces, the group
coordinator found by FindCoordinator) goes there directly.  A plain proxy would only carry
the bootstrap request, and cutting it would cut nothing.  This one rewrites the broker's
advertised port to its own in every response frame it relays, so each connection a client
opens passes through it, and ``cut()`` really separates the client from the broker.

The proxy runs its own event loop in a thread, so tests may block (``wait_ready``) while it
relays.
"""

from __future__ import annotations

import asyncio
import struct
import threading

__all__ = ["KafkaCutProxy"]


class KafkaCutProxy:
    def __init__(self, broker: str) -> None:
        host, _, port = broker.rpartition(":")
        self.broker_host, self.broker_port = host, int(port)
        self.port = 0
        self.connections = 0
        """Client connections accepted and relayed (not counting those refused while cut)."""
        self.rewrites = 0
        """Response frames in which the broker's address was replaced by the proxy's."""
        self._open = True
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kafka-cut-proxy", daemon=True)
        self._server: asyncio.AbstractServer | None = None

    @property
    def address(self) -> str:
        return f"{self.broker_host}:{self.port}"

    def start(self) -> KafkaCutProxy:
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._accept, self.broker_host, 0))
        self.port = self._server.sockets[0].getsockname()[1]
        # The advertised address as it appears in a response: the host string, then the
        # port as a big-endian int32.  The proxy listens on the same host, so only the port
        # bytes change and no length prefix has to be rewritten.
        host = self.broker_host.encode()
        self._find = host + struct.pack(">i", self.broker_port)
        self._replace = host + struct.pack(">i", self.port)
        return self

    def cut(self) -> None:
        """Close every relayed connection and refuse new ones until ``restore()``."""
        self._call(self._cut())

    def restore(self) -> None:
        self._open = True

    def stop(self) -> None:
        if self._server is not None:
            self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    async def _close(self) -> None:
        # On the proxy's own loop: asyncio's Server is not thread-safe, and closing it from the
        # test's thread raced the loop detaching the transports _cut aborts (Python 3.11's
        # Server._wakeup then ran twice: TypeError in a fresh-clone run).
        await self._cut()
        self._server.close()

    async def _cut(self) -> None:
        self._open = False
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if not self._open:
            client_w.transport.abort()
            return
        try:
            broker_r, broker_w = await asyncio.open_connection(self.broker_host, self.broker_port)
        except OSError:
            client_w.transport.abort()
            return
        self.connections += 1
        self._writers.update((client_w, broker_w))
        try:
            await asyncio.gather(self._requests(client_r, broker_w), self._responses(broker_r, client_w))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for writer in (client_w, broker_w):
                self._writers.discard(writer)
                writer.transport.abort()

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.transport.abort()

    async def _responses(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Whole frames (int32 size, then the response), so an address split between two
        # reads is still found.
        while True:
            size = await reader.readexactly(4)
            body = await reader.readexactly(struct.unpack(">i", size)[0])
            if self._find in body:
                body = body.replace(self._find, self._replace)
                self.rewrites += 1
            writer.write(size + body)
            await writer.drain()
