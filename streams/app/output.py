"""Output: verdicts to ``loop-verdicts``, dead letters to ``tool-calls-dlq``, shadow verdicts to
``loop-verdicts-shadow``, record batches.

Verdicts go out on a producer of their own (``Producers.new``): aiokafka sends one produce
request at a time per broker, and a checkpoint's changelog records (hundreds of KB of run
states) would hold every decision produced behind them until the broker acknowledged them.
Dead letters and the changelog share Faust's producer (``Producers.shared``).  Nothing here
waits for a delivery: every send returns its delivery future, and the checkpoint
(``streams.app.checkpoint``) waits for them before it stores the states that depend on them.

Verdicts are co-partitioned with the events that caused them: a verdict goes to its event's
partition number (mod the topic's partition count, with a warning when the counts differ).

Shadow verdicts (agents in shadow mode, the candidate config) go on the shared producer too,
never ahead of or beside a runner's decision, each record tagged with the config it came from
(headers ``loopwatch.config``, ``loopwatch.config_sha256``).  Nothing about them may stop the
worker or delay a decision: ``send_shadow`` is started after a batch's verdicts and dead
letters and not awaited by the batch; a shadow topic that is missing or refuses them loses
them, counted (``loopwatch_shadow_verdicts_lost_total``) and logged, and the worker goes on.
The checkpoint still waits for their delivery, so a crash loses none of them.

A dead letter carries its record's key and value and headers saying why
(``loopwatch.reason``, ``loopwatch.detail``) and where it came from.  A key or value larger
than ``DEAD_LETTER_VALUE_LIMIT`` is cut (``dead_letter_record``); a dead letter the topic
still refuses as too large goes again on its own, then as its headers alone, rather than
stopping the worker at every restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from schemas.keys import partition_for
from schemas.names import CONFIG_HEADER, CONFIG_SHA256_HEADER, GENERATION_HEADER, WORKER_HEADER

from .logs import FailureLog

if TYPE_CHECKING:
    from .records import DeadLetter, VerdictOut

__all__ = [
    "DEAD_LETTER_VALUE_LIMIT",
    "DLQ_MAX_MESSAGE_BYTES",
    "Output",
    "dead_letter_record",
    "send_records",
]

log = logging.getLogger("loopwatch.worker")

DLQ_MAX_MESSAGE_BYTES = 2 * 1024 * 1024
"""``max.message.bytes`` of the dead-letter topic when the worker creates it."""
DEAD_LETTER_VALUE_LIMIT = 1024 * 1024
"""A dead letter's key and value are cut to this many bytes each (``dead_letter_record``)."""
_NO_HEADERS: list = []  # aiokafka's batch builder wants a list; never mutated


def dead_letter_record(
    letter: DeadLetter, value_limit: int
) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
    """``(key, value, headers)`` of a dead letter for the dead-letter topic.

    A key or value larger than ``value_limit`` bytes is cut to its first ``value_limit``
    bytes (``tool-calls`` may accept records larger than the dead-letter topic does, and a
    dead letter that cannot be delivered would stop the worker); ``loopwatch.truncated``
    then names what was cut and ``loopwatch.source.{key,value}_bytes`` give the original
    sizes.
    """
    record = letter.record
    key, value = record.key, record.value
    headers = [
        ("loopwatch.reason", letter.reason.encode()),
        ("loopwatch.detail", letter.detail.encode("utf-8", "replace")),
        ("loopwatch.source.topic", record.topic.encode()),
        ("loopwatch.source.partition", str(record.partition).encode()),
        ("loopwatch.source.offset", str(source_offset(record)).encode()),
    ]
    if record.timestamp:
        headers.append(("loopwatch.source.timestamp_ms", str(int(record.timestamp)).encode()))
    cut = []
    if key is not None and len(key) > value_limit:
        headers.append(("loopwatch.source.key_bytes", str(len(key)).encode()))
        key = key[:value_limit]
        cut.append("key")
    if value is not None and len(value) > value_limit:
        headers.append(("loopwatch.source.value_bytes", str(len(value)).encode()))
        value = value[:value_limit]
        cut.append("value")
    if cut:
        headers.append(("loopwatch.truncated", ",".join(cut).encode()))
    if not key and not value:
        value = b""  # Kafka needs a key or a value
    return key, value, headers


def source_offset(record: Any) -> int:
    """A record's offset in its topic (a forwarded record's ``offset`` is moved: ``Record.source_offset``)."""
    moved = getattr(record, "source_offset", None)
    return record.offset if moved is None else moved


