"""The batch topics' records fetched in bulk (``streams.app.faust_adapter.bulk_getall``) are the
records aiokafka's own ``FetchResult.getall`` returns, call by call, with the same position
afterwards: checked against aiokafka itself on generated fetch responses (record batches with
compacted-away offsets, null keys and values, headers, control batches, a fetch offset inside
the first batch) and every sequence of ``max_records``."""

from __future__ import annotations

import pytest
from aiokafka.consumer.fetcher import FetchResult
from aiokafka.errors import CorruptRecordException
from aiokafka.structs import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.fetch import TOPIC, Assignment, fetch_result, record_batch
from streams.app import faust_adapter

TP = TopicPartition(TOPIC, 3)


@pytest.fixture(autouse=True)
def bulk():
    faust_adapter.fetch_in_bulk(frozenset({TOPIC}))
    yield
    assert FetchResult.getall is faust_adapter.bulk_getall


def fields(record) -> tuple:
    return (
        record.topic,
        record.partition,
        record.offset,
        record.timestamp,
        record.timestamp_type,
        record.key,
        record.value,
        record.checksum,
        record.serialized_key_size,
        record.serialized_value_size,
        tuple(record.headers),
    )


def drain(result: FetchResult, assignment: Assignment, limits: list[int | None], getall) -> list:
    """Each call's records and the position and has_more after it, until nothing is left."""
    calls = []
    for limit in limits + [None]:
        got = getall(result, limit)
        calls.append(([fields(r) for r in got], assignment.state.position, result.has_more()))
        if not result.has_more():
            break
    return calls


values = st.one_of(st.none(), st.binary(max_size=40))
headers = st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=8)), max_size=2)
batches = st.lists(
    st.tuples(
        st.lists(
            st.tuples(st.integers(1, 3), values, values, headers), min_size=1, max_size=12
        ),  # (gap, key, value, headers)
        st.booleans(),  # a control batch (transaction marker)
        st.integers(0, 2),  # offsets compacted away after the batch's last record
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(batches=batches, skip=st.integers(0, 5), limits=st.lists(st.one_of(st.none(), st.integers(1, 15)), max_size=8))
def test_bulk_getall_returns_what_aiokafka_returns(batches, skip, limits):
    data = b""
    base = 100
    for records, control, tail in batches:
        relative, laid = -1, []
        for gap, key, value, hdrs in records:
            relative += gap
            laid.append((relative, key, value, hdrs))
        data += record_batch(base, laid, control=control and len(laid) == 1, tail=tail)
        base += relative + tail + 1 + 2  # the next batch starts after a gap too
    fetch_offset = 100 + skip  # a fetch can start inside the first batch
    theirs = drain(*fetch_result(data, fetch_offset), limits, faust_adapter.aiokafka_getall)
    ours = drain(*fetch_result(data, fetch_offset), limits, faust_adapter.bulk_getall)
    assert ours == theirs


def test_a_hand_worked_fetch():
    data = (
        record_batch(10, [(0, b"k0", b"v0", []), (2, None, b"v2", [("h", b"1")])])
        + record_batch(20, [(0, b"marker", None, [])], control=True)
        + record_batch(30, [(0, b"k30", None, [])])
    )
    result, assignment = fetch_result(data, 11)
    got = faust_adapter.bulk_getall(result, 1)
    # Offset 10 is before the fetch offset; offset 11 was compacted away.
    assert [(r.offset, r.key, r.value, r.headers, r.serialized_key_size) for r in got] == [
        (12, None, b"v2", (("h", b"1"),), -1)
    ]
    assert type(got[0]) is faust_adapter.FetchedRecord
    assert assignment.state.position == 13 and result.has_more()
    got = faust_adapter.bulk_getall(result, 5)
    # The control batch is skipped; the last batch ends the fetch.
    assert [(r.offset, r.key, r.value, r.serialized_value_size) for r in got] == [(30, b"k30", None, -1)]
    assert assignment.state.position == 31 and not result.has_more()


def test_a_corrupt_batch_raises_as_aiokafka_does():
    data = bytearray(record_batch(0, [(0, b"k", b"value", [])]))
    data[-3] ^= 0xFF  # inside the record's value
    for getall in (faust_adapter.aiokafka_getall, faust_adapter.bulk_getall):
        result, _ = fetch_result(bytes(data), 0)
        with pytest.raises(CorruptRecordException):
            getall(result, None)


def test_other_topics_keep_aiokafkas_records():
    result, _ = fetch_result(record_batch(0, [(0, b"k", b"v", [])]), 0, topic="lw-runs-changelog")
    (record,) = faust_adapter.bulk_getall(result, None)
    assert type(record) is not faust_adapter.FetchedRecord and type(record).__name__ == "ConsumerRecord"


def test_a_fetch_cut_at_a_batch_end_moves_past_its_compacted_tail_on_the_next_call():
    # Offsets 50-51 are records, 52-53 were compacted away: the batch ends at 54.
    data = record_batch(50, [(0, b"a", b"1", []), (1, b"b", b"2", [])], tail=2)
    for getall in (faust_adapter.aiokafka_getall, faust_adapter.bulk_getall):
        result, assignment = fetch_result(data, 50)
        assert [r.offset for r in getall(result, 2)] == [50, 51]
        assert (assignment.state.position, result.has_more()) == (52, True)
        assert getall(result, 2) == []
        assert (assignment.state.position, result.has_more()) == (54, False)


def test_fetched_records_are_freed_without_the_cyclic_gc():
    # aiokafka's PartitionRecords and its generator refer to each other until the generator
    # is exhausted; a fetch response left in that cycle waits for a GC collection, which
    # then traverses every such response since the last one (tens of ms at a few thousand
    # fetches a second).
    import gc
    import weakref

    data = record_batch(0, [(0, b"k", b"v", []), (1, b"k", b"w", [])])
    gc.disable()
    try:
        for calls in ([None], [1, None]):
            result, _ = fetch_result(data, 0)
            records = weakref.ref(result._partition_records)
            for limit in calls:
                faust_adapter.bulk_getall(result, limit)
            assert not result.has_more()
            del result
            assert records() is None
    finally:
        gc.enable()
