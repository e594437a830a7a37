"""A worker paused longer than its session timeout (issue 26, item 1), on the real broker.

Before the fix the paused worker, once continued, took the checkpoint its revocation asked
for: it wrote its stale states to the changelog after the new owner's records and moved its
own persisted changelog offset past them; given its partitions back, it restored nothing,
resumed from the new owner's committed offsets, and verdicts were lost or differed (the
sequence: docs/reliability.md).  Now a checkpoint asks the group coordinator first and a
worker that is no longer a member writes nothing and stops; restarted (as its supervisor
would), it restores what the new owner wrote.  The loss that remained after that fix (the new
owner dropping its first records when a rebalance came while its fetch loop waited, with no
seek back) is closed in ``streams/app/faust_adapter.py`` (``_fetch_again``; docs/reliability.md);
the verdicts published again with other content, in ``streams/app/run_store.py`` (an ended
run's marker).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from fault_harness import (
    AFTER_CHECKPOINT,
    BEFORE_CHECKPOINT,
    BEFORE_CHECKPOINT_ENV,
    SESSION_TIMEOUT_S,
    FaultCase,
    crash_workload,
    pause,
)

pytestmark = pytest.mark.kafka

PRODUCTION_LIKE = {
    "LOOPWATCH_CHECKPOINT_S": "5",
    "LOOPWATCH_COMMIT_INTERVAL_S": "2.8",
    "LOOPWATCH_HEARTBEAT_INTERVAL_S": "1",
}
"""Checkpoints and commits at their production intervals: a paused worker then holds a
checkpoint's worth of work when it comes back."""


async def restart_if_exited(case: FaultCase, label: str, wait_s: float = 30.0) -> bool:
    """What a supervisor does: restart the worker once it has exited.  True if it had."""
    worker = case.workers[label]
    deadline = time.monotonic() + wait_s
    while worker.running and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    if worker.running:
        return False
    assert "no longer a member of the group's generation" in worker.log_text()
    worker.start()
    await asyncio.to_thread(worker.wait_ready, 90)
    return True


@pytest.mark.parametrize("point", [BEFORE_CHECKPOINT, AFTER_CHECKPOINT], ids=lambda p: p.name)
async def test_a_worker_paused_past_its_session_loses_no_verdict(lw, point):
    env = {**PRODUCTION_LIKE, **(BEFORE_CHECKPOINT_ENV if not point.committed else {})}
    case = FaultCase(lw, crash_workload(160, 40), workers=("a", "b"), env=env)
    await case.start()
    async with case.producing(rate=700):
        await case.reach(point, records=800)
        await pause(case.workers["a"], 3 * SESSION_TIMEOUT_S)
    restarted = await restart_if_exited(case, "a")
    print(f"{point.name}: the paused worker {'stopped and was restarted' if restarted else 'kept running'}")
    [live] = await case.compare()
    # Duplicated with other content included: an ended run redelivered from before its end
    # (the changelog ahead of the committed offsets) replayed on an empty history until ended
    # runs kept their stamp (run_store.pack_ended; docs/reliability.md).
    live.assert_exact()
