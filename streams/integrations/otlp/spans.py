"""OTLP trace exports (protobuf or JSON) to the tool calls they hold.

Only spans of the GenAI semantic conventions' ``execute_tool`` operation are read; every other
span (model calls, agent steps, HTTP) is passed over.  What a tool span gives:

* ``gen_ai.tool.name``: the tool (a span without it is passed over, counted);
* ``gen_ai.tool.call.arguments`` and ``gen_ai.tool.call.result``: opt-in content in every
  instrumentation (Pydantic AI's ``include_content``, OpenInference's hide-inputs settings).
  A JSON text is parsed, so ``{"a":1,"b":2}`` and ``{"b":2,"a":1}`` hash alike as they do at
  a runner; anything else is hashed as the text it is.  A span without arguments cannot tell
  one call of its tool from another, so it is passed over and counted unless the receiver is
  told to treat every call of a tool alike (``ReceiverOptions.without_arguments``);
* an error: the span's status ``ERROR``, with its message (or the ``exception`` event's);
* ``gen_ai.tool.call.id``, ``gen_ai.agent.name`` (else the resource's ``service.name``) and the
  end time.

Which run a span belongs to is the receiver's choice (``run_from``): its trace, or an
attribute such as ``gen_ai.conversation.id`` or ``session.id`` (span first, then resource),
falling back to the trace when the span has none.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from schemas.errors import LoopwatchError
from streams.edge.canonical import TooDeep, check_depth

__all__ = [
    "NOT_SET",
    "SpanDecodeError",
    "SpanCounts",
    "ToolSpan",
    "decode_json",
    "decode_protobuf",
    "tool_spans",
]

EXECUTE_TOOL = "execute_tool"
STATUS_ERROR = 2
READ = frozenset(
    {
        "gen_ai.operation.name",
        "gen_ai.tool.name",
        "gen_ai.tool.call.id",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
        "gen_ai.agent.name",
        "service.name",
    }
)
"""The attributes a tool call is read from (and the run's, when it comes from one): only
these are converted, the rest of a span is passed over unread."""
EXCEPTION_MESSAGE = frozenset({"exception.message"})
NOT_SET: Any = object()
"""A content attribute the span does not carry (not the same as a JSON ``null``)."""


class SpanDecodeError(LoopwatchError, ValueError):
    """An export body that is not an OTLP trace export (its one line says why)."""


@dataclass(frozen=True, slots=True)
class ToolSpan:
    """One tool call as its span tells it."""

    run_id: str
    trace_id: str
    tool_name: str
    args: Any
    result: Any
    error: str | None
    tool_call_id: str | None
    agent_id: str | None
    end_ms: int


@dataclass(slots=True)
class SpanCounts:
    """What one export held: the tool calls taken, and the spans passed over and why."""

    tool_spans: int = 0
    other_spans: int = 0
    without_tool_name: int = 0
    without_arguments: int = 0
    run_from_trace: int = 0
    """Tool spans whose run attribute was missing, so their trace is their run."""
    calls: list[ToolSpan] = field(default_factory=list)


# -- one shape for both encodings ----------------------------------------------------------------


@dataclass(slots=True)
class _Span:
    trace_id: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    error: bool
    status_message: str
    exception_message: str | None
    end_ns: int


def _any_value_pb(value: Any) -> Any:
    text = value.string_value  # most attributes are strings: one read, no oneof lookup
    if text:
        return text
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_any_value_pb(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _any_value_pb(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


def _attributes_pb(items: Any, wanted: frozenset[str]) -> dict[str, Any]:
    return {kv.key: _any_value_pb(kv.value) for kv in items if kv.key in wanted}


def _spans_pb(body: bytes, wanted: frozenset[str]) -> Iterator[_Span]:
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except (DecodeError, RecursionError) as exc:
        raise SpanDecodeError(f"not an OTLP protobuf trace export: {exc}") from None
    for resource_spans in request.resource_spans:
        resource = _attributes_pb(resource_spans.resource.attributes, wanted)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                exception = next(
                    (
                        _attributes_pb(e.attributes, EXCEPTION_MESSAGE).get("exception.message")
                        for e in span.events
                        if e.name == "exception"
                    ),
                    None,
                )
                yield _Span(
                    trace_id=span.trace_id.hex(),
                    attributes=_attributes_pb(span.attributes, wanted),
                    resource=resource,
                    error=span.status.code == STATUS_ERROR,
                    status_message=span.status.message,
                    exception_message=exception if isinstance(exception, str) else None,
                    end_ns=span.end_time_unix_nano,
                )


def _any_value_json(value: Any) -> Any:
    if not isinstance(value, dict) or not value:
        return None
    kind, inner = next(iter(value.items()))
    if kind == "intValue":
        try:
            return int(inner)  # OTLP/JSON writes 64-bit integers as strings
        except (TypeError, ValueError):
            raise SpanDecodeError(f"intValue must be an integer, not {inner!r:.40}") from None
    if kind == "arrayValue":
        return [_any_value_json(v) for v in _list(_object(inner or {}, "an arrayValue"), "values")]
    if kind == "kvlistValue":
        return _attributes_json(_list(_object(inner or {}, "a kvlistValue"), "values"))
    return inner


def _attributes_json(items: Any) -> dict[str, Any]:
    if not isinstance(items, list):
        raise SpanDecodeError("attributes must be a list of {key, value}")
    out = {}
    for kv in items:
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise SpanDecodeError("an attribute must be an object with a string key")
        out[kv["key"]] = _any_value_json(kv.get("value"))
    return out


def _list(obj: dict, name: str) -> list:
    value = obj.get(name) or []
    if not isinstance(value, list):
        raise SpanDecodeError(f"{name} must be a list")
    return value


def _status_is_error(code: Any) -> bool:
    return code in (STATUS_ERROR, "STATUS_CODE_ERROR")


def _spans_json(body: bytes) -> Iterator[_Span]:
    try:
        request = json.loads(body)
        check_depth(request)
    except RecursionError:
        raise SpanDecodeError(f"not an OTLP JSON trace export: {TooDeep()}") from None
    except TooDeep as exc:
        raise SpanDecodeError(f"not an OTLP JSON trace export: {exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise SpanDecodeError(f"not an OTLP JSON trace export: {exc}") from None
    if not isinstance(request, dict):
        raise SpanDecodeError(f"not an OTLP JSON trace export: the body is a {type(request).__name__}, not an object")
    for resource_spans in _list(request, "resourceSpans"):
        resource_spans = _object(resource_spans, "a resourceSpans item")
        resource = _attributes_json(_list(_object(resource_spans.get("resource") or {}, "resource"), "attributes"))
        for scope_spans in _list(resource_spans, "scopeSpans"):
            for span in _list(_object(scope_spans, "a scopeSpans item"), "spans"):
                span = _object(span, "a span")
                status = _object(span.get("status") or {}, "a span's status")
                exception = None
                for event in _list(span, "events"):
                    if isinstance(event, dict) and event.get("name") == "exception":
                        exception = _attributes_json(event.get("attributes") or []).get("exception.message")
                        break
                try:
                    end_ns = int(span.get("endTimeUnixNano") or 0)
                except (TypeError, ValueError):
                    raise SpanDecodeError("endTimeUnixNano must be an integer") from None
                yield _Span(
                    trace_id=str(span.get("traceId") or "").lower(),
                    attributes=_attributes_json(span.get("attributes") or []),
                    resource=resource,
                    error=_status_is_error(status.get("code")),
                    status_message=str(status.get("message") or ""),
                    exception_message=exception if isinstance(exception, str) else None,
                    end_ns=end_ns,
                )


def _object(value: Any, what: str) -> dict:
    if not isinstance(value, dict):
        raise SpanDecodeError(f"{what} must be an object, not {type(value).__name__}")
    return value


# -- tool calls ---------------------------------------------------------------------------------


def _content(value: Any) -> Any:
    """A content attribute as the hashing takes it: the text of a JSON object or array parsed
    (so its key order does not count), anything else as it is."""
    if value is NOT_SET or not isinstance(value, str) or value.lstrip()[:1] not in ("{", "["):
        return value
    try:
        return _decode_content(value)
    except (msgspec.DecodeError, RecursionError):
        return value


_decode_content = msgspec.json.Decoder().decode
"""msgspec refuses JSON nested past its own bound (1,000 levels) and every value is then
walked by the hashing, which stops at JSON_DEPTH_LIMIT with TooDeep: see ``tool_spans``."""


def tool_spans(spans: Iterator[_Span], *, run_from: str = "trace", without_arguments: bool = False) -> SpanCounts:
    """The tool calls of decoded spans (``run_from``: ``trace`` or ``attribute:NAME``)."""
    attribute = run_from.removeprefix("attribute:") if run_from != "trace" else None
    counts = SpanCounts()
    for span in spans:
        attrs = span.attributes
        if attrs.get("gen_ai.operation.name") != EXECUTE_TOOL:
            counts.other_spans += 1
            continue
        tool = attrs.get("gen_ai.tool.name")
        if not isinstance(tool, str) or not tool:
            counts.without_tool_name += 1
            continue
        args = attrs.get("gen_ai.tool.call.arguments", NOT_SET)
        if args is NOT_SET:
            if not without_arguments:
                counts.without_arguments += 1
                continue
            args = {}
        run_id = None
        if attribute is not None:
            run_id = attrs.get(attribute, span.resource.get(attribute))
            if run_id is None:
                counts.run_from_trace += 1
        error = None
        if span.error:
            error = span.status_message or span.exception_message or "error"
        agent = attrs.get("gen_ai.agent.name", span.resource.get("service.name"))
        call_id = attrs.get("gen_ai.tool.call.id")
        counts.tool_spans += 1
        counts.calls.append(
            ToolSpan(
                run_id=str(run_id) if run_id is not None else span.trace_id,
                trace_id=span.trace_id,
                tool_name=tool,
                args=_content(args),
                result=_content(attrs.get("gen_ai.tool.call.result", None)),
                error=error,
                tool_call_id=str(call_id) if call_id is not None else None,
                agent_id=str(agent) if agent is not None else None,
                end_ms=span.end_ns // 1_000_000,
            )
        )
    return counts


def _read(run_from: str) -> frozenset[str]:
    return READ if run_from == "trace" else READ | {run_from.removeprefix("attribute:")}


def decode_protobuf(body: bytes, run_from: str = "trace", without_arguments: bool = False) -> SpanCounts:
    """The tool calls of an ``application/x-protobuf`` export."""
    return tool_spans(_spans_pb(body, _read(run_from)), run_from=run_from, without_arguments=without_arguments)


def decode_json(body: bytes, run_from: str = "trace", without_arguments: bool = False) -> SpanCounts:
    """The tool calls of an ``application/json`` export (OTLP/JSON: hex ids, camelCase)."""
    return tool_spans(_spans_json(body), run_from=run_from, without_arguments=without_arguments)
