"""The shard of a line (``streams.offline.sharded.value_state_key``: the state key from the run fields
alone, what every shard reading a file itself computes for every line, and what
``run_sharded``'s parent computes) against the standard library's JSON decoder with
``schemas.keys.state_key`` (an independent decode of the whole line): the same key, so the
same shard, for every JSON line; generated with escapes, unicode, whitespace around the
separators and around the run id, any field order, duplicate keys, nested objects and arrays
that hold a ``run_id`` of their own."""

from __future__ import annotations

import json
from types import SimpleNamespace

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.fleets import BASELINE
from schemas.events import encode_event
from schemas.keys import state_key
from streams.engine import engine_for
from streams.offline.scenarios import fleet_trace
from streams.offline.sharded import value_state_key

WS = st.sampled_from(["", " ", "\t", "\u00a0", "\ufeff", "\u2003", "\n", "  "])
RUN_IDS = st.one_of(
    st.text(max_size=12),
    st.builds(lambda a, b, c: a + b + c, WS, st.text('run-0123456789"\\/é☃\U0001f600{}', max_size=10), WS),
    st.none(),
    st.integers(),
    st.just(""),
    st.just("   "),
)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=8), st.sampled_from(['"run_id":"x"', "run_id", "{", "\\"])
)
NESTED = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["run_id", "a", "session_key"]), inner, max_size=3)
    ),
    max_leaves=5,
)


@st.composite
def lines(draw):
    members = []
    if draw(st.booleans()):
        members.append(("run_id", draw(RUN_IDS)))
    for name in ("session_key", "session_id"):
        if draw(st.booleans()):
            members.append((name, draw(st.one_of(st.none(), st.text(max_size=8)))))
    for name in draw(
        st.lists(st.sampled_from(["type", "event_id", "tool_name", "args", "run_id", "ts_ms"]), max_size=4)
    ):
        members.append((name, draw(NESTED)))  # a second "run_id" is a duplicate key
    members = draw(st.permutations(members))
    ascii_only = draw(st.booleans())
    colon, comma, pad = draw(st.sampled_from([":", " :", ": ", " : "])), draw(st.sampled_from([",", ", "])), draw(WS)
    pad = pad if pad in ("", " ", "\t", "  ") else ""  # JSON's own whitespace only, outside strings
    body = comma.join(f"{json.dumps(k)}{colon}{json.dumps(v, ensure_ascii=ascii_only)}" for k, v in members)
    text = pad + "{" + body + "}" + pad
    if draw(st.booleans()) and draw(st.booleans()):
        text = "[" + text + "]"  # an array holding the object: not an event
    return (text + draw(st.sampled_from(["", "\n"]))).encode("utf-8", "surrogatepass")


def stdlib_key(line: bytes) -> bytes | None:
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    fields = SimpleNamespace(
        run_id=doc.get("run_id"), session_key=doc.get("session_key"), session_id=doc.get("session_id")
    )
    return state_key(fields).encode("utf-8", "surrogatepass")


def is_json(line: bytes) -> bool:
    try:
        msgspec.json.decode(line)
    except msgspec.DecodeError:
        return False
    return True


@settings(max_examples=3000, deadline=None)
@given(lines())
def test_the_run_fields_give_the_full_decodes_key_on_every_json_line(line):
    if not is_json(line):  # a lone surrogate from the text strategy: not UTF-8, so not JSON
        assert value_state_key(line) is None
        return
    assert value_state_key(line) == stdlib_key(line)


@pytest.mark.parametrize(
    "line, key",
    [
        (b'{"run_id":"r1","x":1}', b"run:r1"),
        (b'{"run_id":" r1\\u00a0","x":1}', b"run:r1"),  # escaped: decoded, then trimmed
        (b'{"run_id":"\xc3\xa9\xe2\x98\x83 "}\n', "run:é☃".encode()),  # raw unicode, trimmed
        (b'{"run_id" : "r1"}', b"run:r1"),  # whitespace around the colon
        (b'{"run_id":"r1","run_id":"r2"}', b"run:r2"),  # a duplicate: the last wins
        (b'{"args":{"run_id":"inner"},"session_key":"s"}', b"session:s|"),  # nested: not the event's
        (b'[{"run_id":"r1"}]', None),  # not an object
        (b'{"run_id":"  ","session_id":"i"}', b"session:|i"),  # blank: no run
        (b'{"run_id":null,"session_key":"s"}', b"session:s|"),
    ],
)
def test_hand_worked_lines(line, key):
    assert value_state_key(line) == key


def test_the_key_of_the_events_the_runners_publish():
    events, _ = fleet_trace(50, 10, seed=3, engine=engine_for(BASELINE), end=True)
    for event in events:
        line = encode_event(event) + b"\n"
        assert value_state_key(line) == stdlib_key(line) == f"run:{event.run_id}".encode()
