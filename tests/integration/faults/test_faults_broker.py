"""The broker killed under load (issue 26's fault suite): kill -9 of the broker alone, and of
the broker and a worker together, on a broker of the case's own (never the shared one).

A single-node KRaft broker killed with SIGKILL loses no acknowledged record (the machine keeps
its page cache; the broker recovers its logs on start), so the guarantee under test is the
workers': nothing they had fetched but not checkpointed is lost, and a worker killed at the
same moment resumes from what was committed.  An outage longer than the session timeout ends
every member's membership: each worker then finds it is no longer a member at its next
checkpoint, writes nothing and exits, and the case restarts it as a supervisor would
(``supervise``; a worker started again while the broker is still down exits at once, "no broker
answers", and is started again after a second); the restarted worker restores its partitions
from the changelog.
"""

from __future__ import annotations

import asyncio

import pytest
from fault_harness import (
    AFTER_CHECKPOINT,
    BEFORE_CHECKPOINT,
    BEFORE_CHECKPOINT_ENV,
    FaultCase,
    Supervisor,
    crash_workload,
    kill9,
)

pytestmark = pytest.mark.kafka

DOWN_S = 4.0
"""How long the broker stays down before it is started again (its start takes a few seconds more)."""


@pytest.mark.parametrize("point", [BEFORE_CHECKPOINT, AFTER_CHECKPOINT], ids=lambda p: p.name)
async def test_the_broker_killed_loses_no_verdict(lw, own_broker, point):
    env = BEFORE_CHECKPOINT_ENV if not point.committed else {}
    case = FaultCase(lw, crash_workload(), workers=("a", "b"), env=env, broker=own_broker.address)
    await case.start()
    async with Supervisor(case) as supervisor:
        supervisor.start()
        async with case.producing(rate=700):
            await case.reach(point, records=1000)
            await asyncio.to_thread(own_broker.kill9)
            await asyncio.sleep(DOWN_S)
            await asyncio.to_thread(own_broker.start)
        assert own_broker.kills == 1
        [live] = await case.compare(timeout=180)
    print(f"{point.name}: {case.restarts} worker restarts after the broker's outage")
    live.assert_exact()


async def test_the_broker_and_a_worker_killed_together_lose_no_verdict(lw, own_broker):
    case = FaultCase(lw, crash_workload(), workers=("a", "b"), broker=own_broker.address)
    await case.start()
    async with Supervisor(case) as supervisor:
        async with case.producing(rate=700):
            await case.reach(AFTER_CHECKPOINT, records=1000)
            await asyncio.gather(asyncio.to_thread(own_broker.kill9), kill9(case.workers["a"]))
            await asyncio.sleep(DOWN_S)
            await asyncio.to_thread(own_broker.start)
            case.workers["a"].start()
            supervisor.start()
        assert own_broker.kills == 1
        [live] = await case.compare(timeout=180)
    print(f"{case.restarts} worker restarts after the broker's outage")
    live.assert_exact()
