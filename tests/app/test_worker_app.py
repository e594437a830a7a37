"""The worker is wired as documented, and its checkpoints, output and sweep behave on fake
producers (no broker needed: nothing is started)."""

import asyncio
import gc
import time

import faust.stores
import faust.stores.rocksdb
import pytest

from streams.app.settings import Settings


@pytest.fixture
def worker(tmp_path):
    from streams.app.app import build_worker

    asyncio.set_event_loop(asyncio.new_event_loop())
    settings = Settings(data_dir=tmp_path / "state", partitions=6, app_id="lw-unit")
    return build_worker(settings)


@pytest.fixture
def app(worker):
    return worker.app


def test_rocksdb_store_with_the_rocksdict_driver(worker):
    # faust-streaming 0.15.3 registers "rocksdb://" only; "rocksdict://" resolves to the
    # rocksdict module itself, not a store class.  The table uses rocksdb:// with the
    # rocksdict driver (python-rocksdb is not installed).
    assert faust.stores.by_url("rocksdb://") is faust.stores.rocksdb.Store
    assert not isinstance(faust.stores.by_url("rocksdict://"), type)
    table = worker.table
    store = table.data
    assert isinstance(store, faust.stores.rocksdb.Store)
    assert store.use_rocksdict
    assert table.changelog_topic.get_topic_name() == "lw-unit-runs-changelog"
    assert table.partitions == 6
    assert table.key_serializer == "raw" and table.value_serializer == "raw"


def test_topics_partitions_and_handlers(worker, app):
    lw = worker
    assert (lw.tool_calls.get_topic_name(), lw.verdicts.get_topic_name(), lw.dead_letters.get_topic_name()) == (
        "tool-calls",
        "loop-verdicts",
        "tool-calls-dlq",
    )
    assert lw.tool_calls.partitions == lw.verdicts.partitions == 6
    assert app.hooks.batch_topics == frozenset({"tool-calls"})
    assert app.hooks.handle_batch.__wrapped__ == lw.checkpoints.handle_batch  # (gc_policy.freeze_before_first_batch)
    assert app.hooks.before_wait_empty == lw.checkpoints.checkpoint
    assert app.hooks.after_stop == lw.output.close
    assert app.conf.web_bind == "127.0.0.1" and app.conf.web_port == 6066
    assert app.conf.consumer_group_instance_id == lw.settings.group_instance_id  # static membership
    assert str(app.conf.canonical_url) == lw.settings.web_url
    assert app.conf.processing_guarantee.value == "at_least_once"
    assert str(app.conf.datadir).endswith("state")


def test_the_gc_freezes_what_is_alive_before_the_first_batch_only(monkeypatch):
    from streams.app.gc_policy import freeze_before_first_batch

    calls = []
    monkeypatch.setattr(gc, "collect", lambda generation=2: calls.append(f"collect({generation})") or 0)
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))

    async def handle_batch(batch, done):
        calls.append(f"batch {batch}")
        done()

    handle = freeze_before_first_batch(handle_batch)
    acked = []
    loop = asyncio.new_event_loop()
    for batch in (["a"], ["b", "c"], ["d"]):
        loop.run_until_complete(handle(batch, lambda: acked.append(1)))
    loop.close()
    assert calls == ["collect(1)", "freeze", "batch ['a']", "batch ['b', 'c']", "batch ['d']"]
    assert len(acked) == 3


def test_only_the_health_pages_are_served_on_the_web_port(app):
    # Faust's views show a run's raw state (/table/runs/<key>/) and more, to anyone.
    from streams.app.faust_adapter import HealthOnlyWeb

    web = app.web
    assert isinstance(web, HealthOnlyWeb)  # no built-in blueprint at all (404s: test_worker_reliability)
    assert not any((web.default_blueprints, web.production_blueprints, web.debug_blueprints, web.optional_blueprints))


