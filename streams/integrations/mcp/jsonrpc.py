"""JSON-RPC lines as the gateway reads them from the agent and from an upstream server, whatever
the other end wrote: one home for the rules both serving paths (the relay and the SDK proxy's
stdio upstreams) apply before anything else touches a message.

* ``read_line``: one line, or for a line over ``LINE_LIMIT`` its head and tail (the line itself
  is read past, never held whole), so the request it carries can still be answered at once;
* ``parse``: a line's message, refused before decoding when it nests deeper than
  ``streams.edge.canonical.JSON_DEPTH_LIMIT`` (a bracket count, ``text_exceeds_depth``: no decoder recurses into it);
* ``envelope`` and ``oversize_id``: the id of a message too deep or too big to read whole;
* ``healed_error``: an answer whose ``error`` is not a JSON-RPC error object (a code that is
  not an integer, no message, not an object) rewritten as one (``-32603``, naming the upstream
  and keeping what it sent under ``data``), so the agent's JSON-RPC library never chokes on it.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

import mcp_types as types
import msgspec

from streams.edge.canonical import text_exceeds_depth

__all__ = [
    "LINE_LIMIT",
    "Oversize",
    "envelope",
    "healed_error",
    "oversize_id",
    "parse",
    "read_line",
    "request_key",
    "too_big",
]

LINE_LIMIT = 64 * 1024 * 1024
"""The longest message line accepted (asyncio's default, 64 KiB, is less than a tool result can be)."""

_decode = msgspec.json.Decoder().decode
_KEEP = 64 * 1024
"""How much of an oversize line's head and tail is kept to find its id."""


@dataclass(frozen=True)
class Oversize:
    """A line over ``LINE_LIMIT``: its first and last bytes, and its size."""

    head: bytes
    tail: bytes
    size: int


def too_big(size: int) -> str:
    return f"a message of {size} bytes, over the gateway's limit of {LINE_LIMIT} bytes"


def refusal(line: Oversize) -> bytes | None:
    """The JSON-RPC error line that answers an agent's request over ``LINE_LIMIT`` (None: it is no
    request, nothing to answer)."""
    request_id, request = oversize_id(line)
    if not request or request_key(request_id) is None:
        return None
    error = {"code": types.INVALID_REQUEST, "message": f"refused by loopwatch: {too_big(line.size)}"}
    return msgspec.json.encode({"jsonrpc": "2.0", "id": request_id, "error": error}) + b"\n"


async def read_line(stream: asyncio.StreamReader) -> bytes | Oversize:
    """The next line (``b""`` at the end of the stream), or an ``Oversize`` for a line longer
    than the stream's limit, read past chunk by chunk."""
    try:
        return await stream.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        return exc.partial  # the last line without its newline, or b"" at the end
    except asyncio.LimitOverrunError as exc:
        first = await stream.readexactly(exc.consumed)
    size, head, tail = len(first), first[:_KEEP], first[-_KEEP:]
    while True:
        try:
            rest = await stream.readuntil(b"\n")
        except asyncio.LimitOverrunError as exc:
            rest = await stream.readexactly(exc.consumed)
        except asyncio.IncompleteReadError as exc:
            size += len(exc.partial)
            tail = (tail + exc.partial)[-_KEEP:]
            break
        else:
            size += len(rest)
            tail = (tail + rest)[-_KEEP:]
            if rest.endswith(b"\n"):
                break
            continue
        size += len(rest)
        tail = (tail + rest)[-_KEEP:]
    return Oversize(head, tail.rstrip(b"\r\n"), size)


def parse(line: bytes) -> tuple[Any, str | None]:
    """``(message, fault)`` of one line; with a fault (``"not JSON"``, ``"deep"``: nested deeper
    than ``JSON_DEPTH_LIMIT``) the message is None.  The depth is counted before decoding."""
    if text_exceeds_depth(line):
        return None, "deep"
    try:
        return _decode(line), None
    except msgspec.DecodeError:
        return None, "not JSON"


_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[{]+|[\]}]+', re.DOTALL)


