"""``make bench-core``: the detection engine alone on a generated fleet trace.

Generates (outside the timed region) at least 1,000,000 ``tool-calls`` events over 10,000
interleaved runs with a realistic mix of healthy runs and every kind of loop, as an
obedient runner would publish them (blocked calls complete as vetoes, aborted runs end),
then times ``LoopEngine.handle`` over them on one core and reports events/s, the peak RSS
and the serialised state size per active run.

``--profile both`` (the default) times configurable-final and latest on the same trace in
the same process: each pass feeds both engines the trace in chunks of ``--chunk`` events,
alternating which goes first (A B, then B A, …), and adds up each one's CPU time, so that a
noisy neighbour on the shared machine hits both alike; latest's rate is reported as a share
of configurable-final's (the median over the passes).  A single ``--profile`` times whole
passes in wall time, as the figures of earlier sessions were.
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

from schemas.events import decode_event, encode_event
from streams.engine import RunDriver, encode_state, engine_for, state_key
from streams.offline.scenarios import FLEET_MIX, fleet_trace

MIX = FLEET_MIX
PROFILES = ("configurable-final", "latest")
TARGET_RATE, TARGET_SIZE, TARGET_SHARE = 200_000, 2048, 0.8


def config_for(profile: str) -> dict:
    return {"tools": {"loopDetection": {"enabled": True}}, "loopwatch": {"profile": profile}}


CONFIG = config_for("configurable-final")


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def steal_jiffies() -> int | None:
    """The machine's CPU steal so far (/proc/stat), to say how noisy a run was."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()
        return int(fields[8])
    except (OSError, IndexError, ValueError):
        return None


def build_trace(runs: int, calls_per_run: int, seed: int) -> tuple[list, dict[str, str]]:
    # The obedient runners follow configurable-final's verdicts; both profiles then see the
    # very same events.
    return fleet_trace(runs, calls_per_run, seed=seed, engine=engine_for(CONFIG))


def timed_pass(events: list, keys: list, profile: str) -> tuple[float, dict]:
    """One pass of one profile over the whole trace: wall seconds, and the final states."""
    runs = RunDriver(engine_for(config_for(profile)))
    start = time.perf_counter()
    runs.apply(events, keys, validated=True)
    return time.perf_counter() - start, runs.states


