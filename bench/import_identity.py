"""Whether two source trees' ``loopwatch import`` write the same bytes: every transcript under
``tests/data`` (each on its own), bench.evaluate's generated chat runs and Claude Code
sessions, and with ``--data`` (the directory ``make evaluate`` reads) each recorded
mini-swe-agent run on its own, the whole set with its labels, the tau-bench set and the
OpenHands files.  Each tree imports in its own process; the SHA-256 of every output file (or
the one-line refusal, for a file it refuses) is compared.

``python -m bench.import_identity TREE_A TREE_B [--data DIR]`` exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# One import per job: (input files, output name, labels file or "").  Prints name -> digest.
_IMPORT = """
import gzip, hashlib, json, sys
from pathlib import Path
from streams.importers import ImportFailed, import_files, load_labels, open_output
jobs, outdir = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
digests = {}
for files, name, labels in jobs:
    out = outdir / name
    fh, finish = open_output(out)
    try:
        summary = import_files([Path(f) for f in files], fh, labels=load_labels(Path(labels)) if labels else None)
    except ImportFailed as exc:
        finish(False)
        digests[name] = "refused: " + str(exc).replace(str(Path(files[0]).parent), "<dir>")
        continue
    finish(True)
    data = out.read_bytes()
    # a gzip header names the temporary file it was written to: the events are compared
    data = gzip.decompress(data) if name.endswith(".gz") else data
    digests[name] = hashlib.sha256(data).hexdigest() + f" {summary.events} events"
print(json.dumps(digests))
"""


def jobs_for(data: Path | None, tmp: Path) -> list[tuple[list[str], str, str]]:
    from bench.evaluate import chat_runs, claude_session

    jobs: list[tuple[list[str], str, str]] = []
    for path in sorted((REPO / "tests" / "data").rglob("*")):
        if path.is_file() and not path.name.startswith(("LICENSE", "README")):
            jobs.append(([str(path)], _name(path.relative_to(REPO)), ""))
    doc = chat_runs(400, 100)
    (tmp / "chat.json").write_text(json.dumps(doc))
    (tmp / "sessions").mkdir()
    claude_session(doc, tmp / "sessions")
    jobs.append(([str(tmp / "chat.json")], "generated-chat.jsonl.gz", ""))
    jobs.append(([str(p) for p in sorted((tmp / "sessions").glob("*.jsonl"))], "generated-sessions.jsonl", ""))
    if data is not None:
        tarball = data / "mini-swe-agent-gemini-3-pro-swebench-verified.tar.gz"
        if tarball.exists():
            with tarfile.open(tarball) as tar:
                tar.extractall(tmp / "mini", filter="data")
            trajs = sorted((tmp / "mini").glob("trajs/*/*.traj.json"))
            jobs.extend(([str(p)], _name(Path("mini") / p.name), "") for p in trajs)
            summary = tmp / "mini" / "results_summary.json"
            jobs.append(([str(p) for p in trajs], "mini-swe-agent-labelled.jsonl.gz", str(summary)))
        for path in sorted(data.rglob("*")):
            if path.is_file() and path.suffix in (".json", ".jsonl", ".gz") and not path.name.endswith(".tar.gz"):
                jobs.append(([str(path)], _name(Path("shared") / path.relative_to(data)), ""))
    return jobs


def _name(rel: Path) -> str:
    return str(rel).replace("/", "__") + ".out.jsonl"


def digests(tree: Path, jobs: list, outdir: Path) -> dict[str, str]:
    outdir.mkdir()
    listing = outdir.with_suffix(".jobs.json")
    listing.write_text(json.dumps(jobs))
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT, str(listing), str(outdir)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--data", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="import-identity-") as tmp:
        tmpdir = Path(tmp)
        jobs = jobs_for(args.data, tmpdir)
        a = digests(args.a.resolve(), jobs, tmpdir / "a")
        b = digests(args.b.resolve(), jobs, tmpdir / "b")
    differ = sorted(name for name in a.keys() | b.keys() if a.get(name) != b.get(name))
    for name in differ:
        print(f"DIFFERS {name}: {a.get(name)} / {b.get(name)}")
    refused = sum(v.startswith("refused") for v in a.values())
    combined = hashlib.sha256(json.dumps(a, sort_keys=True).encode()).hexdigest()
    print(
        f"{len(jobs)} imports ({len(jobs) - refused} written, {refused} refused alike): "
        f"{'identical' if not differ else f'{len(differ)} differ'}; digest of all outputs {combined}"
    )
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
