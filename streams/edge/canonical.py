"""Canonical serialisation and digests, byte-compatible with upstream's ``stableStringify``.

JSON-like Python values (dict, list, str, int, float, bool, None) are serialised with
ECMAScript semantics: numbers are IEEE doubles printed as ``Number.prototype.toString``
prints them, strings are escaped as well-formed ``JSON.stringify`` escapes them, object
keys are sorted by UTF-16 code units.  ``UNDEFINED`` stands for JavaScript's ``undefined``
where upstream builds an object field from a missing value (spec §2.2, §2.3 rule 6).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Iterable
from json.encoder import encode_basestring as _json_quote
from typing import Any, cast

import msgspec

from schemas.errors import LoopwatchError
from schemas.keys import JS_WHITESPACE  # the one definition of ECMAScript trim()'s whitespace

__all__ = [
    "JSON_DEPTH_LIMIT",
    "UNDEFINED",
    "TooDeep",
    "check_depth",
    "digest",
    "exceeds_depth",
    "text_exceeds_depth",
    "json_text_exceeds_depth",
    "js_number",
    "js_trim",
    "sha256_hex",
    "stable_bytes",
    "stable_stringify",
]


class _Undefined:
    """JavaScript's ``undefined``: distinct from ``None`` (``null``) in every digest."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNDEFINED"

    def __bool__(self) -> bool:
        return False


UNDEFINED = _Undefined()


JSON_DEPTH_LIMIT = 128
"""The deepest nesting of lists and objects loopwatch reads or hashes: a JSON-RPC message, a
tool's arguments or result, a transcript record.  128 is serde_json's default recursion limit
(what a Rust MCP server refuses beyond); msgspec and Python's ``json`` stop only at the
interpreter's recursion limit (about 1,000) with a ``RecursionError``, which must not reach a
caller that serves other requests.  A scalar has depth 0, ``[]`` depth 1."""


class TooDeep(LoopwatchError, ValueError):
    """A value nested deeper than ``JSON_DEPTH_LIMIT`` (a ``ValueError``: bad input)."""

    def __init__(self, limit: int = JSON_DEPTH_LIMIT) -> None:
        super().__init__(f"nested deeper than {limit} levels of lists and objects")
        self.limit = limit


