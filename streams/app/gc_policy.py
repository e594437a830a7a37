"""The worker's use of the cyclic garbage collector: its thresholds, and freezing what lives for good."""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Sequence
from typing import Any

from streams.app import faust_adapter

__all__ = ["GC_THRESHOLDS", "freeze_before_first_batch", "freeze_start_up"]

GC_THRESHOLDS = (100_000, 10, 10)
"""The worker's cyclic-GC thresholds (``gc.set_threshold``; Python's default is 700, 10, 10).

A batch of thousands of records keeps about three container objects a record alive (its
``ConsumerRecord``, the record's place in its run's group, its verdict) until the batch is
done.  At 700, young collections ran every few hundred records, and each one traversed and
promoted the batch's live objects; the promoted ones then set off collections of the older
generations, full ones among them, which traversed every run's state.  With 100,000 net
allocations between young collections, a batch's objects are freed (by reference counting)
before any collection sees them; cyclic garbage still goes at the next collection.  The
measurements are in docs/benchmarks.md (session 7)."""


def freeze_start_up() -> None:
    """What is alive before the first fetch (Faust, aiokafka, the engine, the config) lives for
    good: out of the cyclic GC's full collections, which otherwise scan it all and pause the
    event loop every few seconds.  Collected at start, where the heap holds no run states nor
    batches yet: a worker turns ready while it drains a backlog, and a full collection then
    scans every run state it holds."""
    gc.set_threshold(*GC_THRESHOLDS)
    gc.collect()
    gc.freeze()


def freeze_before_first_batch(handle_batch: faust_adapter.BatchHandler) -> faust_adapter.BatchHandler:
    """``handle_batch`` that first moves what the assignment and the recovery added (consumers,
    fetchers, table partitions) out of the cyclic GC's sight, as ``on_start`` did with what
    was there before: it lives for good too.

    Before the first batch the young generations hold that and the batch's records only, and
    collecting them takes a few ms.  Done later (it was done once the worker turned ready),
    the collection scanned every run state built since, while a backlog was being drained."""
    frozen = False

    @functools.wraps(handle_batch)
    async def handle(batch: Sequence[Any], done: Callable[[], None]) -> None:
        nonlocal frozen
        if not frozen:
            frozen = True
            gc.collect(1)
            gc.freeze()
        await handle_batch(batch, done)

    return handle
