"""The batching consumer's acks and commit offsets (no broker: nothing is started).

Batches of a batch-handler topic are acked as per-partition watermarks; the offset Faust
commits is the watermark + 1.  The worker's end-to-end commits are checked on the real
broker in ``tests/integration/test_kafka_worker.py``.
"""

import asyncio

import pytest
from faust.types import TP

from streams.app.faust_adapter import BatchingConsumer, InlineConsumerThread
from streams.app.settings import Settings


class Message:  # stands in for the Faust message tracked while batches are open
    acked = False


P0 = TP("tool-calls", 0)
P1 = TP("tool-calls", 1)


@pytest.fixture
def consumer(tmp_path) -> BatchingConsumer:
    from streams.app.app import build_worker

    asyncio.set_event_loop(asyncio.new_event_loop())
    worker = build_worker(Settings(data_dir=tmp_path / "state", partitions=2, app_id="lw-unit"))
    return worker.app.consumer


def open_batch(consumer: BatchingConsumer, offsets):
    """What the fetch loop does when it hands a batch over: the ``done`` it passes."""
    if consumer._batch_message is None:
        consumer._batch_message = Message()
    consumer._open_batches += 1
    return lambda: consumer._ack_batch(offsets)


def test_the_consumer_runs_on_the_apps_loop(consumer):
    assert isinstance(consumer, BatchingConsumer)
    assert isinstance(consumer._thread, InlineConsumerThread)
    assert consumer._thread.thread_loop is consumer._thread.parent_loop


def test_commit_offset_is_the_watermark_plus_one(consumer):
    assert consumer._new_offset(P0) is None  # nothing acked
    done = open_batch(consumer, [(P0, 41, 42), (P1, 9, 10)])
    done()
    assert consumer._new_offset(P0) == 42
    assert consumer._new_offset(P1) == 10
    assert consumer._n_acked == 52
    assert {P0, P1} <= set(consumer._filter_tps_with_pending_acks())


def test_acks_never_move_a_watermark_back(consumer):
    first, second = open_batch(consumer, [(P0, 99, 100)]), open_batch(consumer, [(P0, 50, 1)])
    first()
    second()
    assert consumer._new_offset(P0) == 100


def test_nothing_to_commit_at_or_below_the_committed_offset(consumer):
    consumer._committed_offset[P0] = 100
    open_batch(consumer, [(P0, 80, 10)])()  # re-delivered records below the commit
    assert P0 not in consumer._watermarks
    open_batch(consumer, [(P0, 99, 20)])()
    assert consumer._new_offset(P0) is None  # 99 + 1 is what is committed already
    open_batch(consumer, [(P0, 120, 21)])()
    assert consumer._new_offset(P0) == 121


def test_the_batch_message_is_released_with_the_last_open_batch(consumer):
    first, second = open_batch(consumer, [(P0, 1, 2)]), open_batch(consumer, [(P0, 3, 2)])
    sentinel = consumer._batch_message
    consumer._unacked_messages.add(sentinel)
    first()
    assert consumer._batch_message is sentinel and sentinel in consumer._unacked_messages
    second()
    assert consumer._batch_message is None and sentinel not in consumer._unacked_messages and sentinel.acked
    assert consumer._open_batches == 0


def test_a_per_record_topic_keeps_fausts_offsets(consumer):
    changelog = TP("lw-unit-runs-changelog", 0)
    consumer._acked[changelog].extend([5, 6, 7, 9])
    assert consumer._new_offset(changelog) == 8  # Faust's: up to the first gap


def test_commits_run_beside_the_fetch_loop_one_at_a_time(consumer):
    # A commit flushes the producer first (Faust's rule); awaited in the fetch loop, it held
    # every decision behind the last checkpoint's changelog records.
    loop = consumer.loop  # the loop its tasks go to
    release = asyncio.Event()
    started = []

    async def commit():
        started.append(True)
        await release.wait()
        return True

    consumer.commit = commit

    async def settle():  # the task, and mode's wrapper around it, get to run
        for _ in range(5):
            await asyncio.sleep(0)

    async def scenario():
        consumer._commit_in_background()  # returns at once: nothing awaited here
        await settle()
        assert started == [True]
        consumer._commit_in_background()  # one commit at a time
        await settle()
        assert started == [True]
        release.set()
        await consumer._commit_task
        consumer._commit_in_background()
        await settle()
        assert started == [True, True]
        await consumer._commit_task

    loop.run_until_complete(scenario())
