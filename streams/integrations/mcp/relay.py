"""The stdio relay: ``loopwatch mcp-gateway`` in front of one stdio upstream server, the setup an
MCP client's config puts it in (``command: loopwatch mcp-gateway --upstream <server>``).

Every JSON-RPC message is passed on as the bytes it arrived as, in both directions: the
handshake (or the 2026-07-28 per-request ``_meta``), lists, resources, prompts, completions,
progress, cancellation, the server's own requests to the client (sampling, elicitation, roots)
and their answers.  Ids are not rewritten: agent and upstream are the only two ends.  The
relay reads what it must and no more:

* a ``tools/call`` request is guarded (``runs.GuardedRun``: gate or advisory, refusals and
  notices exactly as the SDK gateway's) and forwarded unchanged, or answered by the relay;
* its answer is validated as the SDK validates a ``CallToolResult`` and hashed from the same
  canonical form (``outcome.edge_outcome`` of the SDK's model); it is passed on unchanged
  unless loopwatch appends a notice;
* ``tools/list`` answers are read for the server's tool names (the unknown-tool outcome);
* ``initialize``, ``notifications/initialized`` and ``server/discover`` are kept, to be
  replayed to an upstream started again after a crash (their answers then stay here).

Every line in both directions is first held to the gateway's line rules (``jsonrpc.py``: too
deep or too big fails only that message; an invalid error object is healed), and an upstream
that stops answering is started again with backoff (``health.py``).

Why not the SDK's server and client back to back (``gateway.py``, still used for HTTP, several
upstreams or prefixes): each SDK hop validates and re-serialises every message, about 1 ms at
p50 on this project's machines, which is the whole per-call budget this gives the gateway
(docs/benchmarks.md).  What the relay does not parse it cannot change either.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shlex
import uuid
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
import msgspec
from pydantic import ValidationError

from streams.client import LoopwatchClient
from streams.edge.canonical import JSON_DEPTH_LIMIT, TooDeep
from streams.edge.hashing import ThrownError, unknown_tool_name

from .gateway import RUN_ID_META, GatewayOptions, agent_name, identity, upstream_failed
from .jsonrpc import (
    LINE_LIMIT,
    Oversize,
    envelope,
    healed_error,
    oversize_id,
    parse,
    read_line,
    refusal,
    request_key,
    too_big,
)
from .outcome import edge_outcome, unknown_tool_error
from .runs import GuardedRun, KafkaLink, UnguardedRun
from .upstream import UpstreamUnavailable, unavailable

log = logging.getLogger("loopwatch.mcp")

__all__ = ["Relay", "relays"]

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
_HANDSHAKE = frozenset({"initialize", "server/discover", "notifications/initialized"})
_CLIENT_INFO_META = "io.modelcontextprotocol/clientInfo"
_VERSION_META = "io.modelcontextprotocol/protocolVersion"
"""Present on every request of the 2026-07-28 (sessionless) era, whose results carry ``resultType``."""


def relays(options: GatewayOptions) -> bool:
    """Whether a stdio gateway with these options is a relay: one upstream, a command, no prefix."""
    return (
        options.relay
        and len(options.upstreams) == 1
        and bool(options.upstreams[0].command)
        and not options.upstreams[0].prefix
    )


@dataclass(eq=False)
class _Call:
    run: GuardedRun | UnguardedRun
    name: str
    args: Any
    call_id: str
    notice: str | None
    modern: bool
    """The request came in the 2026-07-28 era: a result the relay writes says ``resultType``."""
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class Relay:
    def __init__(self, options: GatewayOptions, *, client: LoopwatchClient | None = None) -> None:
        if not relays(options):
            raise ValueError("the relay takes one upstream command without a prefix")
        self.options = options
        self.spec = options.upstreams[0]
        self.link = KafkaLink(options, client)
        self._publishing: set[asyncio.Future] = set()
        self._runs: dict[str, GuardedRun] = {}
        self._default_run = options.run_id or f"mcp-{uuid.uuid4().hex[:16]}"
        self._agent_name: str | None = None
        self._call_ids = itertools.count(1)
        self._calls: dict[Any, _Call] = {}
        """The agent's tools/call requests the upstream has not answered, by request id."""
        self._requests: dict[Any, tuple[str, bool]] = {}
        """Its other requests in flight upstream: (method, has a cursor), by request id."""
        self._resumable: dict[str, str] = {}
        """A multi-round call's ``requestState`` -> its tool call id (its retry is the same call)."""
        self._handshake: dict[str, dict] = {}
        self._replayed: set[str] = set()
        self._replay_ids = itertools.count(1)
        self._replay_prefix = f"loopwatch-{uuid.uuid4().hex[:8]}-"
        self.tools: set[str] | None = None
        """The upstream's tool names, as last listed to the agent (None: never listed)."""
        self._process: asyncio.subprocess.Process | None = None
        self._live = False
        """The upstream's output has not ended (a process can be unreaped a while after that)."""
        self._reader: asyncio.Task | None = None
        self._spawning = asyncio.Lock()
        self._gated: set[asyncio.Task] = set()
        self._agent_out: asyncio.StreamWriter | None = None
        self._stopping = False
        self._heard = False
        """The upstream has written something (an upstream that exits before is not a server)."""
        self._exited_at_start = asyncio.Event()
        self.exit_at_start: str | None = None
        """Why the upstream ended at start: one line."""
        self.health = options.upstream_health(self.spec.name)
        self._restarting: asyncio.Task | None = None

    @property
    def client(self) -> LoopwatchClient:
        """The runner client (a new one once Kafka is reached after a failed start)."""
        return self.link.client

    # -- life cycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the runner client and the upstream server (``UpstreamUnavailable`` when its
        command cannot be started)."""
        await self.link.start()
        try:
            await self._spawn()
        except UpstreamUnavailable:
            await self.link.stop()
            raise

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Relay until the agent closes its side; then its runs end (``session closed``).
        ``UpstreamUnavailable`` when the upstream exits at start, before it said anything: a
        server that cannot start does not start on the agent's next message either."""
        self._agent_out = writer
        relaying = asyncio.ensure_future(self._relay_agent(reader))
        exited = asyncio.ensure_future(self._exited_at_start.wait())
        await asyncio.wait([relaying, exited], return_when=asyncio.FIRST_COMPLETED)
        exited.cancel()
        if relaying.done():
            relaying.result()
            return
        relaying.cancel()
        await asyncio.gather(relaying, return_exceptions=True)
        await self._session_closed()
        assert self.exit_at_start is not None
        raise UpstreamUnavailable(self.exit_at_start)

    async def _relay_agent(self, reader: asyncio.StreamReader) -> None:
        while True:
            line = await read_line(reader)
            if isinstance(line, Oversize):
                self._refuse_oversize(line)
                continue
            if not line:
                break
            if line.strip():
                await self._from_agent(line)
        await self._session_closed()

    async def stop(self) -> None:
        self._stopping = True
        if self._restarting is not None:
            self._restarting.cancel()
            await asyncio.gather(self._restarting, return_exceptions=True)
        await self._session_closed()
        await self._stop_upstream()
        if self._publishing:
            await asyncio.wait(set(self._publishing))
        await self.link.stop()

    async def _session_closed(self) -> None:
        for task in list(self._gated):
            task.cancel()
        if self._gated:
            await asyncio.gather(*self._gated, return_exceptions=True)
        for call in self._calls.values():
            if call.timer is not None:
                call.timer.cancel()
        self._calls.clear()
        runs, self._runs = self._runs, {}
        for run in runs.values():
            await run.end("session closed")

    # -- the upstream process -----------------------------------------------------------------------

    async def _spawn(self) -> None:
        try:
            process = await asyncio.create_subprocess_exec(
                *self.spec.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env={**os.environ, **self.spec.env},
                cwd=self.spec.cwd,
                limit=LINE_LIMIT,
            )
        except OSError as exc:
            raise UpstreamUnavailable(unavailable(self.spec, exc)) from None
        self._process, self._live = process, True
        self._reader = asyncio.create_task(self._read_upstream(process), name=f"mcp-relay-{self.spec.name}")
        for _method, message in self._handshake.items():  # a server started again: the agent's handshake
            if "id" in message:
                replay_id = f"{self._replay_prefix}{next(self._replay_ids)}"
                self._replayed.add(replay_id)
                message = {**message, "id": replay_id}
            process.stdin.write(_encode(message) + b"\n")

    def _alive(self) -> bool:
        process = self._process
        return self._live and process is not None and process.returncode is None and not process.stdin.is_closing()

    async def _ensure_upstream(self) -> None:
        """Start the upstream (again) when it is gone; ``UpstreamUnavailable`` when it cannot."""
        if not self._alive():
            async with self._spawning:
                if not self._alive():
                    await self._stop_upstream()
                    await self._spawn()

    async def _to_upstream(self, line: bytes) -> None:
        """Write ``line`` to the running upstream (``_ensure_upstream`` first)."""
        stdin = self._process.stdin
        try:
            stdin.write(line if line.endswith(b"\n") else line + b"\n")
            await stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise UpstreamUnavailable(unavailable(self.spec, exc)) from None

    async def _stop_upstream(self) -> None:
        """Stop the upstream process, the stdio transport's way: stdin closed, then signals.  Its
        output is read to the end first, so nothing it answered is lost; what it never answered
        gets the connection's error from the reader (``_upstream_gone``)."""
        process, reader = self._process, self._reader
        if process is None:
            return
        if process.returncode is None:
            process.stdin.close()
            try:
                await asyncio.wait_for(process.wait(), 2.0)
            except TimeoutError:
                process.terminate()
                try:
                    await asyncio.wait_for(process.wait(), 2.0)
                except TimeoutError:
                    process.kill()
                    await process.wait()
        if reader is not None:
            try:
                await asyncio.wait_for(asyncio.shield(reader), 2.0)
            except TimeoutError:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
        if self._process is process:
            self._process, self._reader, self._live = None, None, False

    async def _read_upstream(self, process: asyncio.subprocess.Process) -> None:
        stdout = process.stdout
        reason = "Connection closed"
        try:
            while True:
                line = await read_line(stdout)
                if isinstance(line, Oversize):
                    self.health.heard()
                    self._oversize_answer(line)
                    continue
                if not line:
                    break
                if line.strip():
                    await self._from_upstream(line)
        except (ConnectionError, OSError) as exc:
            reason = f"Connection closed: {exc}"
        finally:
            if self._process is process and self._live:
                if not self._heard and not self._stopping:
                    await self._ended_at_start(process)
                self._upstream_gone(reason)

    async def _ended_at_start(self, process: asyncio.subprocess.Process) -> None:
        try:
            status = await asyncio.wait_for(process.wait(), 5.0)
        except TimeoutError:
            how = "closed its output"
        else:
            how = f"exited with status {status}"
        where = shlex.join(self.spec.command)
        self.exit_at_start = (
            f"upstream MCP server {self.spec.name!r} ({where}) {how} at start, before answering anything"
        )
        self._stopping = True  # its end is told once, by the relay's error
        self._exited_at_start.set()

    def _upstream_gone(self, reason: str) -> None:
        """The upstream's output ended: every request still waiting on it gets its error now."""
        if not self._stopping:
            log.warning("upstream %s: %s", self.spec.name, reason)
        self._live = False
        calls, self._calls = self._calls, {}
        for request_id, call in calls.items():
            self._failed(request_id, call, upstream_failed(self.spec.name, reason))
        requests, self._requests = self._requests, {}
        for request_id in requests:
            self._write_agent(
                {"jsonrpc": "2.0", "id": request_id, "error": {"code": types.CONNECTION_CLOSED, "message": reason}}
            )
        self._replayed.clear()

    # -- the agent's messages -----------------------------------------------------------------------

    async def _from_agent(self, line: bytes) -> None:
        message, fault = parse(line)  # not JSON (None): the upstream answers it as it would
        if fault == "deep":
            self._refuse_deep(line)
            return
        if isinstance(message, list):  # a JSON-RPC batch (2025-03-26): each message on its own
            for item in message:
                await self._agent_message(item, _encode(item))
        else:
            await self._agent_message(message, line)

    def _refuse_deep(self, line: bytes) -> None:
        """A message of the agent nested deeper than ``JSON_DEPTH_LIMIT``: never forwarded (the
        upstream might not survive it either); each request in it gets a JSON-RPC error."""
        outer = envelope(line)
        answered = False
        for item in outer if isinstance(outer, list) else [outer]:
            request_id = item.get("id") if isinstance(item, dict) and isinstance(item.get("method"), str) else None
            if _key(request_id) is not None:
                error = {"code": types.INVALID_REQUEST, "message": f"refused by loopwatch: {TooDeep()}"}
                self._write_agent({"jsonrpc": "2.0", "id": request_id, "error": error})
                answered = True
        if not answered:
            log.warning("a message of the agent nested deeper than %d levels was dropped", JSON_DEPTH_LIMIT)

    def _refuse_oversize(self, line: Oversize) -> None:
        """A message of the agent over ``LINE_LIMIT``: never forwarded; a request gets a JSON-RPC
        error at once."""
        answer = refusal(line)
        out = self._agent_out
        if answer is None:
            log.warning("a message of the agent was dropped: %s", too_big(line.size))
        elif out is not None and not out.is_closing():
            out.write(answer)

    async def _agent_message(self, message: Any, line: bytes) -> None:
        if not isinstance(message, dict):
            await self._forward(None, None, line)
            return
        method = message.get("method")
        if method == "tools/call" and isinstance(message.get("params"), dict) and _key(message.get("id")) is not None:
            if self.options.mode == "gate":  # the decision is waited for without holding the others
                task = asyncio.ensure_future(self._call(message, line))
                self._gated.add(task)
                task.add_done_callback(self._gated.discard)
            else:
                await self._call(message, line)
            return
        if method in _HANDSHAKE:
            self._handshake[method] = message
            if method == "initialize":
                params = message.get("params")
                self._agent_name = _client_name(params.get("clientInfo") if isinstance(params, dict) else None)
        elif method == "notifications/cancelled":
            params = message.get("params")
            call = self._calls.pop(_key(params.get("requestId")), None) if isinstance(params, dict) else None
            if call is not None and call.timer is not None:
                call.timer.cancel()  # the agent gave it up: no completion, as with the SDK gateway
        await self._forward(message, method, line)

    async def _forward(self, message: dict | None, method: Any, line: bytes) -> None:
        """Pass ``line`` on; a request the upstream cannot get is answered with the connection's
        error (JSON-RPC ``-32000``, as the SDK's client reports a closed connection)."""
        request_id = message.get("id") if message is not None and isinstance(method, str) else None
        key = _key(request_id)
        try:
            await self._ensure_upstream()
            if key is not None:
                params = message.get("params")
                self._requests[key] = (method, isinstance(params, dict) and params.get("cursor") is not None)
            await self._to_upstream(line)
        except UpstreamUnavailable as exc:
            if key is not None and self._requests.pop(key, None) is not None:
                self._write_agent(
                    {
                        "jsonrpc": "2.0",
                        "id": request_id,
                        "error": {"code": types.CONNECTION_CLOSED, "message": str(exc)},
                    }
                )
            else:
                log.warning("%s", exc)

    async def _call(self, message: dict, line: bytes) -> None:
        request_id = message["id"]
        params = message["params"]
        name, args = params.get("name"), params.get("arguments")
        key = _key(request_id)
        if not isinstance(name, str):
            await self._forward(message, "tools/call", line)  # not a call loopwatch can read: the upstream answers it
            return
        args = args if args is not None else {}
        run = self._run_of(params)
        meta = params.get("_meta")
        modern = isinstance(meta, dict) and _VERSION_META in meta
        state = params.get("requestState")
        call_id = self._resumable.pop(state, None) if isinstance(state, str) else None
        notice = None
        if call_id is None:
            call_id = f"mcp-{next(self._call_ids)}"
            refusal, notice = await run.admit(name, args, call_id)
            if refusal is not None:
                self._write_agent({"jsonrpc": "2.0", "id": request_id, "result": _error_result(refusal, modern)})
                return
        call = _Call(run, name, args, call_id, notice, modern)
        try:
            await self._ensure_upstream()
        except UpstreamUnavailable as exc:
            self._failed(request_id, call, str(exc))
            return
        if not self._calls and not self._requests:
            self.health.waiting()
        self._calls[key] = call
        timeout = self.options.upstream_timeout
        call.timer = asyncio.get_running_loop().call_later(timeout, self._timed_out, key, request_id, call, timeout)
        try:
            await self._to_upstream(line)
        except UpstreamUnavailable as exc:
            if self._calls.get(key) is call:
                del self._calls[key]
                call.timer.cancel()
                self._failed(request_id, call, str(exc))

    def _run_of(self, params: dict) -> GuardedRun | UnguardedRun:
        if not self.link.connected:
            return self.link.unguarded()
        meta = params.get("_meta")
        named = meta.get(RUN_ID_META) if isinstance(meta, dict) else None
        run_id = identity(named, 200) if isinstance(named, str) and named.strip() else self._default_run
        run = self._runs.get(run_id)
        if run is None:
            agent_id = (
                self.options.agent_id
                or self._agent_name
                or _client_name(meta.get(_CLIENT_INFO_META) if isinstance(meta, dict) else None)
                or "mcp"
            )
            session_key = self.options.session_key or f"mcp:{agent_id}:{run_id}"
            run = GuardedRun(self.client.run(run_id, session_key=session_key, agent_id=agent_id), self._publishing)
            self._runs[run_id] = run
        return run

    # -- the upstream's messages --------------------------------------------------------------------

    async def _from_upstream(self, line: bytes) -> None:
        self._heard = True
        self.health.heard()
        message, fault = parse(line)
        if fault == "deep":
            self._deep_answer(line)
            return
        if fault == "not JSON":
            log.warning("upstream %s: a line that is not JSON was dropped: %.120r", self.spec.name, line)
            return
        if isinstance(message, dict) and "method" not in message and "id" in message:  # an answer
            healed = healed_error(message, upstream_failed(self.spec.name, "invalid JSON-RPC error"))
            if healed is not None:
                self.health.invalid_answers += 1
                message, line = healed, _encode(healed) + b"\n"
            key = _key(message["id"])
            if key in self._replayed:
                self._replayed.discard(key)  # the answer to a replayed handshake: the gateway's
                return
            call = self._calls.pop(key, None) if key is not None else None
            if call is not None:
                await self._answered(message, line, call)
                return
            request = self._requests.pop(key, None) if key is not None else None
            if request is not None and request[0] == "tools/list":
                self._listed(message, continued=request[1])
        await self._pass_on(line)

    def _deep_answer(self, line: bytes) -> None:
        """A message of the upstream nested deeper than ``JSON_DEPTH_LIMIT``: the request it
        answers fails (a tool call with the gateway's error result), nothing else does."""
        outer = envelope(line)
        request_id = outer.get("id") if isinstance(outer, dict) and "method" not in outer else None
        self._malformed_answer(request_id, TooDeep())

    def _oversize_answer(self, line: Oversize) -> None:
        """A message of the upstream over ``LINE_LIMIT``: the request it answers fails at once."""
        request_id, request = oversize_id(line)
        self._malformed_answer(None if request else request_id, too_big(line.size))

    def _malformed_answer(self, request_id: Any, problem: Any) -> None:
        self.health.invalid_answers += 1
        key = _key(request_id)
        reason = f"malformed answer: {problem}"
        call = self._calls.pop(key, None) if key is not None else None
        if call is not None:
            if call.timer is not None:
                call.timer.cancel()
            self._failed(request_id, call, upstream_failed(self.spec.name, reason))
            return
        if key is not None and self._requests.pop(key, None) is not None:
            error = {"code": types.INTERNAL_ERROR, "message": upstream_failed(self.spec.name, reason)}
            self._write_agent({"jsonrpc": "2.0", "id": request_id, "error": error})
            return
        log.warning("upstream %s: a message was dropped: %s", self.spec.name, problem)

    async def _pass_on(self, line: bytes) -> None:
        self._agent_out.write(line)
        await self._agent_out.drain()

    def _listed(self, message: dict, *, continued: bool) -> None:
        tools = (message.get("result") or {}).get("tools") if isinstance(message.get("result"), dict) else None
        if not isinstance(tools, list):
            return
        names = {tool["name"] for tool in tools if isinstance(tool, dict) and isinstance(tool.get("name"), str)}
        self.tools = (self.tools or set()) | names if continued else names

    async def _answered(self, message: dict, line: bytes, call: _Call) -> None:
        """Complete ``call`` from its answer and pass the answer on: as it came, unless it is
        not a tool result (an error result instead) or loopwatch appends a notice."""
        if call.timer is not None:
            call.timer.cancel()
        run, name, args, call_id = call.run, call.name, call.args, call.call_id
        error = message.get("error")
        if error is not None:  # a protocol error goes back to the agent as the upstream sent it
            code = error.get("code") if isinstance(error, dict) else None
            text = str(error.get("message", "")) if isinstance(error, dict) else str(error)
            if code == types.INVALID_PARAMS and (
                unknown_tool_name(text) or (self.tools is not None and name not in self.tools)
            ):
                run.complete(name, args, call_id, error=unknown_tool_error(name, text))
            else:
                run.complete(name, args, call_id, error=ThrownError(text))
            await self._pass_on(line)
            return
        result = message.get("result")
        kind = result.get("resultType") if isinstance(result, dict) else None
        if kind == "input_required":  # the agent answers the input requests and retries: one call
            state = result.get("requestState")
            if isinstance(state, str):
                self._resumable[state] = call_id
            await self._pass_on(line)
            return
        if kind not in (None, "complete"):
            await self._pass_on(line)  # a shape a client extension claims: not a tool result to hash
            return
        try:
            parsed = types.CallToolResult.model_validate(result)
        except ValidationError as exc:  # the connection itself still works
            reason = f"malformed answer: {exc.error_count()} error(s), first: {exc.errors()[0]['msg']}"
            self._failed(message["id"], call, upstream_failed(self.spec.name, reason))
            return
        run.complete(name, args, call_id, **edge_outcome(parsed))
        notices = run.notices(call.notice)
        if not notices:
            await self._pass_on(line)
            return
        content = [*result.get("content", []), *({"type": "text", "text": text} for text in notices)]
        self._write_agent({**message, "result": {**result, "content": content}})

    def _timed_out(self, key: Any, request_id: Any, call: _Call, timeout: float) -> None:
        if self._calls.get(key) is not call:
            return
        del self._calls[key]
        if self._alive():  # the courtesy cancel the SDK's client sends, so the server stops work
            cancel = {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": request_id, "reason": f"timed out after {timeout:g}s"},
            }
            self._process.stdin.write(_encode(cancel) + b"\n")
        self._failed(request_id, call, upstream_failed(self.spec.name, "Request 'tools/call' timed out"))
        reason = self.health.timed_out()
        if reason is not None and (self._restarting is None or self._restarting.done()) and not self._stopping:
            self._restarting = asyncio.ensure_future(self._restart(reason))

    async def _restart(self, reason: str) -> None:
        """Start the upstream again: it stopped answering (``health.UpstreamHealth``).  What was
        in flight gets the connection's error; the agent's handshake is replayed to the new one."""
        async with self._spawning:
            delay = self.health.restarting(reason, "restarted")
            await self._stop_upstream()
            if delay:
                await asyncio.sleep(delay)
            try:
                await self._spawn()
            except UpstreamUnavailable as exc:
                log.warning("%s", exc)  # the next call tries again

    def _failed(self, request_id: Any, call: _Call, message: str) -> None:
        call.run.complete(call.name, call.args, call.call_id, error=ThrownError(message))
        self._write_agent({"jsonrpc": "2.0", "id": request_id, "result": _error_result(message, call.modern)})

    def _write_agent(self, message: Any) -> None:
        out = self._agent_out
        if out is not None and not out.is_closing():
            out.write(_encode(message) + b"\n")


def _error_result(message: str, modern: bool) -> dict:
    result = {"content": [{"type": "text", "text": message}], "isError": True}
    if modern:
        result["resultType"] = "complete"
    return result


_key = request_key


def _client_name(info: Any) -> str | None:
    return agent_name(info.get("name") if isinstance(info, dict) else None)
