"""The OTLP/HTTP trace endpoint (``POST /v1/traces``), publishing each tool span as loopwatch's
two edge events through the runner client's producer (``LoopwatchClient.enqueue_batch``: an
export's events in one record batch per partition, a run's events in their order, a failed
delivery logged and counted)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from schemas.events import ToolCallCompleted, ToolCallEvent, ToolCallRequested
from streams.client import LoopwatchClient
from streams.edge.canonical import UNDEFINED, TooDeep
from streams.edge.events import completed_from_outcome, requested_event
from streams.edge.hashing import hash_outcome

from .spans import SpanCounts, SpanDecodeError, ToolSpan, decode_json, decode_protobuf

__all__ = ["OtlpReceiver", "ReceiverOptions"]

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


@dataclass(frozen=True)
class ReceiverOptions:
    run_from: str = "trace"
    """``trace``: a span's trace is its run; ``attribute:NAME``: the span's (or its resource's)
    attribute NAME is, e.g. ``attribute:gen_ai.conversation.id``."""
    without_arguments: bool = False
    """Take tool spans that carry no arguments, every call of a tool then hashing alike
    (otherwise they are passed over and counted)."""
    max_body_bytes: int = 16 * 1024 * 1024
    agent_id: str | None = None
    """Every run's agent (a signing receiver's: the key's agent); None: each span's own."""

    def __post_init__(self) -> None:
        if self.run_from != "trace" and not (self.run_from.startswith("attribute:") and len(self.run_from) > 10):
            raise ValueError(f"run_from is 'trace' or 'attribute:NAME', not {self.run_from!r}")


class OtlpReceiver:
    """Receives OTLP trace exports and publishes their tool calls; observe-only."""

    def __init__(self, client: LoopwatchClient, options: ReceiverOptions | None = None) -> None:
        self.client = client
        self.options = options or ReceiverOptions()
        self.counts = {
            "exports": 0,
            "refused_exports": 0,
            "tool_spans": 0,
            "other_spans": 0,
            "without_tool_name": 0,
            "without_arguments": 0,
            "run_from_trace": 0,
            "too_deep": 0,
        }
        """What was received since start (``GET /status`` answers it)."""

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.options.max_body_bytes)
        app.router.add_post("/v1/traces", self.traces)
        app.router.add_get("/status", self.status)
        return app

    def decode(self, body: bytes, content_type: str) -> SpanCounts:
        options = {"run_from": self.options.run_from, "without_arguments": self.options.without_arguments}
        if content_type == JSON:
            return decode_json(body, **options)
        return decode_protobuf(body, **options)

    async def traces(self, request: web.Request) -> web.Response:
        content_type = request.content_type
        if content_type not in (PROTOBUF, JSON):
            self.counts["refused_exports"] += 1
            return web.Response(status=415, text=f"loopwatch otlp reads {PROTOBUF} or {JSON}, not {content_type}\n")
        try:
            body = await request.read()
            found = self.decode(body, content_type)
        except web.HTTPRequestEntityTooLarge:
            self.counts["refused_exports"] += 1
            raise
        except SpanDecodeError as exc:
            self.counts["refused_exports"] += 1
            return web.Response(status=400, text=f"{exc}\n")
        await self.publish(found)
        # An empty ExportTraceServiceResponse: every span accepted.
        if content_type == JSON:
            return web.json_response({})
        return web.Response(body=b"", content_type=PROTOBUF)

    async def publish(self, found: SpanCounts) -> None:
        self.counts["exports"] += 1
        for name in ("tool_spans", "other_spans", "without_tool_name", "without_arguments", "run_from_trace"):
            self.counts[name] += getattr(found, name)
        events: list[ToolCallEvent] = []
        for call in found.calls:
            if self.options.agent_id is not None:
                call = dataclasses.replace(call, agent_id=self.options.agent_id)
            try:
                events.extend(events_of(call, self.client.next_event_id))
            except TooDeep:  # its arguments or result: the span is passed over, counted
                self.counts["too_deep"] += 1
        if events:
            await self.client.enqueue_batch(events)

    async def status(self, request: web.Request) -> web.Response:
        return web.json_response({**self.counts, "undelivered": self.client.undelivered, "gates": False})


def events_of(call: ToolSpan, next_id: Any) -> tuple[ToolCallRequested, ToolCallCompleted]:
    """The call's ``tool_call.requested`` (never gated: its span closed after it ran) and
    ``tool_call.completed``, hashed here (the arguments once, for both); the run is also the
    session key the engine reads."""
    fields = dict(
        tool_call_id=call.tool_call_id,
        run_id=call.run_id,
        session_key=call.run_id,
        agent_id=call.agent_id,
        ts_ms=call.end_ms,
        trace_id=call.trace_id,
    )
    requested = requested_event(next_id(), call.tool_name, call.args, gate=False, **fields)
    if call.error is not None:
        outcome = hash_outcome(call.tool_name, call.args, error=call.error)
    else:
        outcome = hash_outcome(call.tool_name, call.args, result=UNDEFINED if call.result is None else call.result)
    completed = completed_from_outcome(
        next_id(),
        call.tool_name,
        requested.args_hash,
        outcome,
        target_hash=requested.target_hash,
        near_args_hash=requested.near_args_hash,
        **fields,
    )
    return requested, completed


async def serve(client: LoopwatchClient, options: ReceiverOptions, host: str, port: int) -> web.AppRunner:
    """Start the endpoint (the client must be started); the runner's ``cleanup`` stops it."""
    runner = web.AppRunner(OtlpReceiver(client, options).app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
