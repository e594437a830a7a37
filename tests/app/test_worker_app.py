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
