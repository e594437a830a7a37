"""Batch delivery for Faust's Kafka consumer.

Faust delivers every record on its own: the fetcher awaits two fresh tasks per record
(``wait_first(callback(message), ...)``), the conductor decodes it into an ``Event`` and puts
it on a queue, and the stream takes it off with more tasks and futures.  Measured on this
project's 2-core machine, an agent that does *nothing* with its records ran at 2,000 to
4,500 records/s (``stream.take(1000, within=0.02)`` included), far below the 20,000/s the
worker must sustain; the same records delivered as lists ran at ~67,000/s.

``BatchingConsumer`` keeps everything else of Faust's consumer (group membership, the
co-partitioning assignor, table recovery, pausing during rebalances, offset commits,
acks and gaps) and changes only the fetch loop: records of a topic that has a batch
handler are handed over as one list per fetch of aiokafka's own ``ConsumerRecord``s
(timestamps in ms), with a ``done`` callback that acks them all, and are tracked in bulk
(one Faust message per batch keeps rebalances waiting for it); records of every other
topic (the table changelogs during recovery and for standbys) still take Faust's
per-record path.  Handlers are called strictly in order, one batch at a time (the
equivalent of an agent with concurrency 1), so per-partition order is kept.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Sequence

from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from faust.types.tuples import ack_lock
from mode.utils.futures import notify

__all__ = ["BatchHandler", "BatchingConsumer", "BatchingTransport"]

log = logging.getLogger("loopwatch.transport")

BatchHandler = Callable[[Sequence[Any], Callable[[], None]], Awaitable[None]]
"""``handler(batch, done)``: ``done()`` acks the batch; call it once the batch's effects are
safe (the handler may return before that, e.g. to overlap the next batch)."""


class BatchingConsumer(faust_aiokafka.Consumer):
    """Faust's aiokafka consumer with batch delivery for registered topics."""

    def batch_handlers(self) -> dict[str, BatchHandler]:
        return getattr(self.app, "batch_handlers", {})

    async def _drain_messages(self, fetcher: Any) -> None:  # the fetcher's loop, replaced
        # Mirrors faust.transport.consumer.Consumer._drain_messages + getmany, but works per
        # topic-partition instead of per record.
        callback = self.callback
        consumer_should_stop = self._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        read_offset = self._read_offset
        acks_enabled_for = self.app.topics.acks_enabled_for
        handlers = self.batch_handlers()
        unacked = self._unacked_messages
        flow_control = self.app.flow_control
        to_message = self._to_message
        monitor = self.app.monitor
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                await self.sleep(0)
                if self.should_stop:
                    break
                generation = self.app.consumer_generation_id
                records, active_partitions = await self._wait_next_records(1.0)
                if not records or self.should_stop:
                    continue
                if not self.flow_active:
                    # Faust's getmany: records fetched while the flow stopped are dropped and
                    # the partitions are sought back to their committed offsets.
                    try:
                        await self.perform_seek()
                    except Exception as exc:  # noqa: BLE001 - as Faust does
                        self.log.warning("exception performing seek when flow not active %r", exc)
                    continue
                batches: dict[str, list[Any]] = {}
                for tp, tp_records in records.items():
                    if not tp_records:
                        continue
                    if (
                        active_partitions is not None
                        and tp not in active_partitions
                        and tp not in self._buffered_partitions
                    ):
                        continue
                    if self.app.consumer_generation_id != generation:
                        break
                    highwater = self.highwater(tp)
                    monitor.track_tp_end_offset(tp, highwater)
                    r_offset = read_offset[tp]
                    if r_offset is not None and tp_records[0].offset < r_offset:
                        tp_records = [r for r in tp_records if r.offset >= r_offset]
                        if not tp_records:
                            continue
                    first = tp_records[0].offset
                    if r_offset and first - r_offset > 1 and acks_enabled_for(tp.topic):
                        await self._add_gap(tp, r_offset + 1, first)
                    handler = handlers.get(tp.topic)
                    if handler is not None:
                        # aiokafka's records go to the handler as they are: a Faust message
                        # per record (and a Faust ack per record) cost ~12 % of the worker.
                        pending = batches.get(tp.topic)
                        if pending is None:
                            batches[tp.topic] = pending = ([], [])
                        last = tp_records[-1].offset
                        if last - first + 1 != len(tp_records) and acks_enabled_for(tp.topic):
                            previous = first
                            for record in tp_records:  # compacted or transactional: find the gaps
                                if record.offset - previous > 1:
                                    await self._add_gap(tp, previous + 1, record.offset)
                                previous = record.offset
                        pending[0].extend(tp_records)
                        pending[1].append((tp, [record.offset for record in tp_records]))
                        read_offset[tp] = last
                    else:
                        for record in tp_records:
                            offset = record.offset
                            r_offset = read_offset[tp]
                            if r_offset and offset - r_offset > 1 and acks_enabled_for(tp.topic):
                                await self._add_gap(tp, r_offset + 1, offset)
                            await self.wait_first(callback(to_message(tp, record)), self.suspend_flow.wait())
                            read_offset[tp] = offset
                for topic, (batch, offsets) in batches.items():
                    # Rebalances happen between batches: wait out a suspended flow, then drop
                    # what was fetched for an older generation (Faust seeks back to the
                    # committed offsets, so those records come again).
                    await flow_control.acquire()
                    if self.app.consumer_generation_id != generation or self.should_stop:
                        log.debug("dropping %d records fetched before a rebalance", len(batch))
                        continue
                    assignment = self.assignment()
                    if any(tp not in assignment for tp, _ in offsets):
                        offsets = [(tp, o) for tp, o in offsets if tp in assignment]
                        batch = [r for r in batch if TP(r.topic, r.partition) in assignment]
                        if not batch:
                            continue
                    # One tracked Faust message keeps Faust's rebalance (wait_empty) waiting
                    # until the whole batch is done; ``done`` acks every record of the batch.
                    sentinel = to_message(offsets[-1][0], batch[-1])
                    unacked.add(sentinel)
                    try:
                        await handlers[topic](batch, self._acker(offsets, sentinel))
                    except BaseException:
                        unacked.discard(sentinel)
                        raise
                if self._commit_every is not None and self._n_acked >= self._commit_every:
                    self._n_acked = 0
                    await self.commit()
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                self.log.info("Broker stopped consumer, shutting down...")
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                self.log.info("Consumer shutting down for user cancel.")
                return
            raise
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise


    async def wait_empty(self) -> None:
        """Faust waits here for in-flight messages before a rebalance and on shutdown; let the
        app make its pending batches durable (and ack them) first."""
        hook = getattr(self.app, "before_wait_empty", None)
        if hook is not None:
            await hook()
        await super().wait_empty()

    def _acker(self, offsets: list[tuple[Any, list[int]]], sentinel: Any) -> Callable[[], None]:
        """``done`` for one batch: Faust's ``Consumer.ack`` for every record, in bulk (the
        same bookkeeping, one lock and one wake-up of the committer per batch)."""

        def done() -> None:
            with ack_lock:
                acked_total = 0
                for tp, tp_offsets in offsets:
                    if not self.app.topics.acks_enabled_for(tp.topic):
                        continue
                    committed = self._committed_offset[tp]
                    acked_index = self._acked_index[tp]
                    acked = self._acked[tp]
                    for offset in tp_offsets:
                        if (committed is None or offset >= committed) and offset not in acked_index:
                            acked_index.add(offset)
                            acked.append(offset)
                            acked_total += 1
                self._n_acked += acked_total
                sentinel.acked = True
                self._unacked_messages.discard(sentinel)
                notify(self._waiting_for_ack)

        return done


class BatchingTransport(faust_aiokafka.Transport):
    Consumer = BatchingConsumer
