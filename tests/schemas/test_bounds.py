"""Every field of the wire contract is bounded, and the decoder turns anything (arbitrary
bytes, arbitrary JSON, a valid event with one field out of range) into an event or an
``InvalidEvent``: never another exception, never a value the state codec cannot store."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.events import (
    MAX_EVENT_BYTES,
    InvalidEvent,
    decode_event,
)
from schemas.verdicts import decode_verdict, encode_verdict
from streams.app.run_store import pack_state, unpack_state
from streams.engine import engine_for, state_key

REPO = Path(__file__).resolve().parents[2]
JSONSCHEMA = REPO / "schemas" / "jsonschema"
REASONS = {"oversized", "invalid_json", "unsupported_version", "unknown_type", "invalid_event", "missing_key"}
HEX = "0" * 64


def base(**fields) -> dict:
    event = {
        "type": "tool_call.requested",
        "v": 1,
        "event_id": "e1",
        "run_id": "r1",
        "session_key": "s",
        "tool_name": "read",
        "args_hash": "read:" + HEX,
    }
    event.update(fields)
    return event


def encode(obj) -> bytes:
    return json.dumps(obj).encode()


def outcome(data: bytes):
    """The event, or the InvalidEvent: anything else raised fails the test."""
    try:
        return decode_event(data)
    except InvalidEvent as exc:
        assert exc.reason in REASONS, exc.reason
        assert exc.detail and "\n" not in exc.detail and len(exc.detail) <= 300, exc.detail
        return exc


# -- the exported JSON Schema: every field has a bound ------------------------------------------


def _unbounded(node, path: str, defs: dict, seen: set[str]) -> list[str]:
    if not isinstance(node, dict):
        return []
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        if name in seen:
            return []
        return _unbounded(defs[name], f"{path}->{name}", defs, seen | {name})
    problems = []
    for key in ("anyOf", "oneOf", "allOf"):
        for i, sub in enumerate(node.get(key, [])):
            problems += _unbounded(sub, f"{path}|{i}", defs, seen)
    kind = node.get("type")
    bounded = "enum" in node or "const" in node
    if kind in ("integer", "number") and not bounded:
        if not ({"minimum", "exclusiveMinimum"} & node.keys() and {"maximum", "exclusiveMaximum"} & node.keys()):
            problems.append(f"{path}: {kind} without a minimum and a maximum")
    if kind == "string" and not bounded and "maxLength" not in node:
        problems.append(f"{path}: string without maxLength")
    if kind == "array":
        if "maxItems" not in node:
            problems.append(f"{path}: array without maxItems")
        problems += _unbounded(node.get("items"), f"{path}[]", defs, seen)
    if kind == "object":
        for name, sub in node.get("properties", {}).items():
            problems += _unbounded(sub, f"{path}.{name}", defs, seen)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            if "maxProperties" not in node:
                problems.append(f"{path}: map without maxProperties")
            problems += _unbounded(extra, f"{path}{{}}", defs, seen)
    return problems


@pytest.mark.parametrize("name", sorted(p.name for p in JSONSCHEMA.glob("*.json")))
def test_every_field_of_the_exported_schema_is_bounded(name):
    schema = json.loads((JSONSCHEMA / name).read_text())
    defs = schema.get("$defs", {})
    problems = _unbounded(schema, "$", defs, set())
    for def_name, node in defs.items():
        problems += _unbounded(node, def_name, defs, {def_name})
    assert problems == []


def test_the_bound_check_finds_unbounded_fields():
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 0},
            "s": {"type": "string"},
            "a": {"type": "array", "items": {}},
            "m": {"type": "object", "additionalProperties": {"type": "integer"}},
            "ok": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]},
        },
    }
    assert _unbounded(schema, "$", {}, set()) == [
        "$.n: integer without a minimum and a maximum",
        "$.s: string without maxLength",
        "$.a: array without maxItems",
        "$.m: map without maxProperties",
        "$.m{}: integer without a minimum and a maximum",
    ]


# -- the bounds, at and past each limit ---------------------------------------------------------


@pytest.mark.parametrize(
    "field, ok, bad",
    [
        ("ts_ms", 2**53 - 1, 2**53),  # JavaScript's largest safe integer
        ("ts_ms", 0, -1),
        ("ts_ms", 1_780_000_000_000, 9223372036854775808),  # 2^63: what crashed the checkpoint (issue 13)
        ("event_id", "e" * 512, "e" * 513),
        ("event_id", "e", ""),
        ("run_id", "r" * 512, "r" * 513),
        ("session_key", "s" * 512, "s" * 513),
        ("session_id", "i" * 512, "i" * 513),
        ("agent_id", "a" * 512, "a" * 513),
        ("tool_call_id", "c" * 512, "c" * 513),
    ],
)
def test_each_bound_accepts_its_limit_and_dead_letters_beyond_it(field, ok, bad):
    assert not isinstance(outcome(encode(base(**{field: ok}))), InvalidEvent)
    rejected = outcome(encode(base(**{field: bad})))
    assert isinstance(rejected, InvalidEvent) and rejected.reason == "invalid_event"
    assert rejected.detail.endswith(f"- at `$.{field}`")


def test_tool_names_and_hashes_are_bounded():
    tool = "t" * 256
    assert not isinstance(outcome(encode(base(tool_name=tool, args_hash=f"{tool}:{HEX}"))), InvalidEvent)
    long = outcome(encode(base(tool_name=tool + "t", args_hash=f"{tool}t:{HEX}")))
    assert isinstance(long, InvalidEvent) and long.reason == "invalid_event" and "`$.tool_name`" in long.detail
    done = {
        "type": "tool_call.completed",
        "event_id": "d",
        "run_id": "r",
        "tool_name": "read",
        "args_hash": "read:" + HEX,
    }
    assert not isinstance(
        outcome(encode({**done, "result_hash": "error:" + HEX, "unknown_tool_name": "u" * 256})), InvalidEvent
    )
    for bad in ({"result_hash": "error:" + HEX + "0"}, {"unknown_tool_name": "u" * 257}):
        assert outcome(encode({**done, **bad})).reason == "invalid_event"
    ended = {"type": "run.ended", "event_id": "x", "run_id": "r"}
    assert outcome(encode({**ended, "reason": "r" * 257})).reason == "invalid_event"


# -- schema versions ----------------------------------------------------------------------------


@pytest.mark.parametrize("v", [2, -5, 0, 2**64, "1", 1.0, None, [1], {"major": 1}])
def test_unknown_versions_are_dead_lettered_as_unsupported(v):
    rejected = outcome(encode(base(v=v)))
    assert isinstance(rejected, InvalidEvent) and rejected.reason == "unsupported_version"
    assert rejected.detail.endswith("(supported: 1) - at `$.v`")


def test_an_unknown_version_is_named_before_fields_it_may_have_added():
    # A version-2 event with a field and a type version 1 does not know: the version is the cause.
    rejected = outcome(encode({"type": "tool_call.retried", "v": 2, "event_id": "e", "attempt": 3}))
    assert rejected.reason == "unsupported_version"
    assert outcome(encode({"type": "tool_call.retried", "v": 1, "event_id": "e"})).reason == "unknown_type"


def test_version_1_and_a_missing_version_are_accepted():
    assert decode_event(encode(base(v=1))).v == 1
    event = base()
    del event["v"]
    assert decode_event(encode(event)).v == 1


# -- deep nesting ---------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["before_type", "unknown_field", "known_field", "version"])
def test_30000_nested_arrays_are_invalid_json_with_a_one_line_detail(where):
    nest = "[" * 30000 + "]" * 30000
    event = json.dumps(base())
    if where == "before_type":
        data = '{"tool_name": ' + nest + ", " + event[1:]
    elif where == "unknown_field":
        data = '{"x": ' + nest + ", " + event[1:]
    elif where == "version":
        data = '{"v": ' + nest + ", " + event[1:].replace('"v": 1, ', "")
    else:
        data = event[:-1] + ', "tool_call_id": ' + nest + "}"
    assert len(data) < MAX_EVENT_BYTES
    rejected = outcome(data.encode())
    assert isinstance(rejected, InvalidEvent)
    assert rejected.reason in ("invalid_json", "invalid_event"), rejected
    if where != "known_field":  # after the tag msgspec checks the type first: invalid_event
        assert rejected.reason == "invalid_json" and "nested too deeply" in rejected.detail


# -- property tests: nothing but InvalidEvent, and whatever is accepted can be stored -------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
FIELDS = [
    "type",
    "v",
    "event_id",
    "run_id",
    "session_key",
    "session_id",
    "agent_id",
    "ts_ms",
    "tool_call_id",
    "tool_name",
    "args_hash",
    "known_poll",
    "gate",
    "result_hash",
    "is_error",
    "unknown_tool_name",
    "loop_veto",
    "reason",
]
extreme_ints = st.sampled_from([0, -1, 1, 2**31, 2**53 - 1, 2**53, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30])


def _accepted_event_is_storable(event) -> None:
    """What the worker does with an accepted event: run the engine, store the state, answer."""
    engine = engine_for({"tools": {"loopDetection": {"enabled": True}}})
    step = engine.handle(None, event, validated=True)
    for verdict in (step.decision, step.abort):
        if verdict is not None:
            assert decode_verdict(encode_verdict(verdict)) == verdict
    if step.state is not None:
        stored = unpack_state(pack_state(step.state, 2**62, 2**53 - 1))
        assert stored.state.last_event_ms == step.state.last_event_ms
    assert state_key(event)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_arbitrary_bytes(data):
    result = outcome(data)
    if not isinstance(result, InvalidEvent):
        _accepted_event_is_storable(result)


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_arbitrary_json(value):
    result = outcome(encode(value))
    if not isinstance(result, InvalidEvent):
        _accepted_event_is_storable(result)


@settings(max_examples=600, deadline=None)
@given(
    st.sampled_from(["tool_call.requested", "tool_call.completed", "compaction.retried", "run.ended"]),
    st.sampled_from(FIELDS),
    json_values | extreme_ints | st.text(min_size=500, max_size=600),
)
def test_a_valid_event_with_one_field_replaced(kind, field, value):
    event = base(type=kind)
    if kind in ("compaction.retried", "run.ended"):
        del event["tool_name"], event["args_hash"]
    event[field] = value
    result = outcome(encode(event))
    if not isinstance(result, InvalidEvent):
        _accepted_event_is_storable(result)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=60000), st.integers(min_value=0, max_value=3))
def test_nesting_at_any_depth(depth, where):
    nest = "[" * depth + "]" * depth
    body = json.dumps(base())[1:]
    data = [
        '{"x": ' + nest + ", " + body,
        '{"tool_name": ' + nest + ", " + body,
        json.dumps(base())[:-1] + ', "y": ' + nest + "}",
        '{"v": ' + nest + ", " + body,
    ][where]
    result = outcome(data.encode())
    assert isinstance(result, InvalidEvent)


# -- verdicts hold whatever the engine builds from the longest events ---------------------------


def test_verdicts_built_from_events_at_their_bounds_decode():
    tool, other = "t" * 255 + "a", "t" * 255 + "b"
    ids = dict(run_id="r" * 512, session_key="s" * 512, agent_id="a" * 512)
    config = {
        "tools": {
            "loopDetection": {
                "enabled": True,
                "warningThreshold": 2,
                "criticalThreshold": 4,
                "globalCircuitBreakerThreshold": 6,
            }
        },
        "loopwatch": {"abortAfterCriticalBlocks": 2},
    }
    engine = engine_for(config)
    state, verdicts = None, []
    hashes = {tool: f"{tool}:{'1' * 64}", other: f"{other}:{'2' * 64}"}
    for n in range(12):
        name = (tool, other)[n % 2] if n < 8 else tool
        event_id = f"{n:03d}" + "e" * 509
        req = {
            "type": "tool_call.requested",
            "event_id": event_id,
            "tool_call_id": "c" * 512,
            "tool_name": name,
            "args_hash": hashes[name],
            "ts_ms": 2**53 - 1,
            **ids,
        }
        step = engine.handle(state, decode_event(encode(req)), validated=True)
        state = step.state
        verdicts += [v for v in (step.decision, step.abort) if v is not None]
        if step.vetoed:
            continue
        done = {
            **req,
            "type": "tool_call.completed",
            "event_id": event_id[:-1] + "d",
            "result_hash": "error:" + "f" * 64,
            "unknown_tool_name": "u" * 256,
        }
        state = engine.handle(state, decode_event(encode(done)), validated=True).state
    kinds = {(type(v).__name__, getattr(v, "action", None)) for v in verdicts}
    assert ("Decision", "block") in kinds and ("RunAborted", None) in kinds
    for verdict in verdicts:
        assert decode_verdict(encode_verdict(verdict)) == verdict
    assert len(pack_state(state, 0, 0)) > 0


def test_a_verdict_out_of_its_bounds_is_refused_by_the_client_decoder():
    good = {
        "type": "loop.run_aborted",
        "verdict_id": "e/abort",
        "cause_event_id": "e",
        "detector": "x",
        "count": 1,
        "tool_name": "t",
        "message": "m",
    }
    assert decode_verdict(encode(good)).count == 1
    for bad in ({"count": 2**53}, {"message": "m" * 4097}, {"v": 2}, {"ts_ms": -1}):
        with pytest.raises(msgspec.ValidationError):
            decode_verdict(encode({**good, **bad}))


# -- config: loopwatch's bounds on top of upstream's rules --------------------------------------


@pytest.mark.parametrize(
    "block, path, message",
    [
        ({"historySize": 1_001}, "tools.loopDetection.historySize", "Too big: expected number to be <=1000"),
        (
            {"warningThreshold": 1e21},
            "tools.loopDetection.warningThreshold",
            "Too big: expected number to be <=1000000",
        ),
        (
            {"postCompactionGuard": {"windowSize": 1_000_001}},
            "tools.loopDetection.postCompactionGuard.windowSize",
            "Too big: expected number to be <=1000000",
        ),
    ],
)
def test_config_counts_above_their_bound_are_refused(block, path, message):
    from schemas.config import validate

    assert [str(i) for i in validate({"tools": {"loopDetection": block}})] == [f"{path}: {message}"]


def test_config_limits_are_accepted():
    from schemas.config import validate

    block = {
        "enabled": True,
        "historySize": 1_000,
        "warningThreshold": 999_998,
        "criticalThreshold": 999_999,
        "globalCircuitBreakerThreshold": 1_000_000,
        "unknownToolThreshold": 1_000_000,
        "postCompactionGuard": {"windowSize": 1_000_000},
    }
    agents = [{"id": f"{n:03d}" + "a" * 509} for n in range(1000)]
    assert (
        validate(
            {
                "tools": {"loopDetection": block},
                "agents": {"list": agents},
                "loopwatch": {"abortAfterCriticalBlocks": 1_000_000},
            }
        )
        == []
    )


def test_config_agents_are_bounded():
    from schemas.config import validate

    assert [str(i) for i in validate({"agents": {"list": [{"id": "a" * 513}]}})] == [
        "agents.list[0].id: Too big: expected string to have <=512 characters"
    ]
    assert [str(i) for i in validate({"agents": {"list": [{"id": str(n)} for n in range(1001)]}})] == [
        "agents.list: Too big: expected array to have <=1000 items"
    ]
    assert [str(i) for i in validate({"loopwatch": {"abortAfterCriticalBlocks": 1_000_001}})] == [
        "loopwatch.abortAfterCriticalBlocks: Too big: expected number to be <=1000000"
    ]


def test_a_config_file_over_a_mebibyte_is_refused_before_parsing(tmp_path):
    from schemas.config import ConfigError, load_config_file

    path = tmp_path / "big.yaml"
    path.write_text("# " + "x" * (1024 * 1024) + "\n{}\n")
    with pytest.raises(ConfigError, match="larger than 1048576 bytes"):
        load_config_file(path)


# -- the hash fields: exactly what the exported JSON Schema's pattern accepts ---------------------

HASH_FIELDS = {
    # field: (event kind, extra fields it needs, the exported schema's pattern)
    "result_hash": ("tool_call.completed", {}, "(error:)?[0-9a-f]{64}"),
    "normalized_result_hash": ("tool_call.completed", {"result_hash": HEX}, "(error:)?[0-9a-f]{64}"),
    "failure_identity_hash": (
        "tool_call.completed",
        {"result_hash": HEX, "outcome_kind": "terminal-exec-failure", "tool_name": "exec", "args_hash": "exec:" + HEX},
        "[0-9a-f]{64}",
    ),
    "target_hash": ("tool_call.requested", {"tool_name": "write", "args_hash": "write:" + HEX}, "[0-9a-f]{64}"),
}
hash_like = st.one_of(
    st.text(alphabet="0123456789abcdefABCDEF:erox\n é\u0660", min_size=60, max_size=72),
    st.text(alphabet="0123456789", min_size=63, max_size=65),
    st.builds(
        lambda p, h, s: p + h + s,
        st.sampled_from(["", "error:", "Error:", "error", "x"]),
        st.text(alphabet="0123456789abcdef", min_size=63, max_size=65),
        st.sampled_from(["", "\n", " ", "g"]),
    ),
)


def test_the_hash_oracle_is_the_exported_pattern():
    props = {}
    for name in ("tool-calls.event.v1.json",):
        schema = json.loads((JSONSCHEMA / name).read_text())
        for definition in schema.get("$defs", {}).values():
            for field, sub in definition.get("properties", {}).items():
                for option in sub.get("anyOf", [sub]):
                    if "pattern" in option:
                        props[field] = option["pattern"]
    for field, (_kind, _extra, pattern) in HASH_FIELDS.items():
        assert props[field] == f"^{pattern}$", field


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(sorted(HASH_FIELDS)), hash_like)
def test_a_hash_field_is_accepted_exactly_when_it_matches_the_schema_pattern(field, value):
    """The decoder checks the hash fields in Python (not msgspec's regex): it must accept what
    the JSON Schema's pattern accepts, as an ECMA-262 validator reads it (``$`` is the very
    end), and nothing else."""
    import re

    kind, extra, pattern = HASH_FIELDS[field]
    event = base(type=kind, **extra)
    if kind == "tool_call.completed":
        event.pop("gate", None)
    event[field] = value
    result = outcome(encode(event))
    if re.fullmatch(pattern, value):
        assert not isinstance(result, InvalidEvent), result
        assert getattr(result, field) == value
    else:
        assert isinstance(result, InvalidEvent) and result.reason == "invalid_event", result
        assert f"`$.{field}`" in result.detail
