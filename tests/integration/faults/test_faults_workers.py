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


def assert_exact_or_first_records_lost(live) -> None:
    """Exact, or (still open, docs/reliability.md) only verdicts lost: a partition with no
    committed offset that moved to another worker lost its first records (3 and 2 of 3,545 in two
    runs of session 10), before the fix that fetches again what a stopped flow dropped; none in
    6 runs of each of the two cases since.
    Anything differing, duplicated with other content or unexpected fails."""
    if live.lost and not (live.differing or live.conflicting or live.unexpected):
        pytest.xfail(f"issue 26: first records of a moved partition lost ({live.summary()})")
    live.assert_exact()


@pytest.mark.parametrize("point", [BEFORE_CHECKPOINT, AFTER_CHECKPOINT], ids=lambda p: p.name)
async def test_a_worker_killed_loses_no_verdict(lw, point):
    env = BEFORE_CHECKPOINT_ENV if not point.committed else {}
    case = FaultCase(lw, crash_workload(), workers=("a", "b"), env=env)
    await case.start()
    async with case.producing(rate=700):
        await case.reach(point, records=1000)
        await kill9(case.workers["a"])
        case.workers["a"].start()
    [live] = await case.compare()
    if point.committed:
        live.assert_exact()
    else:
        assert_exact_or_first_records_lost(live)


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
    assert third.metric("loopwatch_events_consumed_total") > 0, "the third worker received no partition"
    assert_exact_or_first_records_lost(live)
