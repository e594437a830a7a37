"""Canonical serialisation: golden values from the spec and properties against independent
implementations (Python's json module where both must agree, float parsing for numbers)."""

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.edge.canonical import UNDEFINED, digest, js_number, js_trim, stable_stringify
from streams.edge.hashing import ThrownError, args_hash, hash_outcome


def test_golden_digests_from_the_spec():
    assert stable_stringify({"path": "/file.txt"}) == '{"path":"/file.txt"}'
    assert args_hash("read", {"path": "/file.txt"}) == (
        "read:fcd70c3cc3a31a5afa413e0119a4058f9c6e65288d5621a73ef706cb0649666b"
    )
    assert digest({"details": {"ok": True}, "text": "same output"}) == (
        "e8247a52b90c18a8c1ecdca3031675433387e6001940e9a290d3726bf729a020"
    )
    assert hash_outcome("exec", {}, error=ThrownError("Tool exec not found")).result_hash == (
        "error:97dac4bb07ccc8dc5e8636bef0977d8d47b19daded96b97cb9d141a474c77cb9"
    )


def test_ecmascript_number_formatting():
    cases = {
        1: "1",
        2.5: "2.5",
        -0.0: "0",
        1e21: "1e+21",
        1e-7: "1e-7",
        1e-5: "0.00001",
        1e16: "10000000000000000",
        12345678901234567890: "12345678901234567000",
        0.1: "0.1",
        100.0: "100",
        1.5e300: "1.5e+300",
        5e-324: "5e-324",
        -1e-7: "-1e-7",
        1e20: "100000000000000000000",
        0.000001: "0.000001",
        123e-20: "1.23e-18",
    }
    for value, text in cases.items():
        assert js_number(value) == text, value


def test_special_values():
    assert stable_stringify([float("nan"), float("inf"), -float("inf"), None]) == '["NaN","Infinity","-Infinity",null]'
    assert stable_stringify({"status": UNDEFINED}) == '{"status":undefined}'
    assert digest({"status": UNDEFINED}) != digest({"status": None})  # missing is not null


def test_strings_escape_like_well_formed_json_stringify():
    assert stable_stringify("\ud800") == '"\\ud800"'  # a lone surrogate is kept, escaped
    assert stable_stringify("é\u2028\x7f") == '"é\u2028\x7f"'  # non-ASCII is not escaped
    assert stable_stringify('\x00\x1f\b\t\n\f\r"\\') == '"\\u0000\\u001f\\b\\t\\n\\f\\r\\"\\\\"'


def test_keys_sort_by_utf16_code_units():
    # U+1F600 is D83D DE00 in UTF-16, which sorts before U+E000 (code points say otherwise).
    assert stable_stringify({"\ue000": 1, "\U0001f600": 2}) == '{"\U0001f600":2,"\ue000":1}'


def test_cycles_serialise_as_circular_and_shared_references_in_full():
    shared = {"id": "x"}
    root = {"a": shared, "b": shared}
    root["self"] = root
    assert stable_stringify(root) == '{"a":{"id":"x"},"b":{"id":"x"},"self":"[Circular]"}'


def test_js_trim_differs_from_str_strip_exactly_where_the_spec_says():
    assert js_trim("\ufeff x \u00a0") == "x"
    assert js_trim("\x85x\x1c") == "\x85x\x1c"


finite = st.floats(allow_nan=False, allow_infinity=False)


@given(finite)
def test_js_number_round_trips(value):
    text = js_number(value)
    assert float(text) == value or (value == 0 and float(text) == 0)
    if 1e-6 <= abs(value) < 1e21:
        assert "e" not in text
    elif value != 0:
        assert "e" in text


@given(st.integers(min_value=-(2**53), max_value=2**53))
def test_safe_integers_print_as_integers(value):
    assert js_number(value) == str(value)
    assert js_number(float(value)) == str(value)