def interleaved_pass(events: list, keys: list, chunk: int, first: int) -> tuple[dict[str, float], dict[str, dict]]:
    """One pass of both profiles, chunk by chunk, alternating which goes first: CPU seconds
    and final states per profile."""
    runs = {p: RunDriver(engine_for(config_for(p))) for p in PROFILES}
    cpu = dict.fromkeys(PROFILES, 0.0)
    clock = time.process_time
    for n, start in enumerate(range(0, len(events), chunk)):
        part_keys, part_events = keys[start : start + chunk], events[start : start + chunk]
        order = PROFILES if (n + first) % 2 == 0 else PROFILES[::-1]
        for profile in order:
            began = clock()
            runs[profile].apply(part_events, part_keys, validated=True)
            cpu[profile] += clock() - began
    return cpu, {p: runs[p].states for p in PROFILES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--calls-per-run", type=int, default=52)
    parser.add_argument("--repeat", type=int, default=5, help="timed passes per profile (best and median are reported)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--profile",
        choices=(*PROFILES, "both"),
        default="both",
        help="the profile(s) to time; both alternate on the same trace (default)",
    )
    parser.add_argument(
        "--chunk",
        type=int,
        default=20_000,
        help="with --profile both: events per chunk of the alternation (default 20,000)",
    )
    args = parser.parse_args(argv)
    profiles = PROFILES if args.profile == "both" else (args.profile,)

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print(f"start: {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC")
    t0 = time.perf_counter()
    events, kind_of = build_trace(args.runs, args.calls_per_run, args.seed)
    print(
        f"generated {len(events):,} events over {args.runs:,} interleaved runs in {time.perf_counter() - t0:.1f} s "
        f"(peak RSS so far {peak_rss_mib():.0f} MiB)"
    )
    keys = [state_key(e) for e in events]
    # The trace is input, not engine state: keep the cyclic GC from rescanning its million
    # objects during the timed passes (the worker never holds a trace in memory).
    gc.collect()
    gc.freeze()

    rates: dict[str, list[float]] = {p: [] for p in profiles}
    final_states: dict[str, dict] = {}
    steal_before = steal_jiffies()
    for attempt in range(args.repeat):
        if len(profiles) == 2:
            cpu, final_states = interleaved_pass(events, keys, args.chunk, attempt)
            for profile in profiles:
                rates[profile].append(len(events) / cpu[profile])
            print(
                f"  pass {attempt + 1}: "
                + ", ".join(
                    f"{p} {len(events):,} events in {cpu[p]:.2f} s CPU = {rates[p][-1]:,.0f} events/s" for p in profiles
                )
            )
        else:
            (profile,) = profiles
            elapsed, final_states[profile] = timed_pass(events, keys, profile)
            rates[profile].append(len(events) / elapsed)
            print(
                f"  pass {attempt + 1} {profile}: {len(events):,} events in {elapsed:.2f} s = {rates[profile][-1]:,.0f} events/s"
            )
    steal_after = steal_jiffies()

    # The same with wire decoding (bytes -> validated event) included, as the worker does.
    sample = events[:200_000]
    wire = [encode_event(e) for e in sample]
    runs = RunDriver(engine_for(config_for(profiles[0])))
    start = time.perf_counter()
    for raw in wire:
        runs.handle(decode_event(raw), validated=True)
    decode_rate = len(wire) / (time.perf_counter() - start)

    print()
    verdicts = []
    for profile in profiles:
        best, median = max(rates[profile]), statistics.median(rates[profile])
        sizes = {key: len(encode_state(state)) for key, state in final_states[profile].items()}
        mean_size = statistics.fmean(sizes.values())
        print(f"[{profile}]")
        clock = "CPU time, interleaved" if len(profiles) == 2 else "wall time"
        print(f"engine alone:            best {best:,.0f} events/s, median {median:,.0f} events/s (one core, {clock})")
        print(f"active runs at the end:  {len(sizes):,} (history full at historySize 30)")
        print(
            f"state per active run:    mean {mean_size:,.0f} B, max {max(sizes.values()):,} B (msgpack, as stored in the table)"
        )
        by_kind: dict[str, list[int]] = {}
        for key, size in sizes.items():
            by_kind.setdefault(kind_of.get(key, "?"), []).append(size)
        for kind in MIX:
            if kind in by_kind:
                print(f"    {kind:16} {statistics.fmean(by_kind[kind]):7,.0f} B mean over {len(by_kind[kind]):,} runs")
        print()
        if profile == "configurable-final":
            verdicts.append(f">= {TARGET_RATE:,} events/s -> {'met' if best >= TARGET_RATE else 'NOT met'}")
        verdicts.append(
            f"{profile} < {TARGET_SIZE} B state per run -> {'met' if mean_size < TARGET_SIZE else 'NOT met'}"
        )
    print(f"with JSON decoding:      {decode_rate:,.0f} events/s ({profiles[0]}, first 200,000 events)")
    if len(profiles) == 2:
        # Each pass's latest against the configurable-final of the same pass.
        shares = [b / a for a, b in zip(rates[PROFILES[0]], rates[PROFILES[1]])]
        # (CPU time, chunks of both in turn: see the module docstring.)
        share = statistics.median(shares)
        print(
            f"latest / configurable-final: median of the passes {share:.2f} "
            f"(passes {', '.join(f'{s:.2f}' for s in shares)}; best against best "
            f"{max(rates[PROFILES[1]]) / max(rates[PROFILES[0]]):.2f})"
        )
        verdicts.append(
            f"latest >= {TARGET_SHARE} x configurable-final -> {'met' if share >= TARGET_SHARE else 'NOT met'}"
        )
    if steal_before is not None and steal_after is not None:
        print(f"CPU steal during the timed passes: {steal_after - steal_before} jiffies (/proc/stat)")
    print(f"peak RSS:                {peak_rss_mib():,.0f} MiB (includes the pre-generated trace held in memory)")
    print(f"end: {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC")
    print("targets: " + "; ".join(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
