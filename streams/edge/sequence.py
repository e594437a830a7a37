"""The ``seq`` a runner puts on every event it publishes (``schemas.events.Seq``).

A worker with signed events refuses an event whose ``seq`` is not above the highest its run
applied (``replayed_event``): a replay of the exact signed bytes, at any distance from its
original, while it is still within the max age.  So a publisher's numbers must rise within each
run, also after the publisher restarts and resumes a run it had published under before, and
without remembering anything across the restart.

One counter per process, seeded from the wall clock: each number is the larger of the last one
plus one and the microseconds since the epoch now.  Rising for the process, it rises within every
run the process publishes; a restarted publisher starts at its clock, which is past every number
its predecessor drew unless the predecessor drew more than one a microsecond for longer than
the restart took, or the clock stepped back by more than that.  Numbers stay within
``schemas.events.MAX_SAFE_INT`` (2^53 - 1 microseconds is the year 2255).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from schemas.events import MAX_SAFE_INT

__all__ = ["SeqCounter", "next_seq"]


class SeqCounter:
    """Strictly increasing numbers, each at least the clock's microseconds (``clock``:
    nanoseconds since the epoch, an integer, so no reading is rounded).  Safe to call from
    several threads."""

    def __init__(self, clock: Callable[[], int] = time.time_ns) -> None:
        self.clock = clock
        self.last = -1
        self._lock = threading.Lock()

    def __call__(self) -> int:
        now_us = self.clock() // 1000
        with self._lock:
            seq = self.last + 1
            if now_us > seq:
                seq = now_us
            if seq > MAX_SAFE_INT:
                raise OverflowError(f"seq {seq} is over the schema's bound {MAX_SAFE_INT}")
            self.last = seq
        return seq


next_seq = SeqCounter()
"""The process's counter: every client of a process draws from it (``streams.client``)."""
