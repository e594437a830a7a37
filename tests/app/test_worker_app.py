"""The Faust app is wired as documented (no broker needed: nothing is started)."""

import asyncio

import faust.stores
import faust.stores.rocksdb
import pytest

from streams.app.settings import Settings


@pytest.fixture
def app(tmp_path):
    from streams.app.app import create_app

    asyncio.set_event_loop(asyncio.new_event_loop())
    settings = Settings(data_dir=tmp_path / "state", partitions=6, app_id="lw-unit")
    return create_app(settings)


def test_rocksdb_store_with_the_rocksdict_driver(app):
    # faust-streaming 0.15.3 registers "rocksdb://" only; "rocksdict://" resolves to the
    # rocksdict module itself, not a store class.  The table uses rocksdb:// with the
    # rocksdict driver (python-rocksdb is not installed).
    assert faust.stores.by_url("rocksdb://") is faust.stores.rocksdb.Store
    assert not isinstance(faust.stores.by_url("rocksdict://"), type)
    table = app.loopwatch.table
    store = table.data
    assert isinstance(store, faust.stores.rocksdb.Store)
    assert store.use_rocksdict
    assert table.changelog_topic.get_topic_name() == "lw-unit-runs-changelog"
    assert table.partitions == 6
    assert table.key_serializer == "raw" and table.value_serializer == "raw"


def test_topics_partitions_and_handlers(app):
    lw = app.loopwatch
    assert (lw.tool_calls.get_topic_name(), lw.verdicts.get_topic_name(), lw.dead_letters.get_topic_name()) == (
        "tool-calls", "loop-verdicts", "tool-calls-dlq",
    )
    assert lw.tool_calls.partitions == lw.verdicts.partitions == 6
    assert app.batch_handlers == {"tool-calls": lw.handle_batch}
    assert app.before_wait_empty == lw.checkpoint
    assert app.conf.web_bind == "127.0.0.1" and app.conf.web_port == 6066
    assert app.conf.processing_guarantee.value == "at_least_once"
    assert str(app.conf.datadir).endswith("state")


def test_a_batch_keeps_only_undelivered_or_failed_sends_for_the_checkpoint(app):
    # The checkpoint must still see every failed send (it raises its error and acks
    # nothing), while delivered ones are dropped at once instead of piling up until then.
    lw = app.loopwatch
    loop = asyncio.get_event_loop()
    delivered, failed, in_flight, cancelled = (loop.create_future() for _ in range(4))
    delivered.set_result("metadata")
    failed.set_exception(OSError("broker gone"))
    cancelled.cancel()
    lw._pending = [delivered, failed, in_flight, cancelled]
    acked = []
    loop.run_until_complete(lw._handle([], lambda: acked.append(True)))
    assert lw._pending == [failed, in_flight, cancelled]
    assert len(lw._dones) == 1 and not acked  # acked by the checkpoint, not before
    failed.exception()  # retrieved: no "never retrieved" warning at teardown


class FakeProducer:
    """Records what is produced through aiokafka's record-batch API."""

    def __init__(self):
        self.sent: list[tuple[str, int, list]] = []
        self.started = self.stopped = False

    async def start(self):
        self.started = True

    async def stop(self):
        self.stopped = True

    async def partitions_for(self, topic):
        return set(range(6))

    def create_batch(self):
        return FakeBatch()

    async def send_batch(self, batch, topic, partition):
        self.sent.append((topic, partition, batch.records))
        future = asyncio.get_event_loop().create_future()
        future.set_result(type("Metadata", (), {"offset": 0})())
        return future


class FakeBatch:
    def __init__(self):
        self.records = []

    def append(self, key, value, timestamp, headers):
        self.records.append((key, value))
        return object()


def test_decisions_and_state_writes_go_out_on_separate_producers(app):
    # aiokafka has one produce request in flight per broker: on a shared producer, every
    # decision made during a checkpoint waited behind its changelog records.
    from schemas import decode_verdict, encode_event
    from streams.app.processor import Record
    from streams.edge import requested_event

    lw = app.loopwatch
    faust_producer, verdict_producer = FakeProducer(), FakeProducer()
    lw._producer = lambda: faust_producer
    app.producer._new_producer = lambda: verdict_producer
    loop = asyncio.get_event_loop()
    event = requested_event("c1", "read", {"path": "/a"}, run_id="r1", session_key="s", gate=True, ts_ms=1)
    loop.run_until_complete(lw._handle([Record("tool-calls", 2, 0, b"r1", encode_event(event), 1)], lambda: None))

    assert verdict_producer.started
    [(topic, partition, records)] = verdict_producer.sent
    assert (topic, partition) == ("loop-verdicts", 2)
    assert decode_verdict(records[0][1]).action == "allow"
    assert faust_producer.sent == []

    loop.run_until_complete(lw.checkpoint())
    [(topic, partition, records)] = faust_producer.sent
    assert (topic, partition) == ("lw-unit-runs-changelog", 2) and len(records) == 1
    assert len(verdict_producer.sent) == 1

    loop.run_until_complete(lw.close())
    assert verdict_producer.stopped and lw._verdict_producer is None


def test_a_checkpoint_slice_is_bounded_in_time_and_always_progresses():
    from streams.app.app import _encode_for

    class Frozen:
        def __init__(self, n):
            self.left = n

        def encode_some(self, n):
            assert n == 1
            self.left -= 1
            return self.left == 0

    some = Frozen(1000)
    assert _encode_for(some, 0.0) is False and some.left == 999  # one run even with no time
    assert _encode_for(some, 60.0) is True and some.left == 0  # all of them within a minute


def test_a_checkpoint_pauses_between_slices_only_while_batches_flow(app, monkeypatch):
    # Pauses leave room for the decisions of small batches; when the batch handler itself
    # waits for the checkpoint (too many dirty runs), they would only slow it down.
    import streams.app.app as app_module

    lw = app.loopwatch
    slept = []

    async def sleep(seconds):
        slept.append(seconds)

    monkeypatch.setattr(app_module.asyncio, "sleep", sleep)
    loop = asyncio.get_event_loop()
    lw._last_batch_size = 5
    loop.run_until_complete(lw._step_aside())
    lw._batches_wait = True
    loop.run_until_complete(lw._step_aside())
    lw._batches_wait = False
    lw._last_batch_size = app_module.BUSY_BATCH
    loop.run_until_complete(lw._step_aside())
    assert slept == [app_module.CHECKPOINT_PAUSE_S, 0, 0]
