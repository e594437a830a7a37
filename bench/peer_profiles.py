"""``make bench-core``, second part: the peer profiles (issue 29) alone, on their golden traces.

The sessions of ``tests/data/conformance/openhands``, ``gemini-cli`` and ``gemini-cli-content``
(Gemini's content loop detector, on ``model.text`` events) are turned into the
events a runner publishes (``streams.conformance.peers``), copied under ``--copies`` run ids
each and interleaved round-robin (outside the timed region), then ``LoopEngine.handle`` is
timed over them on one core: events/s, and the serialised state per run at the end (as the
run table stores it).  The sessions are loop-heavy (most end in a stop), so this is the
profiles' busy case, not a healthy fleet's.  The content edge (the runner's hashing) is timed
on its own first.
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
from streams.edge.content_windows import ContentEdge, utf16_length
from streams.engine import RunDriver, encode_state, engine_for, state_key

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "conformance"
TRACES = {
    "openhands": (DATA / "openhands", peers.openhands_events, "openhands"),
    "gemini-cli": (DATA / "gemini-cli", peers.gemini_events, "gemini-cli"),
    # Gemini's content loop detector: model.text events, hashed by the edge outside the timed region
    "gemini-cli content": (DATA / "gemini-cli-content", peers.gemini_events, "gemini-cli"),
}


def trace(name: str, copies: int) -> list:
    folder, events_of, _ = TRACES[name]
    runs = []
    sessions = [list(events_of(session)) for session in open_jsonl(folder / "sessions.jsonl.gz")]
    for copy in range(copies):
        for events in sessions:
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


def edge_rate() -> None:
    """The runner's side of Gemini's content detector (``ContentEdge.feed``: patterns, truncation,
    window hashes) over every chunk of the content set's sessions."""
    chunks = [
        [e["text"] if e["k"] == "text" else None for e in s["events"]]
        for s in open_jsonl(DATA / "gemini-cli-content" / "sessions.jsonl.gz")
    ]
    n = sum(1 for c in chunks for t in c if t is not None)
    units = sum(utf16_length(t) for c in chunks for t in c if t is not None)
    began = time.process_time()
    for session in chunks:
        edge = ContentEdge()
        for text in session:
            if text is None:
                edge.reset()
            else:
                edge.feed(text)
    took = time.process_time() - began
    print(
        f"[gemini-cli content edge] {n:,} chunks, {units:,} UTF-16 units: {n / took:,.0f} chunks/s, "
        f"{units / took / 1e6:.2f} M units/s (one core, CPU time)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--copies", type=int, default=20, help="copies of each golden session (default 20)")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    print(f"peer profiles, start: {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC")
    edge_rate()
    for name, (_, _, profile) in TRACES.items():
        events = trace(name, args.copies)
        keys = [state_key(e) for e in events]
        gc.collect()
        gc.freeze()
        rates, states = [], {}
        for _ in range(args.repeat):
            driver = RunDriver(engine_for({"loopwatch": {"profile": profile}}))
            began = time.process_time()
            driver.apply(events, keys, validated=True)
            rates.append(len(events) / (time.process_time() - began))
            states = driver.states
        sizes = [len(encode_state(s)) for s in states.values()]
        print(
            f"[{name}] {len(events):,} events over {len(states):,} runs: best {max(rates):,.0f} events/s, "
            f"median {statistics.median(rates):,.0f} events/s (one core, CPU time); state per run mean "
            f"{statistics.fmean(sizes):,.0f} B, max {max(sizes):,} B"
        )
        gc.unfreeze()
    print(f"end: {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC")
    return 0


if __name__ == "__main__":
    sys.exit(main())
