"""The per-agent rate limit of fleet outcomes is fleet-wide: two workers, one agent id whose
runs fail on 12 tools, the runs and the tools spread over both workers' partitions.

Worked by hand (minRuns 1, minAgents 1: every outcome counted opens its tool's incident;
``maxToolsPerAgentPerMinute`` 3): within one minute the agent opens 3 incidents and its other
9 outcomes are limited, whichever worker holds which partitions.  A limit kept per worker
lets each worker admit 3 tools of its own partitions: 6 here.  ``loopwatch replay`` agrees
(``tests/cli/test_commands.py::test_replay_bounds_one_agents_fleet_outcomes_as_the_workers_limit_does``).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from harness import collect, encode_all, produce, write_config
from harness.fleet_limit import LIMIT, limit_config, one_agent_outcomes, spread_tools
from schemas.fleet import IncidentOpened, decode_incident

pytestmark = pytest.mark.kafka

PARTITIONS = 4


async def test_one_agent_adds_outcomes_for_at_most_the_limit_of_tools_across_two_workers(lw):
    config = lw.tmp / "limit.json"
    write_config(config, limit_config())
    env = {"LOOPWATCH_PARTITIONS": str(PARTITIONS)}
    a = lw.worker(label="a", config=config, env=env).start()
    b = lw.worker(label="b", config=config, env=env).start()
    a.wait_ready(timeout=120)
    b.wait_ready(timeout=120)
    tools = spread_tools(PARTITIONS, 3)
    while time.time() % 60 > 30:  # all of it within one minute of the limiter's (no timing assertion)
        await asyncio.sleep(1)
    events = one_agent_outcomes(tools, lw.names.tag)
    assert len(tools) == 12 and len({e.agent_id for e in events}) == 1
    await produce(lw.broker, lw.names.tool_calls, encode_all(events))

    def limited() -> float:
        return a.metric("loopwatch_fleet_outcomes_limited_total") + b.metric("loopwatch_fleet_outcomes_limited_total")

    def opened_total() -> float:
        return a.metric("loopwatch_fleet_incidents_opened_total") + b.metric("loopwatch_fleet_incidents_opened_total")

    deadline = time.monotonic() + 90
    while limited() + opened_total() < len(tools):  # every outcome decided, one way or the other
        assert time.monotonic() < deadline, (a.metrics(), b.metrics())
        await asyncio.sleep(0.5)
    records = await collect(lw.broker, lw.names.incidents, until=lambda rs: len(rs) >= LIMIT, timeout=20, settle=3.0)
    opened = [i for i in map(decode_incident, (r.value for r in records)) if isinstance(i, IncidentOpened)]
    assert len(opened) == LIMIT, sorted(i.tool_name for i in opened)
    assert len({i.tool_name for i in opened}) == LIMIT
    assert limited() == len(tools) - LIMIT and opened_total() == LIMIT
    # The runs were spread over both workers: each processed some of the agent's events.
    assert a.metric("loopwatch_events_consumed_total") > 0 and b.metric("loopwatch_events_consumed_total") > 0
