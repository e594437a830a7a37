"""The MCP gateway: an MCP server towards the agent, an MCP client towards each upstream server,
and loopwatch's runner client (``streams.client.LoopwatchClient``) on every ``tools/call``.

Everything but ``tools/call`` is forwarded as it is (tool and prompt names get their upstream's
prefix).  A ``tools/call``:

1. refused with the abort's message once loopwatch ended the run (MCP has no way to end an
   agent's run: every further call is refused instead);
2. ``before_tool_call`` (gate: publish ``tool_call.requested``, wait for the decision; the
   timeout, fail-open and fail-closed are the runner client's);
3. a block is answered with ``isError: true`` and loopwatch's message, which the model reads;
4. otherwise forwarded; the upstream's answer (a result, a protocol error, a timeout or a dead
   connection) is completed with ``after_tool_call`` from its canonical form (``outcome.py``);
5. a warning whose decision says ``notify_model`` (``surfaceWarnings``) is appended to the
   result as one more text block, after the result was hashed.

One MCP session is one run: over stdio the gateway's connection; over HTTP, the run named by the
request (``_meta`` key ``io.loopwatch/runId``, header ``X-Loopwatch-Run-Id``, the HTTP session
id, or the ``traceparent`` trace id; otherwise the gateway's own run).  A run ends when its
session closes: over stdio the connection; over HTTP a handshake-era session (``Mcp-Session-Id``)
that the client deletes (``http_app``), for the runs it used that no other open session uses.
Sessionless (2026-07-28) HTTP has nothing that closes: its runs, and those of sessions that
vanish without a ``DELETE``, end after ``run_idle_timeout`` without a call.  Every run ends
when the gateway stops.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.server import Server
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from streams.client import LoopwatchClient
from streams.edge.canonical import JSON_DEPTH_LIMIT, TooDeep, exceeds_depth
from streams.edge.hashing import ThrownError, unknown_tool_name

from .options import GatewayOptions
from .outcome import edge_outcome, unknown_tool_error
from .runs import GuardedRun, KafkaLink, UnguardedRun
from .upstream import MALFORMED, Upstream, UpstreamUnavailable

log = logging.getLogger("loopwatch.mcp")

__all__ = ["Gateway", "GatewayOptions", "RUN_ID_META", "RUN_ID_HEADER"]

RUN_ID_META = "io.loopwatch/runId"
STATUS_PATH = "/loopwatch/status"
"""Over HTTP: the gateway's counters as JSON (``Gateway.status``)."""
RUN_ID_HEADER = "x-loopwatch-run-id"
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
_IDENTITY_CHARS = re.compile(r"[^A-Za-z0-9_.:-]+")


@dataclass
class _Pending:
    """A call whose upstream asked for more input (``InputRequiredResult``): its retries are the
    same call, so they are not gated again, and it completes once, with the final result."""

    run: GuardedRun | UnguardedRun
    tool_call_id: str