def test_a_batch_keeps_only_undelivered_or_failed_sends_for_the_checkpoint(worker):
    # The checkpoint must still see every failed send (it raises its error and acks
    # nothing), while delivered ones are dropped at once instead of piling up until then.
    lw = worker.checkpoints
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
    """Records what is produced through aiokafka's record-batch and per-record APIs.

    ``fail``: topic -> a list of errors, one taken per send to that topic (None: delivered).
    """

    def __init__(self, fail=None):
        self.sent: list[tuple[str, int, list]] = []
        self.started = self.stopped = False
        self.fail = {topic: list(errors) for topic, errors in (fail or {}).items()}

    async def start(self):
        self.started = True

    async def stop(self):
        self.stopped = True

    async def partitions_for(self, topic):
        return set(range(6))

    def create_batch(self):
        return FakeBatch()

    def _outcome(self, topic):
        future = asyncio.get_event_loop().create_future()
        errors = self.fail.get(topic)
        error = errors.pop(0) if errors else None
        if error is None:
            future.set_result(type("Metadata", (), {"offset": 0})())
        else:
            future.set_exception(error)
        return future

    async def send_batch(self, batch, topic, partition):
        self.sent.append((topic, partition, batch.records))
        return self._outcome(topic)

    async def send(self, topic, value, key=None, partition=None, headers=None):
        self.sent.append((topic, partition, [(key, value, headers)]))
        return self._outcome(topic)


class FakeBatch:
    def __init__(self):
        self.records = []

    def append(self, key, value, timestamp, headers):
        self.records.append((key, value) if headers is _NO_HEADERS else (key, value, headers))
        return object()


_NO_HEADERS = __import__("streams.app.output", fromlist=["_NO_HEADERS"])._NO_HEADERS


def test_decisions_and_state_writes_go_out_on_separate_producers(worker):
    # aiokafka has one produce request in flight per broker: on a shared producer, every
    # decision made during a checkpoint waited behind its changelog records.
    from schemas import decode_verdict, encode_event
    from streams.app.records import Record
    from streams.edge.events import requested_event

    lw, faust_producer, verdict_producer = wired(worker)
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

    loop.run_until_complete(worker.output.close())
    assert verdict_producer.stopped and worker.output.verdict_producer is None


def test_a_checkpoint_slice_is_bounded_in_time_and_always_progresses():
    from streams.app.checkpoint import _encode_for

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


def test_a_checkpoint_pauses_between_slices_only_while_batches_flow(worker, monkeypatch):
    # Pauses leave room for the decisions of small batches; when the batch handler itself
    # waits for the checkpoint (too many dirty runs), they would only slow it down.
    import streams.app.checkpoint as app_module

    lw = worker.checkpoints
    slept = []

    async def sleep(seconds):
        slept.append(seconds)

    monkeypatch.setattr(app_module.asyncio, "sleep", sleep)
    loop = asyncio.get_event_loop()
    lw._last_batch_size = 5
    loop.run_until_complete(lw.step_aside())
    lw._batches_wait = True
    loop.run_until_complete(lw.step_aside())
    lw._batches_wait = False
    lw._last_batch_size = app_module.BUSY_BATCH
    loop.run_until_complete(lw.step_aside())
    assert slept == [app_module.CHECKPOINT_PAUSE_S, 0, 0]


# -- failure paths ---------------------------------------------------------------------------------


def wired(worker, fail=None):
    """The worker's checkpointer with fake producers: (checkpointer, Faust's producer, the verdicts')."""
    faust_producer, verdict_producer = FakeProducer(fail), FakeProducer(fail)
    worker.store._producer = worker.output._shared = lambda: faust_producer
    worker.output._new = lambda: verdict_producer
    return worker.checkpoints, faust_producer, verdict_producer


def gated_record(run_id="r1", offset=0, partition=2, value=None):
    from schemas import encode_event
    from streams.app.records import Record
    from streams.edge.events import requested_event

    event = requested_event(
        f"{run_id}:{offset}", "read", {"path": "/a"}, run_id=run_id, session_key="s", gate=True, ts_ms=1
    )
    return Record(
        "tool-calls", partition, offset, run_id.encode(), value if value is not None else encode_event(event), 1
    )


