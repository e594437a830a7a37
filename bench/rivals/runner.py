"""The benchmark's side of a peer: run it on a preloaded topic, time it, check its verdicts.

A peer runs as its own subprocess (its own process group, stopped by its id) and drains the
events the benchmark produced before starting it.  Its throughput is taken inside it, from
its first processed record to its last (``common.Progress``), as (b) is for the worker.
Then, as for (b), the benchmark waits until the peer's consumer group has committed every
offset (its state and verdicts are safe), stops it (SIGTERM), reads every record on its
verdicts topic and compares them, de-duplicated by verdict id, with the engine run directly
on the same events: a peer that drops, adds or changes a verdict fails the benchmark, so a
broken peer cannot look fast.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from harness import REPO, collect, committed_offsets, dedupe, end_offsets, stop_group
from schemas.verdicts import RunAborted

from . import RIVALS

__all__ = ["RivalFailed", "PeerProcess", "compare_verdicts", "measure_rival", "verdict_counts"]


PROGRESS_S = 30.0
"""While a peer drains its topic, a progress line this often (Faust's takes minutes)."""


class RivalFailed(Exception):
    """A peer did not run, did not drain its topic, or published other verdicts than the
    engine's (the message says which)."""


class PeerProcess:
    """``python -m <peer module> ...`` in its own process group, logging to ``log_dir``."""

    def __init__(
        self,
        name: str,
        broker: str,
        *,
        source: str,
        sink: str,
        group: str,
        expected: int,
        config: Path,
        work_dir: Path,
    ) -> None:
        self.name = name
        self.label, self.module = RIVALS[name].label, RIVALS[name].module
        work_dir.mkdir(parents=True, exist_ok=True)
        self.result_file = work_dir / f"peer-{name}.result.json"
        self.log_path = work_dir / f"peer-{name}.log"
        self.argv = [
            sys.executable,
            "-m",
            self.module,
            broker,
            source,
            sink,
            group,
            str(expected),
            str(config),
            str(work_dir / f"peer-{name}-state"),
            str(self.result_file),
        ]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=str(REPO),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stopped by its id, never by name
            )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def result(self) -> dict | None:
        try:
            return json.loads(self.result_file.read_text())
        except FileNotFoundError:
            return None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> int | None:
        return None if self.proc is None else stop_group(self.proc, timeout=30)


def verdict_counts(verdicts: Iterable[Any]) -> dict[str, int]:
    """Verdicts by action (``allow``/``warn``/``block``), aborts as ``abort``."""
    return dict(sorted(Counter("abort" if isinstance(v, RunAborted) else v.action for v in verdicts).items()))


def compare_verdicts(label: str, got: dict[str, Any], expected: Iterable[Any]) -> None:
    """Raise ``RivalFailed`` unless ``got`` (verdict id -> verdict, de-duplicated) holds exactly
    the ``expected`` verdicts: first the counts by action, then each verdict."""
    want = {v.verdict_id: v for v in expected}
    got_counts, want_counts = verdict_counts(got.values()), verdict_counts(want.values())
    if got_counts != want_counts:
        raise RivalFailed(f"{label}: verdicts by action {got_counts}, the engine's {want_counts}")
    missing = want.keys() - got.keys()
    extra = got.keys() - want.keys()
    differing = sum(1 for k in want.keys() & got.keys() if got[k] != want[k])
    if missing or extra or differing:
        raise RivalFailed(
            f"{label}: {len(missing)} of the engine's verdicts missing, {len(extra)} others published, "
            f"{differing} differing (though the counts by action agree)"
        )


async def measure_rival(
    name: str,
    broker: str,
    *,
    source: str,
    sink: str,
    group: str,
    events: int,
    expected: list,
    config: Path,
    work_dir: Path,
    timeout: float | None = None,
) -> dict:
    """Run peer ``name`` on ``source`` (``events`` records already in it), verdicts to ``sink``.

    Returns its rate (events/s, first to last processed record), CPU per event, the rate
    until every offset was committed, and its verdicts' counts by action, once they are
    found to be the ``expected`` ones (else ``RivalFailed``).  ``timeout``: seconds to drain
    the topic (default: a minute plus 5 ms an event); a line every ``PROGRESS_S`` meanwhile.
    """
    if timeout is None:
        timeout = 60.0 + events / 200
    peer = PeerProcess(
        name, broker, source=source, sink=sink, group=group, expected=events, config=config, work_dir=work_dir
    )
    peer.start()
    try:
        started = time.monotonic()
        deadline = started + timeout
        progress_at = started + PROGRESS_S
        while (result := peer.result()) is None:
            if not peer.running:
                raise RivalFailed(
                    f"{peer.label} exited (code {peer.proc.returncode}) after processing fewer than "
                    f"{events:,} events (see {peer.log_path}):\n{peer.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise RivalFailed(
                    f"{peer.label} did not process {events:,} events within {timeout:.0f} s (see {peer.log_path})"
                )
            if time.monotonic() > progress_at:
                progress_at += PROGRESS_S
                committed = sum((await committed_offsets(broker, group, source)).values())
                print(
                    f"     {peer.label}: {committed:,} of {events:,} events committed after "
                    f"{time.monotonic() - started:.0f} s",
                    flush=True,
                )
            await asyncio.sleep(0.1)
        # At least once: done means every offset committed, hence every state and verdict safe.
        deadline = time.monotonic() + 120
        while sum((await committed_offsets(broker, group, source)).values()) < events:
            if not peer.running:
                raise RivalFailed(f"{peer.label} exited before committing every offset:\n{peer.log_tail()}")
            if time.monotonic() > deadline:
                raise RivalFailed(f"{peer.label} processed every event but did not commit every offset within 120 s")
            await asyncio.sleep(0.1)
        durable_at = time.monotonic()
    finally:
        code = peer.stop()
    if code not in (0, None, -15):
        raise RivalFailed(f"{peer.label} exited with code {code} when stopped:\n{peer.log_tail()}")

    total = sum((await end_offsets(broker, sink)).values())
    records = await collect(broker, sink, until=lambda out: len(out) >= total, timeout=120)
    if len(records) < total:
        raise RivalFailed(f"{peer.label}: read {len(records):,} of the {total:,} records on {sink}")
    by_id, duplicates, differing = dedupe(records)
    if differing:
        raise RivalFailed(f"{peer.label}: {differing} verdicts published twice with different content")
    compare_verdicts(peer.label, by_id, expected)
    return {
        "label": peer.label,
        "rate": result["events"] / result["elapsed"],
        "elapsed": result["elapsed"],
        "events": result["events"],
        "cpu_us": result["cpu"] / result["events"] * 1e6,
        "cpu_cores": result["cpu"] / result["elapsed"],
        "durable_rate": result["events"] / (durable_at - result["first_monotonic"]),
        "verdicts": verdict_counts(by_id.values()),
        "duplicates": duplicates,
        "log": str(peer.log_path),
    }
