"""Shadow verdicts and the shadow topic's lookup (``streams.app.output``): the verdicts of a
worker's first batches, queued before its start-up task has looked the topic up, wait for that
lookup in the background instead of being lost (issue 26: a restarted worker's first batches
lost their candidate verdicts)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry
from test_worker_app import FakeProducer

from schemas import decode_verdict, encode_verdict
from schemas.verdicts import Decision
from streams.app.metrics import Metrics
from streams.app.output import Output
from streams.app.records import VerdictOut


class SlowLookup(FakeProducer):
    """A producer whose metadata for a topic comes once ``known`` is set (or never: ``missing``)."""

    def __init__(self, missing: bool = False):
        super().__init__()
        self.known = asyncio.Event()
        self.missing = missing
        self.lookups = 0

    async def partitions_for(self, topic):
        self.lookups += 1
        await self.known.wait()
        return set() if self.missing else {0, 1}


def verdict(i: int) -> VerdictOut:
    decision = Decision(
        verdict_id=f"e{i}/decision",
        cause_event_id=f"e{i}",
        run_id="r",
        tool_name="read",
        args_hash="read:" + "0" * 64,
        action="allow",
    )
    return VerdictOut(0, b"run:r", encode_verdict(decision), decision)


def output(producer: FakeProducer) -> tuple[Output, Metrics]:
    metrics = Metrics(CollectorRegistry(), process_metrics=False)
    return Output(
        verdicts_topic="v",
        dead_letter_topic="d",
        partitions=2,
        shared_producer=lambda: producer,
        new_producer=lambda: producer,
        shadow_topic="s",
        metrics=metrics,
    ), metrics


def lost(metrics: Metrics) -> float:
    return sum(
        sample.value
        for family in metrics.registry.collect()
        if family.name == "loopwatch_shadow_verdicts_lost"
        for sample in family.samples
        if sample.name.endswith("_total")
    )


def test_shadow_verdicts_queued_before_the_first_lookup_ends_are_delivered_after_it():
    async def scenario():
        producer = SlowLookup()
        out, metrics = output(producer)
        start_up = asyncio.ensure_future(out.find_shadow_topic())  # the worker's start-up task
        await asyncio.sleep(0)
        delivery = out.send_shadow([verdict(1), verdict(2)], "candidate", "abc")  # a first batch's
        await asyncio.sleep(0.01)
        assert not delivery.done() and producer.sent == []  # waiting for the lookup, off the batch
        producer.known.set()
        await asyncio.wait_for(delivery, 1)
        assert await start_up and producer.lookups == 1  # the batch joined the start-up's lookup
        [(topic, _partition, records)] = producer.sent
        assert topic == "s" and [decode_verdict(v).verdict_id for _k, v, _h in records] == [
            "e1/decision",
            "e2/decision",
        ]
        assert lost(metrics) == 0

    asyncio.run(scenario())


def test_a_batch_before_the_start_up_task_looks_the_topic_up_starts_the_lookup_itself():
    async def scenario():
        producer = SlowLookup()
        producer.known.set()
        out, metrics = output(producer)
        await asyncio.wait_for(out.send_shadow([verdict(1)], "candidate", "abc"), 1)
        assert len(producer.sent) == 1 and lost(metrics) == 0 and out.shadow_partitions == 2

    asyncio.run(scenario())


def test_after_a_failed_lookup_shadow_verdicts_are_counted_lost_at_once():
    async def scenario():
        producer = SlowLookup(missing=True)
        producer.known.set()
        out, metrics = output(producer)
        assert not await out.find_shadow_topic()
        await asyncio.wait_for(out.send_shadow([verdict(1), verdict(2)], "candidate", "abc"), 1)
        assert producer.sent == [] and lost(metrics) == 2 and producer.lookups == 1  # no new lookup per batch

    asyncio.run(scenario())
