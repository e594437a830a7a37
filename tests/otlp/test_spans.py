"""OTLP trace exports to tool calls: hand-built exports in both encodings, and hostile bodies."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from streams.integrations.otlp import SpanDecodeError, ToolSpan, decode_json, decode_protobuf
from streams.integrations.otlp.receiver import ReceiverOptions, events_of

TRACE = bytes(range(16))


def kv(key: str, value: str | int) -> KeyValue:
    return KeyValue(
        key=key, value=AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)
    )


def export(*spans: list[KeyValue], error: str | None = None) -> bytes:
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    resource.resource.attributes.append(kv("service.name", "billing-agent"))
    scope = resource.scope_spans.add()
    for n, attributes in enumerate(spans):
        span = scope.spans.add(
            trace_id=TRACE, span_id=bytes([n + 1] * 8), name="span", end_time_unix_nano=1_700_000_000_123_456_789
        )
        span.attributes.extend(attributes)
        if error is not None:
            span.status.CopyFrom(Status(code=Status.STATUS_CODE_ERROR, message=error))
    return request.SerializeToString()


TOOL = [
    kv("gen_ai.operation.name", "execute_tool"),
    kv("gen_ai.tool.name", "refund"),
    kv("gen_ai.tool.call.id", "call-7"),
    kv("gen_ai.tool.call.arguments", '{"order": 42, "amount": "10.00"}'),
    kv("gen_ai.tool.call.result", "refused: order already refunded"),
    kv("gen_ai.conversation.id", "conv-1"),
]


def test_a_protobuf_export_gives_its_tool_spans_only():
    found = decode_protobuf(export(TOOL, [kv("gen_ai.operation.name", "chat")], [kv("http.method", "GET")]))
    assert (found.tool_spans, found.other_spans) == (1, 2)
    assert found.calls == [
        ToolSpan(
            run_id="000102030405060708090a0b0c0d0e0f",
            trace_id="000102030405060708090a0b0c0d0e0f",
            tool_name="refund",
            args={"order": 42, "amount": "10.00"},
            result="refused: order already refunded",
            error=None,
            tool_call_id="call-7",
            agent_id="billing-agent",
            end_ms=1_700_000_000_123,
        )
    ]


def test_the_run_can_be_an_attribute_and_falls_back_to_the_trace():
    without = [a for a in TOOL if a.key != "gen_ai.conversation.id"]
    found = decode_protobuf(export(TOOL, without), run_from="attribute:gen_ai.conversation.id")
    assert [c.run_id for c in found.calls] == ["conv-1", "000102030405060708090a0b0c0d0e0f"]
    assert found.run_from_trace == 1


def test_a_failed_span_is_an_error_with_its_status_message():
    (call,) = decode_protobuf(export(TOOL, error="HTTP 503 from payments")).calls
    assert call.error == "HTTP 503 from payments"


def test_spans_without_arguments_or_a_name_are_counted_not_taken_unless_asked():
    bare = [a for a in TOOL if a.key != "gen_ai.tool.call.arguments"]
    nameless = [a for a in TOOL if a.key != "gen_ai.tool.name"]
    found = decode_protobuf(export(bare, nameless))
    assert (found.tool_spans, found.without_arguments, found.without_tool_name) == (0, 1, 1)
    (call,) = decode_protobuf(export(bare), without_arguments=True).calls
    assert call.args == {}


def test_the_same_call_hashes_alike_from_protobuf_and_json_whatever_its_key_order():
    (from_pb,) = decode_protobuf(export(TOOL)).calls
    body = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "billing-agent"}}]},
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": TRACE.hex(),
                                "endTimeUnixNano": "1700000000123456789",
                                "attributes": [
                                    {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
                                    {"key": "gen_ai.tool.name", "value": {"stringValue": "refund"}},
                                    {"key": "gen_ai.tool.call.id", "value": {"stringValue": "call-7"}},
                                    {
                                        "key": "gen_ai.tool.call.arguments",
                                        "value": {"stringValue": '{"amount": "10.00", "order": 42}'},
                                    },
                                    {
                                        "key": "gen_ai.tool.call.result",
                                        "value": {"stringValue": "refused: order already refunded"},
                                    },
                                ],
                            }
                        ]
                    }
                ],
            }
        ]
    }
    (from_json,) = decode_json(json.dumps(body).encode()).calls
    ids = iter(range(100))
    pb_events = events_of(from_pb, lambda: f"e{next(ids)}")
    json_events = events_of(from_json, lambda: f"e{next(ids)}")
    assert [e.args_hash for e in pb_events] == [e.args_hash for e in json_events]
    assert pb_events[1].result_hash == json_events[1].result_hash is not None
    assert pb_events[0].gate is False


def test_run_from_must_be_trace_or_an_attribute():
    with pytest.raises(ValueError, match="run_from is 'trace' or 'attribute:NAME'"):
        ReceiverOptions(run_from="conversation")


@given(st.binary(max_size=400))
def test_any_bytes_give_tool_spans_or_one_decode_error(body):
    for decode in (decode_protobuf, decode_json):
        try:
            decode(body)
        except SpanDecodeError:
            pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda c: (
        st.lists(c, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "resourceSpans",
                    "scopeSpans",
                    "spans",
                    "attributes",
                    "key",
                    "value",
                    "stringValue",
                    "status",
                    "code",
                    "x",
                ]
            ),
            c,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@given(json_values)
def test_any_json_gives_tool_spans_or_one_decode_error(value):
    try:
        decode_json(json.dumps(value).encode())
    except SpanDecodeError:
        pass


def test_a_body_nested_past_the_bound_is_refused_in_one_line():
    with pytest.raises(SpanDecodeError, match="nested deeper than 128"):
        decode_json(b"[" * 100_000 + b"]" * 100_000)


def test_arguments_nested_past_the_bound_pass_the_span_over_and_count_it():
    import asyncio

    from streams.integrations.otlp.receiver import OtlpReceiver

    deep = "[" * 200 + "]" * 200
    spans = [a if a.key != "gen_ai.tool.call.arguments" else kv(a.key, deep) for a in TOOL]
    found = decode_protobuf(export(spans, TOOL))
    published = []

    class Client:  # the receiver's one use of the client: hand it the events
        undelivered = 0
        ids = iter(range(10))

        def next_event_id(self):
            return f"e{next(self.ids)}"

        async def enqueue_batch(self, events):
            published.extend(events)

    receiver = OtlpReceiver(Client())
    asyncio.run(receiver.publish(found))
    assert receiver.counts["too_deep"] == 1 and receiver.counts["tool_spans"] == 2
    assert [type(e).__name__ for e in published] == ["ToolCallRequested", "ToolCallCompleted"]
