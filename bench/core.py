"""``make bench-core``: the detection engine alone on a generated fleet trace.

Generates (outside the timed region) at least 1,000,000 ``tool-calls`` events over 10,000
interleaved runs with a realistic mix of healthy runs and every kind of loop, as an
obedient runner would publish them (blocked calls complete as vetoes, aborted runs end),
then times ``LoopEngine.handle`` over them on one core and reports events/s, the peak RSS
and the serialised state size per active run.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import resource
import statistics
import sys
import time

from schemas.events import encode_event, decode_event
from streams.engine import LoopEngine, encode_state, state_key
from streams.scenarios import FLEET_MIX, fleet_trace

MIX = FLEET_MIX
CONFIG = {"tools": {"loopDetection": {"enabled": True}}}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build_trace(runs: int, calls_per_run: int, seed: int) -> tuple[list, dict[str, str]]:
    return fleet_trace(runs, calls_per_run, seed=seed, engine=LoopEngine(CONFIG))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--calls-per-run", type=int, default=52)
    parser.add_argument("--repeat", type=int, default=5, help="timed passes (best and median are reported)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    t0 = time.perf_counter()
    events, kind_of = build_trace(args.runs, args.calls_per_run, args.seed)
    print(f"generated {len(events):,} events over {args.runs:,} interleaved runs in {time.perf_counter() - t0:.1f} s "
          f"(peak RSS so far {peak_rss_mib():.0f} MiB)")
    keys = [state_key(e) for e in events]
    # The trace is input, not engine state: keep the cyclic GC from rescanning its million
    # objects during the timed passes (the worker never holds a trace in memory).
    gc.collect()
    gc.freeze()

    rates = []
    states: dict = {}
    for attempt in range(args.repeat):
        engine = LoopEngine(CONFIG)
        states = {}
        handle = engine.handle
        get = states.get
        start = time.perf_counter()
        for key, event in zip(keys, events):
            step = handle(get(key), event, validated=True)
            if step.state is None:
                states.pop(key, None)
            else:
                states[key] = step.state
        elapsed = time.perf_counter() - start
        rates.append(len(events) / elapsed)
        print(f"  pass {attempt + 1}: {len(events):,} events in {elapsed:.2f} s = {rates[-1]:,.0f} events/s")

    # The same with wire decoding (bytes -> validated event) included, as the worker does.
    sample = events[:200_000]
    wire = [encode_event(e) for e in sample]
    engine = LoopEngine(CONFIG)
    st: dict = {}
    start = time.perf_counter()
    for raw in wire:
        event = decode_event(raw)
        key = state_key(event)
        step = engine.handle(st.get(key), event, validated=True)
        st[key] = step.state
    decode_rate = len(wire) / (time.perf_counter() - start)

    sizes = {key: len(encode_state(state)) for key, state in states.items()}
    by_kind: dict[str, list[int]] = {}
    for key, size in sizes.items():
        by_kind.setdefault(kind_of.get(key, "?"), []).append(size)
    mean_size = statistics.fmean(sizes.values())
    print()
    print(f"engine alone:            best {max(rates):,.0f} events/s, median {statistics.median(rates):,.0f} events/s (one core)")
    print(f"with JSON decoding:      {decode_rate:,.0f} events/s (first 200,000 events)")
    print(f"active runs at the end:  {len(states):,} (history full at the default historySize 30)")
    print(f"state per active run:    mean {mean_size:,.0f} B, max {max(sizes.values()):,} B (msgpack, as stored in the table)")
    for kind in MIX:
        if kind in by_kind:
            print(f"    {kind:16} {statistics.fmean(by_kind[kind]):7,.0f} B mean over {len(by_kind[kind]):,} runs")
    print(f"peak RSS:                {peak_rss_mib():,.0f} MiB (includes the pre-generated trace held in memory)")
    target_rate, target_size = 200_000, 2048
    print(f"targets: >= {target_rate:,} events/s -> {'met' if max(rates) >= target_rate else 'NOT met'}; "
          f"< {target_size} B state per run -> {'met' if mean_size < target_size else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