def envelope(line: bytes, keep: int = 2) -> Any:
    """A too-deep message with every list and object below depth ``keep`` replaced by null:
    its ``id`` and ``method`` (a batch's, its items'), or None when it is not JSON at all."""
    parts: list[bytes] = []
    depth, start, cutting = 0, 0, False
    for match in _TOKENS.finditer(line):
        token = match.group()
        if token[0] == 0x22:  # a string: its brackets are text
            continue
        if token[0] in b"[{":
            if not cutting and depth + len(token) > keep:
                parts.append(line[start : match.start() + keep - depth])
                cutting = True
            depth += len(token)
        else:
            if cutting and depth - len(token) <= keep:
                parts.append(b"null")
                start = match.start() + depth - keep
                cutting = False
            depth -= len(token)
    if cutting:
        return None
    parts.append(line[start:])
    try:
        return parse(b"".join(parts))[0]
    except ValueError:
        return None


_SCALAR_ID = rb'(-?\d+|"(?:[^"\\]|\\.)*")'
_ID_IN_HEAD = re.compile(rb'[{,]\s*"id"\s*:\s*' + _SCALAR_ID)
_ID_AT_END = re.compile(rb'[{,]\s*"id"\s*:\s*' + _SCALAR_ID + rb"\s*}\s*$")
_METHOD_IN_HEAD = re.compile(rb'[{,]\s*"method"\s*:\s*"')


def oversize_id(line: Oversize) -> tuple[Any, bool]:
    """``(id, is a request)`` of an oversize message, from its first-level keys: in its head
    (read with the nested values cut out) or last before its closing brace (where JavaScript
    SDKs write it); ``(None, False)`` when neither holds one."""
    skeleton = _first_level(line.head)
    request = _METHOD_IN_HEAD.search(skeleton) is not None
    found = _ID_IN_HEAD.search(skeleton) or _ID_AT_END.search(line.tail)
    if found is None:
        return None, request
    try:
        return _decode(found.group(1)), request
    except msgspec.DecodeError:
        return None, request


def _first_level(head: bytes) -> bytes:
    """The part of a message's head at the top level of its object: nested values dropped."""
    parts: list[bytes] = []
    depth, start = 0, 0
    for match in _TOKENS.finditer(head):
        token = match.group()
        if token[0] == 0x22:
            continue
        if token[0] in b"[{":
            if depth <= 1 < depth + len(token):
                parts.append(head[start : match.start() + 1 - depth])
            depth += len(token)
        else:
            if depth > 1 >= depth - len(token):
                start = match.start() + depth - 1
            depth -= len(token)
    if depth <= 1:
        parts.append(head[start:])
    return b" ".join(parts)


def request_key(request_id: Any) -> Any:
    """A JSON-RPC id as a dict key (a string or a number; anything else is no id of a request)."""
    return request_id if isinstance(request_id, (str, int, float)) and not isinstance(request_id, bool) else None


def _error_problem(error: Any) -> str | None:
    if not isinstance(error, dict):
        return f"not an object but {_kind(error)}"
    code = error.get("code")
    if not isinstance(code, int) or isinstance(code, bool):
        return "no code" if code is None else f"a code that is {_kind(code)}, not an integer"
    if not isinstance(error.get("message"), str):
        return "no message" if error.get("message") is None else f"a message that is {_kind(error['message'])}"
    return None


def healed_error(message: dict, upstream_failed: str) -> dict | None:
    """``message`` (an answer) with its error rewritten as a valid JSON-RPC error object, or None
    when it needs no healing.  ``upstream_failed`` (naming the upstream) starts its message."""
    if "error" not in message or "method" in message:
        return None
    problem = _error_problem(message["error"])
    if problem is None:
        return None
    error = {
        "code": types.INTERNAL_ERROR,
        "message": f"{upstream_failed} ({problem})",
        "data": {"upstreamError": message["error"]},
    }
    return {"jsonrpc": "2.0", "id": message.get("id"), "error": error}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
