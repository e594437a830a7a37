"""Records a stopped flow dropped are fetched again, also on a partition with no committed
offset (issue 26), on the real broker with aiokafka's own consumer.

Faust drops what the fetch loop got while its flow was stopped and relies on ``perform_seek``
(aiokafka's ``seek_to_committed``) to fetch it again.  The first test pins what that leaves
undone: ``seek_to_committed`` does not move a partition whose group never committed, so its
position stays past the dropped records (a partition's first records were lost when it moved
to another worker before its first commit).  The second drives ``_BatchingConsumer._fetch_again``
on that consumer, as the fetch loop does after ``perform_seek``: the partition is sought back to
its first dropped record, and a partition that was sought to its committed offset is left alone.
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from harness import create_topic
from streams.app.faust_adapter import _BatchingConsumer

pytestmark = pytest.mark.kafka


async def _consumer_after_a_dropped_fetch(broker: str, topic: str, group: str, committed: dict[int, int]):
    """A group consumer of both partitions of ``topic`` that fetched their records (and
    dropped them, as the fetch loop does), with ``committed`` committed before."""
    tps = [TopicPartition(topic, p) for p in (0, 1)]
    if committed:
        # Committed by a consumer of its own first: the reading consumer looks its positions up
        # as soon as it is assigned, before a commit of its own could be in place.
        committer = AIOKafkaConsumer(bootstrap_servers=broker, group_id=group, enable_auto_commit=False)
        await committer.start()
        try:
            committer.assign(tps)
            await committer.commit({TopicPartition(topic, p): o for p, o in committed.items()})
        finally:
            await committer.stop()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=broker, group_id=group, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    consumer.assign(tps)
    fetched: dict = {}
    while sum(len(v) for v in fetched.values()) < 20 - sum(committed.values()):
        for tp, records in (await consumer.getmany(timeout_ms=1000)).items():
            fetched.setdefault(tp, []).extend(records)
    return consumer, fetched


async def _two_partitions(broker: str, name: str) -> None:
    await create_topic(broker, name, partitions=2)

    producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all")
    await producer.start()
    try:
        for p in (0, 1):
            for i in range(10):
                await producer.send_and_wait(name, f"p{p}-{i}".encode(), partition=p)
    finally:
        await producer.stop()


@pytest.fixture
async def two_partition_topic(kafka_broker):
    name = f"lwit-fetch-again-{uuid.uuid4().hex[:8]}"
    await _two_partitions(kafka_broker, name)
    return name


async def test_seek_to_committed_leaves_a_partition_never_committed_past_what_it_fetched(
    kafka_broker, two_partition_topic
):
    topic = two_partition_topic
    consumer, fetched = await _consumer_after_a_dropped_fetch(kafka_broker, topic, f"g-{uuid.uuid4().hex}", {0: 3})
    try:
        p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
        assert [r.offset for r in fetched[p0]] == list(range(3, 10))
        assert [r.offset for r in fetched[p1]] == list(range(10))
        await consumer.seek_to_committed()  # Faust's perform_seek
        assert await consumer.position(p0) == 3  # committed: sought back
        assert await consumer.position(p1) == 10  # never committed: left past the dropped records
    finally:
        await consumer.stop()


@pytest.mark.parametrize("consumed_by", ["the batches", "an agent", "a table's recovery"])
async def test_fetch_again_seeks_back_only_what_perform_seek_left_past_the_dropped_records(
    kafka_broker, two_partition_topic, consumed_by
):
    topic = two_partition_topic
    consumer, fetched = await _consumer_after_a_dropped_fetch(kafka_broker, topic, f"g-{uuid.uuid4().hex}", {0: 3})
    try:
        await consumer.seek_to_committed()
        p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
        records = dict(fetched)  # (Faust's TP and aiokafka's TopicPartition are equal tuples)
        sought: list = []

        async def seek(tp, offset):
            sought.append((tp.partition, offset))
            consumer.seek(TopicPartition(tp.topic, tp.partition), offset)

        # The parts of the Faust consumer _fetch_again reads: the tables' changelogs and
        # aiokafka's consumer.  A changelog is left to Faust's recovery, which seeks it itself.
        changelogs = {topic} if consumed_by == "a table's recovery" else {f"{topic}-changelog"}
        view = SimpleNamespace(
            app=SimpleNamespace(tables=SimpleNamespace(changelog_topics=changelogs)),
            _thread=SimpleNamespace(_ensure_consumer=lambda: consumer),
            seek=seek,
        )
        await _BatchingConsumer._fetch_again(view, records, "fetched while the flow was stopped")
        if consumed_by == "a table's recovery":
            assert sought == [] and await consumer.position(p1) == 10
            return
        assert sought == [(1, 0)]
        assert await consumer.position(p0) == 3 and await consumer.position(p1) == 0
        again = {}
        while sum(len(v) for v in again.values()) < 17:
            for tp, got in (await consumer.getmany(timeout_ms=1000)).items():
                again.setdefault(tp.partition, []).extend(r.offset for r in got)
        assert again == {0: list(range(3, 10)), 1: list(range(10))}
    finally:
        await consumer.stop()
