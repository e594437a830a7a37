"""The part the framework adapters share (``streams/integrations/frameworks/guard.py``), without Kafka:
what framework values become before the edge hashes them, and a run's default identity."""

from __future__ import annotations

import dataclasses
import json

import pydantic
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from streams.client import LoopwatchClient
from streams.edge.hashing import ThrownError, args_hash
from streams.integrations.frameworks.guard import json_args, open_run, plain, thrown

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=6), JSON, max_size=5))
def test_json_arguments_hash_as_the_value_they_encode_whatever_the_spacing(args):
    compact = json.dumps(args, separators=(",", ":"))
    spaced = json.dumps(args, indent=2, sort_keys=True)
    assert args_hash("t", json_args(compact)) == args_hash("t", json_args(spaced)) == args_hash("t", args)


@given(st.text().filter(lambda t: _not_json(t)))
def test_arguments_that_are_not_json_stay_text(text):
    assert json_args(text) == text


def _not_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return True
    return False


@given(JSON)
def test_plain_leaves_json_values_as_they_are(value):
    assert plain(value) == value


class Page(pydantic.BaseModel):
    title: str
    tags: list[str]


@dataclasses.dataclass
class Hit:
    page: Page
    score: int


def test_models_and_dataclasses_hash_by_their_fields_and_anything_else_by_its_text():
    hit = Hit(Page(title="a", tags=["x"]), 3)
    assert plain(hit) == {"page": {"title": "a", "tags": ["x"]}, "score": 3}
    assert plain((1, {2: object.__new__(type("Opaque", (), {"__str__": lambda self: "opaque"}))})) == [
        1,
        {"2": "opaque"},
    ]


def test_an_exception_is_upstreams_thrown_error_and_a_framework_text_its_message():
    assert thrown(RuntimeError("down")) == ThrownError(message="down", name="RuntimeError")
    assert thrown("Error: nosuch is not a valid tool") == ThrownError(message="Error: nosuch is not a valid tool")


async def test_a_run_without_session_key_gets_one_and_the_active_trace_id():
    client = LoopwatchClient("127.0.0.1:1")  # never started: nothing is sent
    guard = open_run(client, "r1", agent_id="ops")
    assert guard.run.fields["session_key"] == "agent:ops:r1" and guard.run.trace_id is None
    context = SpanContext(trace_id=0x1234, span_id=0x99, is_remote=False, trace_flags=TraceFlags(1))
    with trace.use_span(NonRecordingSpan(context)):
        traced = open_run(client, "r2", session_key="agent:main:s")
    assert traced.run.fields["session_key"] == "agent:main:s" and traced.run.trace_id == f"{0x1234:032x}"
    assert open_run(client, agent_id=None).run.fields["run_id"]  # a fresh run id when none is given
    await client.stop()
