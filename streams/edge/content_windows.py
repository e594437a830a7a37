"""The runner's side of Gemini CLI's content loop detector (``checkContentLoop`` in
``@google/gemini-cli-core``'s loopDetectionService.ts): what Gemini does with each chunk of the
model's streamed text before it looks for a loop, so that only window hashes leave the runner.

``ContentEdge`` (one per run) mirrors Gemini's text handling exactly: the reset patterns
(JavaScript regular expressions, reproduced with their own semantics: JavaScript's ``\\s``, ``.``
not matching any line terminator, ``^``/``$`` at the ends of the chunk only, ``[0-9]`` for
``\\d``, and the character ranges ``[*-+]`` (``*`` or ``+``, not ``-``) and ``[+-_...]`` (every
character from ``+`` to ``_``) as JavaScript reads them), the code-block toggle (which no reset
clears: Gemini keeps it for the client's whole life), skipping, appending, and truncation to the
last 5000 code units.  Lengths and positions are UTF-16 code units, as JavaScript's strings count
them: an astral character counts 2, and a window may cut it in half.

For every chunk it gives what the engine's half (``streams.engine.gemini_content``) needs: the
windows of 50 units the chunk completed, in the kept text's coordinates after truncation, as the
first 8 bytes of SHA-256 of each window's UTF-8.  node hashes a JavaScript string as UTF-8 with
each lone surrogate as U+FFFD; so does this.

Depends only on the schemas' constants (the client's rule).
"""

from __future__ import annotations

import re
from hashlib import sha256
from typing import NamedTuple

from schemas.events import CONTENT_HISTORY, CONTENT_WINDOW, WINDOW_HASH_BYTES

__all__ = ["ContentEdge", "ContentWindows", "window_hash", "utf16_length"]

# JavaScript's \s (the same set in every engine since ES2015; checked against node in the tests)
# and the line terminators ``.`` does not match.  Python's own \s differs (\x1c-\x1f, \x85).
_WS = "[\t\n\x0b\x0c\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"
_DOT = "[^\n\r\u2028\u2029]"
# (^|\n) without the m flag: the start of the chunk or after a newline.  \A, never ^ (which
# Python's re also reads as the start without MULTILINE, but \A says so).
_TABLE = re.compile(rf"(?:\A|\n){_WS}*(?:\|{_DOT}*\||[|+\-]{{3,}})")
_LIST = re.compile(rf"(?:\A|\n){_WS}*(?:[*+]|[0-9]+\.){_WS}")  # /[*-+]\s/ or /\d+\.\s/
_HEADING = re.compile(rf"(?:\A|\n)#+{_WS}")
_QUOTE = re.compile(rf"(?:\A|\n)>{_WS}")
# /^[+-_=*\u2500-\u257F]+$/: JavaScript's $ without m is the very end (Python's $ would also
# match before a final newline: \Z).
_DIVIDER = re.compile("\\A[+-_=*\u2500-\u257f]+\\Z")
_LONE = re.compile("[\ud800-\udfff]")


class ContentWindows(NamedTuple):
    """What Gemini did with one chunk (the fields of a ``model.text`` event)."""

    reset: bool
    """Its content tracking was reset before the chunk."""
    skipped: bool
    """The chunk was not appended (nothing analysed)."""
    truncated: int
    """Code units dropped from the start of the kept text."""
    length: int
    """The kept text's length after the chunk, in code units."""
    windows: bytes
    """The windows the chunk completed, 8 bytes each, in order of position."""


def utf16_length(text: str) -> int:
    """``text.length`` in JavaScript."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def window_hash(units: bytes) -> bytes:
    """The first 8 bytes of SHA-256 of the UTF-8 of a JavaScript string given as UTF-16-LE
    code units, as node's ``createHash().update(string)`` computes it: a valid surrogate pair is
    its character, a lone surrogate U+FFFD."""
    text = units.decode("utf-16-le", "surrogatepass")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        data = _LONE.sub("\ufffd", text).encode("utf-8")
    return sha256(data).digest()[:WINDOW_HASH_BYTES]


def is_reset(chunk: str) -> tuple[int, bool, bool]:
    """(the number of code fences, whether the chunk is a divider, whether it resets tracking)."""
    fences = chunk.count("```")  # /```/g: non-overlapping, left to right, as str.count
    divider = _DIVIDER.search(chunk) is not None
    reset = bool(
        fences
        or divider
        or _TABLE.search(chunk)
        or _LIST.search(chunk)
        or _HEADING.search(chunk)
        or _QUOTE.search(chunk)
    )
    return fences, divider, reset


class ContentEdge:
    """Gemini's content tracking for one run, on the runner's side (see the module)."""

    __slots__ = ("_units", "in_code_block")

    def __init__(self) -> None:
        self._units = b""
        """The kept text (``streamContentHistory``), UTF-16-LE: 2 bytes per code unit."""
        self.in_code_block = False
        """``inCodeBlock``: never reset, by a tool call or a new prompt either (as Gemini's)."""

    @property
    def length(self) -> int:
        return len(self._units) // 2

    def reset(self) -> None:
        """``resetContentTracking``: on a tool call request and on a new user prompt."""
        self._units = b""

    tool_call = reset
    user_prompt = reset

    def feed(self, chunk: str) -> ContentWindows:
        """``checkContentLoop(chunk)`` up to its analysis: what the engine needs of it."""
        fences, divider, reset = is_reset(chunk)
        if reset:
            self._units = b""
        was_in_code_block = self.in_code_block
        if fences % 2:
            self.in_code_block = not self.in_code_block
        if was_in_code_block or self.in_code_block or divider:
            return ContentWindows(reset, True, 0, len(self._units) // 2, b"")
        before = len(self._units) // 2
        units = self._units + chunk.encode("utf-16-le", "surrogatepass")
        n = len(units) // 2
        truncated = max(0, n - CONTENT_HISTORY)
        if truncated:
            units = units[2 * truncated :]
            n = CONTENT_HISTORY
        self._units = units
        # The windows complete before the chunk start at 0 .. before - 50; the new ones follow,
        # shifted by the truncation (those it cut off are gone).
        first = max(0, before - CONTENT_WINDOW + 1 - truncated)
        span = 2 * CONTENT_WINDOW
        windows = b"".join([window_hash(units[2 * p : 2 * p + span]) for p in range(first, n - CONTENT_WINDOW + 1)])
        return ContentWindows(reset, False, truncated, n, windows)
