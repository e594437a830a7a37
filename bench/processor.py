"""The worker's per-event work without Kafka: CPU time of the batch processor on the bench workload.

``make bench``'s (b) swings with the machine's neighbours and the broker's share of the two
cores; this measures only what loopwatch's own code costs per event, on the same workload
as (b) (``bench.kafka.fleet``): each batch as the worker handles one (``Checkpointer._handle``:
``BatchProcessor.process`` with its decoding, checks, engine and verdict encoding, the
decision-latency histogram, the buffered log lines flushed), and a checkpoint's state
encoding every ``--checkpoint-every`` records, with the worker's logging (info, to
/dev/null), metrics and GC thresholds.  Kafka's fetch and produce are left out.

    python -m bench.processor [--events 200000] [--runs 2000] [--batch 2000] [--passes 3] [--signed plain|seq]

``--signed``: every record signed with its agent's key and the processor given the keyring
(the freshness checks run); ``seq``: the events numbered as the clients number them.

It prints one line per pass: events/s and µs of CPU (``time.process_time``) per event.
To compare builds, copy this file into a checkout of each and run it there, alternating
(docs/benchmarks.md, session 7).
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import time
import zlib

import msgspec

from schemas import encode_event
from schemas.keys import record_key
from schemas.signing import Keyring, SigningKey
from streams.app import logs
from streams.app.metrics import Metrics
from streams.app.processor import BatchProcessor
from streams.app.records import Record
from streams.engine import engine_for
from streams.offline.scenarios import FLEET_MIX, fleet_trace

CONFIG = {"tools": {"loopDetection": {"enabled": True}}}
PARTITIONS = 4


def workload(n_events: int, runs: int, signed: str | None = None) -> tuple[list[Record], Keyring | None]:
    """About ``n_events`` records of ``runs`` interleaved runs, as (b) drains them; ``signed``
    (``plain``, ``seq``): signed by their agents' keys (the keyring), numbered with ``seq``."""
    calls = max(2, n_events // (2 * runs))
    events, _ = fleet_trace(
        runs,
        calls,
        seed=7,
        mix=FLEET_MIX,
        run_prefix="bench-7",
        gate=True,
        start_ms=int(time.time() * 1000),
        end=True,
        engine=engine_for(CONFIG),
    )
    keys = {}
    if signed:
        for agent in sorted({e.agent_id or "" for e in events}):
            keys[agent] = SigningKey(f"bench-{len(keys)}", agent, zlib.crc32(agent.encode()).to_bytes(4) * 8)
    records = []
    first_seq = int(time.time() * 1_000_000)
    for offset, event in enumerate(events):
        key = record_key(event).encode("utf-8", "surrogatepass")
        if signed == "seq":
            event = msgspec.structs.replace(event, seq=first_seq + offset)
        value = encode_event(event)
        if signed:
            headers = keys[event.agent_id or ""].headers(value)
            at = event.ts_ms
        else:
            headers, at = None, time.time()
        records.append(Record("tool-calls", zlib.crc32(key) % PARTITIONS, offset, key, value, at, headers))
    return records, Keyring(list(keys.values())) if signed else None


def one_pass(records: list[Record], batch: int, checkpoint_every: int, keyring: Keyring | None = None) -> float:
    """CPU seconds to run ``records`` through a fresh processor."""
    processor = BatchProcessor(engine_for(CONFIG), Metrics(process_metrics=False), keyring=keyring)
    runs = processor.runs
    store: dict = {}
    read = lambda partition, key: store.get((partition, key))  # noqa: E731

    def checkpoint() -> None:
        runs.begin_checkpoint()
        while not runs.encode_some(None):
            pass
        cp = runs.end_checkpoint()
        for pk, value in cp.writes.items():
            if value is None:
                store.pop(pk, None)
            else:
                store[pk] = value
        runs.checkpoint_written()

    since = 0
    start = time.process_time()
    for i in range(0, len(records), batch):
        result = processor.process(records[i : i + batch], read)
        if result.verdicts:
            processor.observe_latency(result.verdicts)
        logs.flush()
        since += batch
        if since >= checkpoint_every:
            checkpoint()
            since = 0
    checkpoint()
    return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.processor", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--runs", type=int, default=2_000)
    p.add_argument("--batch", type=int, default=2_000, help="records per batch")
    p.add_argument("--checkpoint-every", type=int, default=50_000, help="records between two checkpoints")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--signed", choices=("plain", "seq"), help="signed records (seq: numbered too)")
    args = p.parse_args(argv)
    if min(args.events, args.runs, args.batch, args.checkpoint_every, args.passes) < 1:
        print(
            "bench.processor: --events, --runs, --batch, --checkpoint-every and --passes must be at least 1",
            file=sys.stderr,
        )
        return 1
    logs.configure("/dev/null")
    logging.getLogger("loopwatch").setLevel(logging.INFO)
    try:  # the worker's GC thresholds, where this build has them
        from streams.app.gc_policy import GC_THRESHOLDS
    except ImportError:
        GC_THRESHOLDS = None
    records, keyring = workload(args.events, args.runs, args.signed)
    # The worker frees each batch's records once it is done; here they all stay alive.  Out of
    # the cyclic GC's sight (as the worker's start-up objects are, gc.freeze in streams.app.app)
    # they cost no collection time the worker does not pay.
    gc.collect()
    gc.freeze()
    print(
        f"{len(records):,} records, batches of {args.batch:,}, GC thresholds {GC_THRESHOLDS or gc.get_threshold()}",
        flush=True,
    )
    if GC_THRESHOLDS:
        gc.set_threshold(*GC_THRESHOLDS)
    for n in range(1, args.passes + 1):
        cpu = one_pass(records, args.batch, args.checkpoint_every, keyring)
        print(f"pass {n}: {len(records) / cpu:,.0f} events/s, {cpu / len(records) * 1e6:.2f} µs CPU/event", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
