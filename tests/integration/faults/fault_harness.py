"""The fault suite's one harness (issue 26): a workload, workers, a fault injected at a point
of the stream, and every verdict compared with the uninterrupted run's.

**The reference** is what an uninterrupted worker publishes for the workload: the engine
alone (``harness.reference_verdicts``, the path every worker, replay and benchmark share);
``test_faults.py::test_an_uninterrupted_run_publishes_the_reference`` checks that a worker on
Kafka publishes exactly that, with no fault.  A case then produces the same records with a
fault injected and compares every verdict by id and content (``Comparison``): lost 0,
differing 0, duplicated with other content 0, unexpected 0.  With a candidate config, the
candidate's verdicts on the shadow topic are compared the same way.

**A case**::

    case = FaultCase(lw, crash_workload(), workers=("a", "b"), env={...})
    await case.start()
    async with case.producing(rate=900):          # the workload streams in, paced
        await case.reach(AFTER_CHECKPOINT)        # a point of the stream (see ``Point``)
        await pause(case.workers["a"], 10)        # the fault (the functions below)
    comparison = await case.compare()
    comparison.assert_exact()

``Point``: ``BEFORE_CHECKPOINT`` (the workers have processed records and the group has
committed none: nothing is durable yet) or ``AFTER_CHECKPOINT`` (a checkpoint committed part
of the stream and more is still coming).  ``reach`` asserts the point was really reached
(e.g. that the producer is not done yet), so a case cannot pass by injecting its fault
after the stream.

**To reuse it** (e.g. for ``scope: session`` with overlapping runs): build a ``Workload``
with its own events and config roots (``Workload(name, events, live=..., candidate=...)``);
the config files are written by the case (``FaultCase.config_path``), the reference is the
engine with the same config (under session scope it keys its states by session, as the
worker does).  ``env`` adds ``LOOPWATCH_*`` settings to every worker.

**Faults**: ``pause`` (SIGSTOP, SIGCONT after a while), ``kill9`` (the worker's process group),
a worker joining (``FaultCase.add_worker``).  A case that kills a broker must start a broker
of its own (``scripts/kafka.sh`` with its own ``KAFKA_PORT``, ``KAFKA_CONTROLLER_PORT`` and
``KAFKA_STATE_DIR``) and pass its address as ``broker``: never the shared one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from harness import (
    REPO,
    collect,
    committed_offsets,
    encode_all,
    end_offsets,
    free_port,
    header,
    produce,
    reference_verdicts,
    signal_group,
    write_config,
)
from schemas import decode_verdict
from schemas.names import GENERATION_HEADER, WORKER_HEADER
from streams.offline.scenarios import fleet_trace

__all__ = [
    "AFTER_CHECKPOINT",
    "BEFORE_CHECKPOINT",
    "Comparison",
    "FaultCase",
    "OwnBroker",
    "Point",
    "Workload",
    "Supervisor",
    "crash_workload",
    "kill9",
    "pause",
    "supervise",
]

ENABLED = {"tools": {"loopDetection": {"enabled": True}}}

FAULT_GROUP_ENV = {
    "LOOPWATCH_SESSION_TIMEOUT_S": "6",
    "LOOPWATCH_HEARTBEAT_INTERVAL_S": "0.5",
    "LOOPWATCH_REBALANCE_TIMEOUT_S": "10",
    "LOOPWATCH_COMMIT_INTERVAL_S": "0.5",
    "LOOPWATCH_CHECKPOINT_S": "1",
}
"""Short session timeout (a pause of 2x it expels the worker) and a checkpoint every second."""
SESSION_TIMEOUT_S = float(FAULT_GROUP_ENV["LOOPWATCH_SESSION_TIMEOUT_S"])


# -- the workload ------------------------------------------------------------------------------------


@dataclass
class Workload:
    """The records a case produces, the config roots the workers run on, and the reference."""

    name: str
    events: list
    live: Any = field(default_factory=lambda: ENABLED)
    candidate: Any = None

    def records(self) -> list[tuple[bytes, bytes]]:
        return encode_all(self.events)

    def expected(self) -> list:
        return reference_verdicts(self.events, self.live)

    def expected_candidate(self) -> list:
        return [] if self.candidate is None else reference_verdicts(self.events, self.candidate)


def crash_workload(runs: int = 120, calls: int = 30, *, seed: int = 7, candidate: Any = None) -> Workload:
    """The crash workload, small: interleaved runs of every kind (half healthy, the rest
    looping), gated, as obedient runners publish them, stamped now."""
    start_ms = int(time.time() * 1000)
    events, _kinds = fleet_trace(runs, calls, seed=seed, gate=True, end=True, start_ms=start_ms, run_prefix=f"f{seed}")
    return Workload(f"crash-{runs}x{calls}", events, candidate=candidate)


# -- comparing with the reference -------------------------------------------------------------------


@dataclass
class Comparison:
    """Verdicts read from a topic against the reference, by id and content."""

    topic: str
    expected: int
    records: int
    lost: list[str]
    differing: list[str]
    """Ids whose (first) published content is not the reference's."""
    conflicting: list[str]
    """Ids published more than once with different contents."""
    unexpected: list[str]
    duplicates: int
    partitions: dict[str, dict[int, int]] = field(default_factory=dict)
    """Per kind of fault (lost, differing, conflicting): how many on each partition (the run's
    record partition): a fault of one worker shows on its partitions."""
    publishers: dict[str, int] = field(default_factory=dict)
    """The copies of conflicting ids by publisher (``loopwatch.worker`` and
    ``loopwatch.generation`` headers) and whether each is the reference's content."""
    examples: list = field(default_factory=list)
    """A few conflicting ids' copies (publisher, generation, partition, offset, verdict) and the reference."""

    @classmethod
    def of(cls, topic: str, records: list, expected: list) -> Comparison:
        want = {v.verdict_id: v for v in expected}
        got: dict[str, Any] = {}
        partition_of: dict[str, int] = {}
        conflicting: set[str] = set()
        copies: dict[str, list] = {}
        duplicates = 0
        for record in records:
            verdict = decode_verdict(record.value)
            copies.setdefault(verdict.verdict_id, []).append((verdict, record))
            partition_of.setdefault(verdict.run_id or "", record.partition)
            seen = got.setdefault(verdict.verdict_id, verdict)
            if seen is not verdict:
                duplicates += 1
                if seen != verdict:
                    conflicting.add(verdict.verdict_id)
        publishers: dict[str, int] = {}
        examples = []
        for i in sorted(conflicting)[:3]:
            examples.append(
                [
                    (
                        header(record, WORKER_HEADER),
                        header(record, GENERATION_HEADER),
                        record.partition,
                        record.offset,
                        msgspec.to_builtins(verdict),
                    )
                    for verdict, record in copies[i]
                ]
                + [("reference", msgspec.to_builtins(want.get(i)))]
            )
        for i in conflicting:
            for verdict, record in copies[i]:
                who = (
                    f"{header(record, WORKER_HEADER)}@{header(record, GENERATION_HEADER)} "
                    f"{'reference' if want.get(i) == verdict else 'other'}"
                )
                publishers[who] = publishers.get(who, 0) + 1
        lost = sorted(set(want) - set(got))
        differing = sorted(i for i, v in got.items() if i in want and want[i] != v)

        def by_partition(ids: list[str]) -> dict[int, int]:
            out: dict[int, int] = {}
            for i in ids:
                partition = partition_of.get(want[i].run_id or "", -1) if i in want else -1
                out[partition] = out.get(partition, 0) + 1
            return out

        return cls(
            topic,
            len(want),
            len(records),
            lost=lost,
            differing=differing,
            conflicting=sorted(conflicting),
            unexpected=sorted(set(got) - set(want)),
            duplicates=duplicates,
            publishers=publishers,
            examples=examples,
            partitions={
                "lost": by_partition(lost),
                "differing": by_partition(differing),
                "conflicting": by_partition(sorted(conflicting)),
            },
        )

    @property
    def exact(self) -> bool:
        return not (self.lost or self.differing or self.conflicting or self.unexpected)

    def summary(self) -> str:
        return (
            f"{self.topic}: {self.expected} expected, {self.records} records, lost {len(self.lost)}, "
            f"differing {len(self.differing)}, duplicated with other content {len(self.conflicting)}, "
            f"unexpected {len(self.unexpected)}, duplicates {self.duplicates}"
            + ("" if self.exact else f"; by partition {self.partitions}")
            + (f"; conflicting copies by publisher {self.publishers}" if self.publishers else "")
            + "".join(f"\n  e.g. {example}" for example in self.examples)
        )

    def assert_exact(self) -> None:
        assert self.exact, self.summary() + f"; e.g. lost {self.lost[:5]}, differing {self.differing[:5]}"


