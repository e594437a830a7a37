"""The per-agent rate limit's scenario on the real broker: one agent id whose runs fail once on
each of many tools, spread over every partition (``tests/integration/test_fleet_rate_limit_on_kafka.py``
and the fault suite's ``test_faults_fleet_limit.py``)."""

from __future__ import annotations

import time
from typing import Any

from schemas.events import ToolCallEvent
from schemas.keys import partition_for
from streams.offline.scenarios import tool_outage

__all__ = ["LIMIT", "limit_config", "one_agent_outcomes", "spread_tools"]

LIMIT = 3
"""``maxToolsPerAgentPerMinute`` in these tests."""


def limit_config() -> dict[str, Any]:
    """minRuns 1 and minAgents 1: every outcome the limit admits opens its tool's incident."""
    return {
        "tools": {"loopDetection": {"enabled": True}},
        "loopwatch": {
            "fleetIncidents": {
                "enabled": True,
                "minRuns": 1,
                "minAgents": 1,
                "windowSeconds": 60,
                "hopSeconds": 10,
                "quietSeconds": 600,
                "maxOpenIncidents": 50,
                "maxToolsPerAgentPerMinute": LIMIT,
            }
        },
    }


def spread_tools(partitions: int, per_partition: int, prefix: str = "tool") -> list[str]:
    """``partitions * per_partition`` tool names, ``per_partition`` on each partition of
    ``<app id>-fleet`` (keyed ``tool:<name>``), in round robin over the partitions: whichever
    tools come first, every worker's fleet partitions hold some."""
    by_partition: dict[int, list[str]] = {p: [] for p in range(partitions)}
    n = 0
    while any(len(names) < per_partition for names in by_partition.values()):
        name = f"{prefix}-{n:03d}"
        names = by_partition[partition_for(f"tool:{name}".encode(), partitions)]
        if len(names) < per_partition:
            names.append(name)
        n += 1
    return [by_partition[p][i] for i in range(per_partition) for p in range(partitions)]


def one_agent_outcomes(tools: list[str], run_prefix: str) -> list[ToolCallEvent]:
    """One agent id (``agent-0``), one run per tool (its run id decides its ``tool-calls``
    partition), each failing once."""
    events: list[ToolCallEvent] = []
    for t, tool in enumerate(tools):
        events += tool_outage(
            tool, runs=1, agents=1, calls_per_run=1, run_prefix=f"{run_prefix}-t{t}", start_ms=int(time.time() * 1000)
        )
    return events
