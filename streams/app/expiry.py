"""Idle expiry: runs without events for ``LOOPWATCH_IDLE_TIMEOUT_S`` are deleted.

Ended runs' markers (``run_store.pack_ended``) go at the same age, not counted as runs.

A periodic scan of the active partitions' RocksDB rather than Faust's windowed-table expiry:
windows would cut one run's state into time buckets, while a run's history must live as long
as the run.  The scan reads only each envelope's header (when this worker last wrote the
run, by its own clock: ``run_store.idle_since_ms``), yields to the event loop every
``SWEEP_CHUNK`` runs, re-checks a candidate under the write lock before deleting it, and
deletes through the run store's write path (RocksDB + changelog tombstone).  It also
recounts ``loopwatch_runs_tracked``.  Partitions with a backlog are not expired: after an
outage every run would look idle while its events still wait to be processed.

The same sweep bounds the runs per agent (``LOOPWATCH_MAX_RUNS_PER_AGENT``): it counts each
agent's runs (their owner, ``run_store.owner_of``) over this worker's active partitions, and
when an agent holds more, deletes that agent's longest idle runs first until it holds the
cap (``loopwatch_runs_evicted_total``).  Idle expiry alone bounds nothing while an agent opens
runs faster than they go idle: 200,000 fresh runs of one agent all stay.  The cap is per
worker, as the memory it protects is; runs touched since the last checkpoint are never
evicted, and partitions with a backlog are counted but not evicted from, as for expiry.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .logs import FailureLog
from .run_store import idle_since_ms, is_ended, owner_of, parse_header

if TYPE_CHECKING:
    from .live_runs import LiveRuns
    from .run_store import RunStore

__all__ = ["Expiry", "SWEEP_CHUNK"]

log = logging.getLogger("loopwatch.worker")

SWEEP_CHUNK = 2000
"""The sweep yields to the event loop after this many runs."""


class Expiry:
    """The idle sweep.

    ``runs``: the runs in memory (one touched since the last checkpoint is active, whatever
    its stored time says); ``write_lock``: the checkpointer's (``Checkpointer.write_lock``);
    ``group``: the consumer and group (``streams.app.faust_adapter.ConsumerView``); ``ready()``:
    the worker's readiness (no sweep before the tables are recovered).
    """

    def __init__(
        self,
        store: RunStore,
        runs: LiveRuns,
        *,
        write_lock: asyncio.Lock,
        group: Any,
        ready: Callable[[], bool],
        tool_calls_topic: str,
        idle_timeout_s: float,
        max_batch: int,
        max_runs_per_agent: int | None = None,
        metrics: Any = None,
    ) -> None:
        self.store = store
        self.runs = runs
        self.write_lock = write_lock
        self.group = group
        self.ready = ready
        self.tool_calls_topic = tool_calls_topic
        self.idle_timeout_s = idle_timeout_s
        self.max_batch = max_batch
        self.max_runs_per_agent = max_runs_per_agent
        """At most this many runs per agent (owner) on this worker; None: no cap."""
        self.metrics = metrics
        self._counted_generation: int | None = None
        self._assignment_check = FailureLog(log, "the idle sweep's look at this worker's partitions")
        self._backlog_check = FailureLog(log, "the idle sweep's backlog check (partitions taken as backlogged)")

    async def on_new_assignment(self) -> None:
        """After a new assignment (or the first), once ready: recount the runs this worker now
        holds (and expire idle ones) instead of waiting up to a minute for the next sweep."""
        generation = self.group.generation
        if generation != self._counted_generation and self.ready():
            self._counted_generation = generation
            await self.sweep()

    def has_backlog(self, partition: int) -> bool:
        """More than a batch of ``tool-calls`` records not yet processed on this partition
        (or not known yet: assume the worst)."""
        group, topic = self.group, self.tool_calls_topic
        try:
            highwater = group.highwater(topic, partition)
            done = group.read_offset(topic, partition)
            if done is None:
                done = group.committed_offset(topic, partition)
        except Exception as exc:  # noqa: BLE001 - not assigned (any more): assume the worst
            self._backlog_check.failed(exc)
            return True
        self._backlog_check.ok()
        if highwater is None:
            return True
        if done is None:
            return highwater > 0
        return highwater - done > self.max_batch

    def _cutoff_ms(self) -> int:
        return int(time.time() * 1000) - int(self.idle_timeout_s * 1000)

    async def sweep(self) -> int:
        """Delete the active partitions' runs idle for longer than the timeout; returns how many."""
        group, store = self.group, self.store
        if group.rebalancing or group.in_recovery or not self.ready():
            return 0
        generation = group.generation
        cutoff = self._cutoff_ms()
        try:
            actives = group.assigned_actives()
        except Exception as exc:  # noqa: BLE001 - mid-rebalance: next time
            self._assignment_check.failed(exc)
            return 0
        self._assignment_check.ok()
        changelog = store.changelog_topic
        # (topic, partition) tuples equal Faust's TP named tuples
        partitions = [p for p in store.open_partitions() if (changelog, p) in actives]
        total = deleted = 0
        owners: dict[str, int] = {}
        """Runs per agent over the partitions swept (after expiry)."""
        for partition in partitions:
            db = store.partition_db(partition)
            if db is None:
                continue
            # Not while the partition has a backlog (after an outage, say): a run that looks
            # idle may have events waiting to be processed.  Count only.
            expire = not self.has_backlog(partition)
            candidates: list[bytes] = []
            seen = 0
            markers = 0
            for key, value in store.items(db):
                seen += 1
                try:
                    _offset, touched_ms, _seen_at, owner_at, state_at = parse_header(value)
                    if state_at == len(value):
                        markers += 1  # an ended run's marker (run_store.pack_ended): not a run
                    if expire and touched_ms < cutoff:
                        candidates.append(key)
                    else:
                        owner = owner_of(value, owner_at, state_at)
                        if owner is not None:
                            owners[owner] = owners.get(owner, 0) + 1
                except Exception:  # noqa: BLE001 - unreadable: leave it to the processor
                    pass
                if seen % SWEEP_CHUNK == 0:
                    await asyncio.sleep(0)
                    if group.generation != generation or store.partition_db(partition) is not db:
                        return deleted  # rebalanced meanwhile: try again next time
            expired = swept_markers = 0
            if candidates:
                async with self.write_lock:
                    if group.generation != generation or store.partition_db(partition) is not db:
                        return deleted
                    cutoff = self._cutoff_ms()
                    doomed = []
                    for key in candidates:
                        if self.runs.is_dirty(partition, key):
                            continue  # touched since the last checkpoint: active
                        value = db.get(key)
                        if value is not None and idle_since_ms(value) < cutoff:
                            doomed.append(((partition, key), None))
                            swept_markers += is_ended(value)
                    if doomed:
                        await store.write(doomed)
                        for (p, key), _ in doomed:
                            self.runs.forget(p, key)
                    expired = len(doomed) - swept_markers
            deleted += expired
            total += seen - markers - expired
        cap = self.max_runs_per_agent
        if cap is not None:
            over = {owner: n - cap for owner, n in owners.items() if n > cap}
            if over:
                evicted = await self._evict(partitions, over, generation)
                total -= evicted
        store.runs_tracked = total
        if deleted:
            log.info("expired %d idle runs (idle > %ss)", deleted, self.idle_timeout_s)
        # (the markers of ended runs go at the same age, silently: they are not runs)
        return deleted

    async def _evict(self, partitions: list[int], over: dict[str, int], generation: Any) -> int:
        """Delete, per agent of ``over`` (agent -> runs beyond the cap), that many of its runs
        on ``partitions``, longest idle first; returns how many were deleted."""
        group, store = self.group, self.store
        # (idle since, partition, key) of the agents over the cap: a second pass, only then.
        runs: dict[str, list[tuple[int, int, bytes]]] = {owner: [] for owner in over}
        dbs = {}
        seen = 0
        for partition in partitions:
            db = store.partition_db(partition)
            if db is None or self.has_backlog(partition):
                continue
            dbs[partition] = db
            for key, value in store.items(db):
                seen += 1
                try:
                    _offset, touched_ms, _seen_at, owner_at, state_at = parse_header(value)
                    owner = owner_of(value, owner_at, state_at)
                    mine = None if owner is None else runs.get(owner)
                    if mine is not None:
                        mine.append((touched_ms, partition, key))
                except Exception:  # noqa: BLE001 - unreadable: leave it to the processor
                    pass
                if seen % SWEEP_CHUNK == 0:
                    await asyncio.sleep(0)
                    if group.generation != generation or store.partition_db(partition) is not db:
                        return 0  # rebalanced meanwhile: try again next time
        doomed: list[tuple[tuple[int, bytes], None]] = []
        async with self.write_lock:
            if group.generation != generation or any(store.partition_db(p) is not db for p, db in dbs.items()):
                return 0
            for owner, excess in over.items():
                mine = runs[owner]
                mine.sort()
                taken = 0
                for _touched_ms, partition, key in mine:
                    if taken == excess:
                        break
                    if self.runs.is_dirty(partition, key):
                        continue  # touched since the last checkpoint: active
                    doomed.append(((partition, key), None))
                    taken += 1
            if doomed:
                await store.write(doomed)
                for (partition, key), _ in doomed:
                    self.runs.forget(partition, key)
        if doomed:
            log.warning(
                "deleted %d runs of %d agent(s) over LOOPWATCH_MAX_RUNS_PER_AGENT=%d, longest idle first (runs over: %s)",
                len(doomed),
                len(over),
                self.max_runs_per_agent,
                ", ".join(f"{owner[:64]!r}: {n}" for owner, n in sorted(over.items(), key=lambda kv: -kv[1])[:5]),
            )
            if self.metrics is not None:
                self.metrics.runs_evicted.inc(len(doomed))
        return len(doomed)
