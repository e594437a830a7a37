"""Reading line-per-record files (JSONL, plain or gzip) with a bound on each line.

Every reader of recorded events uses ``read_lines``: ``loopwatch backtest`` (``FileSource``),
``loopwatch replay``, the conformance traces (``streams.conformance.traces``, with a larger
bound: a trace line is a whole session) and the importers.  A line is read with
``readline(limit + 1)``, so no more than the bound is ever held: an over-long line (a gzip
bomb inflating to one 2 GiB line, say) is read through in ``SKIP_CHUNK`` pieces to its end,
counted and reported as an ``OverlongLine``, and the next line is read as usual.  Before,
iterating the file built the whole line first and the 64 KiB record limit
(``schemas.events.MAX_EVENT_BYTES``) was applied afterwards.

``decompressed``: a file opened in binary mode, read through gzip when it starts with gzip's
magic bytes (whatever its name), as is.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from typing import IO

from schemas.events import MAX_EVENT_BYTES

__all__ = ["LINE_MARGIN_BYTES", "MAX_LINE_BYTES", "OverlongLine", "decompressed", "read_lines"]

LINE_MARGIN_BYTES = 4096
"""Read beyond the record limit before a line is cut off: a line a little over the limit (a
record with trailing blanks, or one just too large) is still handed to the event check, which
names its size as the worker's dead letter would (``oversized``)."""
MAX_LINE_BYTES = MAX_EVENT_BYTES + LINE_MARGIN_BYTES
"""The default bound of ``read_lines``: the longest line (without its line end) read whole."""
SKIP_CHUNK = 64 * 1024
"""How much of an over-long line is read at a time while it is skipped."""


class OverlongLine:
    """A line longer than the bound, skipped: ``size`` is its length in bytes, without its
    line end (all of it was read, none of it kept)."""

    __slots__ = ("size", "limit")

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit

    def __repr__(self) -> str:
        return f"OverlongLine(size={self.size}, limit={self.limit})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OverlongLine) and (self.size, self.limit) == (other.size, other.limit)

    def describe(self) -> str:
        """One line for a report: what was skipped and why."""
        return f"line is {self.size} bytes, over the {self.limit}-byte bound of a line: skipped unread"


def read_lines(fh: IO[bytes], limit: int = MAX_LINE_BYTES) -> Iterator[bytes | OverlongLine]:
    """Each line of ``fh`` (binary), in order: its bytes with the line end as read (``\\n``;
    the last line may have none), or an ``OverlongLine`` for a line of more than ``limit``
    bytes without its line end.  One item per line, so ``enumerate(..., 1)`` numbers them as
    an editor does.  Holds at most ``limit + 1`` bytes of a line at any time."""
    readline = fh.readline
    bound = limit + 1
    while True:
        line = readline(bound)
        if not line:
            return
        if len(line) < bound or line[-1] == 10:  # 10: b"\n"
            yield line
            continue
        size = len(line)  # no line end within limit + 1 bytes: over-long
        del line
        while True:
            part = readline(SKIP_CHUNK)
            if not part:
                break
            if part[-1] == 10:
                size += len(part) - 1
                break
            size += len(part)
        yield OverlongLine(size, limit)


def decompressed(raw: IO[bytes]) -> IO[bytes]:
    """``raw`` (a seekable binary file at its start) through gzip when it is gzip, else itself."""
    magic = raw.read(2)
    raw.seek(0)
    return gzip.GzipFile(fileobj=raw) if magic == b"\x1f\x8b" else raw
