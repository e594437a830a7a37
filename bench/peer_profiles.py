"""``make bench-core``, second part: the peer profiles (issue 29) alone, on their golden traces.

The sessions of ``tests/data/conformance/openhands`` and ``gemini-cli`` are turned into the
events a runner publishes (``streams.conformance.peers``), copied under ``--copies`` run ids
each and interleaved round-robin (outside the timed region), then ``LoopEngine.handle`` is
timed over them on one core: events/s, and the serialised state per run at the end (as the
run table stores it).  The sessions are loop-heavy (most end in a stop), so this is the
profiles' busy case, not a healthy fleet's.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import msgspec

from streams.conformance import peers
from streams.conformance.traces import open_jsonl
from streams.engine import LoopEngine, RunDriver, encode_state, state_key

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "conformance"
TRACES = {"openhands": (DATA / "openhands", peers.openhands_events), "gemini-cli": (DATA / "gemini-cli", peers.gemini_events)}


def trace(profile: str, copies: int) -> list:
    folder, events_of = TRACES[profile]
    runs = []
    for copy in range(copies):
        for session in open_jsonl(folder / "sessions.jsonl.gz"):
            events = list(events_of(session))
            runs.append([msgspec.structs.replace(e, run_id=f"{e.run_id}/{copy}") for e in events])
    out, live = [], [iter(r) for r in runs]
    while live:  # round-robin: every run interleaved with the others
        nxt = []
        for it in live:
            e = next(it, None)
            if e is not None:
                out.append(e)
                nxt.append(it)
        live = nxt
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--copies", type=int, default=20, help="copies of each golden session (default 20)")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    print(f"peer profiles, start: {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC")
    for profile in TRACES:
        events = trace(profile, args.copies)
        keys = [state_key(e) for e in events]
        gc.collect()
        gc.freeze()
        rates, states = [], {}
        for _ in range(args.repeat):
            driver = RunDriver(LoopEngine({"loopwatch": {"profile": profile}}))
            began = time.process_time()
            driver.apply(events, keys, validated=True)
            rates.append(len(events) / (time.process_time() - began))
            states = driver.states
        sizes = [len(encode_state(s)) for s in states.values()]
        print(f"[{profile}] {len(events):,} events over {len(states):,} runs: best {max(rates):,.0f} events/s, "
              f"median {statistics.median(rates):,.0f} events/s (one core, CPU time); state per run mean "
              f"{statistics.fmean(sizes):,.0f} B, max {max(sizes):,} B")
        gc.unfreeze()
    print(f"end: {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC")
    return 0


if __name__ == "__main__":
    sys.exit(main())