async def send_records(
    producer: Any,
    topic: str,
    partition: int,
    items: Iterable[tuple[bytes | None, bytes | None]],
    headers: list[tuple[str, bytes]] = _NO_HEADERS,
) -> list[tuple[asyncio.Future, int]]:
    """Produce records to one partition as few record batches, each record with ``headers``;
    returns (future, count) per batch."""
    return await _send_batches(producer, topic, partition, ((key, value, headers) for key, value in items))


async def _send_batches(
    producer: Any,
    topic: str,
    partition: int,
    records: Iterable[tuple[Any, ...]],
) -> list[tuple[asyncio.Future, int]]:
    """Produce ``(key, value, headers)`` records, or ``(key, value, headers, timestamp ms)``
    ones (None: the producer's clock), to one partition as few record batches; returns
    (future, count) per batch."""
    sent: list[tuple[asyncio.Future, int]] = []
    batch = producer.create_batch()
    append = batch.append
    n = 0
    for record in records:
        key, value, headers = record[0], record[1], record[2]
        timestamp = record[3] if len(record) > 3 else None
        if append(key=key, value=value, timestamp=timestamp, headers=headers) is None:
            if n:
                sent.append((await producer.send_batch(batch, topic, partition=partition), n))
                batch = producer.create_batch()
                append = batch.append
                n = 0
            if append(key=key, value=value, timestamp=timestamp, headers=headers) is None:
                # Larger than a whole batch: the per-record path sizes a batch for it.
                sent.append(
                    (
                        await producer.send(
                            topic, value, key=key, partition=partition, headers=headers, timestamp_ms=timestamp
                        ),
                        1,
                    )
                )
                continue
        n += 1
    if n:
        sent.append((await producer.send_batch(batch, topic, partition=partition), n))
    return sent


async def _send_keyed(
    producer: Any, topic: str, partitions: int, items: Iterable[tuple[Any, ...]]
) -> list[asyncio.Future]:
    """Produce ``(key, value, headers[, timestamp ms])`` records to the partitions their keys
    give, as one record batch per partition (a record larger than a batch on its own)."""
    by_partition: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for item in items:
        by_partition[partition_for(item[0], partitions)].append(item)
    futures = []
    for partition, records in by_partition.items():
        futures += [future for future, _n in await _send_batches(producer, topic, partition, records)]
    return futures


