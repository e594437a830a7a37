"""The consumer's cost per record: aiokafka's ``FetchResult.getall`` against the adapter's
``bulk_getall`` (``streams.app.faust_adapter``), on the same fetch response, without a broker.

    python -m bench.fetch [--records 20000] [--value-bytes 477] [--passes 8]

Each pass builds a fetch response of v2 record batches (500 records each, the size of a
bench event's value), then drains it both ways in turn (alternating, as ``docs/benchmarks.md``
asks), ``--max-records`` at a time as the worker asks for them, and prints the CPU time
(``time.process_time``) per record of each: the medians and every pass.  Under ``valgrind
--tool=cachegrind`` with ``--only aiokafka`` or ``--only bulk`` it counts instructions instead.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from aiokafka.consumer.fetcher import FetchResult, PartitionRecords
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import TopicPartition

from streams.app import faust_adapter

TOPIC = "tool-calls"
ATTRIBUTES = 21
"""Where a v2 record batch's attributes start; its CRC covers from there on."""
LAST_OFFSET_DELTA = 23
CONTROL = 0x20


def record_batch(
    base: int, records: list[tuple[int, bytes | None, bytes | None, list]], control: bool = False, tail: int = 0
) -> bytes:
    """A v2 record batch at offset ``base`` of ``(relative offset, key, value, headers)``
    records, as a broker sends it; gaps in the relative offsets, and ``tail`` offsets after
    the last record, are records a compaction removed; ``control``: a transaction marker."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for relative, key, value, headers in records:
        if (
            builder.append(relative, timestamp=1_700_000_000_000 + relative, key=key, value=value, headers=headers)
            is None
        ):
            raise ValueError("a record batch holds at most 1 MiB here")
    data = bytearray(builder.build())
    data[0:8] = base.to_bytes(8, "big")  # the broker sets a batch's base offset
    if control:
        data[ATTRIBUTES + 1] |= CONTROL
    if tail:
        last_delta = int.from_bytes(data[LAST_OFFSET_DELTA : LAST_OFFSET_DELTA + 4], "big")
        data[LAST_OFFSET_DELTA : LAST_OFFSET_DELTA + 4] = (last_delta + tail).to_bytes(4, "big")
    data[17:21] = calc_crc32c(bytes(data[ATTRIBUTES:])).to_bytes(4, "big")
    return bytes(data)


class PartitionState:
    """What ``FetchResult`` reads and moves of aiokafka's subscription state."""

    def __init__(self, position: int) -> None:
        self.position = position
        self.paused = False

    def consumed_to(self, position: int) -> None:
        self.position = position


class Assignment:
    """One partition's place in aiokafka's assignment (``FetchResult``'s view of it)."""

    active = True

    def __init__(self, position: int) -> None:
        self.state = PartitionState(position)

    def state_value(self, tp: TopicPartition) -> PartitionState:
        return self.state


def fetch_result(
    data: bytes, fetch_offset: int, topic: str = TOPIC, partition: int = 3
) -> tuple[FetchResult, Assignment]:
    """A partition's part of a fetch response, as aiokafka's fetcher builds it."""
    tp = TopicPartition(topic, partition)
    assignment = Assignment(fetch_offset)
    records = PartitionRecords(tp, MemoryRecords(data), [], fetch_offset, None, None, True, 0)
    return FetchResult(tp, assignment=assignment, partition_records=records, backoff=0), assignment


def response(n_records: int, value_bytes: int) -> bytes:
    value = b"x" * value_bytes
    batches = []
    for base in range(0, n_records, 500):
        batches.append(
            record_batch(base, [(i, f"run-{base + i}".encode(), value, []) for i in range(min(500, n_records - base))])
        )
    return b"".join(batches)


def drain(data: bytes, getall, max_records: int) -> tuple[float, int]:
    result, _ = fetch_result(data, 0)
    start = time.process_time()
    n = 0
    while result.has_more():
        n += len(getall(result, max_records))
    return time.process_time() - start, n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.fetch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument("--value-bytes", type=int, default=477)
    p.add_argument("--max-records", type=int, default=20_000, help="records asked for per call (LOOPWATCH_MAX_BATCH)")
    p.add_argument("--passes", type=int, default=8)
    p.add_argument("--only", choices=("aiokafka", "bulk"), help="drain once, one way only (for valgrind)")
    args = p.parse_args(argv)
    if min(args.records, args.value_bytes, args.max_records, args.passes) < 1:
        print("bench.fetch: --records, --value-bytes, --max-records and --passes must be at least 1", file=sys.stderr)
        return 1
    faust_adapter.fetch_in_bulk(frozenset({TOPIC}))
    ways = {"aiokafka": faust_adapter.aiokafka_getall, "bulk": faust_adapter.bulk_getall}
    data = response(args.records, args.value_bytes)
    if args.only:
        drain(data, ways[args.only], args.max_records)
        return 0
    per_record: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(args.passes):
        for way, getall in ways.items():
            cpu, n = drain(data, getall, args.max_records)
            if n != args.records:
                print(f"bench.fetch: {way} returned {n:,} records of {args.records:,}", file=sys.stderr)
                return 1
            per_record[way].append(cpu / n * 1e6)
    for way, values in per_record.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"{way:>8}: median {statistics.median(values):.2f} µs CPU/record ({shown})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
