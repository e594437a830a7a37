"""Logging for ``loopwatch.*``: plain format, written once per batch.

A looping fleet makes the engine log a lot: upstream logs three lines for every blocked
call.  Through Faust's default (colorlog, one ``write`` per line) that was the worker's
biggest cost, ~70 µs a line.  Here ``loopwatch.*`` records keep going through the standard
``logging`` machinery (levels, filters and extra handlers still apply) but the handler
installed by ``configure`` formats plainly and buffers its output; the worker calls
``flush()`` after every batch, a timer calls it twice a second, and it runs at exit.  A
``kill -9`` can lose the last batch's lines.  The engine's lines of a batch are logged
together after it (``log_many``), with one time stamp.
"""

from __future__ import annotations

import atexit
import io
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import IO, Any

__all__ = ["FORMAT", "LEVELS", "BufferedHandler", "FailureLog", "configure", "direct_handler", "flush", "log_many"]

FORMAT = "[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s"

_handlers: list[BufferedHandler] = []


class _Formatter(logging.Formatter):
    """``logging.Formatter`` with the timestamp text cached per second."""

    _cached: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return self.stamp(record.created)

    def stamp(self, when: float) -> str:
        """``when`` (Unix time) as lines show it: ``2026-12-01 12:00:00,123``."""
        second = int(when)
        cached = self._cached
        if second != cached[0]:
            self._cached = cached = (second, time.strftime("%Y-%m-%d %H:%M:%S", self.converter(when)))
        return f"{cached[1]},{int((when - second) * 1000):03d}"


class BufferedHandler(logging.StreamHandler):
    """A stream handler that flushes only when told to (``flush()``) or when its buffer fills."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__(stream)
        self.setFormatter(_Formatter(FORMAT))

    def flush(self) -> None:  # called by logging after every record: don't
        pass

    def stamp(self, when: float) -> str:
        """``when`` as this handler's lines show it."""
        fmt = self.formatter
        assert isinstance(fmt, _Formatter)
        return fmt.stamp(when)

    def write_text(self, text: str) -> None:
        """Append already formatted lines to the buffer."""
        lock = self.lock
        if lock is not None:
            with lock:
                self.stream.write(text)
        else:
            self.stream.write(text)

    def really_flush(self) -> None:
        self.acquire()
        try:
            if self.stream and hasattr(self.stream, "flush"):
                self.stream.flush()
        except Exception:  # noqa: BLE001 - never fail the caller over logging
            pass
        finally:
            self.release()


def configure(logfile: str | None = None, *, buffer_bytes: int = 256 * 1024) -> BufferedHandler:
    """Give ``loopwatch.*`` its own buffered handler (stderr, or ``logfile``)."""
    logger = logging.getLogger("loopwatch")
    for old in [h for h in logger.handlers if isinstance(h, BufferedHandler)]:
        logger.removeHandler(old)
        old.really_flush()
        if old in _handlers:
            _handlers.remove(old)
    if logfile:
        stream: IO[str] = open(logfile, "a", buffering=buffer_bytes, encoding="utf-8", errors="replace")
    else:
        stream = io.TextIOWrapper(
            open(os.dup(sys.stderr.fileno()), "wb", buffering=buffer_bytes),
            encoding="utf-8",
            errors="replace",
            write_through=False,
        )
    handler = BufferedHandler(stream)
    logger.addHandler(handler)
    logger.propagate = False
    _handlers.append(handler)
    return handler


LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
"""The engine's level names (``LogLine.level``) as ``logging`` levels."""


def log_many(prefix: str, lines: Sequence[Any]) -> None:
    """Log many lines at once, in order: each ``line`` (the engine's ``LogLine``) under the
    logger ``prefix + line.subsystem`` at ``LEVELS[line.level]`` (INFO for an unknown name).

    While the ``loopwatch`` tree is exactly what ``configure`` set up (``direct_handler``),
    the lines are formatted as the handler would, all with this moment's time stamp, and
    written in one call, without a ``LogRecord`` each: a blocked call logs three lines, and
    one by one these were a tenth of the worker's CPU on a looping fleet.  Otherwise each
    line goes through ``Logger.handle``, so levels, filters and other handlers apply.  The
    set-up is looked at once per call: a handler added later takes over at the next batch.
    """
    resolved: dict[tuple[str, str], tuple[logging.Logger, int, str | None] | None] = {}
    parts: list[str] = []
    handler: BufferedHandler | None = None
    stamp = ""
    for line in lines:
        how = (line.subsystem, line.level)
        entry = resolved.get(how, False)
        if entry is False:
            logger = logging.getLogger(prefix + line.subsystem)
            level = LEVELS.get(line.level, logging.INFO)
            entry = None
            if logger.isEnabledFor(level):
                direct = direct_handler(logger)
                head = None
                if direct is not None:
                    if handler is None:
                        handler, stamp = direct, direct.stamp(time.time())
                    head = f"[{stamp}] [{os.getpid()}] [{logging.getLevelName(level)}] {logger.name}: "
                entry = (logger, level, head)
            resolved[how] = entry
        if entry is None:
            continue
        logger, level, head = entry
        if head is not None:
            parts.append(head + line.message + "\n")
            continue
        if parts:  # keep the order of the lines
            handler.write_text("".join(parts))
            parts.clear()
        # makeRecord + handle: Logger.log without its per-record stack walk (findCaller).
        logger.handle(logger.makeRecord(logger.name, level, "(engine)", 0, line.message, None, None))
    if parts:
        handler.write_text("".join(parts))


def direct_handler(logger: logging.Logger) -> BufferedHandler | None:
    """The handler ``configure`` installed, when it alone would handle ``logger``'s records
    (a ``loopwatch.*`` logger): no handlers or filters on ``logger`` or its ancestors below
    ``loopwatch``, and ``loopwatch`` holding only that handler, unfiltered, not propagating.
    Otherwise None.  (The caller still checks ``isEnabledFor``.)"""
    node: logging.Logger | None = logger
    while node is not None and node.name != "loopwatch":
        if node.handlers or node.filters or node.disabled or not node.propagate:
            return None
        node = node.parent if isinstance(node.parent, logging.Logger) else None
    if node is None or node.filters or node.disabled or node.propagate or len(node.handlers) != 1:
        return None
    handler = node.handlers[0]
    if not isinstance(handler, BufferedHandler) or handler.filters:
        return None
    return handler


def flush() -> None:
    for handler in _handlers:
        handler.really_flush()


class FailureLog:
    """A check that may keep failing (a timer's, a probe's): its first failure is logged with
    its cause, the next ones are not, and the first success after them is logged again."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self.logger = logger
        self.what = what
        self.failing = False

    def failed(self, exc: BaseException) -> None:
        if not self.failing:
            self.failing = True
            self.logger.warning("%s failed (%r); logged once until it works again", self.what, exc)

    def ok(self) -> None:
        if self.failing:
            self.failing = False
            self.logger.info("%s works again", self.what)


atexit.register(flush)