@pytest.mark.parametrize("topic", ["loop-verdicts", "tool-calls-dlq", "lw-unit-runs-changelog"])
def test_a_failed_delivery_fails_the_checkpoint_and_acks_nothing(worker, topic):
    # A verdict or dead letter not delivered, or a state the changelog did not take: the
    # checkpoint raises (the worker stops and redoes the work from the last committed offsets),
    # nothing is acked, and no later batch or checkpoint runs on top of it.
    from aiokafka.errors import KafkaTimeoutError

    lw, _faust, _verdicts = wired(worker, fail={topic: [KafkaTimeoutError()]})
    loop = asyncio.get_event_loop()
    acked = []
    batch = [gated_record(), gated_record("bad", 1, value=b"{not json")]
    loop.run_until_complete(lw._handle(batch, lambda: acked.append(True)))
    with pytest.raises(KafkaTimeoutError):
        loop.run_until_complete(lw.checkpoint())
    assert acked == [] and lw.failed is not None and not worker.health.is_ready()
    with pytest.raises(RuntimeError, match="restart the worker"):
        loop.run_until_complete(lw._handle([gated_record(offset=2)], lambda: acked.append(True)))
    loop.run_until_complete(lw.checkpoint())  # logs, writes nothing
    assert acked == []


def test_a_dead_letter_refused_as_too_large_goes_alone_then_as_headers(worker):
    from aiokafka.errors import MessageSizeTooLargeError

    lw, faust_producer, _ = wired(
        worker, fail={"tool-calls-dlq": [MessageSizeTooLargeError(), MessageSizeTooLargeError()]}
    )
    loop = asyncio.get_event_loop()
    acked = []
    big = gated_record("big", 0, value=b"x" * (3 * 1024 * 1024))
    loop.run_until_complete(lw._handle([big], lambda: acked.append(True)))
    loop.run_until_complete(lw.checkpoint())
    assert acked == [True] and lw.failed is None
    sends = [records for topic, _p, records in faust_producer.sent if topic == "tool-calls-dlq"]
    assert len(sends) == 3  # with the batch, alone, headers only
    ((key, value, headers),) = sends[0]
    assert len(value) == 1024 * 1024 and dict(headers)["loopwatch.truncated"] == b"value"
    assert len(sends[1][0][1]) == 1024 * 1024
    ((key, value, headers),) = sends[2]
    assert (key, value) == (b"", b"") and dict(headers)["loopwatch.source.value_bytes"] == str(3 * 1024 * 1024).encode()
    assert dict(headers)["loopwatch.reason"] == b"oversized"


def test_too_many_dirty_runs_make_the_batch_wait_for_a_checkpoint(worker, monkeypatch):
    import streams.app.checkpoint as app_module

    monkeypatch.setattr(app_module, "MAX_DIRTY_RUNS", 3)
    lw, faust_producer, _ = wired(worker)
    loop = asyncio.get_event_loop()
    acked = []
    loop.run_until_complete(lw._handle([gated_record("a"), gated_record("b", 1)], lambda: acked.append(1)))
    assert acked == [] and lw.runs.dirty == 2  # under the limit: acked by a later checkpoint
    waited = []
    real = lw.checkpoint

    async def checkpoint():
        waited.append(lw._batches_wait)
        await real()

    lw.checkpoint = checkpoint
    loop.run_until_complete(lw._handle([gated_record("c", 2)], lambda: acked.append(2)))
    assert waited == [True]  # the batch handler itself took the checkpoint, pauses off
    assert acked == [1, 2] and lw.runs.dirty == 0 and not lw._batches_wait
    changelog = [records for topic, _p, records in faust_producer.sent if topic.endswith("-changelog")]
    assert sorted(key for records in changelog for key, _value in records) == [b"run:a", b"run:b", b"run:c"]


