"""What both peers share inside their own process: the per-event work, the progress
stamps and the command line.

The per-event work is what a user of Quix Streams or Faust would write around loopwatch's
engine: decode the event, decode the run's stored state, ``LoopEngine.handle``, encode the
new state for the framework's store, encode the verdicts to publish.  The framework around
it (consumption, the state store and its changelog, production, commits) is the peer's own.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from schemas import decode_event, encode_verdict
from streams.engine import decode_state, encode_state, engine_for, published

__all__ = ["EventStep", "PeerArgs", "Progress", "load_config", "parse_args"]


class EventStep:
    """One event through the engine, with the run's state as bytes on both sides."""

    def __init__(self, config: object) -> None:
        self.engine = engine_for(config)

    def __call__(self, stored: bytes | None, value: bytes) -> tuple[bytes | None, list[bytes]]:
        """``(new stored state or None to delete it, encoded verdicts to publish)``.

        The verdicts are what loopwatch publishes for the event (``streams.engine.published``).
        """
        event = decode_event(value)
        state = None if stored is None else decode_state(stored)
        step = self.engine.handle(state, event, validated=True)
        out = [encode_verdict(verdict) for verdict in published(step)]
        return (None if step.state is None else encode_state(step.state)), out


class Progress:
    """Stamps the first and the last of ``expected`` processed records, as ``make bench``
    times (b), and writes them to ``result_file`` (JSON) once the last one is done.

    CPU time is the whole process's (every thread, the Kafka client's included).
    ``first_monotonic`` is ``time.monotonic()`` at the first record: on Linux one clock for
    every process, so the bench can time from it to when it sees every offset committed.
    """

    def __init__(self, expected: int, result_file: Path) -> None:
        self.expected = expected
        self.result_file = result_file
        self.done = 0
        self.verdicts = 0
        self._first = 0.0
        self._first_cpu = 0.0
        self._first_monotonic = 0.0

    def started(self) -> None:
        """Call before processing each record."""
        if not self._first:
            self._first = time.perf_counter()
            self._first_cpu = time.process_time()
            self._first_monotonic = time.monotonic()

    def finished(self, verdicts: int) -> None:
        """Call after processing each record (``verdicts``: how many it published)."""
        self.done += 1
        self.verdicts += verdicts
        if self.done == self.expected:
            elapsed = time.perf_counter() - self._first
            cpu = time.process_time() - self._first_cpu
            tmp = self.result_file.with_name(self.result_file.name + ".tmp")
            tmp.write_text(
                json.dumps(
                    {
                        "events": self.done,
                        "elapsed": elapsed,
                        "cpu": cpu,
                        "verdicts": self.verdicts,
                        "first_monotonic": self._first_monotonic,
                    }
                )
            )
            os.replace(tmp, self.result_file)  # the bench sees the whole file or none


class PeerArgs(argparse.Namespace):
    broker: str
    source: str
    sink: str
    group: str
    expected: int
    config: Path
    state_dir: Path
    result_file: Path


def parse_args(prog: str, description: str, argv: list[str] | None = None) -> PeerArgs:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("broker", help="bootstrap servers, host:port")
    p.add_argument("source", help="the tool-calls topic (preloaded)")
    p.add_argument("sink", help="the topic verdicts go to")
    p.add_argument("group", help="consumer group / application id")
    p.add_argument("expected", type=int, help="events to process before writing the result file")
    p.add_argument("config", type=Path, help="the loop-detection config (JSON)")
    p.add_argument("state_dir", type=Path, help="where the framework keeps its RocksDB state")
    p.add_argument("result_file", type=Path, help="written (JSON) once `expected` events are processed")
    return p.parse_args(argv, namespace=PeerArgs())


def load_config(path: Path) -> object:
    """The config file's JSON; a file that cannot be read or parsed exits with one line."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"peer: cannot read the config {path}: {exc}") from None
