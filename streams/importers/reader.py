"""Reading transcripts with bounded memory: whole JSON documents up to ``MAX_DOCUMENT_BYTES``,
JSONL one line at a time, never more than a line's limit plus one byte in memory.

gzip (``.gz`` or not: by its magic bytes) is read transparently.  Every failure is an
``ImportFailed`` with one line naming the file (and the line).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import msgspec

from streams.edge.canonical import JSON_DEPTH_LIMIT, TooDeep, json_text_exceeds_depth, text_exceeds_depth
from streams.offline.files import decompressed

from .model import ImportFailed

__all__ = [
    "MAX_DOCUMENT_BYTES",
    "MAX_LINE_BYTES",
    "MAX_RUN_LINE_BYTES",
    "Opened",
    "decode",
    "decode_embedded",
    "open_source",
]

MAX_DOCUMENT_BYTES = 256 * 1024 * 1024
"""A JSON document (a ``.traj``, a tau-bench results file): the largest read whole."""
MAX_LINE_BYTES = 1024 * 1024
"""A line of an event-per-line transcript (Claude Code, Codex CLI).  loopwatch's own events
are at most 64 KiB (``schemas.events.MAX_EVENT_BYTES``); a transcript's line also carries a
tool's raw output, which real sessions often make larger than that, so the limit is 1 MiB:
64 KiB and a margin sixteen times its size.  A longer line is refused, never read whole."""
MAX_RUN_LINE_BYTES = 64 * 1024 * 1024
"""A line of a run-per-line file (OpenHands ``output.jsonl``: a whole run's history a line)."""
_CHUNK = 1 << 20

_decoder = msgspec.json.Decoder()


_TOO_DEEP = f"JSON nested deeper than {JSON_DEPTH_LIMIT} levels of lists and objects (loopwatch's bound)"


def _decode_bounded(text: bytes | str) -> Any:
    """``text`` decoded; ``TooDeep`` when ``text_exceeds_depth(text)``, found before decoding
    (no decoder recurses into it).  That count walks the text with a regular expression, a
    third of a large document's import: it is asked only when ``json_text_exceeds_depth``,
    which gives its answer on JSON in passes of bytes methods, says the text is too deep, or
    when the text is no JSON (the decoder refuses it, having read no deeper than that said)."""
    if json_text_exceeds_depth(text) and text_exceeds_depth(text):
        raise TooDeep
    try:
        return _decoder.decode(text)
    except msgspec.DecodeError:
        if text_exceeds_depth(text):
            raise TooDeep from None
        raise


def decode(data: bytes, where: str) -> Any:
    """A whole JSON document; ``ImportFailed`` when it is not JSON or nests deeper than
    ``JSON_DEPTH_LIMIT`` (counted before decoding: no decoder recurses into it)."""
    try:
        return _decode_bounded(data)
    except TooDeep:
        raise ImportFailed(f"{where}: {_TOO_DEEP}") from None
    except msgspec.DecodeError as exc:
        raise ImportFailed(f"{where} is not valid JSON ({exc}): a truncated or corrupt file?") from None


def decode_embedded(text: str, where: str) -> Any:
    """A JSON value held in a string of the transcript (a call's ``arguments``): decoded, or
    ``text`` itself when it is not JSON; ``ImportFailed`` when it nests deeper than
    ``JSON_DEPTH_LIMIT``."""
    try:
        return _decode_bounded(text)
    except TooDeep:
        raise ImportFailed(f"{where}: {_TOO_DEEP}") from None
    except msgspec.DecodeError:
        return text


class Opened:
    """A file opened for import: its first line peeked to tell JSONL from a JSON document."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = str(path)
        try:
            raw = open(path, "rb")
        except OSError as exc:
            raise ImportFailed(f"cannot read {path}: {exc.strerror or exc}") from None
        if path.is_dir():
            raw.close()
            raise ImportFailed(f"cannot read {path}: is a directory")
        self._raw = raw
        self.size = path.stat().st_size
        self.fh: IO[bytes] = decompressed(raw)
        self.first: Any = None
        """The first line, decoded, when it is a JSON object that fits ``MAX_RUN_LINE_BYTES``
        (the longest line any format allows: each format's reader applies its own limit)."""
        self.single_line = False
        self._pending: bytes | None = None
        """The first line read, while nothing else has been: a document is read on from it."""
        head = self._readline(MAX_RUN_LINE_BYTES + 1)
        blank = False
        while head is not None and not head.strip():
            blank = True
            head = self._readline(MAX_RUN_LINE_BYTES + 1)
        self._pending = None if blank else head
        if head is not None and len(head) <= MAX_RUN_LINE_BYTES and head.lstrip()[:1] == b"{":
            try:
                self.first = _decode_bounded(head)
            except (TooDeep, msgspec.DecodeError):  # too deep: refused when read as a line or a document
                self.first = None
            if self.first is not None:
                nxt = self._readline(1)
                self.single_line = nxt is None
                # back to the start: the importers read the file from its beginning
                self._rewind()

    def _readline(self, limit: int) -> bytes | None:
        try:
            line = self.fh.readline(limit)
        except (OSError, EOFError, zlib.error) as exc:
            raise ImportFailed(f"cannot read {self.name}: {exc} (a truncated gzip file?)") from None
        return line or None

    def _rewind(self) -> None:
        self._raw.seek(0)
        if self.fh is not self._raw:
            self.fh = decompressed(self._raw)
        self._pending = None

    def close(self) -> None:
        self._raw.close()

    def position(self) -> int:
        """Bytes of the file on disk read so far (for progress)."""
        try:
            return self._raw.tell()
        except (OSError, ValueError):
            return 0

    def document(self) -> Any:
        """The whole file as one JSON document (at most ``MAX_DOCUMENT_BYTES``)."""
        head, self._pending = self._pending, None
        if head is None:
            self._rewind()
        # else the file's first line, read to tell the format (a one-line document is all of
        # it): the rest is read on from there, not the whole file again
        try:
            data = (
                self.fh.read(MAX_DOCUMENT_BYTES + 1)
                if head is None
                else head + self.fh.read(MAX_DOCUMENT_BYTES + 1 - len(head))
            )
        except (OSError, EOFError, zlib.error) as exc:
            raise ImportFailed(f"cannot read {self.name}: {exc} (a truncated gzip file?)") from None
        if len(data) > MAX_DOCUMENT_BYTES:
            raise ImportFailed(f"{self.name} is larger than {MAX_DOCUMENT_BYTES >> 20} MiB: split it first")
        try:
            return decode(data, self.name)
        except ImportFailed:
            problem = self._first_line_problem()
            if problem is None:
                raise
        raise ImportFailed(f"{self.name}: line 1: {problem}")

    def _first_line_problem(self) -> str | None:
        """For a file that is no JSON document but has more than one line: what is wrong with
        its first line when that line is JSON, but no object ("expected a JSON object, got an
        array") or too deep (JSONL of the wrong records, to be named as such), else None."""
        self._rewind()
        head = self._readline(MAX_RUN_LINE_BYTES + 1)
        while head is not None and not head.strip():
            head = self._readline(MAX_RUN_LINE_BYTES + 1)
        if head is None or len(head) > MAX_RUN_LINE_BYTES or self._readline(1) is None:
            return None
        if text_exceeds_depth(head):
            return _TOO_DEEP
        try:
            first = _decoder.decode(head)
        except msgspec.DecodeError:
            return None
        return None if isinstance(first, dict) else f"expected a JSON object, got {_kind(first)}"

    def lines(self, limit: int = MAX_LINE_BYTES) -> Iterator[tuple[int, Any]]:
        """``(line number, decoded object)`` per non-empty line; a line over ``limit`` bytes is
        refused (only ``limit`` + 1 bytes of it are read), a last line cut short is reported
        as a truncated file.  (Not ``streams.offline.files.read_lines``: that one reads an over-long
        line through to go on with the next, where an import stops at the first.)"""
        self._rewind()
        number = 0
        while True:
            line = self._readline(limit + 1)
            if line is None:
                return
            number += 1
            if len(line) > limit and not line.endswith(b"\n"):
                raise ImportFailed(
                    f"{self.name}: line {number} is longer than {_size(limit)}: not a transcript "
                    "this importer reads (or a corrupt file)"
                )
            if line.isspace():  # (not empty: the end of the file is None)
                continue
            try:
                value = _decode_bounded(line)
            except TooDeep:
                raise ImportFailed(f"{self.name}: line {number}: {_TOO_DEEP}") from None
            except msgspec.DecodeError as exc:
                cut = not line.endswith(b"\n")
                raise ImportFailed(
                    f"{self.name}: line {number} is not valid JSON"
                    + (" (the file ends mid-line: truncated?)" if cut else f" ({exc})")
                ) from None
            yield number, value


_NOT_JSON = object()


def _kind(value: Any) -> str:
    """A JSON value's type as a sentence names it."""
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def open_source(path: Path) -> Opened:
    return Opened(path)
