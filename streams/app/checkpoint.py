"""Checkpoints: what makes the worker's work durable, and in which order.

Every rule about durability is here.  The per-batch logic (``streams.app.processor``)
changes runs in memory; the run store (``streams.app.run_store``) writes them; output
(``streams.app.output``) publishes verdicts and dead letters; this module decides when
and in which order.

**A batch** (``Checkpointer.handle_batch``) is processed at once, under the write lock: its
runs change in memory (``LiveRuns``), its verdicts and dead letters are queued without waiting
(their delivery futures kept), and its ``done`` (the ack of its records) is kept for the next
checkpoint.  A batch that fails half-way (its states in memory, its verdicts maybe not
queued) poisons the worker: no checkpoint may store those states (their events would be
skipped after a restart, their verdicts never published), so the worker stops and
everything since the last checkpoint is processed again.

**A checkpoint** (``Checkpointer.checkpoint``; every ``LOOPWATCH_CHECKPOINT_S``, 5 s, sooner
once ``MAX_DIRTY_RUNS`` runs wait or once the worker has caught up, and always before a
rebalance or a shutdown proceeds) does, in this order:

1. freeze the runs touched so far (``LiveRuns.begin_checkpoint``), under the write lock: a
   batch is either wholly in this checkpoint (its states, its deliveries, its acks) or
   wholly after it;
2. encode them, once per run, in time slices with the event loop free in between: batches
   go on, and a batch that touches a frozen run copies its state (``copy_state``) before it
   changes it rather than encoding it itself;
3. wait for the delivery of every verdict and dead letter queued before the freeze (an
   error stops the worker: nothing of this checkpoint is acked);
4. write the states (RocksDB, then the changelog); until RocksDB has them, reads of those
   runs are served from the checkpoint itself;
5. wait until the changelog has them (a state the changelog refused would be gone at the
   next restore while its records count as done: that error stops the worker too);
6. ack the batches' records; Faust flushes the producer before it commits acked offsets.

**Only a member writes**.  Before step 4, the checkpoint asks the group coordinator
whether this worker is still a member of the generation its batches were processed in
(``ConsumerView.still_member``: a heartbeat, checked by the broker).  A worker that was paused
past its session timeout (a long GC, a frozen VM) learns there that its partitions may be
another worker's: it writes nothing (no changelog record, no RocksDB write, no ack, hence no
commit) and stops, as after any failed checkpoint (``NotAMember``); restarted, it rejoins
and restores from the changelog, which then holds only members' writes, and the partitions'
owner redoes the dropped work from the committed offsets.  (Rejoining in place would need
every run, cached state and fetched batch of the lost generation dropped first: a restart
does exactly that.)
Its commits are generation-checked by the broker as well (aiokafka's commit fails with
``UnknownMemberId``/``IllegalGeneration``).  Written anyway, its stale states would land in
the changelog after the new owner's: the next owner restores them, history and offsets
disagree, and its own RocksDB, with its persisted offset moved past the new owner's records,
would never read those (docs/reliability.md has the sequence).

A crash loses at most the work since the last checkpoint, which is redone from the last
committed offsets with the same verdict ids (consumers drop duplicates by id).  Because a
state is stored only after the verdicts of every event in it were delivered, an event that
is skipped on redelivery (``streams.app.processor``: its offset is in the stored state) has
always had its verdict published.

A run's state is encoded once per checkpoint, not once per event or per batch: the state
codec is the engine's most expensive call, and with small batches at moderate load it would
otherwise run per event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from schemas.errors import LoopwatchError
from schemas.names import CANDIDATE, LIVE

from . import logs
from .live_runs import LiveRuns
from .run_store import state_disk_full

if TYPE_CHECKING:
    from .output import Output
    from .processor import BatchProcessor
    from .run_store import RunStore

__all__ = ["Checkpointer", "NotAMember"]

log = logging.getLogger("loopwatch.worker")

FULL_DISK_HOLD_S = 30.0
"""How long a worker whose state disk is full stays up, unready, before it stops: two scrapes
at Prometheus' default 15 s interval, three readiness probes at Kubernetes' default 10 s."""


def describe_failure(exc: BaseException | None) -> str | None:
    """One line for what stopped the batches and checkpoints (``/readyz``'s ``error``)."""
    if exc is None:
        return None
    if state_disk_full(exc):
        return f"state disk full: the run table's write failed ({str(exc)[:300]})"
    return f"a batch or checkpoint failed: {type(exc).__name__}: {str(exc)[:300]}"


MAX_DIRTY_RUNS = 50_000
"""A checkpoint is taken early (and waited for) when this many runs wait for one."""
IDLE_CHECKPOINT_S = 0.5
"""A checkpoint is taken early once no batch came for this long (the worker caught up)."""
CHECKPOINT_SLICE_S = 0.0005
"""How long a checkpoint encodes runs before it yields to the event loop.  In time, not in
runs: one run's encoding varies several-fold with the machine's load (docs/benchmarks.md,
session 5)."""
CHECKPOINT_PAUSE_S = 0.002
"""A checkpoint's pause after each slice while the worker keeps up: it then takes at most a
fifth of the event loop, and a checkpoint's encoding spreads over a few times its length."""
MEMBERSHIP_RETRY_S = 0.2
"""How soon a checkpoint asks the group coordinator again when it got no answer."""
MIXED = "mixed"
"""The epoch of a checkpoint whose batches came from more than one assignment."""
BUSY_BATCH = 256
"""While batches stay under this many records (the worker keeps up), a checkpoint steps
aside for ``CHECKPOINT_PAUSE_S`` after each slice; otherwise it only lets the next batch in.
With ``sleep(0)`` alone, the checkpoint task is back in the ready queue at once and each hop
of an arriving event (fetch response, fetcher, batch handler, producer) waits behind one
more slice.  Catching up, latency is the backlog's anyway and the checkpoint must not fall
behind."""


class NotAMember(LoopwatchError, RuntimeError):
    """The group coordinator no longer counts this worker a member of the generation its
    batches were processed in: nothing of them may be written."""


# -- the protocol --------------------------------------------------------------------------------


def _encode_for(runs: LiveRuns, seconds: float) -> bool:
    """Encode frozen runs for about ``seconds`` (at least one); True when none is left."""
    clock = time.perf_counter
    deadline = clock() + seconds
    while not runs.encode_some(1):
        if clock() >= deadline:
            return False
    return True


def _delivered(future: asyncio.Future) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


class Checkpointer:
    """Batches in, checkpoints out (the module docstring has the rules).

    ``spawn(coro)``: runs a checkpoint in the background (Faust's ``add_future``: stopped with
    the app); ``group``: the consumer group's state (``ConsumerView``: is a rebalance or a
    shutdown waiting for the checkpoint?).
    """

    def __init__(
        self,
        processor: BatchProcessor,
        store: RunStore,
        output: Output,
        *,
        checkpoint_s: float,
        spawn: Callable[[Any], asyncio.Future],
        group: Any,
    ) -> None:
        self.processor = processor
        self.runs: LiveRuns = processor.runs
        self.store = store
        self.output = output
        self.checkpoint_s = checkpoint_s
        self._spawn = spawn
        self._group = group
        self.write_lock = asyncio.Lock()
        """Held while a batch changes runs and while a checkpoint freezes them or takes its
        writes; the idle sweep deletes under it."""
        self._checkpoint_lock = asyncio.Lock()
        self._hold_until = 0.0
        """Until when a failure the worker stops for is shown before the exit (a full disk)."""
        self._pending: list[asyncio.Future] = []
        """Delivery futures of the verdicts and dead letters produced since the last checkpoint
        and not delivered yet (or failed): the checkpoint waits for them and raises their errors."""
        self._dones: list[Callable[[], None]] = []
        """Ack callbacks of the batches processed since the last checkpoint."""
        self._checkpointed_at = time.monotonic()
        self._last_batch_at = 0.0
        self._last_batch_size = 0
        self.failed: BaseException | None = None
        """Set when a batch or a checkpoint was interrupted half-way: no more checkpoints."""
        self._checkpointing: asyncio.Future | None = None
        self._batches_wait = False
        """The batch handler waits for the checkpoint (``MAX_DIRTY_RUNS``): no pauses in it."""
        self._epoch: Any = None
        """``group.epoch`` of the batches since the last freeze (``MIXED``: more than one)."""
        self.checkpoints = 0
        self.batches = 0
        self.records = 0
        self.verdicts_sent = 0
        self.dead_lettered = 0

    # -- batches ------------------------------------------------------------------------------------

    async def handle_batch(self, messages: Sequence[Any], done: Callable[[], None]) -> None:
        """Process one batch and publish its verdicts and dead letters (without waiting for
        their delivery); the records are acked by the next checkpoint (``done``).

        Shielded: a shutdown cancels the fetch loop, but a batch that was processed must also
        be registered (its delivery futures and ack) before a checkpoint may include it.
        """
        await asyncio.shield(self._handle(messages, done))

    async def _handle(self, messages: Sequence[Any], done: Callable[[], None]) -> None:
        processor = self.processor
        async with self.write_lock:
            if self.failed is not None:
                await asyncio.sleep(max(0.0, self._hold_until - time.monotonic()))  # (a full disk: see above)
                raise RuntimeError("an earlier batch or checkpoint failed; restart the worker") from self.failed
            epoch = self._group.epoch
            if self._epoch is None:
                self._epoch = epoch
            elif self._epoch != epoch:
                self._epoch = MIXED
            result = processor.process(messages, self.store.read)
            try:
                # Only sends in flight (or failed) wait for the checkpoint.  Kept until then,
                # thousands of delivered futures (and their record metadata) lived long enough
                # to reach the GC's oldest generation and make its full collections longer.
                self._pending = pending = [future for future in self._pending if not _delivered(future)]
                if result.forwards:  # under session scope, before they count as done
                    pending += await self.output.send_forwards(result.forwards)
                if result.verdicts:
                    processor.observe_latency(result.verdicts)
                    pending += await self.output.send_verdicts(result.verdicts, epoch[0])
                if result.fleet:
                    pending += await self.output.send_fleet(result.fleet)
                if result.fleet_outcomes:
                    pending += await self.output.send_fleet_outcomes(result.fleet_outcomes)
                for letter in result.dead_letters:
                    pending.append(await self.output.send_dead_letter(letter))
                # Last, and not awaited: shadow verdicts never delay a decision (output.py).
                for config, shadow in ((LIVE, result.shadow), (CANDIDATE, result.candidate)):
                    if shadow:
                        pending.append(self.output.send_shadow(shadow, config, result.sha256.get(config, "defaults")))
                self._dones.append(done)
            except BaseException as exc:
                self.failed = exc  # see the module docstring: the batch's states must not be stored
                raise
        logs.flush()
        self._last_batch_at = time.monotonic()
        self._last_batch_size = len(messages)
        self.batches += 1
        self.records += len(messages)
        self.verdicts_sent += len(result.verdicts)
        self.dead_lettered += len(result.dead_letters)
        if result.skipped:
            log.info("skipped %d re-delivered events already applied to their runs", result.skipped)
        if self.runs.dirty >= MAX_DIRTY_RUNS:
            self._batches_wait = True  # backpressure: no batch runs until it is done
            try:
                await self.checkpoint()
            finally:
                self._batches_wait = False
        elif time.monotonic() - self._checkpointed_at >= self.checkpoint_s:
            self.checkpoint_soon()

    # -- when ------------------------------------------------------------------------------------

    async def tick(self) -> None:
        """The checkpoint timer: every ``checkpoint_s``, or sooner once the worker caught up."""
        now = time.monotonic()
        if now - self._checkpointed_at >= self.checkpoint_s:
            self.checkpoint_soon()
        elif self._dones and now - self._last_batch_at >= IDLE_CHECKPOINT_S:
            self.checkpoint_soon()  # caught up: a quiet moment costs nothing to use

    def checkpoint_soon(self) -> None:
        """Start a checkpoint in the background unless one is running."""
        if self._checkpointing is None or self._checkpointing.done():
            self._checkpointing = self._spawn(self.checkpoint())

    # -- how ---------------------------------------------------------------------------------------

    async def checkpoint(self) -> None:
        """Make everything processed so far durable (steps 1-6 of the module docstring)."""
        if self.failed is not None:
            # Not even the lock: the checkpoint holding it may be the one that failed, still
            # on its way out, and a stop or rebalance waiting here must not wait for it.
            self._no_checkpoint()
            return
        async with self._checkpoint_lock:
            runs = self.runs
            async with self.write_lock:
                self._checkpointed_at = time.monotonic()
                if self.failed is not None:
                    self._no_checkpoint()
                    return
                if not self._dones and not runs.dirty:
                    return
                pending, self._pending = self._pending, []
                dones, self._dones = self._dones, []
                epoch, self._epoch = self._epoch, None
                runs.begin_checkpoint()
            # An error below (a verdict not delivered, a failed write, a cancellation)
            # propagates and stops the worker: nothing of this checkpoint is acked, so its
            # records are processed again after a restart.
            try:
                while not _encode_for(runs, CHECKPOINT_SLICE_S):
                    await self.step_aside()
                waiting = [future for future in pending if not future.done()]
                if waiting:
                    await asyncio.gather(*waiting)
                for future in pending:
                    future.result()  # raises a delivery error
                await self.step_aside()
                if epoch is not None and not await self._still_member(epoch):
                    raise NotAMember(
                        f"this worker is no longer a member of the group's generation "
                        f"{epoch if epoch is MIXED else epoch[0]} (paused past its session timeout?): its checkpoint "
                        f"is dropped, nothing written or acked; the worker stops and its partitions' owner redoes the "
                        f"work from the committed offsets"
                    )
                async with self.write_lock:
                    cp = runs.end_checkpoint()
                # Batches go on while the states are written: until ``checkpoint_written`` the
                # runs serve reads of these runs themselves, and the next checkpoint waits for
                # this one (the checkpoint lock).
                if cp.writes:
                    sent = await self.store.write(
                        cp.writes.items(), on_stored=runs.checkpoint_written, step_aside=self.step_aside
                    )
                    await asyncio.gather(*sent)
                else:
                    runs.checkpoint_written()
            except BaseException as exc:
                self.failed = exc
                if state_disk_full(exc):
                    await self._hold_before_exit(exc)
                raise
            for i, done in enumerate(dones, 1):
                done()
                if i % 256 == 0:
                    await self.step_aside()  # thousands of acks: let batches in between
            self.store.count(cp.created, cp.deleted)
            self.checkpoints += 1

    def _no_checkpoint(self) -> None:
        log.warning(
            "no checkpoint after an interrupted batch or checkpoint (%r): the work since the last one is redone "
            "after a restart",
            self.failed,
        )

    async def _hold_before_exit(self, exc: BaseException) -> None:
        """A full state disk stops the worker, and its restart finds the disk full again: say
        why in one line, and stay up ``FULL_DISK_HOLD_S`` first, so that ``/readyz`` (503,
        ``error``) and ``loopwatch_state_disk_full`` show it to the probes and the scrapes
        before the exit (docs/operations.md: alert-loopwatchworkernotready, cause state disk full)."""
        self._hold_until = time.monotonic() + FULL_DISK_HOLD_S
        log.error(
            "%s; the worker stops in %.0f s: free space on the state volume (LOOPWATCH_DATA_DIR) or grow it, "
            "then restart (docs/operations.md: a full state disk)",
            describe_failure(exc),
            FULL_DISK_HOLD_S,
        )
        logs.flush()
        await asyncio.sleep(FULL_DISK_HOLD_S)

    async def step_aside(self) -> None:
        """A checkpoint's yield to the event loop between two slices of its work: a pause
        while batches are small, none while catching up or when a rebalance or a shutdown
        waits for the checkpoint (no decisions are being made then), nor when the batch
        handler itself waits for it (``MAX_DIRTY_RUNS``)."""
        group = self._group
        keeping_up = (
            self._last_batch_size < BUSY_BATCH
            and not self._batches_wait
            and not group.rebalancing
            and not group.stopping
        )
        await asyncio.sleep(CHECKPOINT_PAUSE_S if keeping_up else 0)

    async def _still_member(self, epoch: Any) -> bool:
        """Whether this worker may write the work of ``epoch``: the group has not moved on
        and the coordinator still counts it a member of that generation.  Without an answer
        it asks again until a session timeout has passed, then counts itself expelled (the
        coordinator has by then)."""
        group = self._group
        deadline = time.monotonic() + group.session_timeout_s
        while True:
            if epoch is MIXED or group.epoch != epoch:
                return False
            answer = await group.still_member(epoch[0])
            if answer is not None:
                return answer
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(MEMBERSHIP_RETRY_S)