json_scalars = (
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(alphabet=st.characters(max_codepoint=0xD7FF))
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(alphabet=st.characters(max_codepoint=0xD7FF), max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300)
@given(json_values)
def test_matches_an_independent_json_encoder_where_both_apply(value):
    # Without floats and with keys below the surrogate range, upstream's output is plain
    # sorted compact JSON with non-ASCII kept: Python's json module produces exactly that.
    expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert stable_stringify(value) == expected


@given(st.dictionaries(st.text(max_size=5), json_scalars, max_size=6), st.randoms())
def test_key_order_never_matters(obj, rnd):
    items = list(obj.items())
    rnd.shuffle(items)
    assert digest(dict(items)) == digest(obj)


@given(json_values)
def test_digest_is_64_lowercase_hex(value):
    d = digest(value)
    assert len(d) == 64 and d == d.lower() and int(d, 16) >= 0


@given(finite)
def test_floats_serialise_to_parseable_json(value):
    parsed = json.loads(stable_stringify([value]))[0]
    assert math.isclose(parsed, value, rel_tol=0, abs_tol=0) or parsed == value


@settings(max_examples=500)
@given(
    st.text(alphabet=st.characters(codec=None, exclude_categories=()))
    | st.text(alphabet='\n\t"\\\x00\x1f\x7f\u2028\ud800\udfffa\u00e9')
)
def test_quoting_fast_path_escapes_as_the_character_rules_do(text):
    """The C encoder's quoting (the fast path for text without lone surrogates) gives the
    bytes that upstream's character rules (``_SHORT_ESCAPES``, ``\\u%04x``) give, character by
    character, for any text."""
    from streams.edge.canonical import _NEEDS_ESCAPE, _escape_char, _quote

    assert _quote(text) == '"' + _NEEDS_ESCAPE.sub(_escape_char, text) + '"'


any_text = st.text(alphabet=st.characters(codec=None, exclude_categories=())) | st.text(
    alphabet='a\ud800\udfff\ue000\U0001f600\n"'
)
any_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.floats(allow_nan=True) | any_text,
    lambda children: (
        st.lists(children, max_size=4) | st.tuples(children, children) | st.dictionaries(any_text, children, max_size=4)
    ),
    max_leaves=25,
)


@settings(max_examples=500)
@given(any_values)
def test_the_plain_json_fast_path_writes_what_the_value_walk_writes(value):
    """For any value (floats, big integers, lone surrogates, keys past U+D800 included), the
    C encoder's fast path and the value-at-a-time serialisation give the same text: the fast
    path is taken only where they agree."""
    from streams.edge.canonical import _write

    out: list[str] = []
    _write(value, out, [])
    assert stable_stringify(value) == "".join(out)


def test_the_fast_path_leaves_cycles_and_deep_values_to_the_walk():
    from streams.edge.canonical import _PLAIN_DEPTH

    cyclic: dict = {"a": 1}
    cyclic["self"] = cyclic
    assert stable_stringify(cyclic) == '{"a":1,"self":"[Circular]"}'
    deep: list = []
    for _ in range(_PLAIN_DEPTH + 5):
        deep = [deep]
    assert stable_stringify(deep) == "[" * (_PLAIN_DEPTH + 6) + "]" * (_PLAIN_DEPTH + 6)


def _plain_before(value, depth):
    """``streams.edge.canonical._plain`` as it was at 968e5d1 (a call per leaf): the reference for
    the version that checks ASCII string leaves inline."""
    from streams.edge.canonical import _MAX_SAFE, _PLAIN_DEPTH, _SURROGATE

    kind = type(value)
    if kind is str:
        return value.isascii() or _SURROGATE.search(value) is None
    if kind is dict:
        if depth >= _PLAIN_DEPTH:
            return False
        return all(
            type(k) is str and (k.isascii() or not k or max(k) < "\ud800") and _plain_before(v, depth + 1)
            for k, v in value.items()
        )
    if kind is list or kind is tuple:
        if depth >= _PLAIN_DEPTH:
            return False
        return all(_plain_before(v, depth + 1) for v in value)
    if kind is int:
        return -_MAX_SAFE <= value <= _MAX_SAFE
    return value is None or value is True or value is False


@settings(max_examples=500)
@given(any_values)
def test_the_fast_path_is_taken_for_exactly_the_values_it_was_taken_for_before(value):
    from streams.edge.canonical import _plain

    assert _plain(value, 0) == _plain_before(value, 0)


escapable_text = st.text(alphabet=st.characters(max_codepoint=0x7F)) | st.text(
    alphabet='\x00\x01\x08\t\n\x0b\x0c\r\x1f"\\/\x7f\u2028\u2029\u00e9\ud7ff\ue000\uffff\U0001f600a'
)


@settings(max_examples=500)
@given(any_values | st.dictionaries(escapable_text, escapable_text | st.lists(escapable_text, max_size=3), max_size=5))
def test_the_bytes_hashed_are_the_value_walks_text_in_utf8(value):
    """``digest`` and ``stable_bytes`` (msgspec's encoder on plain values) hash the UTF-8 of
    the value-at-a-time serialisation, for any value, every escaped character included."""
    import hashlib

    from streams.edge.canonical import _write, digest, stable_bytes

    out: list[str] = []
    _write(value, out, [])
    text = "".join(out).encode("utf-8")
    assert stable_bytes(value) == text
    assert digest(value) == hashlib.sha256(text).hexdigest()
