"""The per-agent rate limit survives a kill -9 of the worker that holds it, on the real broker.

Two workers, one agent id (``harness.fleet_limit``: minRuns 1, minAgents 1,
``maxToolsPerAgentPerMinute`` 3).  Its runs fail on 12 tools; the worker owning the agent's
partition of ``<app id>-fleet-agents`` admits 3 and limits 9.  That worker is killed (-9) at
once, and the agent's runs fail on 12 more tools.  The survivor processes the runs on its own
partitions at once, so some of these outcomes are stamped in the first wave's minute; it takes
the agent's partition after the session timeout and restores the agent's tools from the
table's changelog.  Worked by hand: in the first wave's minute exactly its 3 tools are
admitted (a limiter that started afresh would admit 3 more); in any later minute at most 3.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import pytest
from fault_harness import kill9

from harness import collect, encode_all, produce, write_config
from harness.fleet_limit import LIMIT, limit_config, one_agent_outcomes, spread_tools
from schemas.fleet import FleetOutcome, decode_fleet_record

pytestmark = pytest.mark.kafka

PARTITIONS = 4


def fleet_metrics(worker) -> dict:
    return {k: v for k, v in worker.metrics().items() if "fleet" in k[0] and v}


async def test_the_limit_of_a_worker_killed_is_restored_and_a_forward_repeated_keeps_its_time(lw):
    config = lw.tmp / "limit.json"
    write_config(config, limit_config())
    env = {"LOOPWATCH_PARTITIONS": str(PARTITIONS)}
    workers = [lw.worker(label=label, config=config, env=env).start() for label in ("a", "b")]
    for worker in workers:
        worker.wait_ready(timeout=120)
    first, second = spread_tools(PARTITIONS, 3, "first"), spread_tools(PARTITIONS, 3, "second")
    while time.time() % 60 > 5:  # both waves start early in a minute (no timing assertion)
        await asyncio.sleep(0.5)
    await produce(lw.broker, lw.names.tool_calls, encode_all(one_agent_outcomes(first, f"{lw.names.tag}-1")))

    def decided(worker) -> float:
        return worker.metric("loopwatch_fleet_outcomes_limited_total") + worker.metric(
            "loopwatch_fleet_incidents_opened_total"
        )

    deadline = time.monotonic() + 90
    while sum(decided(w) for w in workers) < len(first):
        assert time.monotonic() < deadline, [fleet_metrics(w) for w in workers]
        await asyncio.sleep(0.2)
    (owner,) = [w for w in workers if w.metric("loopwatch_fleet_outcomes_limited_total") > 0]
    assert owner.metric("loopwatch_fleet_outcomes_limited_total") == len(first) - LIMIT
    (survivor,) = [w for w in workers if w is not owner]
    before = decided(survivor)  # (the incidents of the first wave's tools it owns)
    await kill9(owner)
    await produce(lw.broker, lw.names.tool_calls, encode_all(one_agent_outcomes(second, f"{lw.names.tag}-2")))
    deadline = time.monotonic() + 150
    while decided(survivor) < before + len(second):  # it owns the agent's partition by then
        assert time.monotonic() < deadline, (before, fleet_metrics(survivor))
        await asyncio.sleep(0.5)

    async def outcomes(topic: str) -> list[tuple[int, FleetOutcome]]:
        records = await collect(lw.broker, topic, until=lambda rs: False, timeout=8)
        found = [(r.timestamp, decode_fleet_record(r.value)) for r in records]
        return [(ts, o) for ts, o in found if isinstance(o, FleetOutcome)]

    sent = await outcomes(f"{lw.names.app_id}-fleet-agents")
    admitted = await outcomes(f"{lw.names.app_id}-fleet")
    assert {o.tool_name for _, o in sent} == set(first) | set(second)
    # Every outcome forwarded (once, or again after the crash) keeps the timestamp it was sent
    # with (a batch processed again after the crash sends its outcomes again, at a later time).
    sent_at = {(o.run, ts) for ts, o in sent}
    assert [(o.tool_name, ts) for ts, o in admitted if (o.run, ts) not in sent_at] == []
    by_minute: dict[int, set[str]] = defaultdict(set)
    for ts, o in admitted:
        by_minute[ts // 60_000].add(o.tool_name)
    minute = min(ts for ts, o in sent if o.tool_name in first) // 60_000
    # The crash fell inside the limit's minute: outcomes of the second wave were sent in it ...
    assert any(ts // 60_000 == minute and o.tool_name in second for ts, o in sent)
    # ... and refused there, by the survivor, from the table it restored.
    assert len(by_minute[minute]) == LIMIT and by_minute[minute] <= set(first), dict(by_minute)
    assert all(len(tools) <= LIMIT for tools in by_minute.values()), dict(by_minute)