# -- points of the stream ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    name: str
    committed: bool
    """After a checkpoint (some of the stream committed), or before one: processed records that
    no checkpoint has committed yet (``FaultCase.reach``)."""


BEFORE_CHECKPOINT = Point("before-checkpoint", committed=False)
UNCOMMITTED_AT_LEAST = 100
"""Before a checkpoint that came early (idle, rebalance): processed records not committed yet."""
AFTER_CHECKPOINT = Point("after-checkpoint", committed=True)

BEFORE_CHECKPOINT_ENV = {"LOOPWATCH_CHECKPOINT_S": "60"}
"""For ``BEFORE_CHECKPOINT``: no timed checkpoint comes before the fault (the stream keeps the
workers busy, so the idle one does not either)."""


# -- a case ---------------------------------------------------------------------------------------------


class FaultCase:
    """One fault case: its workload, its workers (labels), its settings, on broker ``broker``
    (the shared one unless the case runs its own, ``OwnBroker``)."""

    def __init__(
        self,
        lw: Any,
        workload: Workload,
        *,
        workers: tuple[str, ...] = ("a",),
        env: dict[str, str] | None = None,
        broker: str | None = None,
    ) -> None:
        self.lw = lw
        self.workload = workload
        self.broker = broker or lw.broker
        self.env = {**FAULT_GROUP_ENV, **(env or {}), "LOOPWATCH_BOOTSTRAP": self.broker}
        self.config_path = lw.tmp / "live.json"
        write_config(self.config_path, workload.live)
        if workload.candidate is not None:
            candidate = lw.tmp / "candidate.json"
            write_config(candidate, workload.candidate)
            self.env["LOOPWATCH_CANDIDATE_CONFIG"] = str(candidate)
        self.workers: dict[str, Any] = {}
        for label in workers:
            self.add_worker(label)
        self._producing: asyncio.Task | None = None
        self.faults = 0
        self.restarts = 0
        """Workers ``supervise`` started again."""

    @property
    def names(self) -> Any:
        return self.lw.names

    def add_worker(self, label: str) -> Any:
        worker = self.lw.worker(label=label, config=self.config_path, env=self.env)
        self.workers[label] = worker
        return worker

    async def start(self, timeout: float = 90.0) -> None:
        for worker in self.workers.values():
            worker.start()
        for worker in self.workers.values():
            await asyncio.to_thread(worker.wait_ready, timeout)

    @contextlib.asynccontextmanager
    async def producing(self, rate: float = 900.0) -> AsyncIterator[None]:
        """The workload's records streaming in at ``rate`` records/s while the body runs;
        waits for the rest of them when the body is done."""
        self._producing = asyncio.create_task(
            produce(self.broker, self.names.tool_calls, self.workload.records(), rate=rate)
        )
        try:
            yield
        finally:
            await self._producing

    def consumed(self) -> float:
        return sum(w.metric("loopwatch_events_consumed_total") for w in self.workers.values() if w.running)

    async def committed(self) -> int:
        return sum((await committed_offsets(self.broker, self.names.app_id, self.names.tool_calls)).values())

    async def reach(self, point: Point, *, records: int = 300, timeout: float = 60.0) -> None:
        """Wait until the workers have processed at least ``records`` records, and (after a
        checkpoint) the group has committed some of them, or (before one) that many are processed and
        not committed; assert the stream is still coming."""
        deadline = time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, f"{point.name} not reached in {timeout:.0f} s"
            consumed = self.consumed()
            if point.committed:
                if consumed >= records and await self.committed() > 0:
                    break
            elif consumed >= records and (
                (committed := await self.committed()) == 0 or consumed - committed >= UNCOMMITTED_AT_LEAST
            ):
                # Processed work no checkpoint committed yet: all of it, or (on a loaded host an
                # idle or rebalance checkpoint can commit the first records) enough of it that
                # the fault loses a checkpoint's work all the same.
                break
            await asyncio.sleep(0.1)
        assert self._producing is not None and not self._producing.done(), "the stream ended before the fault"
        self.faults += 1

    async def settled(self, timeout: float = 120.0) -> None:
        """Wait until the group has committed every record (every checkpoint went through)."""
        deadline = time.monotonic() + timeout
        while True:
            ends = await end_offsets(self.broker, self.names.tool_calls)
            committed = await committed_offsets(self.broker, self.names.app_id, self.names.tool_calls)
            if all(committed.get(p, 0) >= end for p, end in ends.items()):
                return
            assert time.monotonic() < deadline, f"offsets not committed to the end: {committed} of {ends}"
            await asyncio.sleep(0.3)

    async def read(self, topic: str, expected: list, timeout: float = 120.0) -> list:
        want = {v.verdict_id for v in expected}

        def done(records: list) -> bool:
            return want <= {decode_verdict(r.value).verdict_id for r in records}

        return await collect(self.broker, topic, until=done, timeout=timeout, settle=1.0)

    async def compare(self, timeout: float = 120.0) -> list[Comparison]:
        """Every verdict against the reference: the live config's on the verdicts topic and,
        with a candidate, the candidate's on the shadow topic.  Waits until every record is
        committed first (so nothing published later is missed)."""
        await self.settled(timeout)
        expected = self.workload.expected()
        out = [Comparison.of(self.names.verdicts, await self.read(self.names.verdicts, expected, timeout), expected)]
        if self.workload.candidate is not None:
            candidate = self.workload.expected_candidate()
            records = await self.read(self.names.shadow_verdicts, candidate, timeout)
            out.append(
                Comparison.of(
                    self.names.shadow_verdicts,
                    [r for r in records if header(r, "loopwatch.config") == "candidate"],
                    candidate,
                )
            )
        for comparison in out:
            print(comparison.summary())
        return out


