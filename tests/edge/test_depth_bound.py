"""The nesting bound of the canonical form and the edge hashing: a value nested deeper than
``JSON_DEPTH_LIMIT`` (128, serde_json's default) is refused with ``TooDeep`` (a ``ValueError``),
however deep it is, never with a ``RecursionError``; one at the bound is serialised.

Expected serialisations are written by hand: ``[[...[0]...]]`` is its brackets around ``0``."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streams.edge.canonical import (
    JSON_DEPTH_LIMIT,
    TooDeep,
    check_depth,
    digest,
    exceeds_depth,
    json_text_exceeds_depth,
    stable_bytes,
    stable_stringify,
    text_exceeds_depth,
)
from streams.edge.hashing import args_hash, gemini_call_key, hash_outcome, js_json_stringify, strip_volatile_send_ids


def nest(shape: list[bool], leaf: object = 0) -> object:
    """``leaf`` inside one container per entry of ``shape`` (True: a dict under key "k", False:
    a list), the first entry outermost; built without recursion."""
    value = leaf
    for is_dict in reversed(shape):
        value = {"k": value} if is_dict else [value]
    return value


def text_of(shape: list[bool], leaf: str = "0") -> str:
    opened = "".join('{"k":' if is_dict else "[" for is_dict in shape)
    closed = "".join("}" if is_dict else "]" for is_dict in reversed(shape))
    return opened + leaf + closed


HASHERS = {
    "stable_stringify": stable_stringify,
    "stable_bytes": stable_bytes,
    "digest": digest,
    "normalised stable_stringify": lambda v: stable_stringify(v, str.lower),
    "js_json_stringify": js_json_stringify,
    "gemini_call_key": lambda v: gemini_call_key("t", v),
    "args_hash": lambda v: args_hash("t", v),
    "strip_volatile_send_ids": strip_volatile_send_ids,
    "hash_outcome of a result": lambda v: hash_outcome("t", {}, result={"details": {"d": v}}),
    "hash_outcome of a thrown value": lambda v: hash_outcome("t", {}, error=v),
    "hash_outcome of a send": lambda v: hash_outcome("message", {"action": "send"}, result={"details": {"d": v}}),
}

shapes = st.lists(st.booleans(), min_size=1, max_size=400)


@pytest.mark.parametrize("name", HASHERS)
def test_a_value_100000_deep_is_refused_with_too_deep(name):
    value = nest([i % 3 == 0 for i in range(100_000)])
    with pytest.raises(TooDeep, match="nested deeper than 128 levels"):
        HASHERS[name](value)


@pytest.mark.parametrize("name", HASHERS)
@settings(max_examples=60, deadline=None)
@given(shape=shapes)
@example(shape=[False] * 126)
@example(shape=[True] * 127)
@example(shape=[False] * 128)
@example(shape=[True, False] * 64 + [True])
def test_mixed_nesting_is_refused_exactly_past_the_bound(name, shape):
    value = nest(shape)
    hasher = HASHERS[name]
    # The hashers that wrap the value add their own levels: a result hashes {"details": {"d": v},
    # "text": ...}, two more; a send hashes its details {"d": v} alone, one more.
    wrapped = {"hash_outcome of a result": 2, "hash_outcome of a send": 1}.get(name, 0)
    if len(shape) + wrapped > JSON_DEPTH_LIMIT:
        with pytest.raises(TooDeep):
            hasher(value)
    else:
        hasher(value)  # no error at or below the bound


@settings(max_examples=100, deadline=None)
@given(shape=st.lists(st.booleans(), min_size=0, max_size=JSON_DEPTH_LIMIT))
def test_at_the_bound_the_serialisation_is_the_brackets_around_the_leaf(shape):
    assert stable_stringify(nest(shape)) == text_of(shape)
    assert stable_stringify(nest(shape, 0.5)) == text_of(shape, "0.5")  # floats take the slow path


@settings(max_examples=200, deadline=None)
@given(shape=shapes)
def test_exceeds_depth_counts_containers(shape):
    assert exceeds_depth(nest(shape)) is (len(shape) > JSON_DEPTH_LIMIT)
    assert exceeds_depth(nest(shape), len(shape)) is False
    assert exceeds_depth(nest(shape), len(shape) - 1) is True


def test_depth_counts_the_deepest_branch_not_the_first():
    wide = {"a": 1, "b": [nest([False] * 200)], "c": []}
    assert exceeds_depth(wide)
    with pytest.raises(TooDeep):
        check_depth(wide)
    check_depth(nest([True] * JSON_DEPTH_LIMIT))


def test_a_cycle_within_the_bound_is_still_circular():
    cycle: list = []
    cycle.append(cycle)
    assert stable_stringify(cycle) == '["[Circular]"]'


def test_too_deep_is_bad_input():
    assert issubclass(TooDeep, ValueError)


# -- the pre-scan of JSON text: refused before any decoder recurses into it ---------------------------


@given(st.lists(st.booleans(), min_size=0, max_size=3 * JSON_DEPTH_LIMIT), st.sampled_from(["0", '"[{"', '"\\\\"']))
def test_text_exceeds_depth_counts_the_nesting_of_the_text(shape, leaf):
    # A string leaf holding brackets (or an escaped backslash) is text, not nesting.
    assert text_exceeds_depth(text_of(shape, leaf)) is (len(shape) > JSON_DEPTH_LIMIT)
    assert text_exceeds_depth(text_of(shape, leaf).encode()) is (len(shape) > JSON_DEPTH_LIMIT)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ax,:'),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet='[]{}"\\a'), inner, max_size=3),
    max_leaves=400,
)


@given(JSON_VALUES)
def test_text_exceeds_depth_agrees_with_the_walk_of_the_decoded_value(value):
    import json

    assert text_exceeds_depth(json.dumps(value)) is exceeds_depth(value)


def test_text_exceeds_depth_of_100000_brackets_is_quick_and_true():
    assert text_exceeds_depth("[" * 100_000 + "]" * 100_000)
    assert text_exceeds_depth(b"{" * 100_000)  # unterminated: still refused before decoding


# -- the same count on JSON text, in passes of bytes methods (what the importers ask first) ------


@given(st.lists(st.booleans(), min_size=0, max_size=3 * JSON_DEPTH_LIMIT), st.sampled_from(["0", '"[{"', '"\\\\"']))
def test_json_text_exceeds_depth_counts_the_nesting_of_the_text(shape, leaf):
    assert json_text_exceeds_depth(text_of(shape, leaf)) is (len(shape) > JSON_DEPTH_LIMIT)
    assert json_text_exceeds_depth(text_of(shape, leaf).encode()) is (len(shape) > JSON_DEPTH_LIMIT)


@settings(max_examples=300)
@given(JSON_VALUES, st.integers(min_value=0, max_value=2 * JSON_DEPTH_LIMIT))
def test_json_text_exceeds_depth_agrees_with_the_walk_on_json_text(value, wrap):
    import json

    # wrapped to nest near the bound, with the strings' brackets, quotes and backslashes inside
    value = nest([w % 2 == 0 for w in range(wrap)], value)
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False, indent=1)):
        assert json_text_exceeds_depth(text) is exceeds_depth(value)


def _old_decode(text: str) -> object:
    """The importers' decoding as it was: the regular expression's count first, then msgspec."""
    import msgspec

    if text_exceeds_depth(text):
        return "too deep"
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        return "not JSON"


@settings(max_examples=500)
@given(
    JSON_VALUES,
    st.integers(min_value=0, max_value=2 * JSON_DEPTH_LIMIT),
    st.lists(st.tuples(st.integers(min_value=0), st.sampled_from(list('[]{}"\\ a'))), max_size=3),
)
def test_the_importers_decoding_refuses_what_it_refused_before_even_on_text_that_is_no_json(value, wrap, edits):
    import json

    import msgspec

    from streams.importers.reader import _decode_bounded

    text = json.dumps(nest([w % 3 == 0 for w in range(wrap)], value))
    for at, char in edits:  # a stray bracket, quote or backslash anywhere
        at %= len(text) + 1
        text = text[:at] + char + text[at:]
    try:
        got: object = _decode_bounded(text)
    except TooDeep:
        got = "too deep"
    except msgspec.DecodeError:
        got = "not JSON"
    assert got == _old_decode(text)
