"""Gemini CLI's content loop detector ("chanting", ``analyzeContentChunksForLoop`` and
``isLoopDetectedForChunk`` in ``@google/gemini-cli-core`` 0.61.0's loopDetectionService.ts) on
the window hashes the edge sends (``model.text``, ``streams.edge.content_windows``), sans I/O.

Gemini hashes every 50-unit window of the model's last 5000 UTF-16 units of streamed text, from
``lastContentIndex`` on, and keeps each hash's positions.  A window seen for the 10th time or more
is a loop when its last 10 positions are on average at most 250 apart and the 9 texts between them
("periods") take at most 5 distinct values.  It stops at the first loop without moving on: the
next chunk looks at the same window again (and records its position a second time).

The engine never sees the text, only 8-byte window hashes, and takes two windows with equal
hashes for equal texts (Gemini compares the texts when its full SHA-256 hashes are equal).  A
period ``text[a:b]`` equals ``text[c:d]`` when ``b - a == d - c`` and the windows at
``a+1 .. b-50`` equal those at ``c+1 .. d-50`` (the window at ``a`` equals the one at ``c``: both
are the repeated window); a period of 50 units or fewer is a prefix of the repeated window itself,
so periods of equal length are then equal.  What two colliding 8-byte hashes can do:
docs/peer-profiles.md.
"""

from __future__ import annotations

import sys

import msgspec

from schemas.events import CONTENT_WINDOW, WINDOW_HASH_BYTES

__all__ = ["ContentState", "content_loop", "reset"]

THRESHOLD = 10
"""``CONTENT_LOOP_THRESHOLD``."""
MAX_AVERAGE_DISTANCE = CONTENT_WINDOW * 5
MAX_PERIODS = THRESHOLD // 2

_H = WINDOW_HASH_BYTES


class ContentState(msgspec.Struct, array_like=True, gc=False):
    windows: bytearray = bytearray()
    """The window hashes of the kept text, 8 bytes per position (at most 4,951 of them)."""
    index: int = 0
    """``lastContentIndex``: the next window to analyse."""
    stats: dict[int, int | list[int]] = {}
    """``contentStats``: a window hash (its 8 bytes, little endian) -> the analysed positions
    with it, in order (the position of a loop's window twice when the next chunk saw it again):
    a bare int while there is one.  (Most windows are seen once; ints keep the garbage
    collector off the table, which lists of thousands of runs would keep busy.)  At most one
    position per analysed position, plus such repeats (one per detection)."""


def reset(c: ContentState) -> None:
    """``resetContentTracking``."""
    c.windows = bytearray()
    c.index = 0
    c.stats = {}


def content_loop(c: ContentState, was_reset: bool, skipped: bool, truncated: int, length: int, windows: bytes) -> bool:
    """``checkContentLoop`` after the edge's part: resets, truncation, the new windows, then the
    analysis.  A chunk whose windows do not add up to the edge's kept length (a lost or reordered
    event) resets the tracking and is not analysed: the mirror cannot be trusted, and no loop is
    found on it."""
    if was_reset:
        reset(c)
    if skipped:
        return False
    if truncated:
        c.index = max(0, c.index - truncated)
        del c.windows[: _H * truncated]
        stats = c.stats
        for key, positions in list(stats.items()):
            if isinstance(positions, int):
                if positions >= truncated:
                    stats[key] = positions - truncated
                else:
                    del stats[key]
                continue
            kept = [p - truncated for p in positions if p >= truncated]
            if len(kept) > 1:
                stats[key] = kept
            elif kept:
                stats[key] = kept[0]
            else:
                del stats[key]
    c.windows += windows
    if len(c.windows) != _H * max(0, length - CONTENT_WINDOW + 1):
        reset(c)
        return False
    return _analyse(c)


def _keys(windows: bytearray, start: int) -> list[int]:
    """The windows from ``start`` on as ints (their 8 bytes little endian), in one C call where
    the machine is little endian."""
    if _LITTLE:
        # (every view released at once: a bytearray with a live view cannot be resized)
        with memoryview(windows) as whole, whole[_H * start :] as tail, tail.cast("Q") as words:
            return words.tolist()
    return [int.from_bytes(windows[i : i + _H], "little") for i in range(_H * start, len(windows), _H)]


_LITTLE = sys.byteorder == "little"


def _analyse(c: ContentState) -> bool:
    windows, stats = c.windows, c.stats
    start = p = c.index
    keys = _keys(windows, start)
    end = start + len(keys)
    while p < end:
        key = keys[p - start]
        positions = stats.get(key)
        if positions is None:
            stats[key] = p
        else:
            if isinstance(positions, int):
                positions = stats[key] = [positions, p]
            else:
                positions.append(p)
            if len(positions) >= THRESHOLD:
                recent = positions[-THRESHOLD:]
                # averageDistance = total / 9 <= 250, in integers
                if (
                    recent[-1] - recent[0] <= MAX_AVERAGE_DISTANCE * (THRESHOLD - 1)
                    and _periods(windows, recent) <= MAX_PERIODS
                ):
                    c.index = p
                    return True
        p += 1
    c.index = p
    return False


def _periods(windows: bytearray, recent: list[int]) -> int:
    """How many distinct texts lie between consecutive positions of ``recent`` (see the module)."""
    seen: set = set()
    for a, b in zip(recent, recent[1:]):
        n = b - a
        if n <= CONTENT_WINDOW:
            seen.add(n)
        else:  # the windows after the first that lie wholly inside the period
            seen.add(bytes(windows[_H * (a + 1) : _H * (b - CONTENT_WINDOW + 1)]))
    return len(seen)