def exceeds_depth(value: object, limit: int = JSON_DEPTH_LIMIT) -> bool:
    """Whether ``value`` (decoded JSON: dicts, lists, tuples, scalars) nests deeper than
    ``limit``, found without recursion and without walking past ``limit``."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        children: Iterable[object]
        if kind is dict:
            children = cast("dict[str, object]", item).values()
        elif kind is list or kind is tuple:
            children = cast("list[object]", item)
        else:
            continue
        depth += 1
        if depth > limit:
            return True
        stack.extend((child, depth) for child in children if type(child) in _CONTAINERS)
    return False


_CONTAINERS = (dict, list, tuple)

_NESTING_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[{]+|[\]}]+', re.DOTALL)
"""A JSON string (its brackets are text), a run of opening brackets or a run of closing ones
(a run is one token, so the deepest text costs no more than its changes of direction)."""


def text_exceeds_depth(text: bytes | str, limit: int = JSON_DEPTH_LIMIT) -> bool:
    """Whether JSON ``text`` nests lists and objects deeper than ``limit``, by counting brackets
    outside strings before any decoder sees it: msgspec and ``json`` recurse once per level,
    and a line of 100,000 brackets must be refused before, not caught after.  Text that is not
    JSON gets an answer too; its decoder refuses it anyway."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if data.count(b"[") + data.count(b"{") <= limit:  # too few brackets to nest that deep
        return False
    depth = 0
    for match in _NESTING_TOKENS.finditer(data):
        token = match.group()
        first = token[0]
        if first == 0x22:
            continue
        if first == 0x5B or first == 0x7B:
            depth += len(token)
            if depth > limit:
                return True
        else:
            depth -= len(token)
    return False


_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')


def json_text_exceeds_depth(text: bytes | str, limit: int = JSON_DEPTH_LIMIT) -> bool:
    """``text_exceeds_depth`` for text that is JSON, in a few passes of bytes methods (no
    regular expression walks it): the answer is ``text_exceeds_depth``'s whenever the text is
    JSON.  On text that is not JSON the two may differ, but never so that a decoder recurses
    deeper than ``limit`` on text this calls shallow: a decoder stops at the first byte that is
    not JSON, and up to there this reads the text as JSON does.  So a caller decodes when this
    says no, and asks ``text_exceeds_depth`` which refusal to give when decoding fails."""
    if len(text) <= limit:  # a tool's arguments, mostly: too short to hold that many brackets
        return False
    if isinstance(text, str):
        if text.count("[") + text.count("{") <= limit:
            return False
        data = text.encode("utf-8", "surrogatepass")
    else:
        if text.count(b"[") + text.count(b"{") <= limit:
            return False
        data = text
    # In JSON a backslash is only ever inside a string, where it begins an escape: with the
    # escaped backslashes and then the escaped quotes gone, every quote opens or closes a
    # string.  Of the rest only quotes and brackets count; two quotes side by side hold
    # nothing between them (an empty string, or two strings' ends), and once they are gone,
    # what lies between the remaining quotes is the few strings that hold brackets.
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = data.translate(_BRACKETS, _NOT_STRUCTURE)
    if b'"' in brackets:
        brackets = brackets.replace(b'""', b"")
        if b'"' in brackets:
            brackets = b"".join(brackets.split(b'"')[::2])
    # JSON's brackets balance: each pass takes away the innermost pairs, one level, so the
    # text is empty after as many passes as it nests deep, and never if it does not balance.
    for _ in range(limit):
        if not brackets:
            return False
        brackets = brackets.replace(b"[]", b"")
    return bool(brackets)


def check_depth(value: object, limit: int = JSON_DEPTH_LIMIT) -> None:
    """``TooDeep`` when ``value`` nests deeper than ``limit``."""
    if exceeds_depth(value, limit):
        raise TooDeep(limit)


def js_trim(text: str) -> str:
    return text.strip(JS_WHITESPACE)


_MAX_SAFE = 2**53


def _to_double(value: int) -> float:
    """An integer as JavaScript would hold it after JSON.parse."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def js_number(value: float | int) -> str:
    """``Number.prototype.toString()`` of a finite number (ECMA-262 Number::toString)."""
    if isinstance(value, int):
        if -_MAX_SAFE <= value <= _MAX_SAFE:
            return str(value)
        value = _to_double(value)
    if value == 0:
        return "0"  # also -0
    if value != value or value in (math.inf, -math.inf):
        raise ValueError("js_number takes finite numbers")
    sign = "-" if value < 0 else ""
    # repr() gives the shortest round-trip digits, as ECMAScript requires.
    mantissa, _, exp = repr(abs(value)).partition("e")
    int_part, _, frac_part = mantissa.partition(".")
    if frac_part == "0":
        frac_part = ""
    digits = (int_part + frac_part).lstrip("0")
    # n: position of the decimal point relative to the start of `digits`.
    n = len(int_part) + (int(exp) if exp else 0)
    if int_part == "0":
        stripped = frac_part.lstrip("0")
        n = -(len(frac_part) - len(stripped)) + (int(exp) if exp else 0)
        digits = stripped
    digits = digits.rstrip("0") or "0"
    k = len(digits)
    if k <= n <= 21:
        body = digits + "0" * (n - k)
    elif 0 < n <= 21:
        body = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        body = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        exp_text = ("+" if e >= 0 else "-") + str(abs(e))
        body = digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + exp_text
    return sign + body


_SURROGATE = re.compile("[\ud800-\udfff]")
_NEEDS_ESCAPE = re.compile('[\x00-\x1f"\\\\\ud800-\udfff]')
_SHORT_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def _escape_char(match: re.Match[str]) -> str:
    ch = match.group(0)
    return _SHORT_ESCAPES.get(ch) or f"\\u{ord(ch):04x}"


def _quote(text: str) -> str:
    """Well-formed ``JSON.stringify`` of a string: non-ASCII kept, lone surrogates escaped."""
    if text.isascii() or _SURROGATE.search(text) is None:
        # Python's C encoder (ensure_ascii off) escapes exactly the same characters the same
        # way; only a lone surrogate, which it leaves as it is, needs the character rules
        # below.  (``isascii`` reads a flag of the string: no scan.)  Tool output is full of
        # newlines: escaping it character by character was most of what an import cost.
        return _json_quote(text)
    return '"' + _NEEDS_ESCAPE.sub(_escape_char, text) + '"'


def _utf16_key(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def _sorted_keys(obj: dict) -> list:
    keys = list(obj)
    # Code-point order equals UTF-16 order unless a key holds a char at or above U+D800.
    if any(k and max(k) >= "\ud800" for k in keys):
        keys.sort(key=_utf16_key)
    else:
        keys.sort()
    return keys


def _normalized_keys(obj: dict, normalize: Callable[[str], str]) -> list[tuple[str, str]]:
    """(original, normalised) keys ordered by the normalised key, ties by the original
    (both in UTF-16 code-unit order), as upstream sorts when it has a normaliser."""
    pairs = [(key, normalize(key)) for key in obj]
    pairs.sort(key=lambda pair: (_utf16_key(pair[1]), _utf16_key(pair[0])))
    return pairs


def _write(value: object, out: list[str], ancestors: list[int], normalize: Callable[[str], str] | None = None) -> None:
    # ``ancestors`` is the path of containers from the top: its length is the depth.
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(_quote(value if normalize is None else normalize(value)))
    elif isinstance(value, int):
        if -_MAX_SAFE <= value <= _MAX_SAFE:
            out.append(str(value))
        else:
            _write(_to_double(value), out, ancestors)
    elif isinstance(value, float):
        if value != value:
            out.append('"NaN"')
        elif value == math.inf:
            out.append('"Infinity"')
        elif value == -math.inf:
            out.append('"-Infinity"')
        else:
            out.append(js_number(value))
    elif value is UNDEFINED:
        out.append("undefined")
    elif isinstance(value, dict):
        if id(value) in ancestors:
            out.append('"[Circular]"')
            return
        if len(ancestors) >= JSON_DEPTH_LIMIT:
            raise TooDeep
        ancestors.append(id(value))
        out.append("{")
        first = True
        if normalize is None:
            pairs = [(key, key) for key in _sorted_keys(value)]
        else:
            pairs = _normalized_keys(value, normalize)
        for key, shown in pairs:
            if not first:
                out.append(",")
            first = False
            out.append(_quote(shown))
            out.append(":")
            _write(value[key], out, ancestors, normalize)
        out.append("}")
        ancestors.pop()
    elif isinstance(value, (list, tuple)):
        if id(value) in ancestors:
            out.append('"[Circular]"')
            return
        if len(ancestors) >= JSON_DEPTH_LIMIT:
            raise TooDeep
        ancestors.append(id(value))
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _write(item, out, ancestors, normalize)
        out.append("]")
        ancestors.pop()
    else:
        raise TypeError(f"cannot canonicalise a value of type {type(value).__name__}")


# The plain values' serialisation (``_plain``): msgspec's encoder writes sorted compact JSON
# with non-ASCII kept and the escapes ``JSON.stringify`` uses, as UTF-8 bytes, in one C call
# (Python's C JSON encoder took seven times as long on a tool's arguments).
_plain_json_bytes = msgspec.json.Encoder(order="sorted").encode
_PLAIN_DEPTH = 32


def _plain(value: Any, depth: int) -> bool:  # (Any: narrowed by its exact type below)
    """``value`` holds only what upstream's serialisation and msgspec's sorted encoder write
    alike: strings without lone surrogates, safe integers, booleans, null, lists, and dicts
    whose keys are strings below U+D800 (so code-point order is UTF-16 order), nested at most
    ``_PLAIN_DEPTH`` deep (a cycle fails the depth).  No floats (JavaScript prints numbers its
    own way), no ``UNDEFINED``.  Tool arguments nearly always are: one C call then writes
    them, instead of ``_write`` a value at a time."""
    kind = type(value)
    if kind is str:
        return value.isascii() or _SURROGATE.search(value) is None
    # Containers check their ASCII string leaves here, the common case, rather than through
    # a call each (the same rule as above; anything else goes through the call).
    if kind is dict:
        if depth >= _PLAIN_DEPTH:
            return False
        depth += 1
        for key, item in value.items():
            if type(key) is not str or not (key.isascii() or not key or max(key) < "\ud800"):
                return False
            if not (type(item) is str and item.isascii()) and not _plain(item, depth):
                return False
        return True
    if kind is list or kind is tuple:
        if depth >= _PLAIN_DEPTH:
            return False
        depth += 1
        for item in value:
            if not (type(item) is str and item.isascii()) and not _plain(item, depth):
                return False
        return True
    if kind is int:
        return -_MAX_SAFE <= value <= _MAX_SAFE
    return value is None or value is True or value is False


def stable_stringify(value: object, normalize: Callable[[str], str] | None = None) -> str:
    """Upstream's canonical serialisation of a JSON-like value (spec §2.2).

    ``normalize`` (profile latest, openclaw-latest.md §4.1) is applied to every string value
    and every object key before it is quoted; keys are then ordered by their normalised form.
    ``TooDeep`` when ``value`` nests deeper than ``JSON_DEPTH_LIMIT``.
    """
    # Fast path for the most common leaf types.
    if isinstance(value, str):
        return _quote(value if normalize is None else normalize(value))
    if normalize is None and _plain(value, 0):
        return _plain_json_bytes(value).decode()
    out: list[str] = []
    _write(value, out, [], normalize)
    return "".join(out)


def stable_bytes(value: object) -> bytes:
    """``stable_stringify(value)`` in UTF-8 (what ``digest`` hashes), without making the text
    first where the value is plain."""
    if type(value) is str and value.isascii():  # a tool's output, mostly
        return _plain_json_bytes(value)
    if _plain(value, 0):
        return _plain_json_bytes(value)
    return stable_stringify(value).encode("utf-8")


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def digest(value: object, normalize: Callable[[str], str] | None = None) -> str:
    """Lowercase hex SHA-256 of ``stable_stringify(value, normalize)`` in UTF-8."""
    if normalize is None:
        return hashlib.sha256(stable_bytes(value)).hexdigest()
    return sha256_hex(stable_stringify(value, normalize))
