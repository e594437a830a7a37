"""Kafka I/O for tests and benchmarks: topics, offsets, producing events, collecting what the
worker published, and what the engine alone answers.

Nothing here mocks Kafka: these helpers talk to a real broker with plain aiokafka clients.
They take ``client_options``, aiokafka's security keyword arguments
(``Settings.kafka_client_options()``'s form), for the secured broker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from schemas import decode_verdict, encode_event
from schemas.events import ToolCallEvent
from schemas.keys import record_key
from streams.engine import LoopEngine, RunDriver, engine_for

__all__ = [
    "collect",
    "collect_verdicts",
    "committed_offsets",
    "create_topic",
    "dedupe",
    "delete_topics",
    "encode_all",
    "end_offsets",
    "group_lag",
    "header",
    "produce",
    "reference_verdicts",
    "wait_for_topic",
]


async def create_topic(broker: str, topic: str, partitions: int) -> None:
    """Create ``topic`` (one replica) and wait until the broker describes it."""
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        await admin.close()
    await wait_for_topic(broker, topic)


async def wait_for_topic(
    broker: str, topic: str, timeout: float = 60.0, *, client_options: Mapping[str, Any] | None = None
) -> int:
    """Wait until ``topic`` exists; returns its partition count."""
    admin = AIOKafkaAdminClient(bootstrap_servers=broker, **(client_options or {}))
    await admin.start()
    try:
        deadline = time.monotonic() + timeout
        while True:
            described = await admin.describe_topics([topic])
            info = described[0] if described else {}
            if info.get("error_code", 1) == 0 and info.get("partitions"):
                return len(info["partitions"])
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {topic} does not exist after {timeout}s")
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


async def delete_topics(
    broker: str, prefixes: Iterable[str], *, client_options: Mapping[str, Any] | None = None
) -> list[str]:
    """Delete every topic whose name starts with one of ``prefixes``; returns their names."""
    admin = AIOKafkaAdminClient(bootstrap_servers=broker, **(client_options or {}))
    await admin.start()
    try:
        doomed = [t for t in await admin.list_topics() if t.startswith(tuple(prefixes))]
        if doomed:
            await admin.delete_topics(doomed)
        return doomed
    finally:
        await admin.close()


async def committed_offsets(broker: str, group: str, topic: str) -> dict[int, int]:
    """Per partition of ``topic`` with a committed offset: the group's committed offset."""
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp.partition: meta.offset for tp, meta in committed.items() if tp.topic == topic and meta.offset >= 0}


async def end_offsets(broker: str, topic: str) -> dict[int, int]:
    """Per partition of ``topic``: its end offset (the number of records it ever had)."""
    tps = [TopicPartition(topic, p) for p in range(await wait_for_topic(broker, topic))]
    consumer = AIOKafkaConsumer(bootstrap_servers=broker, enable_auto_commit=False)
    await consumer.start()
    try:
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
    return {tp.partition: offset for tp, offset in ends.items()}


async def group_lag(broker: str, group: str, topic: str) -> dict[int, int]:
    """Per partition of ``topic``: end offset minus the group's committed offset (the whole
    partition when nothing is committed)."""
    ends = await end_offsets(broker, topic)
    committed = await committed_offsets(broker, group, topic)
    return {partition: end - committed.get(partition, 0) for partition, end in ends.items()}


def encode_all(events: Iterable[ToolCallEvent]) -> list[tuple[bytes, bytes]]:
    """(Kafka key, value) per event, keyed as the runner client keys them (``record_key``)."""
    return [(record_key(event).encode("utf-8", "surrogatepass"), encode_event(event)) for event in events]


async def produce(
    broker: str,
    topic: str,
    records: Sequence[tuple[bytes | None, bytes | None] | tuple[bytes | None, bytes | None, Any]],
    *,
    rate: float | None = None,
    on_sent: Callable[[int, float], None] | None = None,
    client_options: Mapping[str, Any] | None = None,
) -> float:
    """Produce records (in order, keyed; a third item is the record's headers); ``rate``
    events/s paces them.  Returns seconds taken."""
    producer = AIOKafkaProducer(
        bootstrap_servers=broker,
        linger_ms=2 if rate else 10,
        max_batch_size=512 * 1024,
        max_request_size=4 * 1024 * 1024,
        acks="all",
        **(client_options or {}),
    )
    await producer.start()
    start = time.perf_counter()
    try:
        futures = []
        for i, (key, value, *headers) in enumerate(records):
            if rate:
                due = start + i / rate
                delay = due - time.perf_counter()
                if delay > 0.001:
                    await asyncio.sleep(delay)
            futures.append(await producer.send(topic, value, key=key, headers=headers[0] if headers else None))
            if on_sent is not None:
                on_sent(i, time.time())
            if len(futures) >= 5000:
                await asyncio.gather(*futures)
                futures.clear()
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return time.perf_counter() - start


async def collect(
    broker: str,
    topic: str,
    *,
    until: Callable[[list], bool],
    timeout: float = 60.0,
    settle: float = 0.0,
    client_options: Mapping[str, Any] | None = None,
) -> list:
    """Read ``topic`` from the beginning until ``until(records)`` holds (then ``settle`` seconds
    more, to catch late duplicates) or ``timeout`` passes.  Returns aiokafka records."""
    partitions = await wait_for_topic(broker, topic, timeout=timeout, client_options=client_options)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=broker, enable_auto_commit=False, auto_offset_reset="earliest", **(client_options or {})
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        out: list = []
        deadline = time.monotonic() + timeout
        settle_until = None
        while True:
            now = time.monotonic()
            if settle_until is None and until(out):
                settle_until = now + settle
            if settle_until is not None and now >= settle_until:
                return out
            if now > deadline:
                return out
            batch = await consumer.getmany(timeout_ms=200)
            for tp_records in batch.values():
                out.extend(tp_records)
    finally:
        await consumer.stop()


async def collect_verdicts(
    broker: str,
    topic: str,
    expected_ids: Iterable[str],
    *,
    timeout: float = 60.0,
    settle: float = 0.5,
) -> list:
    """Every verdict record of ``topic``, read until each of ``expected_ids`` has arrived."""
    want = set(expected_ids)

    def done(records: list) -> bool:
        return want <= {decode_verdict(r.value).verdict_id for r in records}

    return await collect(broker, topic, until=done, timeout=timeout, settle=settle)


def reference_verdicts(events: Iterable[ToolCallEvent], config: Any = None) -> list:
    """What loopwatch publishes for these events, answered by the engine alone
    (``streams.engine.published``), in event order."""
    engine = config if isinstance(config, LoopEngine) else engine_for(config)
    return RunDriver(engine).verdicts(events)


def dedupe(records: Iterable[Any]) -> tuple[dict[str, Any], int, int]:
    """Verdicts by id, first delivery kept.  Returns (by_id, duplicates, differing duplicates)."""
    by_id: dict[str, Any] = {}
    duplicates = differing = 0
    for record in records:
        verdict = decode_verdict(record.value)
        seen = by_id.get(verdict.verdict_id)
        if seen is None:
            by_id[verdict.verdict_id] = verdict
        else:
            duplicates += 1
            if seen != verdict:
                differing += 1
    return by_id, duplicates, differing


def header(record: Any, name: str) -> str | None:
    for key, value in record.headers or ():
        if key == name:
            return value.decode("utf-8", "replace")
    return None
