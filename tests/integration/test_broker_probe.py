"""The worker's readiness probe (``Health.probe_broker``, once a second) on the real broker: it
asks for the ``tool-calls`` topic's metadata only.  It used to ask for every topic of the
cluster: an answer that grows with the cluster, which every worker decoded in Python every
second.  A broker that no longer answers it is tested through a worker cut off from its broker
(``test_worker_reliability.py``)."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.conn import AIOKafkaConnection

from harness import create_topic
from streams.app.faust_adapter import fetch_topic_metadata

pytestmark = pytest.mark.kafka


async def test_the_probe_asks_a_broker_for_one_topic_and_not_the_clusters(kafka_broker, monkeypatch):
    topic = f"lwt-probe-{uuid.uuid4().hex[:8]}"
    await create_topic(kafka_broker, topic, partitions=2)
    asked: list[tuple[list[str] | None, bool | None]] = []
    send = AIOKafkaConnection.send

    def spy(self, request, *args, **kwargs):
        if type(request).__name__.startswith("MetadataRequest"):
            asked.append((request._topics, request._allow_auto_topic_creation))
        return send(self, request, *args, **kwargs)

    producer = AIOKafkaProducer(bootstrap_servers=kafka_broker)
    await producer.start()
    try:
        monkeypatch.setattr(AIOKafkaConnection, "send", spy)
        await fetch_topic_metadata(producer, topic)
    finally:
        await producer.stop()
    # None would be every topic of the cluster; and the probe must not create the topic on a
    # broker with auto.create.topics.enable (aiokafka's default for the request).
    assert asked == [([topic], False)]
