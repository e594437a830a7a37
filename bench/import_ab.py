"""Import throughput of two source trees, A and B alternated in one run (A B B A per round),
each pass in its own process: tool calls per CPU second of ``import_files`` into a gzip
events file, on bench.evaluate's generated chat runs and Claude Code sessions and, with
``--data``, the first ``--mini`` files of the recorded mini-swe-agent set and the tau-bench
set; the input's bytes per call and, per tree, the input bytes per CPU second (plain JSON:
a gzip file counts inflated).

``python -m bench.import_ab TREE_A TREE_B [--data DIR] [--rounds N]`` (a tree: a checkout,
e.g. ``git archive <commit> | tar -x -C /tmp/a``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

_PASS = """
import json, sys, time
from pathlib import Path
from streams.importers import import_files, open_output
files = [Path(p) for p in json.loads(sys.argv[1])]
fh, finish = open_output(Path(sys.argv[2]))
cpu = time.process_time()
summary = import_files(files, fh)
finish(True)
print(summary.calls, time.process_time() - cpu)
"""


def one_pass(tree: Path, files: list[Path], out: Path) -> tuple[int, float]:
    proc = subprocess.run(
        [sys.executable, "-c", _PASS, json.dumps([str(f) for f in files]), str(out)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
    )
    calls, cpu = proc.stdout.split()
    return int(calls), float(cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--data", type=Path)
    parser.add_argument("--mini", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    from bench.evaluate import chat_runs, claude_session

    print(f"bench.import_ab  {time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime())}  load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="import-ab-") as tmp:
        tmpdir = Path(tmp)
        doc = chat_runs(400, 100)
        (tmpdir / "chat.json").write_text(json.dumps(doc))
        (tmpdir / "s").mkdir()
        claude_session(doc, tmpdir / "s")
        sets = {"generated chat": [tmpdir / "chat.json"], "generated sessions": sorted((tmpdir / "s").glob("*.jsonl"))}
        if args.data:
            with tarfile.open(args.data / "mini-swe-agent-gemini-3-pro-swebench-verified.tar.gz") as tar:
                tar.extractall(tmpdir / "mini", filter="data")
            sets[f"mini-swe-agent, {args.mini} files"] = sorted((tmpdir / "mini").glob("trajs/*/*.traj.json"))[
                : args.mini
            ]
            tau = args.data / "tau-bench-gpt-4o-airline.json.gz"
            if tau.exists():
                (tmpdir / "tau.json").write_bytes(gzip.decompress(tau.read_bytes()))
                sets["tau-bench airline"] = [tmpdir / "tau.json"]
        for name, files in sets.items():
            size = sum(f.stat().st_size for f in files)
            rates: dict[str, list[float]] = {"A": [], "B": []}
            calls = 0
            for _ in range(args.rounds):
                for side in "ABBA":
                    calls, cpu = one_pass(args.a if side == "A" else args.b, files, tmpdir / "out.jsonl.gz")
                    rates[side].append(calls / cpu)
            a, b = statistics.median(rates["A"]), statistics.median(rates["B"])
            per_call = size / calls
            print(
                f"{name} ({calls:,} calls, {per_call:,.0f} bytes a call): "
                f"A {' '.join(f'{r:,.0f}' for r in rates['A'])} (median {a:,.0f}, {a * per_call / 1e6:.1f} MB/s)  "
                f"B {' '.join(f'{r:,.0f}' for r in rates['B'])} (median {b:,.0f}, {b * per_call / 1e6:.1f} MB/s)  "
                f"{b / a - 1:+.0%}"
            )
        print(f"end {time.strftime('%H:%M:%SZ', time.gmtime())}  load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