def test_the_sweep_expires_idle_runs_except_on_partitions_with_a_backlog(worker, app, monkeypatch):
    from faust.types import TP

    from streams.app.run_store import pack_state
    from streams.engine import RunState

    wired(worker)
    store, expiry = worker.store, worker.expiry
    loop = asyncio.get_event_loop()
    changelog = store.changelog_topic
    long_ago = 1_000  # ms since the epoch: idle for decades
    writes = [((p, f"run:{p}".encode()), pack_state(RunState(run_id=str(p)), 0, long_ago)) for p in (0, 1, 2)]
    loop.run_until_complete(store.write(writes))
    monkeypatch.setattr(expiry, "ready", lambda: True)
    monkeypatch.setattr(app.assignor, "assigned_actives", lambda: {TP(changelog, p) for p in (0, 1, 2)})
    monkeypatch.setattr(expiry, "has_backlog", lambda partition: partition == 1)
    assert loop.run_until_complete(expiry.sweep()) == 2
    assert store.read(1, b"run:1") is not None  # events may wait for it: not expired
    assert store.read(0, b"run:0") is None and store.read(2, b"run:2") is None
    assert store.runs_tracked == 1


def test_the_sweep_deletes_old_markers_of_ended_runs_without_counting_them_as_runs(worker, app, monkeypatch):
    from faust.types import TP

    from streams.app.run_store import pack_ended, pack_state
    from streams.engine import RunState

    wired(worker)
    store, expiry = worker.store, worker.expiry
    loop = asyncio.get_event_loop()
    now_ms = int(time.time() * 1000)
    long_ago = 1_000
    writes = [
        ((0, b"run:old-end"), pack_ended(7, long_ago)),
        ((0, b"run:new-end"), pack_ended(8, now_ms)),
        ((0, b"run:live"), pack_state(RunState(run_id="live"), 9, now_ms)),
    ]
    loop.run_until_complete(store.write(writes))
    monkeypatch.setattr(expiry, "ready", lambda: True)
    monkeypatch.setattr(app.assignor, "assigned_actives", lambda: {TP(store.changelog_topic, 0)})
    monkeypatch.setattr(expiry, "has_backlog", lambda partition: False)
    assert loop.run_until_complete(expiry.sweep()) == 0  # no run expired: one marker swept
    assert store.read(0, b"run:old-end") is None
    assert store.read(0, b"run:new-end") is not None and store.read(0, b"run:live") is not None
    assert store.runs_tracked == 1  # the live run; a marker is not a run


def test_the_sweep_caps_the_runs_of_an_agent_deleting_its_longest_idle_runs_first(worker, app, monkeypatch):
    """Cap 3.  Agent busy holds 6 runs over partitions 0 and 1, idle since (ms ago) 60, 50,
    40, 30, 20, 10; the longest idle one was touched since the last checkpoint (active).  So
    the three longest idle of the others go (50, 40, 30 ms): busy keeps the active one and the
    two freshest.  Agent quiet's 2 runs, and a run without a known owner, stay."""
    from faust.types import TP

    from streams.app.live_runs import LiveRun
    from streams.app.run_store import pack_state
    from streams.engine import RunState

    wired(worker)
    store, expiry = worker.store, worker.expiry
    loop = asyncio.get_event_loop()
    now_ms = int(time.time() * 1000)
    busy = [((i % 2, f"run:busy-{i}".encode()), now_ms - 60 + 10 * i) for i in range(6)]
    writes = [(pk, pack_state(RunState(run_id=pk[1].decode()), 1, at, owner="busy")) for pk, at in busy]
    writes += [
        ((0, f"run:quiet-{i}".encode()), pack_state(RunState(run_id="q"), 1, now_ms - 1000, owner="quiet"))
        for i in range(2)
    ]
    writes.append(((1, b"run:nobody"), pack_state(RunState(run_id="n"), 1, now_ms - 1000)))
    loop.run_until_complete(store.write(writes))
    worker.processor.runs.touched[(0, b"run:busy-0")] = LiveRun(None, None, -1)
    expiry.max_runs_per_agent = 3
    monkeypatch.setattr(expiry, "ready", lambda: True)
    monkeypatch.setattr(app.assignor, "assigned_actives", lambda: {TP(store.changelog_topic, p) for p in (0, 1)})
    monkeypatch.setattr(expiry, "has_backlog", lambda partition: False)
    assert loop.run_until_complete(expiry.sweep()) == 0  # nothing idle for the 30 min timeout
    kept = {key for partition in (0, 1) for key, _value in store.items(store.partition_db(partition))}
    assert kept == {b"run:busy-0", b"run:busy-4", b"run:busy-5", b"run:quiet-0", b"run:quiet-1", b"run:nobody"}
    assert store.runs_tracked == 6
    assert worker.metrics.runs_evicted._value.get() == 3
    assert loop.run_until_complete(expiry.sweep()) == 0 and worker.metrics.runs_evicted._value.get() == 3