class Gateway:
    def __init__(self, options: GatewayOptions, *, client: LoopwatchClient | None = None) -> None:
        if not options.upstreams:
            raise ValueError("the gateway needs at least one upstream MCP server")
        names = [u.name for u in options.upstreams]
        if len(set(names)) != len(names):
            raise ValueError(f"upstream names must differ: {', '.join(names)}")
        self.options = options
        self.link = KafkaLink(options, client)
        self.upstreams = [
            Upstream(
                spec,
                connect_timeout=options.connect_timeout,
                on_notification=self._notification,
                health=options.upstream_health(spec.name),
            )
            for spec in options.upstreams
        ]
        self._routes: dict[str, tuple[Upstream, str]] = {}
        self._prompt_routes: dict[str, tuple[Upstream, str]] = {}
        self._resource_routes: dict[str, Upstream] = {}
        self._runs: dict[str, GuardedRun] = {}
        # Over HTTP: the open sessions (Mcp-Session-Id) that used each run, and the runs each used.
        self._run_sessions: dict[str, set[str]] = {}
        self._session_runs: dict[str, set[str]] = {}
        self._pending: dict[str, _Pending] = {}
        self._call_ids = itertools.count(1)
        self._gateway_run = options.run_id or f"mcp-{uuid.uuid4().hex[:16]}"
        self._agent_sessions: list[Any] = []
        self._sweeper: asyncio.Task | None = None
        self._publishing: set[asyncio.Future] = set()
        self.server: Server | None = None
        self.sessions = {"opened": 0, "refused": 0}
        """Over HTTP: sessions the SDK opened, and those refused over ``http_max_sessions``."""

    @property
    def client(self) -> LoopwatchClient:
        """The runner client (a new one once Kafka is reached after a failed start)."""
        return self.link.client

    # -- life cycle -------------------------------------------------------------------------------

    async def start(self) -> Server:
        """Start the runner client and connect every upstream; the agent-facing server, with the
        handlers of what the upstreams serve."""
        await self.link.start()
        # An upstream that cannot be reached now is tried again by the calls that need it: the
        # agent's session comes up with what the others serve.  With none reachable, nothing does.
        reached = 0
        for upstream in self.upstreams:
            try:
                await upstream.start()
                reached += 1
            except UpstreamUnavailable as exc:
                log.warning("%s", exc)
        if not reached:
            failure = UpstreamUnavailable("; ".join(u.describe() for u in self.upstreams))
            await self.stop()
            raise failure
        self._sweeper = asyncio.create_task(self._sweep_idle_runs(), name="mcp-gateway-runs")
        self.server = self._build_server()
        return self.server

    def http_app(self, host: str = "127.0.0.1") -> Any:
        """The agent-facing streamable HTTP ASGI app (after ``start``): the SDK's, watched for
        the one message that closes a session.

        A handshake-era client closes its session with ``DELETE`` and its ``Mcp-Session-Id``
        (the SDK client's ``terminate_on_close``); a 2xx answer means the SDK terminated that
        session (an unknown id, or another credential's, gets 404).  That is the protocol's own
        signal, read here at the ASGI edge: the SDK hands handlers no public way to the
        connection's teardown (``Connection.exit_stack`` is reachable only through
        ``ServerSession``'s private ``_connection``).  A session the SDK drops by itself (its
        own idle timeout, a crash) sends nothing: its runs end by ``run_idle_timeout``."""
        assert self.server is not None, "start() first"
        app = self.server.streamable_http_app(
            host=host,
            max_sessions=self.options.http_max_sessions,
            session_idle_timeout=self.options.http_session_idle_timeout,
        )

        async def asgi(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["path"] == STATUS_PATH and scope["method"] == "GET":
                return await _send_json(send, 200, self.status())
            if scope["type"] == "http" and _header(scope, b"mcp-session-id") is None:
                return await app(scope, receive, self._watch_new_session(send))
            session_id = _closing_session(scope)
            if session_id is None:
                return await app(scope, receive, send)
            status = 0

            async def watch(message: Any) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            await app(scope, receive, watch)
            if 200 <= status < 300:
                self._session_closed(session_id)

        return asgi

    def status(self) -> dict:
        """The gateway's counters (served over HTTP at ``STATUS_PATH``): its HTTP sessions and,
        per upstream, restarts, timeouts and invalid answers (``health.UpstreamHealth``)."""
        return {
            "sessions": {"max": self.options.http_max_sessions, **self.sessions},
            "runs": len(self._runs),
            "upstreams": {u.spec.name: u.health.status() for u in self.upstreams},
        }

    def _watch_new_session(self, send: Any) -> Any:
        """``send`` for a request without a session id: the SDK opens a session for it (counted),
        or refuses one over ``http_max_sessions`` with 503, whose body is replaced by one that
        says which bound it hit and how to raise it."""
        refused = False

        async def watch(message: Any) -> None:
            nonlocal refused
            if message["type"] == "http.response.start":
                if message["status"] == 503:
                    refused = True
                    self.sessions["refused"] += 1
                    count = self.sessions["refused"]
                    if count & (count - 1) == 0:  # 1, 2, 4, 8 ...: a flood does not flood the log too
                        log.warning(
                            "refused a new HTTP session: %d open, the most --http-max-sessions allows (refused %d so far)",
                            self.options.http_max_sessions,
                            count,
                        )
                    error = {
                        "code": types.INTERNAL_ERROR,
                        "message": (
                            f"loopwatch mcp-gateway: too many open sessions ({self.options.http_max_sessions}, "
                            "--http-max-sessions): close one (DELETE) or retry once an idle one expired"
                        ),
                    }
                    await _send_json(send, 503, {"jsonrpc": "2.0", "id": None, "error": error}, retry_after=5)
                    return
                if any(name == b"mcp-session-id" for name, _ in message.get("headers", ())):
                    self.sessions["opened"] += 1
            elif refused:
                return  # the SDK's own body of the refusal: replaced above
            await send(message)

        return watch

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        for key in list(self._runs):
            await self._end_run(key, "gateway stopped")
        if self._publishing:
            await asyncio.wait(set(self._publishing))
        for upstream in self.upstreams:
            await upstream.close()
        await self.link.stop()

    async def end_session_run(self) -> None:
        """The stdio session closed: its run ends."""
        for key in list(self._runs):
            await self._end_run(key, "session closed")

    async def _end_run(self, key: str, reason: str) -> None:
        run = self._forget_run(key)
        if run is not None:
            await run.end(reason)

    def _forget_run(self, key: str) -> GuardedRun | None:
        """No longer a run of the gateway's (nor of any session's): a later call naming it starts
        it again."""
        for session_id in self._run_sessions.pop(key, ()):
            runs = self._session_runs.get(session_id)
            if runs is not None:
                runs.discard(key)
                if not runs:  # a session that vanished without DELETE is forgotten with its runs
                    del self._session_runs[session_id]
        return self._runs.pop(key, None)

    def _held_by_session(self, ctx: Any, key: str) -> None:
        """Over HTTP, the run ``key`` is used by this request's session: once every session
        that used it is closed, it ends."""
        headers = getattr(getattr(ctx, "request", None), "headers", None)
        session_id = headers.get("mcp-session-id") if headers is not None else None
        if not session_id:
            return  # stdio, or sessionless HTTP
        self._session_runs.setdefault(session_id, set()).add(key)
        self._run_sessions.setdefault(key, set()).add(session_id)

    def _session_closed(self, session_id: str) -> None:
        # The runs are forgotten now (a call naming one later starts it again) and their
        # run.ended is published behind their earlier events, in the background: the DELETE's
        # answer does not wait for it, ``stop`` does.
        for key in self._session_runs.pop(session_id, ()):
            holders = self._run_sessions.get(key)
            if holders is None:
                continue
            holders.discard(session_id)
            if holders:
                continue  # another open session still uses it
            run = self._forget_run(key)
            if run is not None:
                run.later(lambda run=run: run.handle.end("session closed"))

    async def _sweep_idle_runs(self) -> None:
        period = min(60.0, max(self.options.run_idle_timeout / 4, 0.05))
        while True:
            await asyncio.sleep(period)
            cutoff = time.monotonic() - self.options.run_idle_timeout
            for key, run in list(self._runs.items()):
                if run.last_used < cutoff:
                    await self._end_run(key, "idle")

    def _build_server(self) -> Server:
        caps = [u.capabilities for u in self.upstreams if u.capabilities is not None]
        has = lambda what: any(getattr(c, what, None) is not None for c in caps)  # noqa: E731
        handlers: dict[str, Any] = {"on_list_tools": self._list_tools, "on_call_tool": self._call_tool}
        if has("resources"):
            handlers.update(
                on_list_resources=self._list_resources,
                on_read_resource=self._read_resource,
                on_list_resource_templates=self._list_resource_templates,
            )
            if any(c.resources is not None and c.resources.subscribe for c in caps):
                handlers.update(on_subscribe_resource=self._subscribe, on_unsubscribe_resource=self._unsubscribe)
        if has("prompts"):
            handlers.update(on_list_prompts=self._list_prompts, on_get_prompt=self._get_prompt)
        if has("completions"):
            handlers["on_completion"] = self._completion
        infos = [u.client.server_info for u in self.upstreams if u.client is not None and u.client.server_info]
        instructions = (
            "\n\n".join(u.client.instructions for u in self.upstreams if u.client is not None and u.client.instructions)
            or None
        )
        name = infos[0].name if len(infos) == 1 else "loopwatch-mcp-gateway"
        server = Server(
            name, version=infos[0].version if len(infos) == 1 else "", instructions=instructions, **handlers
        )
        return server

    # -- runs ---------------------------------------------------------------------------------------

    def _run_for(self, ctx: Any, params: Any) -> GuardedRun | UnguardedRun:
        self._remember_agent_session(ctx)
        if not self.link.connected:
            return self.link.unguarded()
        run_id = self._run_id_of(ctx, params)
        run = self._runs.get(run_id)
        if run is None:
            agent_id = self.options.agent_id or _client_name(ctx) or "mcp"
            session_key = self.options.session_key or f"mcp:{agent_id}:{run_id}"
            run = GuardedRun(self.client.run(run_id, session_key=session_key, agent_id=agent_id), self._publishing)
            self._runs[run_id] = run
        self._held_by_session(ctx, run_id)
        run.last_used = time.monotonic()
        return run

    def _run_id_of(self, ctx: Any, params: Any) -> str:
        meta = getattr(params, "meta", None)  # a TypedDict: a plain dict with any keys
        named = meta.get(RUN_ID_META) if isinstance(meta, dict) else None
        if isinstance(named, str) and named.strip():
            return identity(named, 200)
        headers = getattr(getattr(ctx, "request", None), "headers", None)
        if headers is not None:
            for header in (RUN_ID_HEADER, "mcp-session-id"):
                value = headers.get(header)
                if value:
                    return identity(value, 200)
            trace = _TRACEPARENT.match(headers.get("traceparent", "").strip().lower())
            if trace:
                return f"trace-{trace.group(1)}"
        return self._gateway_run

    def _remember_agent_session(self, ctx: Any) -> None:
        # Over stdio, the one agent connection gets the upstreams' own notifications.
        if getattr(ctx, "request", None) is None and not self._agent_sessions:
            self._agent_sessions.append(ctx.session)

    async def _notification(self, upstream: Upstream, notification: Any) -> None:
        if isinstance(notification, types.ProgressNotification):
            return  # forwarded per call (``_progress``), with the agent's own token
        for session in self._agent_sessions:
            try:
                await session.send_notification(notification)
            except Exception as exc:  # noqa: BLE001 - a notification is never worth a failed call
                log.debug("notification from %s not forwarded: %s", upstream.spec.name, exc)

    # -- tools ----------------------------------------------------------------------------------------

    async def _list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        self._remember_agent_session(ctx)
        return types.ListToolsResult(tools=await self._refresh_tools())

    async def _refresh_tools(self) -> list[types.Tool]:
        routes: dict[str, tuple[Upstream, str]] = {}
        tools: list[types.Tool] = []
        for upstream in self.upstreams:
            try:
                listed = await asyncio.wait_for(upstream.list_tools(), self.options.upstream_timeout)
            except (TimeoutError, UpstreamUnavailable, MCPError, OSError) as exc:
                log.warning("upstream %s: tools not listed: %s", upstream.spec.name, exc)
                continue
            for tool in listed:
                name = upstream.spec.prefix + tool.name
                if name in routes:
                    log.warning(
                        "tool %s of upstream %s hidden by the one of %s",
                        name,
                        upstream.spec.name,
                        routes[name][0].spec.name,
                    )
                    continue
                routes[name] = (upstream, tool.name)
                tools.append(tool.model_copy(update={"name": name}) if upstream.spec.prefix else tool)
        self._routes = routes
        return tools

    async def _route(self, name: str) -> tuple[Upstream, str] | None:
        if name not in self._routes:
            await self._refresh_tools()  # the agent may call a tool it never listed
        return self._routes.get(name)

    async def _call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> Any:
        name, args = params.name, params.arguments if params.arguments is not None else {}
        if exceeds_depth(args, JSON_DEPTH_LIMIT - 2):  # within params within the message: the relay's bound
            raise MCPError(types.INVALID_REQUEST, f"refused by loopwatch: {TooDeep()}")
        run = self._run_for(ctx, params)
        pending = self._pending.pop(params.request_state, None) if params.request_state else None
        notice = None
        if pending is not None:
            run, call_id = pending.run, pending.tool_call_id
        else:
            call_id = f"mcp-{next(self._call_ids)}"
            refusal, notice = await run.admit(name, args, call_id)
            if refusal is not None:
                return error_result(refusal)
        return await self._forward(ctx, params, run, name, args, call_id, notice)

    async def _forward(
        self,
        ctx: Any,
        params: types.CallToolRequestParams,
        run: GuardedRun | UnguardedRun,
        name: str,
        args: dict,
        call_id: str,
        notice: str | None,
    ) -> Any:
        route = await self._route(name)
        if route is None:
            run.complete(name, args, call_id, error=unknown_tool_error(name))
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {name}")
        upstream, tool = route
        if not upstream.in_flight:
            upstream.health.waiting()
        upstream.in_flight += 1
        try:
            return await self._forward_to(ctx, params, run, name, args, call_id, notice, upstream, tool)
        finally:
            upstream.in_flight -= 1

    async def _forward_to(
        self,
        ctx: Any,
        params: types.CallToolRequestParams,
        run: GuardedRun,
        name: str,
        args: dict,
        call_id: str,
        notice: str | None,
        upstream: Upstream,
        tool: str,
    ) -> Any:
        timeout = self.options.upstream_timeout
        try:
            session = await upstream.session()
            result = await asyncio.wait_for(
                session.call_tool(
                    tool,
                    params.arguments,
                    read_timeout_seconds=timeout,
                    progress_callback=_progress(ctx, params),
                    input_responses=params.input_responses,
                    request_state=params.request_state,
                    allow_input_required=True,
                    allow_claimed=True,
                ),
                timeout + 1.0,
            )  # the session's own read timeout answers first; this is the backstop
        except MCPError as exc:
            if exc.code in (types.CONNECTION_CLOSED, types.REQUEST_TIMEOUT):
                if exc.code == types.CONNECTION_CLOSED:
                    await upstream.broken()
                else:
                    upstream.timed_out()
                return await self._failed(run, name, args, call_id, upstream, exc.message)
            upstream.health.heard()
            if isinstance(exc.data, dict) and exc.data.get(MALFORMED):  # too deep or too big to read
                return await self._failed(run, name, args, call_id, upstream, exc.message)
            if exc.code == types.INVALID_PARAMS and (unknown_tool_name(exc.message) or tool not in upstream.tools):
                error = unknown_tool_error(name, exc.message)
            else:
                error = ThrownError(exc.message)
            run.complete(name, args, call_id, error=error)
            raise  # a protocol error goes back to the agent as the upstream sent it
        except TimeoutError:
            upstream.timed_out()
            return await self._failed(run, name, args, call_id, upstream, f"no answer within {timeout:g}s")
        except UpstreamUnavailable as exc:
            return await self._failed(run, name, args, call_id, upstream, str(exc), described=True)
        except asyncio.CancelledError:
            raise  # the agent cancelled the call: the upstream's request is cancelled with it
        except ValidationError as exc:  # a malformed answer: the connection itself still works
            reason = f"malformed answer: {exc.error_count()} error(s), first: {exc.errors()[0]['msg']}"
            return await self._failed(run, name, args, call_id, upstream, reason)
        except Exception as exc:  # noqa: BLE001 - a broken pipe, a dead process: the agent's session stays up
            await upstream.broken()
            return await self._failed(run, name, args, call_id, upstream, _describe(exc))
        upstream.health.heard()
        if isinstance(result, types.InputRequiredResult):
            if result.request_state:
                self._pending[result.request_state] = _Pending(run, call_id)
            return result  # the agent answers the input requests and retries: passed on unchanged
        if not isinstance(result, types.CallToolResult):
            return result  # a shape a client extension claimed: not a tool result to hash
        try:
            outcome = edge_outcome(result)
        except TooDeep as exc:
            return await self._failed(run, name, args, call_id, upstream, f"malformed answer: {exc}")
        run.complete(name, args, call_id, **outcome)
        notices = run.notices(notice)
        if not notices:
            return result
        extra = [types.TextContent(type="text", text=text) for text in notices]
        return result.model_copy(update={"content": [*result.content, *extra]})

    async def _failed(
        self,
        run: GuardedRun | UnguardedRun,
        name: str,
        args: dict,
        call_id: str,
        upstream: Upstream,
        reason: str,
        *,
        described: bool = False,
    ) -> types.CallToolResult:
        message = reason if described else upstream_failed(upstream.spec.name, reason)
        run.complete(name, args, call_id, error=ThrownError(message))
        return error_result(message)

    # -- everything else: forwarded -----------------------------------------------------------------

    def _with(self, what: str) -> list[Upstream]:
        return [
            u for u in self.upstreams if u.capabilities is not None and getattr(u.capabilities, what, None) is not None
        ]

    async def _list_resources(self, ctx: Any, params: Any) -> types.ListResourcesResult:
        resources: list[types.Resource] = []
        for upstream in self._with("resources"):
            session = await upstream.session()
            cursor = None
            while True:
                page = await session.list_resources(cursor=cursor) if cursor else await session.list_resources()
                for resource in page.resources:
                    self._resource_routes.setdefault(str(resource.uri), upstream)
                resources.extend(page.resources)
                cursor = page.next_cursor
                if not cursor:
                    break
        return types.ListResourcesResult(resources=resources)

    async def _list_resource_templates(self, ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
        templates: list[types.ResourceTemplate] = []
        for upstream in self._with("resources"):
            session = await upstream.session()
            templates.extend((await session.list_resource_templates()).resource_templates)
        return types.ListResourceTemplatesResult(resource_templates=templates)

    def _resource_upstream(self, uri: str) -> Upstream:
        upstream = self._resource_routes.get(uri)
        if upstream is not None:
            return upstream
        serving = self._with("resources")
        if not serving:
            raise MCPError(types.METHOD_NOT_FOUND, "no upstream serves resources")
        return serving[0]  # a templated uri nobody listed: the first upstream with resources

    async def _read_resource(self, ctx: Any, params: types.ReadResourceRequestParams) -> Any:
        session = await self._resource_upstream(str(params.uri)).session()
        return await session.read_resource(
            params.uri,
            input_responses=params.input_responses,
            request_state=params.request_state,
            allow_input_required=True,
        )

    async def _subscribe(self, ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        return await (await self._resource_upstream(str(params.uri)).session()).subscribe_resource(params.uri)

    async def _unsubscribe(self, ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        return await (await self._resource_upstream(str(params.uri)).session()).unsubscribe_resource(params.uri)

    async def _list_prompts(self, ctx: Any, params: Any) -> types.ListPromptsResult:
        prompts: list[types.Prompt] = []
        routes: dict[str, tuple[Upstream, str]] = {}
        for upstream in self._with("prompts"):
            for prompt in (await (await upstream.session()).list_prompts()).prompts:
                name = upstream.spec.prefix + prompt.name
                routes.setdefault(name, (upstream, prompt.name))
                prompts.append(prompt.model_copy(update={"name": name}) if upstream.spec.prefix else prompt)
        self._prompt_routes = routes
        return types.ListPromptsResult(prompts=prompts)

    async def _get_prompt(self, ctx: Any, params: types.GetPromptRequestParams) -> Any:
        if params.name not in self._prompt_routes:
            await self._list_prompts(ctx, None)
        route = self._prompt_routes.get(params.name)
        if route is None:
            raise MCPError(types.INVALID_PARAMS, f"Unknown prompt: {params.name}")
        upstream, name = route
        return await (await upstream.session()).get_prompt(
            name,
            params.arguments,
            input_responses=params.input_responses,
            request_state=params.request_state,
            allow_input_required=True,
        )

    async def _completion(self, ctx: Any, params: types.CompleteRequestParams) -> types.CompleteResult:
        ref = params.ref
        upstream = None
        if isinstance(ref, types.PromptReference) and ref.name in self._prompt_routes:
            upstream, name = self._prompt_routes[ref.name]
            ref = ref.model_copy(update={"name": name})
        serving = self._with("completions")
        upstream = upstream or (serving[0] if serving else None)
        if upstream is None:
            raise MCPError(types.METHOD_NOT_FOUND, "no upstream serves completions")
        return await (await upstream.session()).complete(
            ref,
            params.argument.model_dump(),
            context_arguments=(params.context.arguments if params.context is not None else None),
        )


def error_result(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


def upstream_failed(upstream: str, reason: str) -> str:
    """The text of a call that its upstream server failed (timed out, crashed, answered malformed)."""
    return f"upstream MCP server {upstream!r} failed: {reason}"


def _progress(ctx: Any, params: Any):
    """A progress callback that passes the upstream's progress on under the agent's token."""
    meta = getattr(params, "meta", None)
    token = meta.get("progress_token", meta.get("progressToken")) if isinstance(meta, dict) else None
    if token is None:
        return None

    async def forward(progress: float, total: float | None, message: str | None) -> None:
        try:
            await ctx.session.send_progress_notification(
                token, progress, total, message, related_request_id=ctx.request_id
            )
        except Exception as exc:  # noqa: BLE001 - progress is advisory
            log.debug("progress not forwarded: %s", exc)

    return forward


def _header(scope: Any, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


async def _send_json(send: Any, status: int, body: Any, *, retry_after: int | None = None) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def _closing_session(scope: Any) -> str | None:
    """The ``Mcp-Session-Id`` of an HTTP ``DELETE``: the client closing that session."""
    if scope["type"] != "http" or scope["method"] != "DELETE":
        return None
    for name, value in scope["headers"]:
        if name == b"mcp-session-id":
            return value.decode("latin-1")
    return None


def _client_name(ctx: Any) -> str | None:
    params = getattr(ctx.session, "client_params", None)
    info = getattr(params, "client_info", None)
    return agent_name(getattr(info, "name", None))


def agent_name(name: Any) -> str | None:
    """The agent id a client's name gives (``clientInfo.name``), or None when it names none."""
    return identity(name, 100) if isinstance(name, str) and name.strip() else None


def identity(text: str, limit: int) -> str:
    """A run id or agent id from what a client sent: trimmed, other characters as ``_``, bounded."""
    return _IDENTITY_CHARS.sub("_", text.strip())[:limit]


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
