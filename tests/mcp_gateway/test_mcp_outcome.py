"""The canonical form of an MCP tool result and the hashes the gateway publishes for it
(docs/mcp-gateway.md §2), checked against an independent computation: Python's own ``json`` with
keys in UTF-16 code-unit order and ``hashlib`` (the form's spec, written out), and the spec's
worked examples.

Values are limited to strings, integers, booleans, null, lists and objects: on those, JavaScript's
``JSON.stringify`` with sorted keys and ``json.dumps(..., separators=(",", ":"), ensure_ascii=False)``
of the keys so ordered agree byte for byte (numbers with a fraction are JavaScript's own format:
streams/edge/canonical.py, tested on its own).
"""

from __future__ import annotations

import hashlib
import json

import mcp_types as types
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streams.edge.canonical import js_trim  # JavaScript's trim (spec §2.2), tested on its own
from streams.edge.events import completed_event
from streams.edge.hashing import ThrownError
from streams.integrations.mcp.outcome import canonical_form, edge_outcome, unknown_tool_error


def independent_digest(value) -> str:
    """sha256 of compact JSON with keys in UTF-16 code-unit order, as JavaScript sorts them
    (big-endian UTF-16 bytes compare as the code units do; Python's own order is by code
    point, which puts U+E000 before U+10000)."""

    def ordered(v):
        if isinstance(v, dict):
            return {k: ordered(v[k]) for k in sorted(v, key=lambda k: k.encode("utf-16-be"))}
        if isinstance(v, list):
            return [ordered(x) for x in v]
        return v

    return hashlib.sha256(json.dumps(ordered(value), separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()


def published(result) -> object:
    return completed_event("e1", "tool", {"a": 1}, **edge_outcome(result))


# The spec's worked examples (docs/mcp-gateway.md §2.3), their hashes computed by hand there.
def test_worked_example_1_a_text_result():
    result = types.CallToolResult(content=[types.TextContent(type="text", text="14:00 in Asia/Tokyo")])
    assert canonical_form(result) == {
        "content": [{"type": "text", "text": "14:00 in Asia/Tokyo"}],
        "structuredContent": None,
        "isError": False,
    }
    event = published(result)
    assert event.result_hash == "d0093fab9ca14fe9fc17c1c9d11da5890b5494e46b61f3fdc83b51f8ae2e0545"
    assert not event.is_error and event.unknown_tool_name is None


def test_worked_example_2_structured_content_counts():
    result = types.CallToolResult(
        content=[types.TextContent(type="text", text='{"sum": 5}')], structured_content={"sum": 5}
    )
    assert published(result).result_hash == "9bd4048e2d5ee32a406f1aa131c5b9c82392aaae4ac540a34110f57ab615b450"
    other = types.CallToolResult(
        content=[types.TextContent(type="text", text='{"sum": 5}')], structured_content={"sum": 6}
    )
    assert published(other).result_hash != published(result).result_hash


def test_worked_example_3_an_error_result_is_a_thrown_error_of_its_text():
    result = types.CallToolResult(
        content=[types.TextContent(type="text", text="Permission denied: /etc/shadow")], is_error=True
    )
    event = published(result)
    assert event.result_hash == "error:1eea5b07c36647dcdea0dabec4ed96f86d681b5f03a57c56d0fb4da8b643de92"
    assert event.is_error and event.unknown_tool_name is None


def test_worked_example_4_unknown_tool():
    event = completed_event("e1", "no_such_tool", {}, error=unknown_tool_error("no_such_tool", "Invalid params"))
    assert event.result_hash == "error:c5d29696144084158d419c0981872dca28b211319cb50888453c8218d3f34a18"
    assert event.unknown_tool_name == "no_such_tool"
    # a server's own message is kept when the unknown-tool patterns read a name from it
    assert unknown_tool_error("x", "Tool x not found").message == "Tool x not found"
    assert unknown_tool_error("x", "MCP error -32602: invalid arguments").message == "Unknown tool: x"


def test_wire_dict_and_model_give_one_form_and_transport_fields_are_left_out():
    result = types.CallToolResult(
        content=[types.ImageContent(type="image", data="AAAA", mime_type="image/png")],
        meta={"io.modelcontextprotocol/serverInfo": {"name": "s", "version": "1"}},
    )
    wire = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert "_meta" in wire and "resultType" in wire
    assert (
        canonical_form(result)
        == canonical_form(wire)
        == {
            "content": [{"type": "image", "data": "AAAA", "mimeType": "image/png"}],
            "structuredContent": None,
            "isError": False,
        }
    )


def test_an_image_changes_the_hash_though_it_has_no_text():
    a = types.CallToolResult(content=[types.ImageContent(type="image", data="AAAA", mime_type="image/png")])
    b = types.CallToolResult(content=[types.ImageContent(type="image", data="BBBB", mime_type="image/png")])
    assert published(a).result_hash != published(b).result_hash


def test_an_error_without_text_hashes_its_form():
    result = {"content": [], "structuredContent": {"code": 7}, "isError": True}
    outcome = edge_outcome(result)["error"]
    assert isinstance(outcome, ThrownError)
    assert json.loads(outcome.message) == {"content": [], "isError": True, "structuredContent": {"code": 7}}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
blocks = st.lists(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text()})
    | st.fixed_dictionaries({"type": st.just("image"), "data": st.text(), "mimeType": st.text()}),
    max_size=4,
)


@settings(max_examples=300, deadline=None)
@given(content=blocks, structured=json_values)
@example(content=[], structured={"\ue000": None, "\U00010000": None})  # code-unit order differs from code-point order
def test_success_hash_is_the_digest_of_details_and_text(content, structured):
    wire = {"content": content, "structuredContent": structured, "isError": False}
    form = {"content": content, "structuredContent": structured, "isError": False}
    text = "\n".join(b["text"] for b in content if b["type"] == "text")
    assert published(wire).result_hash == independent_digest({"details": form, "text": js_trim(text)})


@settings(max_examples=300, deadline=None)
@given(content=blocks, structured=json_values)
def test_error_hash_is_the_digest_of_its_text(content, structured):
    wire = {"content": content, "structuredContent": structured, "isError": True}
    text = js_trim("\n".join(b["text"] for b in content if b["type"] == "text"))
    event = published(wire)
    assert event.is_error and event.result_hash.startswith("error:")
    if text:  # the error text is hashed as a JSON string (spec §2.3 rule 1: digest of the text)
        assert event.result_hash == "error:" + independent_digest(text)
