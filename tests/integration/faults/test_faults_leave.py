"""A worker that lost its group always leaves, on the real broker: a worker paused past its
session timeout (SIGSTOP of the worker) and a broker that stops answering past it (SIGSTOP
of a broker of the test's own), each repeated.

Once a worker finds it is no longer a member of its generation (``NotAMember``) it stops, and
its supervisor starts it again.  Its stop used to wait for ever in about one case of four:
the log ended with "Wait for streams..." after a failed JoinGroup, SIGTERM did nothing, and
``/healthz`` kept answering 200, so no liveness probe would ever restart it.  A case fails
when a worker outlives the loss of its membership by more than its watchdog's bound
(``LOOPWATCH_MEMBER_WATCHDOG_S``) plus a margin, or when a worker that is still up past the
bound answers ``/healthz`` with 200.

A worker may also come back as a member without a crash (it had nothing to write when it
learnt that its generation was over): that is a worker that did not lose its group for good,
and it counts as rejoined.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from fault_harness import FAULT_GROUP_ENV, NOT_A_MEMBER, SESSION_TIMEOUT_S, FaultCase, crash_workload, pause

from harness import produce
from streams.app.watchdog import EXIT_CODE

pytestmark = pytest.mark.kafka

WATCHDOG_S = 2 * SESSION_TIMEOUT_S + float(FAULT_GROUP_ENV["LOOPWATCH_REBALANCE_TIMEOUT_S"])
"""The watchdog's default bound for the harness's group settings (2 x session + rebalance)."""
MARGIN_S = 8.0
"""What a loaded host may add to the exit: the grace before the forced exit, a log flush, the poll."""
STALL_S = 2 * SESSION_TIMEOUT_S + 1
"""A pause (of the worker, or of the broker) that outlasts the session timeout twice."""
REJOIN_AFTER_S = 2 * SESSION_TIMEOUT_S
"""A worker without a crash this long after the fault, and ready, has rejoined its group."""
REPEATS = 4
"""A hang seen once in four crashes shows in four repetitions with probability 1 - (3/4)^4 = 68 %
per case, 90 % over both cases' eight; the total stays near four minutes."""
WATCHDOG_LINE = "loopwatch worker: leaving:"
ENV = {"LOOPWATCH_CHECKPOINT_S": "2"}
"""A checkpoint every two seconds: a worker holds uncheckpointed work when the fault comes."""


@dataclass
class Outcome:
    label: str
    repetition: int
    how: str
    """``exited`` (its exit code in ``code``), ``rejoined`` or ``stuck``."""
    seconds: float
    """From the end of the fault to the exit (or to the verdict)."""
    code: int | None = None
    crashed: bool = False
    """It logged that it is no longer a member (``NotAMember``)."""
    healthz_200_past_bound: int = 0
    """``/healthz`` answers 200 while it was still up past the watchdog's bound after the fault."""
    healthz_503: str = ""
    """The first 503 ``/healthz`` answered after the fault (its body), if any."""
    by_watchdog: bool = False
    """Its watchdog ended it (the worker's "leaving:" line)."""

    def __str__(self) -> str:
        code = "" if self.code is None else f" (code {self.code})"
        how = self.how + (" by its watchdog" if self.by_watchdog else "")
        return f"{self.label}#{self.repetition}: {how}{code} {self.seconds:.1f} s after the fault" + (
            f"; /healthz said {self.healthz_503[:160]}" if self.healthz_503 else ""
        )


def _this_start(worker) -> str:
    return worker.log_text().rsplit("===== start #", 1)[-1]


async def watch(worker, repetition: int, fault_ended: float) -> Outcome:
    """How the worker came out of the fault: it exits, rejoins, or is still up when the bound
    and the margin have passed (its task stacks are then dumped into its log, SIGUSR1)."""
    outcome = Outcome(worker.label, repetition, "stuck", 0.0)
    while True:
        waited = time.monotonic() - fault_ended
        outcome.seconds = waited
        outcome.crashed = NOT_A_MEMBER in _this_start(worker)
        if not worker.running:
            outcome.how, outcome.code = "exited", worker.proc.returncode
            outcome.by_watchdog = WATCHDOG_LINE in _this_start(worker)
            return outcome
        status, body = await asyncio.to_thread(worker.http, "/healthz")
        if not worker.running:
            continue  # gone while it was asked: an exit, not an answer
        if status == 503 and not outcome.healthz_503:
            outcome.healthz_503 = body[:2000]
        if waited > WATCHDOG_S and status == 200:
            outcome.healthz_200_past_bound += 1
        if waited > REJOIN_AFTER_S and not outcome.crashed:
            ready, _ = await asyncio.to_thread(worker.http, "/readyz")
            if ready == 200:
                outcome.how = "rejoined"
                return outcome
        if waited > WATCHDOG_S + MARGIN_S:
            os.killpg(worker.proc.pid, signal.SIGUSR1)  # mode's worker: every task's stack to its log
            await asyncio.sleep(1.0)
            return outcome
        await asyncio.sleep(0.25)


