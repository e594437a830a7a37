"""Workers crashing and joining under load (issue 26's fault suite), on the real broker."""

from __future__ import annotations

import asyncio

import pytest

from fault_harness import AFTER_CHECKPOINT, BEFORE_CHECKPOINT, BEFORE_CHECKPOINT_ENV, FaultCase, crash_workload, kill9

pytestmark = pytest.mark.kafka


async def test_an_uninterrupted_run_publishes_the_reference(lw):
    # What every fault case is compared with: the engine alone, driven over the same events.
    case = FaultCase(lw, crash_workload(60, 30), workers=("a",))
    await case.start()
    async with case.producing(rate=900):
        pass
    [live] = await case.compare()
    live.assert_exact()
    assert live.duplicates == 0


FIRST_RECORDS_OPEN = pytest.mark.xfail(strict=False, reason=(
    "issue 26 item 1, still open: a partition with no committed offset that moves to another worker can lose "
    "its first records (a fresh-clone run lost 2 of 3,545, calls 0 of two runs; docs/reliability.md)"))


@pytest.mark.parametrize("point", [pytest.param(BEFORE_CHECKPOINT, marks=FIRST_RECORDS_OPEN), AFTER_CHECKPOINT],
                         ids=lambda p: p.name)
async def test_a_worker_killed_loses_no_verdict(lw, point):
    env = BEFORE_CHECKPOINT_ENV if not point.committed else {}
    case = FaultCase(lw, crash_workload(), workers=("a", "b"), env=env)
    await case.start()
    async with case.producing(rate=700):
        await case.reach(point, records=1000)
        await kill9(case.workers["a"])
        case.workers["a"].start()
    [live] = await case.compare()
    live.assert_exact()


async def test_a_worker_removed_while_its_partitions_are_busy_loses_no_verdict(lw):
    # A graceful stop (SIGTERM) mid-stream, not restarted: the other worker takes over.
    case = FaultCase(lw, crash_workload(), workers=("a", "b"))
    await case.start()
    async with case.producing(rate=700):
        await case.reach(AFTER_CHECKPOINT, records=1000)
        assert await asyncio.to_thread(case.workers["a"].stop) == 0
    [live] = await case.compare()
    live.assert_exact()
    assert case.workers["b"].metric("loopwatch_events_consumed_total") > 0


@pytest.mark.xfail(reason=(
    "issue 26 item 1, still open here: with the fix for records dropped across a rebalance, exact in 2 runs, "
    "3 of 3,545 verdicts lost in a third (the first calls of runs on one partition; docs/reliability.md)"))
async def test_a_third_worker_joining_under_load_takes_partitions_and_loses_no_verdict(lw):
    # Six partitions: with four, two workers hold two each, which Faust's assignor counts as
    # its capacity for three workers, and the third gets none.
    case = FaultCase(lw, crash_workload(), workers=("a", "b"), env={"LOOPWATCH_PARTITIONS": "6"})
    await case.start()
    async with case.producing(rate=700):
        await case.reach(AFTER_CHECKPOINT, records=600)
        third = case.add_worker("c").start()
        await asyncio.to_thread(third.wait_ready, 90)
    [live] = await case.compare()
    live.assert_exact()
    assert third.metric("loopwatch_events_consumed_total") > 0, "the third worker received no partition"