class Output:
    """The worker's producers of verdicts and dead letters.

    ``shared_producer()``: the aiokafka producer under Faust's (started with the app);
    ``new_producer()``: an unstarted one with the same settings, for the verdicts (``start``).
    """

    def __init__(
        self,
        *,
        verdicts_topic: str,
        dead_letter_topic: str,
        partitions: int,
        shared_producer: Callable[[], Any],
        new_producer: Callable[[], Any],
        sessions_topic: str | None = None,
        fleet_topic: str | None = None,
        fleet_agents_topic: str | None = None,
        shadow_topic: str = "loop-verdicts-shadow",
        metrics: Any = None,
        worker_id: str = "",
    ) -> None:
        self.verdicts_topic = verdicts_topic
        self._worker_header = (WORKER_HEADER, worker_id.encode())
        self._provenance: tuple[int, list[tuple[str, bytes]]] = (-1, _NO_HEADERS)
        """The verdict headers of the last generation seen (``provenance``)."""
        self.dead_letter_topic = dead_letter_topic
        self.sessions_topic = sessions_topic
        """Under session scope, the repartition topic (``<app id>-sessions``)."""
        self.fleet_topic = fleet_topic
        """With fleet incidents or agent rings, the fleet topology's input (``<app id>-fleet``)."""
        self.fleet_agents_topic = fleet_agents_topic
        """With fleet incidents, the per-agent limit's input (``<app id>-fleet-agents``)."""
        self.shadow_topic = shadow_topic
        self.metrics = metrics
        self.shadow_partitions: int | None = None
        """The shadow topic's partition count once known (``find_shadow_topic``); until then
        shadow verdicts are lost (counted)."""
        self._shadow_failures = FailureLog(log, f"publishing shadow verdicts to {shadow_topic}")
        self._shadow_lookup: asyncio.Future | None = None
        """The shadow topic's lookup under way, if any (``find_shadow_topic``)."""
        self.partitions = partitions
        self._shared = shared_producer
        self._new = new_producer
        self.verdict_producer: Any = None
        """The verdicts' aiokafka producer once started (``start``)."""
        self._partition_counts: dict[str, int] = {}

    async def start(self) -> Any:
        """Start the verdict producer (before the first decision; the readiness probe uses
        its connections too).  Only batches send verdicts, one at a time."""
        producer = self.verdict_producer
        if producer is None:
            producer = self._new()
            await producer.start()
            self.verdict_producer = producer
        return producer

    async def close(self) -> None:
        """Stop the verdict producer (after the last checkpoint, which waited for its sends)."""
        producer, self.verdict_producer = self.verdict_producer, None
        if producer is not None:
            await producer.stop()

    async def _partition_count(self, topic: str) -> int:
        """The partition count of an output topic (from the producer's metadata, once)."""
        n = self._partition_counts.get(topic)
        if n is None:
            n = self._partition_counts[topic] = len(await self._shared().partitions_for(topic))
            if n != self.partitions:
                log.warning(
                    "%s has %d partitions, not %d: verdicts go to source partition mod %d", topic, n, self.partitions, n
                )
        return n

    def provenance(self, generation: int) -> list[tuple[str, bytes]]:
        """The headers of verdicts decided in ``generation``: which worker, in which group
        generation.  Two copies of one verdict id with different contents can then be told
        apart by who published them (a consumer deduplicating by id keeps either)."""
        cached_generation, headers = self._provenance
        if cached_generation != generation:
            headers = [self._worker_header, (GENERATION_HEADER, str(generation).encode())]
            self._provenance = (generation, headers)
        return headers

    async def send_verdicts(self, verdicts: list[VerdictOut], generation: int = -1) -> list[asyncio.Future]:
        """Queue verdicts decided in group ``generation``, one record batch per partition, each
        record with the ``provenance`` headers; returns their delivery futures."""
        n_partitions = await self._partition_count(self.verdicts_topic)
        producer = await self.start()
        headers = self.provenance(generation)
        by_partition: dict[int, list[tuple[bytes, bytes]]] = defaultdict(list)
        for out in verdicts:
            by_partition[out.partition % n_partitions].append((out.key, out.value))
        futures = []
        for partition, items in by_partition.items():
            for future, _n in await send_records(producer, self.verdicts_topic, partition, items, headers):
                futures.append(future)
        return futures

    async def send_forwards(self, records: list[tuple[bytes, bytes, list, int | None]]) -> list[asyncio.Future]:
        """Repartition records under session scope (``streams.app.processor``): to the
        repartition topic, by their new key, headers (signatures) and Kafka timestamp kept.  On the verdicts'
        producer: a forwarded event's decision waits for this hop."""
        topic = self.sessions_topic
        return await _send_keyed(await self.start(), topic, await self._partition_count(topic), records)

    async def send_fleet(self, records: list[tuple[bytes, bytes]]) -> list[asyncio.Future]:
        """The fleet topology's input records (``<app id>-fleet``), by key (tool or trace)."""
        topic = self.fleet_topic
        return await _send_keyed(
            self._shared(),
            topic,
            await self._partition_count(topic),
            [(key, value, _NO_HEADERS) for key, value in records],
        )

    async def send_fleet_outcomes(self, records: list[tuple[bytes, bytes]]) -> list[asyncio.Future]:
        """Failing outcomes for the per-agent limit (``<app id>-fleet-agents``), by agent."""
        topic = self.fleet_agents_topic
        return await _send_keyed(
            self._shared(),
            topic,
            await self._partition_count(topic),
            [(key, value, _NO_HEADERS) for key, value in records],
        )

    async def find_shadow_topic(self, timeout: float = 10.0) -> bool:
        """Look the shadow topic up (its partition count), at most ``timeout`` seconds; True once
        it is known.  Called where waiting harms no decision: at start and after a config
        reload, never by a batch.  Shadow verdicts queued before the first lookup ended wait for
        it in the background (``_send_shadow``): the first batches of a worker that has just
        started (its partitions can come before its start-up task looks the topic up) lose
        none of them."""
        if self.shadow_partitions is not None:
            return True
        lookup = self._shadow_lookup
        if lookup is None or lookup.done():
            lookup = self._shadow_lookup = asyncio.ensure_future(self._look_up_shadow_topic(timeout))
        return await asyncio.shield(lookup)

    async def _look_up_shadow_topic(self, timeout: float) -> bool:
        try:
            partitions = await asyncio.wait_for(self._shared().partitions_for(self.shadow_topic), timeout)
        except Exception as exc:  # noqa: BLE001 - missing, not allowed, no broker: shadow verdicts wait
            self._shadow_failures.failed(exc)
            return False
        if not partitions:
            return False
        self.shadow_partitions = len(partitions)
        self._shadow_failures.ok()
        return True

    def send_shadow(self, verdicts: list[VerdictOut], config: str, sha256: str) -> asyncio.Future:
        """Queue verdicts for the shadow topic, tagged with their config, in the background;
        a future of their delivery that never raises (what is not delivered is counted lost)."""
        return asyncio.ensure_future(self._send_shadow(verdicts, config, sha256))

    async def _send_shadow(self, verdicts: list[VerdictOut], config: str, sha256: str) -> None:
        lost = len(verdicts)
        try:
            lookup = self._shadow_lookup
            if self.shadow_partitions is None and (lookup is None or not lookup.done()):
                # the worker's first lookup (at start) is not over, or has not begun: wait for it
                # here, off the batch; after a failed one, fail fast until the next (poll_files)
                await self.find_shadow_topic()
            n_partitions = self.shadow_partitions
            if n_partitions is None:
                raise RuntimeError(
                    f"topic {self.shadow_topic} not found (create it: docs/configuration.md, Changing thresholds safely)"
                )
            headers = [(CONFIG_HEADER, config.encode()), (CONFIG_SHA256_HEADER, sha256.encode())]
            by_partition: dict[int, list[tuple[bytes, bytes]]] = defaultdict(list)
            for out in verdicts:
                by_partition[out.partition % n_partitions].append((out.key, out.value))
            sent = []
            for partition, items in by_partition.items():
                sent += await send_records(self._shared(), self.shadow_topic, partition, items, headers)
            results = await asyncio.gather(*(future for future, _n in sent), return_exceptions=True)
            lost = sum(n for (_future, n), got in zip(sent, results) if isinstance(got, BaseException))
            failure = next((got for got in results if isinstance(got, BaseException)), None)
            if failure is not None:
                raise failure
            self._shadow_failures.ok()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - shadow output never stops the worker
            self._shadow_failures.failed(exc)
            if self.metrics is not None and lost:
                self.metrics.shadow_verdicts_lost.labels(config).inc(lost)

    async def send_dead_letter(self, letter: DeadLetter) -> asyncio.Future:
        """Queue a dead letter; returns a future of its delivery."""
        partition = letter.record.partition % await self._partition_count(self.dead_letter_topic)
        key, value, headers = dead_letter_record(letter, DEAD_LETTER_VALUE_LIMIT)
        sent = await self._shared().send(self.dead_letter_topic, value, key=key, partition=partition, headers=headers)
        return asyncio.ensure_future(self._deliver_dead_letter(letter, sent, partition))

    async def _deliver_dead_letter(self, letter: DeadLetter, sent: asyncio.Future, partition: int) -> Any:
        """Wait for a dead letter's delivery.  When the topic refuses it as too large (its
        ``max.message.bytes`` set below ``DEAD_LETTER_VALUE_LIMIT`` by someone; the producer
        may also have put it in one request with others), it goes again on its own, then
        as its headers alone."""
        # Imported here, not at the top: the run store imports this module, the processor the
        # run store, and neither needs a Kafka client.
        from aiokafka.errors import MessageSizeTooLargeError, RecordListTooLargeError, RecordTooLargeError

        too_large = (MessageSizeTooLargeError, RecordListTooLargeError, RecordTooLargeError)
        try:
            return await sent
        except too_large:
            pass
        try:
            return await self._send_alone(letter, DEAD_LETTER_VALUE_LIMIT, partition)
        except too_large as exc:
            record = letter.record
            log.error(
                "dead letter of %s[%d]@%d refused by %s (%r): sending its headers without key or value",
                record.topic,
                record.partition,
                source_offset(record),
                self.dead_letter_topic,
                exc,
            )
        return await self._send_alone(letter, 0, partition)

    async def _send_alone(self, letter: DeadLetter, limit: int, partition: int) -> Any:
        """Send a dead letter as a record batch of its own and wait for its delivery."""
        key, value, headers = dead_letter_record(letter, limit)
        producer = self._shared()
        batch = producer.create_batch()
        batch.append(key=key, value=value, timestamp=None, headers=headers)
        return await (await producer.send_batch(batch, self.dead_letter_topic, partition=partition))