# -- a broker of the case's own ----------------------------------------------------------------

KAFKA_SH = REPO / "scripts" / "kafka.sh"


class OwnBroker:
    """A single-node broker of ``scripts/kafka.sh`` on free ports with its own state directory."""

    def __init__(self, state_dir: Path) -> None:
        port = free_port()
        self.env = {
            **os.environ,
            "KAFKA_PORT": str(port),
            "KAFKA_CONTROLLER_PORT": str(free_port()),
            "KAFKA_STATE_DIR": str(state_dir),
        }
        self.address = f"127.0.0.1:{port}"
        self.pid_file = state_dir / "kafka.pid"
        self.kills = 0
        self.stalls = 0

    def _script(self, *args: str) -> None:
        done = subprocess.run([str(KAFKA_SH), *args], env=self.env, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            pytest.fail(f"scripts/kafka.sh {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")

    def start(self) -> None:
        self._script("start")

    def kill9(self) -> None:
        """SIGKILL the broker's JVM (the pid ``scripts/kafka.sh`` recorded) and wait until it is gone."""
        pid = self.pid
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and _state(pid) != "Z":
            assert time.monotonic() < deadline, f"broker {pid} still alive after SIGKILL"
            time.sleep(0.05)
        self.kills += 1

    @property
    def pid(self) -> int:
        return int(self.pid_file.read_text().strip())

    async def stall(self, seconds: float) -> None:
        """SIGSTOP the broker's JVM, SIGCONT it ``seconds`` later (a broker that stops
        answering without closing its connections: a long GC pause, a frozen VM, a stalled disk)."""
        pid = self.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)
        self.stalls += 1

    def stop(self) -> None:
        subprocess.run([str(KAFKA_SH), "stop", "--wipe"], env=self.env, capture_output=True, timeout=120)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


