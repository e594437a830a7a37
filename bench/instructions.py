"""Instructions per event of the batch processor, or of the engine alone, counted by valgrind: an A/B that noise cannot move.

On the shared VMs this project runs on, the same code measures 14 to 23 µs of CPU per event
from one minute to the next (docs/benchmarks.md), so a change worth 3 % cannot be seen in
``bench.processor``'s timings without dozens of alternations.  The number of instructions
the processor executes is the same on every run: this counts them with valgrind's
cachegrind (``--cache-sim=no``) on ``bench.processor``'s workload, once with every record
and once with none, and divides the difference by the records.

    python -m bench.instructions [--events 30000] [--runs 300] [TREE ...]
    python -m bench.instructions --engine configurable-final|latest [--runs 300] [TREE ...]

Each TREE is a checkout (``git archive <commit> | tar -x -C <dir>``) whose ``streams`` and
``bench.processor`` are the ones counted; without one, this checkout.  Instructions are not
time (a cache miss costs more than an add), so a change is judged by both: instructions here,
and a timed A/B in ``make bench``.  valgrind runs Python about 50 times slower: 30,000 records
take about half a minute per tree.

``--engine PROFILE`` counts ``LoopEngine.handle`` alone instead, on ``make bench-core``'s
workload (``bench.core.build_trace``, ``--runs`` runs of ``--calls-per-run`` calls): the
events are decoded by the tree's own ``schemas.decode_event`` (fields the tree does not know
left out) before the count begins, in both the full and the empty run, and fed as
``RunDriver.apply`` feeds them.  The child uses only what every version of the engine has
had (``engine_for(config).handle(state, event, validated=True)``, ``Step.state``), so a TREE
may be any commit back to the engine's first (``git archive``); latest needs a tree that has
the profile.  valgrind needs ``apt-get install valgrind`` (a bench-only tool: no test runs it).
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


CHILD = """
import gc, logging, os, pickle, sys
from bench.processor import one_pass
from streams.app import logs
try:
    from streams.app.records import Record
except ImportError:  # a checkout from before the record types had their own module
    from streams.app.processor import Record
logs.configure(os.devnull)
logging.getLogger("loopwatch").setLevel(logging.INFO)
with open(sys.argv[1], "rb") as f:
    records = [Record(*fields) for fields in pickle.load(f)][:int(sys.argv[2])]
try:
    from streams.app.gc_policy import GC_THRESHOLDS
except ImportError:
    try:  # a checkout from before the GC policy had its own module
        from streams.app.app import GC_THRESHOLDS
    except ImportError:
        GC_THRESHOLDS = None
gc.collect()
gc.freeze()
if GC_THRESHOLDS:
    gc.set_threshold(*GC_THRESHOLDS)
one_pass(records, 2000, 50000)
"""
"""Run in valgrind, in the tree counted: ``count`` of the pickled records through a fresh
processor, as ``bench.processor`` does (``one_pass``: batches of 2,000, a checkpoint every
50,000 records)."""


ENGINE_CHILD = """
import gc, json, pickle, sys
from schemas import events as ev
from streams.engine import LoopEngine, engine_for
try:
    from schemas.keys import state_key
except ImportError:
    from streams.engine import state_key
with open(sys.argv[1], "rb") as f:
    raw = pickle.load(f)
count, profile = int(sys.argv[2]), sys.argv[3]
config = {"tools": {"loopDetection": {"enabled": True}}}
if profile != "configurable-final":
    config["loopwatch"] = {"profile": profile}
known = {}
for cls in (ev.ToolCallRequested, ev.ToolCallCompleted, ev.CompactionRetried, ev.RunEnded):
    known[cls.__struct_config__.tag] = set(cls.__struct_fields__) | {"type"}
events = []
for data in raw:
    fields = json.loads(data)
    allowed = known[fields["type"]]
    events.append(ev.decode_event(json.dumps({k: v for k, v in fields.items() if k in allowed}).encode()))
keys = [state_key(e) for e in events]
engine = engine_for(config)
gc.collect()
gc.freeze()

def apply(events, keys):  # RunDriver.apply as it was when it came (a function: fast locals)
    handle = engine.handle
    states = {}
    get = states.get
    for key, event in zip(keys, events):
        step = handle(get(key), event, validated=True)
        if step.state is None:
            states.pop(key, None)
        else:
            states[key] = step.state

import time
began = time.process_time()
try:
    from streams.engine import RunDriver
except ImportError:  # before RunDriver: its loop
    apply(events[:count], keys[:count])
else:
    RunDriver(engine).apply(events[:count], keys[:count], validated=True)
print(time.process_time() - began)
"""
"""Run in valgrind, in the tree counted: the first ``count`` of the pickled encoded events
through one engine of the profile, as ``bench.core`` times it (``RunDriver.apply``, or
before there was one, the same loop written out)."""


def time_engine(tree: Path, events_file: Path, count: int, profile: str) -> float:
    """CPU seconds of the engine child's loop, run natively (``--timed``)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        [sys.executable, "-c", ENGINE_CHILD, str(events_file), str(count), profile],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"bench.instructions: the run in {tree} failed (exit {done.returncode}):\n{done.stderr[-500:]}"
        )
    return float(done.stdout.split()[-1])


