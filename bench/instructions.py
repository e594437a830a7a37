"""Instructions per event of the batch processor, counted by valgrind: an A/B that noise cannot move.

On the shared VMs this project runs on, the same code measures 14 to 23 µs of CPU per event
from one minute to the next (docs/benchmarks.md), so a change worth 3 % cannot be seen in
``bench.processor``'s timings without dozens of alternations.  The number of instructions
the processor executes is the same on every run: this counts them with valgrind's
cachegrind (``--cache-sim=no``) on ``bench.processor``'s workload, once with every record
and once with none, and divides the difference by the records.

    python -m bench.instructions [--events 30000] [--runs 300] [TREE ...]

Each TREE is a checkout (``git archive <commit> | tar -x -C <dir>``) whose ``streams`` and
``bench.processor`` are the ones counted; without one, this checkout.  Instructions are not
time (a cache miss costs more than an add), so a change is judged by both: instructions here,
and a timed A/B in ``make bench``.  valgrind runs Python about 50 times slower: 30,000 records
take about half a minute per tree.
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import shutil
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


def count_instructions(tree: Path, records_file: Path, count: int, valgrind: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [valgrind, "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
               sys.executable, "-c", CHILD, str(records_file), str(count)]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    found = _REFS.search(done.stderr)
    if done.returncode != 0 or found is None:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise SystemExit(f"bench.instructions: the run in {tree} failed (exit {done.returncode}):\n{tail}")
    return int(found.group(1).replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=30_000)
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("trees", nargs="*", type=Path, help="checkouts to count (default: this one)")
    args = p.parse_args(argv)
    if args.events < 1 or args.runs < 1:
        print("bench.instructions: --events and --runs must be at least 1", file=sys.stderr)
        return 1
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print("bench.instructions: needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 1
    trees = [tree.resolve() for tree in args.trees] or [REPO]
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


if __name__ == "__main__":
    sys.exit(main())