# -- faults ------------------------------------------------------------------------------------------


async def pause(worker: Any, seconds: float) -> None:
    """SIGSTOP the worker's process group, SIGCONT it ``seconds`` later (a long GC, a throttled
    container, a frozen VM)."""
    signal_group(worker.proc, signal.SIGSTOP)
    try:
        await asyncio.sleep(seconds)
    finally:
        signal_group(worker.proc, signal.SIGCONT)


async def kill9(worker: Any) -> None:
    await asyncio.to_thread(worker.kill)


NOT_A_MEMBER = "no longer a member of the group's generation"
"""What a worker logs when it stops because its group membership is gone (docs/reliability.md)."""
NO_BROKER = "cannot use the Kafka cluster"
"""What a worker says when it exits at its start because no broker answers (the broker is
still down when it is started again)."""


async def supervise(case: FaultCase, backoff_s: float = 1.0) -> None:
    """What a supervisor (Kubernetes' restart policy) does, until cancelled: start again every
    worker of the case that exited, after ``backoff_s``.  A worker exits by design when it finds
    it is no longer a member of its group's generation, as every member does after a broker
    outage longer than the session timeout, and at its start when no broker answers yet; any
    other exit fails the case."""
    while True:
        for label, worker in case.workers.items():
            if worker.proc is not None and not worker.running:
                last_start = worker.log_text().rsplit("===== start #", 1)[-1]
                assert NOT_A_MEMBER in last_start or NO_BROKER in last_start, (
                    f"worker {label} exited for another reason: {last_start[-600:]}"
                )
                await asyncio.sleep(backoff_s)
                case.restarts += 1
                worker.start()
        await asyncio.sleep(0.2)


class Supervisor:
    """``supervise`` as a context: ``start()`` begins it (at once, or after a fault); leaving
    the context stops it and raises what made it fail (a worker that exited for another reason),
    which would otherwise show only as offsets that never reach the end."""

    def __init__(self, case: FaultCase) -> None:
        self.case = case
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(supervise(self.case))

    async def __aenter__(self) -> Supervisor:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        task = self.task
        if task is None:
            return
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