def test_a_partition_has_a_backlog_while_more_than_a_batch_is_unprocessed(worker, app, monkeypatch):
    from faust.types import TP

    lw = worker.expiry
    consumer = app.consumer
    tp = TP("tool-calls", 0)
    highwater = {tp: 50_000}
    monkeypatch.setattr(consumer, "highwater", lambda tp: highwater.get(tp))
    assert lw.has_backlog(0)  # nothing read or committed yet
    consumer._read_offset[tp] = 50_000 - worker.settings.max_batch
    assert not lw.has_backlog(0)
    consumer._read_offset[tp] = 50_000 - worker.settings.max_batch - 1
    assert lw.has_backlog(0)
    assert lw.has_backlog(3)  # never fetched: assume the worst


def test_a_revoked_partition_forgets_its_watermark(app):
    from faust.types import TP

    consumer = app.consumer
    tp = TP("tool-calls", 0)
    loop = asyncio.get_event_loop()
    consumer._open_batches = 1
    consumer._ack_batch([(tp, 9, 10)])
    assert consumer._new_offset(tp) == 10
    loop.run_until_complete(consumer.on_partitions_revoked({tp}))
    assert consumer._new_offset(tp) is None  # nothing to commit for a partition this worker lost
    # Assigned again, with the group's offset at 20 (another worker went on): an ack below it
    # must not move the commit back; one above it does.
    consumer._committed_offset[tp] = 20
    consumer._open_batches = 2
    consumer._ack_batch([(tp, 9, 10)])
    assert consumer._new_offset(tp) is None
    consumer._ack_batch([(tp, 25, 5)])
    assert consumer._new_offset(tp) == 26


def test_every_tables_changelog_is_created_before_the_worker_starts(tmp_path):
    """Faust declares a table's changelog as the table starts, a moment before the consumer
    subscribes; a group leader whose first metadata did not show it yet assigned none of its
    partitions and refused the table's writes (``PartitionsMismatch``: the changelog "has 0
    partitions"), so the limit of a worker killed was not restored.  Every table of the app
    (Faust's own registry) has its changelog in the topics ``ensure_topics`` creates at start,
    with the configs Faust would give it: compacted, deleted after the window's expiry where
    the table is windowed, and the run table's own record size."""
    import json

    from streams.app.app import build_worker

    config = tmp_path / "fleet.json"
    config.write_text(
        json.dumps(
            {
                "tools": {"loopDetection": {"enabled": True}},
                "loopwatch": {"fleetIncidents": {"enabled": True}, "agentRings": {"enabled": True}},
            }
        )
    )
    asyncio.set_event_loop(asyncio.new_event_loop())
    worker = build_worker(Settings(data_dir=tmp_path / "state", partitions=6, app_id="lw-unit", config=config))
    extra = worker.extra_topics()
    changelogs = {table.changelog_topic.get_topic_name() for table in worker.app.tables.values()}
    assert changelogs == {
        "lw-unit-runs-changelog",
        "lw-unit-fleet-outcomes-changelog",
        "lw-unit-fleet-incidents-changelog",
        "lw-unit-fleet-sources-changelog",
        "lw-unit-fleet-traces-changelog",
    }
    assert changelogs <= set(extra)
    assert extra["lw-unit-runs-changelog"] == {"cleanup.policy": "compact", "max.message.bytes": str(2 * 1024 * 1024)}
    assert extra["lw-unit-fleet-incidents-changelog"] == {"cleanup.policy": "compact"}
    # a minute's tools per agent, kept two windows (120 s)
    assert extra["lw-unit-fleet-sources-changelog"] == {"cleanup.policy": "compact,delete", "retention.ms": "120000"}