async def restart(worker) -> None:
    """What a supervisor does with a worker that exited."""
    worker.start()
    await asyncio.to_thread(worker.wait_ready, 90)


async def until_consuming(case: FaultCase, labels: tuple[str, ...], more: float = 100.0) -> None:
    """Until each of ``labels`` has processed ``more`` records from now (it holds work)."""
    start = {label: case.workers[label].metric("loopwatch_events_consumed_total") for label in labels}
    deadline = time.monotonic() + 60
    while any(case.workers[label].metric("loopwatch_events_consumed_total") < start[label] + more for label in labels):
        assert time.monotonic() < deadline, f"{labels} processed no records in 60 s"
        await asyncio.sleep(0.1)


def streaming(case: FaultCase, repetition: int, seconds: float, rate: float = 250.0) -> asyncio.Task:
    """Records at ``rate`` for about ``seconds``: a workload of its own for each repetition."""
    workload = crash_workload(int(rate * seconds / 40) + 1, 40, seed=100 + repetition)
    return asyncio.create_task(produce(case.broker, case.names.tool_calls, workload.records(), rate=rate))


def verdict(outcomes: list[Outcome]) -> None:
    print("\n".join(map(str, outcomes)))
    exited = [o.seconds for o in outcomes if o.how == "exited"]
    if exited:
        print(f"exits: {len(exited)}, {min(exited):.1f} .. {max(exited):.1f} s after the fault")
    stuck = [o for o in outcomes if o.how == "stuck"]
    assert not stuck, f"still up {WATCHDOG_S + MARGIN_S:.0f} s after the fault: {', '.join(map(str, stuck))}"
    late = [o for o in outcomes if o.how == "exited" and o.seconds > WATCHDOG_S + MARGIN_S]
    assert not late, f"exited later than the bound and the margin: {', '.join(map(str, late))}"
    lying = [o for o in outcomes if o.healthz_200_past_bound]
    assert not lying, f"/healthz answered 200 past the bound: {', '.join(map(str, lying))}"
    bad_codes = [o for o in outcomes if o.how == "exited" and not o.code]
    assert not bad_codes, f"a worker that lost its group exited with code 0: {', '.join(map(str, bad_codes))}"


async def test_a_worker_paused_past_its_session_always_leaves(lw):
    case = FaultCase(lw, crash_workload(1, 1), workers=("a", "b"), env=ENV)
    await case.start()
    outcomes: list[Outcome] = []
    for repetition in range(1, REPEATS + 1):
        stream = streaming(case, repetition, STALL_S + 2)
        await until_consuming(case, ("a",))
        await pause(case.workers["a"], STALL_S)
        outcome = await watch(case.workers["a"], repetition, time.monotonic())
        outcomes.append(outcome)
        await stream
        if outcome.how == "stuck":
            break  # its stacks are in its log; the next repetition would only wait for it again
        if outcome.how == "exited":
            await restart(case.workers["a"])
    verdict(outcomes)


async def test_a_broker_that_stalls_past_the_session_leaves_no_worker_behind(lw, own_broker):
    case = FaultCase(lw, crash_workload(1, 1), workers=("a", "b"), env=ENV, broker=own_broker.address)
    await case.start()
    outcomes: list[Outcome] = []
    for repetition in range(1, REPEATS + 1):
        stream = streaming(case, repetition, 4)
        await until_consuming(case, ("a", "b"))
        await own_broker.stall(STALL_S)
        ended = time.monotonic()
        found = await asyncio.gather(*(watch(w, repetition, ended) for w in case.workers.values()))
        outcomes += found
        await stream
        if any(o.how == "stuck" for o in found):
            break
        for o in found:
            if o.how == "exited":
                await restart(case.workers[o.label])
    assert own_broker.stalls >= 1
    verdict(outcomes)


async def test_a_stop_that_never_finishes_is_ended_by_the_watchdog(lw):
    """The backstop alone: a worker whose stop hangs (``hung_stop_worker.py``) after it lost its
    group exits with the watchdog's code and line within the bound, and ``/healthz`` answers
    503 with the reason from the moment it stops."""
    case = FaultCase(lw, crash_workload(1, 1), workers=("b",), env=ENV)
    hung = lw.worker(
        label="a",
        config=case.config_path,
        env=case.env,
        command=[sys.executable, str(Path(__file__).with_name("hung_stop_worker.py"))],
    )
    case.workers["a"] = hung
    await case.start()
    stream = streaming(case, 0, STALL_S + 2)
    await until_consuming(case, ("a",))
    await pause(hung, STALL_S)
    outcome = await watch(hung, 1, time.monotonic())
    await stream
    verdict([outcome])
    assert outcome.crashed and outcome.how == "exited" and outcome.by_watchdog, outcome
    assert outcome.code == EXIT_CODE, outcome
    said = json.loads(outcome.healthz_503)
    assert said["status"] == "stopping" and said["reason"].startswith("stopping for "), said
    assert "NotAMember: this worker is no longer a member" in said["reason"], said
