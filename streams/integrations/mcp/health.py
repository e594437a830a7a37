"""When the gateway starts an upstream server again that stopped answering, and how often it did.

An upstream that hangs for good (a deadlock, a dependency that never answers) would otherwise
fail every later call after its full timeout.  ``UpstreamHealth`` watches the calls' timeouts:
after ``restart_after_timeouts`` calls in a row timed out, or a call timed out while the
upstream had said nothing for ``restart_after_silence`` seconds, the upstream is restarted (a
stdio command) or reconnected (a URL).  Restarts that follow each other without an answer in
between wait longer each time (``backoff_initial`` doubling up to ``backoff_max``), so a server
that cannot come up is not restarted in a tight loop.  The counters are the gateway's metrics:
each restart is one warning line with them, and ``status`` is what the HTTP gateway serves at
``/loopwatch/status``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

log = logging.getLogger("loopwatch.mcp")

__all__ = ["UpstreamHealth"]


@dataclass
class UpstreamHealth:
    name: str
    restart_after_timeouts: int = 3
    """Restart after this many calls in a row timed out (0: never for this reason)."""
    restart_after_silence: float = 120.0
    """Restart when a call times out and the upstream has said nothing for this long."""
    backoff_initial: float = 1.0
    backoff_max: float = 60.0
    timeouts: int = 0
    timeouts_in_a_row: int = 0
    restarts: int = 0
    invalid_answers: int = 0
    """Answers that were not JSON-RPC (an invalid error object, too deep, too big): each failed its call."""
    last_heard: float = field(default_factory=time.monotonic)
    _next_delay: float = 0.0

    def heard(self) -> None:
        """The upstream answered: it is healthy, and the next restart needs no backoff."""
        self.last_heard = time.monotonic()
        self.timeouts_in_a_row = 0
        self._next_delay = 0.0

    def waiting(self) -> None:
        """A request was sent while none was in flight: silence counts from here."""
        self.last_heard = time.monotonic()

    def timed_out(self) -> str | None:
        """A call timed out: why the upstream should be restarted now, or None."""
        self.timeouts += 1
        self.timeouts_in_a_row += 1
        if 0 < self.restart_after_timeouts <= self.timeouts_in_a_row:
            return f"{self.timeouts_in_a_row} calls in a row timed out"
        silent = time.monotonic() - self.last_heard
        if silent >= self.restart_after_silence:
            return f"no answer for {silent:.0f}s"
        return None

    def restarting(self, reason: str, how: str) -> float:
        """Count a restart (``how``: restarted or reconnected) and log it; the seconds to wait
        before it (0 the first time after an answer, then doubling)."""
        delay = self._next_delay
        self._next_delay = min(self.backoff_max, max(self.backoff_initial, delay * 2))
        self.restarts += 1
        self.timeouts_in_a_row = 0
        self.last_heard = time.monotonic() + delay
        log.warning(
            "upstream %s: %s because %s (restarts %d, timeouts %d, invalid answers %d; waiting %gs first)",
            self.name,
            how,
            reason,
            self.restarts,
            self.timeouts,
            self.invalid_answers,
            delay,
        )
        return delay

    def status(self) -> dict:
        return {
            "restarts": self.restarts,
            "timeouts": self.timeouts,
            "timeouts_in_a_row": self.timeouts_in_a_row,
            "invalid_answers": self.invalid_answers,
        }
