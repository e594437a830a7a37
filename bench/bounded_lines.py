"""``python -m bench.bounded_lines``: a gzip bomb line through the file readers (issue 26).

Writes (``gzip_bomb``) a ``.jsonl.gz`` of a few events around ONE line of ``--size-mib``
MiB (2,048 by default: a file of about 2 MB), then, each in a fresh subprocess so its peak
RSS (``ru_maxrss``) is its own, alternating ``--repeat`` times:

* ``iterate``: the file iterated as the readers did before (``for line in GzipFile``), which
  builds the whole line before any limit applies;
* ``bounded``: ``streams.offline.files.read_lines`` over the same file;
* ``backtest``: ``loopwatch backtest`` on it (the whole command: the line is counted as
  ``oversized`` and the events around it are judged).

Prints wall seconds, CPU seconds and peak RSS of each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

__all__ = ["gzip_bomb"]


def gzip_bomb(path: Path, before: list[bytes], after: list[bytes], size: int) -> Path:
    """``before``, one line of about ``size`` bytes (a JSON string of "a"s), ``after``: gzip,
    written as a stream (the line is never in memory)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip container
    with open(path, "wb") as out:
        for line in before:
            out.write(compressor.compress(line))
        out.write(compressor.compress(b'{"v": 1, "pad": "'))
        block = b"a" * (1024 * 1024)
        for _ in range(max(1, (size - 20) // len(block))):
            out.write(compressor.compress(block))
        out.write(compressor.compress(b'"}\n'))
        for line in after:
            out.write(compressor.compress(line))
        out.write(compressor.flush())
    return path


READERS = {
    "iterate": "import gzip,sys\nn=0\nfor line in gzip.GzipFile(sys.argv[1]): n+=1\nprint(n)",
    "bounded": (
        "import sys\nfrom streams.offline.files import decompressed, read_lines\nn=0\n"
        "with open(sys.argv[1],'rb') as raw:\n    for line in read_lines(decompressed(raw)): n+=1\nprint(n)"
    ),
}


def peak_rss_child(argv: list[str]) -> tuple[float, float, float, int]:
    """Run ``argv`` under a tiny wrapper that reports its own child's peak RSS (KiB)."""
    wrapper = (
        "import resource,subprocess,sys,time\nt=time.monotonic()\nr=subprocess.run(sys.argv[1:],"
        "stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL).returncode\nu=resource.getrusage("
        "resource.RUSAGE_CHILDREN)\nprint(time.monotonic()-t,u.ru_utime+u.ru_stime,u.ru_maxrss,r)"
    )
    out = subprocess.run([sys.executable, "-c", wrapper, *argv], capture_output=True, text=True, check=True).stdout
    wall, cpu, rss_kib, code = out.split()
    return float(wall), float(cpu), int(rss_kib) / 1024, int(code)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bounded_lines", description=__doc__.splitlines()[0])
    p.add_argument("--size-mib", type=int, default=2048)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args(argv)
    from schemas.events import encode_event
    from streams.edge.events import requested_event

    events = [
        encode_event(
            requested_event(
                f"r:{i}",
                "read",
                {"p": 1},
                tool_call_id=f"c{i}",
                run_id="r",
                session_key="agent:main:r",
                agent_id="main",
                ts_ms=1000 + i,
            )
        )
        + b"\n"
        for i in range(10)
    ]
    with tempfile.TemporaryDirectory(prefix="lw-bomb-") as tmp:
        tmp_path = Path(tmp)
        path = gzip_bomb(tmp_path / "bomb.jsonl.gz", events[:5], events[5:], args.size_mib * 1024 * 1024)
        config = tmp_path / "loop.json"
        config.write_text(json.dumps({"tools": {"loopDetection": {"enabled": True}}}))
        print(
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, {platform.node()}, {os.cpu_count()} cores, "
            f"load {os.getloadavg()[0]:.2f}; {path.stat().st_size:,} bytes of gzip, one line of {args.size_mib} MiB"
        )
        runs = {
            "iterate": [sys.executable, "-c", READERS["iterate"], str(path)],
            "bounded": [sys.executable, "-c", READERS["bounded"], str(path)],
            "backtest": [
                sys.executable,
                "-m",
                "streams.cli",
                "backtest",
                "--baseline",
                str(config),
                "--candidate",
                str(config),
                str(path),
            ],
        }
        for n in range(args.repeat):
            for name, cmd in runs.items():
                wall, cpu, rss, code = peak_rss_child(cmd)
                print(
                    f"round {n + 1} {name:9} wall {wall:6.2f} s  cpu {cpu:6.2f} s  peak RSS {rss:8.1f} MiB  exit {code}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
