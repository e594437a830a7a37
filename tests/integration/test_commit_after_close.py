"""A worker whose consumer Faust closed during a rejoin does not wait for ever on a commit
(docs/reliability.md: a worker that lost its group always leaves), on the real broker.

The sequence of the hang, as the workers' logs show it: the worker stops while its group
coordinator rejoins; Faust's rebalance callback, seeing the app stopping, closes the aiokafka
consumer (``AIOKafkaConsumerThread.close``: its client, then its coordinator); the JoinGroup
request in flight on the closed client fails ("Error sending JoinGroupRequest ... marking
coordinator dead"); and the stop's commit ("Wait for streams...") then retried for ever inside
aiokafka's ``commit_offsets``: a closing coordinator never looks a coordinator up again, and
"coordinator not available" is retriable.

Here the JoinGroup is held by the broker for real: the consumer under test (``a``, Faust's
consumer thread of a worker app around a real aiokafka consumer) is a member with partitions,
a member with a long heartbeat interval (``slow``) is in the same group, and a third member
joins: ``a`` rejoins at once and the broker holds its JoinGroup until ``slow``'s next
heartbeat, seconds later.  Faust's own ``close`` is called in that window.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
from aiokafka import AIOKafkaConsumer
from faust.types import TP

from harness import create_topic
from streams.app.settings import Settings

pytestmark = pytest.mark.kafka

HANG_S = 60.0
"""Far past any commit on a local broker (milliseconds): a commit still running then retries for ever."""


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def _topic(broker: str, partitions: int) -> str:
    name = f"lwit-close-{uuid.uuid4().hex[:8]}"
    await create_topic(broker, name, partitions)
    return name


def _member(broker: str, topic: str, group: str, *, heartbeat_ms: int, session_ms: int) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        topic,
        bootstrap_servers=broker,
        group_id=group,
        enable_auto_commit=False,
        heartbeat_interval_ms=heartbeat_ms,
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=session_ms,
    )


async def _until(condition, what: str, timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"not within {timeout:.0f} s: {what}"
        await asyncio.sleep(0.05)


async def test_a_commit_after_faust_closed_the_consumer_under_a_failed_join_returns(kafka_broker, tmp_path):
    from streams.app.app import build_worker

    topic = await _topic(kafka_broker, 3)
    group = topic
    thread = build_worker(Settings(data_dir=tmp_path / "state", app_id=f"{group}-app")).app.consumer._thread
    a = _member(kafka_broker, topic, group, heartbeat_ms=300, session_ms=10_000)
    slow = _member(kafka_broker, topic, group, heartbeat_ms=10_000, session_ms=30_000)
    third = _member(kafka_broker, topic, group, heartbeat_ms=300, session_ms=10_000)
    coordinator_log = logging.getLogger("aiokafka.consumer.group_coordinator")
    lines = _Lines()
    third_started = None
    coordinator_log.addHandler(lines)
    coordinator_log.setLevel(logging.INFO)
    try:
        await a.start()
        await _until(lambda: a.assignment(), "a is assigned the topic's partitions")
        await slow.start()
        # Both have taken their new shares (until then a still shows all three, as under load it did).
        await _until(
            lambda: (
                a.assignment()
                and slow.assignment()
                and not (a.assignment() & slow.assignment())
                and len(a.assignment() | slow.assignment()) == 3
            ),
            "a and slow share the partitions",
        )
        thread._consumer = a  # Faust's consumer thread around this consumer
        owned = {TP(tp.topic, tp.partition) for tp in a.assignment()}
        assert owned and owned == thread.assignment()

        lines.lines.clear()
        # a rejoins at once; the broker holds its JoinGroup (and third's start) until slow's next heartbeat
        third_started = asyncio.ensure_future(third.start())
        await _until(lambda: sum(line.startswith("(Re-)joining group") for line in lines.lines) >= 2, "a rejoins")
        await asyncio.sleep(0.3)  # the JoinGroup is on the wire, held by the broker
        thread.close()  # what Faust's rebalance callback does while the app stops
        await _until(lambda: a._coordinator.coordinator_id is None, "the failed JoinGroup marks the coordinator dead")
        assert any(line.startswith("Error sending JoinGroupRequest") for line in lines.lines), lines.lines
        assert thread.assignment() == owned, "the partitions are still a's: Faust commits their offsets"

        try:
            committed = await asyncio.wait_for(thread.commit({tp: 1 for tp in owned}), HANG_S)
        except TimeoutError:
            pytest.fail(f"the commit still retried {HANG_S:.0f} s after the consumer was closed")
        assert committed is False
    finally:
        coordinator_log.removeHandler(lines)
        if third_started is not None:
            await third_started
        for consumer in (third, slow, a):
            await consumer.stop()
