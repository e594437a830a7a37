"""Topics a worker uses are in its consumer's metadata, on the real broker.

A topic created moments before a worker started was missing from its consumer's first
metadata answer (seen on a busy 2-core machine), and aiokafka keeps an answer for
``metadata_max_age_ms`` (Faust's default: 5 minutes).  Meanwhile the group leader assigned
none of the topic's partitions, and Faust refused every write to a table whose changelog it
was (the fleet limiter then admitted every outcome: ``faults/test_faults_fleet_limit.py``).
Two changes, each tested here: the worker's consumer asks again while a topic it subscribes
to is missing (``AskAgainForMissingTopics``), and ``ensure_topics`` returns only once the
broker describes every topic it made sure of (``wait_until_described``)."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient

from harness import create_topic, produce
from streams.app.faust_adapter import AskAgainForMissingTopics
from streams.app.topics import wait_until_described

pytestmark = pytest.mark.kafka

FAUST_METADATA_MAX_AGE_MS = 5 * 60 * 1000


async def test_a_consumer_told_its_topic_is_missing_asks_again_and_consumes_it_once_created(kafka_broker):
    topic = f"lwt-late-{uuid.uuid4().hex[:8]}"
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka_broker,
        group_id=f"{topic}-group",
        auto_offset_reset="earliest",
        metadata_max_age_ms=FAUST_METADATA_MAX_AGE_MS,
    )
    listener = AskAgainForMissingTopics.watch(consumer)
    await consumer.start()
    try:
        consumer.subscribe([topic])  # after the start, as Faust's consumer subscribes
        # The broker has answered without the topic (the test broker never creates topics on use).
        for _ in range(200):
            if topic in listener.reported:
                break
            await asyncio.sleep(0.05)
        assert listener.reported == {topic}
        await create_topic(kafka_broker, topic, partitions=2)
        await produce(kafka_broker, topic, [(b"k", b"created after the consumer started")])
        # Without asking again the consumer would see the topic after 5 minutes at the earliest.
        record = await asyncio.wait_for(consumer.getone(), timeout=30)
        assert record.value == b"created after the consumer started"
        assert listener.reported == frozenset()
    finally:
        await consumer.stop()


async def test_wait_until_described_returns_the_topics_the_broker_does_not_describe(kafka_broker, caplog):
    there = f"lwt-described-{uuid.uuid4().hex[:8]}"
    absent = f"lwt-absent-{uuid.uuid4().hex[:8]}"
    await create_topic(kafka_broker, there, partitions=3)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker)
    await admin.start()
    try:
        assert await wait_until_described(admin, [there], timeout=5) == []
        with caplog.at_level(logging.WARNING, logger="loopwatch.worker"):
            assert await wait_until_described(admin, [there, absent], timeout=0.5) == [absent]
    finally:
        await admin.close()
    assert [r.getMessage() for r in caplog.records] == [
        f"the broker does not describe topics {absent} 0 s after they were made sure of; the worker starts anyway"
    ]
