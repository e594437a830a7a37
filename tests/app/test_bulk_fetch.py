"""The batch topics' records fetched in bulk (``streams.faust_adapter.bulk_getall``) are the
records aiokafka's own ``FetchResult.getall`` returns, call by call, with the same position
afterwards: checked against aiokafka itself on generated fetch responses (record batches with
compacted-away offsets, null keys and values, headers, control batches, a fetch offset inside
the first batch) and every sequence of ``max_records``."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from aiokafka.consumer.fetcher import FetchResult, PartitionRecords
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from streams import faust_adapter

TOPIC = "tool-calls"
TP = TopicPartition(TOPIC, 3)
ATTRIBUTES = 21  # where a v2 record batch's attributes start; its CRC covers from there on
CONTROL = 0x20
LAST_OFFSET_DELTA = 23


def record_batch(base: int, records: list[tuple[int, bytes | None, bytes | None, list]], control: bool = False,
                 tail: int = 0) -> bytes:
    """A v2 record batch at ``base`` of ``(relative offset, key, value, headers)`` records;
    gaps in the relative offsets, and ``tail`` offsets after the last record, are records a
    compaction removed."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for relative, key, value, headers in records:
        assert builder.append(relative, timestamp=1_700_000_000_000 + relative, key=key, value=value,
                              headers=headers) is not None
    data = bytearray(builder.build())
    data[0:8] = base.to_bytes(8, "big")  # the broker sets a batch's base offset
    if control:
        data[ATTRIBUTES + 1] |= CONTROL
    if tail:
        last_delta = int.from_bytes(data[LAST_OFFSET_DELTA:LAST_OFFSET_DELTA + 4], "big")
        data[LAST_OFFSET_DELTA:LAST_OFFSET_DELTA + 4] = (last_delta + tail).to_bytes(4, "big")
    data[17:21] = calc_crc32c(bytes(data[ATTRIBUTES:])).to_bytes(4, "big")
    return bytes(data)


@dataclass
class PartitionState:
    position: int
    paused: bool = False

    def consumed_to(self, position: int) -> None:
        self.position = position


class Assignment:
    """What FetchResult reads of aiokafka's subscription state: one partition's position."""

    active = True

    def __init__(self, position: int) -> None:
        self.state = PartitionState(position)

    def state_value(self, tp):
        return self.state


def fetch_result(data: bytes, fetch_offset: int, topic: str = TOPIC) -> tuple[FetchResult, Assignment]:
    tp = TopicPartition(topic, TP.partition)
    assignment = Assignment(fetch_offset)
    records = PartitionRecords(tp, MemoryRecords(data), [], fetch_offset, None, None, True, 0)
    return FetchResult(tp, assignment=assignment, partition_records=records, backoff=0), assignment


@pytest.fixture(autouse=True)
def bulk():
    faust_adapter.fetch_in_bulk(frozenset({TOPIC}))
    yield
    assert FetchResult.getall is faust_adapter.bulk_getall


def aiokafka_getall(result: FetchResult, max_records: int | None):
    return faust_adapter._aiokafka.getall(result, max_records)


def fields(record) -> tuple:
    return (record.topic, record.partition, record.offset, record.timestamp, record.timestamp_type, record.key,
            record.value, record.checksum, record.serialized_key_size, record.serialized_value_size,
            tuple(record.headers))


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
        st.lists(st.tuples(st.integers(1, 3), values, values, headers), min_size=1, max_size=12),  # (gap, key, value, headers)
        st.booleans(),  # a control batch (transaction marker)
        st.integers(0, 2),  # offsets compacted away after the batch's last record
    ),
    min_size=1, max_size=5,
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
    theirs = drain(*fetch_result(data, fetch_offset), limits, aiokafka_getall)
    ours = drain(*fetch_result(data, fetch_offset), limits, faust_adapter.bulk_getall)
    assert ours == theirs


def test_a_hand_worked_fetch():
    data = (record_batch(10, [(0, b"k0", b"v0", []), (2, None, b"v2", [("h", b"1")])])
            + record_batch(20, [(0, b"marker", None, [])], control=True)
            + record_batch(30, [(0, b"k30", None, [])]))
    result, assignment = fetch_result(data, 11)
    got = faust_adapter.bulk_getall(result, 1)
    # Offset 10 is before the fetch offset; offset 11 was compacted away.
    assert [(r.offset, r.key, r.value, r.headers, r.serialized_key_size) for r in got] == [(12, None, b"v2", (("h", b"1"),), -1)]
    assert type(got[0]) is faust_adapter.FetchedRecord
    assert assignment.state.position == 13 and result.has_more()
    got = faust_adapter.bulk_getall(result, 5)
    # The control batch is skipped; the last batch ends the fetch.
    assert [(r.offset, r.key, r.value, r.serialized_value_size) for r in got] == [(30, b"k30", None, -1)]
    assert assignment.state.position == 31 and not result.has_more()


def test_a_corrupt_batch_raises_as_aiokafka_does():
    data = bytearray(record_batch(0, [(0, b"k", b"value", [])]))
    data[-3] ^= 0xFF  # inside the record's value
    for getall in (aiokafka_getall, faust_adapter.bulk_getall):
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
    for getall in (aiokafka_getall, faust_adapter.bulk_getall):
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