def count_instructions(tree: Path, records_file: Path, count: int, valgrind: str, profile: str | None = None) -> int:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    child = [CHILD] if profile is None else [ENGINE_CHILD]
    command = [
        valgrind,
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
        sys.executable,
        "-c",
        *child,
        str(records_file),
        str(count),
        *([profile] if profile else []),
    ]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    found = _REFS.search(done.stderr)
    if done.returncode != 0 or found is None:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise SystemExit(f"bench.instructions: the run in {tree} failed (exit {done.returncode}):\n{tail}")
    return int(found.group(1).replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.instructions", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--events", type=int, default=30_000)
    p.add_argument("--runs", type=int, default=300)
    p.add_argument(
        "--engine",
        choices=("configurable-final", "latest"),
        help="count the engine alone under this profile on bench-core's workload",
    )
    p.add_argument("--calls-per-run", type=int, default=52, help="with --engine (default 52, as bench-core)")
    p.add_argument(
        "--timed",
        type=int,
        metavar="K",
        default=0,
        help="with --engine: no valgrind; time the same child natively, K rounds of the trees in "
        "turn (order alternating), CPU time of the loop (an A/B across commits in time)",
    )
    p.add_argument("trees", nargs="*", type=Path, help="checkouts to count (default: this one)")
    args = p.parse_args(argv)
    if args.events < 1 or args.runs < 1:
        print("bench.instructions: --events and --runs must be at least 1", file=sys.stderr)
        return 1
    valgrind = shutil.which("valgrind")
    if valgrind is None and not args.timed:
        print("bench.instructions: needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 1
    trees = [tree.resolve() for tree in args.trees] or [REPO]
    if args.engine:
        return count_engine(trees, args, valgrind)
    for tree in trees:
        if not (tree / "streams" / "app" / "processor.py").is_file() or not (tree / "bench" / "processor.py").is_file():
            print(f"bench.instructions: {tree} is not a loopwatch checkout with bench/processor.py", file=sys.stderr)
            return 1
    from bench.processor import workload

    records = workload(args.events, args.runs)
    with tempfile.TemporaryDirectory(prefix="lw-instructions-") as tmp:
        records_file = Path(tmp) / "records.pickle"
        with open(records_file, "wb") as f:
            pickle.dump([(r.topic, r.partition, r.offset, r.key, r.value, r.timestamp) for r in records], f)
        print(f"{len(records):,} records of {args.runs:,} runs, batches of 2,000; valgrind cachegrind", flush=True)
        for tree in trees:
            full = count_instructions(tree, records_file, len(records), valgrind)
            empty = count_instructions(tree, records_file, 0, valgrind)
            print(f"{tree}: {(full - empty) / len(records):,.0f} instructions/event", flush=True)
    return 0


def count_engine(trees: list[Path], args: argparse.Namespace, valgrind: str) -> int:
    for tree in trees:
        if not (tree / "streams" / "engine" / "engine.py").is_file():
            print(f"bench.instructions: {tree} is not a loopwatch checkout with streams/engine", file=sys.stderr)
            return 1
    from bench.core import build_trace
    from schemas.events import encode_event

    events, _kinds = build_trace(args.runs, args.calls_per_run, 7)
    with tempfile.TemporaryDirectory(prefix="lw-instructions-") as tmp:
        events_file = Path(tmp) / "events.pickle"
        with open(events_file, "wb") as f:
            pickle.dump([encode_event(e) for e in events], f)
        if args.timed:
            print(
                f"{len(events):,} events of {args.runs:,} runs (bench-core's fleet), engine alone, {args.engine}; "
                f"CPU time, {args.timed} rounds alternating",
                flush=True,
            )
            rates: dict[Path, list[float]] = {tree: [] for tree in trees}
            for round_ in range(args.timed):
                for tree in trees[:: 1 if round_ % 2 == 0 else -1]:
                    rates[tree].append(len(events) / time_engine(tree, events_file, len(events), args.engine))
                    print(f"  round {round_ + 1} {tree}: {rates[tree][-1]:,.0f} events/s", flush=True)
            for tree, got in rates.items():
                print(f"{tree}: best {max(got):,.0f} events/s, median {statistics.median(got):,.0f}", flush=True)
            return 0
        print(
            f"{len(events):,} events of {args.runs:,} runs (bench-core's fleet), engine alone, {args.engine}; "
            "valgrind cachegrind",
            flush=True,
        )
        for tree in trees:
            full = count_instructions(tree, events_file, len(events), valgrind, args.engine)
            empty = count_instructions(tree, events_file, 0, valgrind, args.engine)
            print(f"{tree}: {(full - empty) / len(events):,.0f} instructions/event", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
