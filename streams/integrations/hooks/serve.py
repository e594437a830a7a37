"""``loopwatch hook --serve``: one ``LoopwatchClient`` (one Kafka connection) answering the
per-call hook commands of every supported CLI over a Unix socket, one JSON line each way (``call``),
and, with ``--http``, Claude Code's HTTP hooks (``http_endpoint``) with the same handlers."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import stat
import sys
from typing import Any

from streams.client import LoopwatchClient
from streams.edge.canonical import TooDeep, text_exceeds_depth

from .call import MAX_LINE
from .claude_code import ClaudeCodeHooks
from .codex import CodexHooks
from .gemini import GeminiHooks
from .relay import MAGIC
from .sessions import PayloadError

log = logging.getLogger("loopwatch.hook")


class HookServer:
    def __init__(self, client: LoopwatchClient, path: str, *, agent_id: str | None = None) -> None:
        """``agent_id``: the agent id of every run, or None for each CLI's own name."""
        self.client = client
        self.path = path
        self.clis: dict[str, ClaudeCodeHooks | GeminiHooks] = {
            "claude-code": ClaudeCodeHooks(client, agent_id=agent_id or "claude-code"),
            "codex": CodexHooks(client, agent_id=agent_id or "codex"),
            "gemini": GeminiHooks(client, agent_id=agent_id or "gemini-cli"),
        }
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        _clear_stale_socket(self.path)
        self._server = await asyncio.start_unix_server(self._connection, path=self.path, limit=MAX_LINE + 1)
        os.chmod(self.path, 0o600)  # the socket is the user's own: hook payloads carry tool output

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    async def answer(self, line: bytes) -> dict[str, Any]:
        try:
            request = read_json(line)
            if not isinstance(request, dict) or not isinstance(request.get("payload"), dict):
                raise PayloadError('a request is {"cli": ..., "payload": {...}}')
            return {"output": await self.handle(str(request.get("cli")), request["payload"])}
        except (PayloadError, ValueError) as exc:
            return {"error": str(exc)[:300]}

    async def handle(self, cli: str, payload: dict) -> dict | None:
        """The CLI's hook output for one hook input, whichever way it came (socket or HTTP)."""
        hooks = self.clis.get(cli)
        if hooks is None:
            raise PayloadError(f"unknown cli {cli[:40]!r}")
        return await hooks.handle(payload)

    async def relayed(self, cli: bytes, body: bytes) -> bytes:
        """The answer to the relay (``relay``): ``O`` and the hook output, ``X`` when the input
        is not a JSON object, ``E`` for any other refusal."""
        if text_exceeds_depth(body):  # before json, which recurses once per level
            return b"E" + f"refused: {TooDeep()}".encode()
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError) as exc:
            return b"X" + f"not a JSON object: {str(exc)[:200]}".encode()
        if not isinstance(payload, dict):
            return b"X" + b"not a JSON object"
        try:
            output = await self.handle(cli.decode("ascii", "replace"), payload)
        except (PayloadError, ValueError) as exc:
            return b"E" + str(exc)[:300].encode()
        return b"O" + (json.dumps(output, separators=(",", ":")).encode() if output is not None else b"")

    async def _relay(self, cli: bytes, reader: asyncio.StreamReader) -> bytes:
        chunks, size = [], 0
        while chunk := await reader.read(65536):
            size += len(chunk)
            if size > MAX_LINE:
                return b"X" + f"longer than {MAX_LINE} bytes".encode()
            chunks.append(chunk)
        return await self.relayed(cli, b"".join(chunks))

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            answer: dict[str, Any] | None = None
            try:
                line = await reader.readline()
            except (asyncio.LimitOverrunError, ValueError):
                line, answer = b"", {"error": f"request longer than {MAX_LINE} bytes"}
            if line.startswith(MAGIC):
                out = await self._relay(line[len(MAGIC) :].strip(), reader)
            else:
                if answer is None:
                    answer = await self.answer(line) if line else {"error": "empty request"}
                out = json.dumps(answer, separators=(",", ":")).encode() + b"\n"
            writer.write(out)
            await writer.drain()
        except Exception:  # noqa: BLE001 - one broken connection must not end the server
            log.exception("hook request failed")
        finally:
            writer.close()


def read_json(data: bytes) -> Any:
    """``data`` decoded, refusing nesting deeper than loopwatch reads (``ValueError``)."""
    if text_exceeds_depth(data):
        raise PayloadError(f"refused: {TooDeep()}")
    return json.loads(data)


def _clear_stale_socket(path: str) -> None:
    """A socket file left by a process that is gone is removed; anything else is refused."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise FileExistsError(f"{path} exists and is not a socket")
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError:
            os.unlink(path)
            return
    raise FileExistsError(f"another loopwatch hook --serve is answering on {path}")


async def serve(args: Any) -> int:
    client = LoopwatchClient(
        args.bootstrap,
        timeout=args.timeout,
        fail_closed=args.fail_closed,
        tool_calls_topic=args.tool_calls_topic,
        verdicts_topic=args.verdicts_topic,
        start_timeout=args.start_timeout,
        **args.kafka_options,
    )
    await client.start()
    server = HookServer(client, args.socket, agent_id=args.agent_id)
    endpoint = None
    try:
        await server.start()
        where = args.socket
        if args.http is not None:
            from .http_endpoint import HttpHookEndpoint

            endpoint = HttpHookEndpoint(
                server, args.http_host, args.http, token=args.http_token, fail_closed=args.fail_closed
            )
            await endpoint.start()
            where += f" and http://{endpoint.address}/hooks/claude-code (bearer token: {args.http_token_where})"
        how = "closed: a tool call is denied" if args.fail_closed else "open: a tool call runs"
        print(
            f"loopwatch hook: serving on {where} (Kafka {args.bootstrap}); fails {how} "
            f"when loopwatch does not answer within {args.timeout}s",
            flush=True,
        )
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        await stopping.wait()
    finally:
        if endpoint is not None:
            await endpoint.close()
        await server.close()
        await client.stop()
    return 0


def main(args: Any) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    return asyncio.run(serve(args))
