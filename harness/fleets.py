"""Recorded fleets for ``loopwatch backtest``'s tests and benchmark, and the answers they are
checked against.

``hand_worked_fleet`` is small enough to work out by hand (its docstring does); a generated
fleet (``streams.offline.scenarios.fleet_trace``) is checked against ``reference_report``: the engine
driven directly with each config, counted here without the backtest's code.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from schemas.events import ToolCallEvent
from streams.edge.events import blocked_result, compaction_event, completed_event, requested_event, run_ended_event
from streams.engine import RunDriver, engine_for, published

__all__ = ["BAD_RECORDS", "BASELINE", "CANDIDATE", "assert_matches_reference", "hand_worked_fleet", "reference_report"]

BASELINE = {"tools": {"loopDetection": {"enabled": True}}}
CANDIDATE = {"tools": {"loopDetection": {"enabled": True, "warningThreshold": 5, "criticalThreshold": 8}}}
SAME = {"content": [{"type": "text", "text": "same"}]}
T0 = 1_700_000_000_000

BAD_RECORDS = {
    "invalid_json": b"{not json",
    "unsupported_version": json.dumps({"type": "run.ended", "v": 2, "event_id": "v2", "run_id": "x"}).encode(),
    "missing_key": json.dumps({"type": "run.ended", "event_id": "nokey"}).encode(),
    "oversized": b'{"type": "run.ended", "event_id": "big", "run_id": "big", "reason": "' + b"x" * 70_000 + b'"}',
}
"""One record of each kind the worker dead-letters whatever its Kafka key: not JSON, schema
version 2, no run id, session key or session id, over 64 KiB."""


def _reads(run_id: str, n: int, *, agent: str = "main", veto_from: int | None = None, distinct: bool = False):
    fields = dict(run_id=run_id, session_key=f"agent:{agent}:{run_id}", agent_id=agent)
    out = []
    for i in range(1, n + 1):
        args = {"path": f"/f{i}" if distinct else "/same"}
        ts = T0 + i * 1000
        out.append(requested_event(f"{run_id}:{i}", "read", args, tool_call_id=f"c{i}", ts_ms=ts, **fields))
        result = blocked_result("blocked") if veto_from is not None and i >= veto_from else SAME
        out.append(
            completed_event(
                f"{run_id}:{i}:done", "read", args, tool_call_id=f"c{i}", result=result, ts_ms=ts + 1, **fields
            )
        )
    return out


def _ended(run_id: str, reason: str, agent: str = "main"):
    return run_ended_event(
        f"{run_id}:end",
        reason=reason,
        run_id=run_id,
        session_key=f"agent:{agent}:{run_id}",
        agent_id=agent,
        ts_ms=T0 + 100_000,
    )


def hand_worked_fleet() -> tuple[list[ToolCallEvent], ToolCallEvent]:
    """Four runs, interleaved, and a retry: ``(events, retry)``, the retry to be published after
    the first 30 events.  Under ``BASELINE`` (upstream's defaults: warning 10, critical 20)
    and ``CANDIDATE`` (warning 5, critical 8), by spec §2.7/§2.10 (an identical call counts the
    identical calls with identical results before it; a warning is shown only when count // 10
    reaches a new high; a blocked call is not recorded, nor is the loop's own veto that
    completes it) and §4 (after a compaction, three identical outcomes end the run):

    * run ``a`` (agent main): 10 identical reads, then ``run.ended completed``.  Baseline:
      counts 0-9, nothing.  Candidate: the 9th call sees 8 and is blocked; the runner (which
      followed the baseline) completed it with its result, so the 10th sees 9: blocked.
      Outcome none -> block, first disagreement at event ``a:9``; 2 candidate blocks in a run
      that ended normally.
    * run ``b`` (agent main): 21 identical reads, the 21st completed as a veto, then
      ``run.ended failed``.  Baseline: a warning at call 11 (count 10), a block at call 21
      (count 20).  Candidate: calls 9-21 blocked (13; counts 8 and up; its warnings, counts
      5-7, are hidden: count // 10 is 0).  Outcome block under both; they disagree from call 9.
    * run ``c`` (agent cron): 5 different reads, ``run.ended completed``: nothing under either.
    * run ``d`` (agent main): a compaction, then 3 identical gateway calls with identical
      results: aborted at the third outcome under both (window 3), then ``run.ended aborted``.
    * the retry: run a's third completion published again (the same event id): skipped.

    So: 83 events of 4 runs; verdicts baseline warn 1, block 1, abort 1, candidate warn 0,
    block 15, abort 1; outcomes baseline none 2 (a, c), block 1 (b), abort 1 (d), candidate
    none 1 (c), block 2 (a, b), abort 1 (d).
    """
    a = _reads("a", 10) + [_ended("a", "completed")]
    b = _reads("b", 21, veto_from=21) + [_ended("b", "failed")]
    c = _reads("c", 5, agent="cron", distinct=True) + [_ended("c", "completed", agent="cron")]
    fields = dict(run_id="d", session_key="agent:main:d", agent_id="main")
    d = [compaction_event("d:compaction", ts_ms=T0 + 500, **fields)]
    for i in range(1, 4):
        d.append(requested_event(f"d:{i}", "gateway", {"op": "x"}, tool_call_id=f"g{i}", ts_ms=T0 + 600 + i, **fields))
        d.append(
            completed_event(
                f"d:{i}:done", "gateway", {"op": "x"}, tool_call_id=f"g{i}", result=SAME, ts_ms=T0 + 600 + i, **fields
            )
        )
    d.append(_ended("d", "aborted"))
    events = []
    runs = [a, b, c, d]
    while any(runs):  # round robin: every run's events in order, runs interleaved
        for run in runs:
            if run:
                events.append(run.pop(0))
    return events, _reads("a", 3)[5]


def reference_report(events: Iterable[ToolCallEvent], baseline: Any, candidate: Any) -> dict:
    """Per config (``baseline``, ``candidate``): ``(rows, strongest)``, where rows are the runs
    warned, blocked and aborted per (agent, detector, tool) and strongest each run's strongest
    verdict (1 warn, 2 block, 3 abort), from the engine driven directly on every event (a
    fleet without duplicates, dead letters or run ids reused after their end)."""
    events = list(events)
    rank = {"warn": 1, "block": 2, "abort": 3}
    kinds = {"warn": "warned", "block": "blocked", "abort": "aborted"}
    out = {}
    for name, config in (("baseline", baseline), ("candidate", candidate)):
        rows: dict = defaultdict(lambda: {"warned": set(), "blocked": set(), "aborted": set()})
        strongest: dict = {}
        driver = RunDriver(engine_for(config))
        for event in events:
            for verdict in published(driver.handle(event)):
                action = getattr(verdict, "action", "abort")
                if action == "allow":
                    continue
                run = verdict.run_id
                rows[(verdict.agent_id, verdict.detector, verdict.tool_name)][kinds[action]].add(run)
                strongest[run] = max(strongest.get(run, 0), rank[action])
        out[name] = ({k: {kind: len(v) for kind, v in row.items()} for k, row in rows.items()}, strongest)
    return out


def assert_matches_reference(report: dict, events: Iterable[ToolCallEvent], baseline: Any, candidate: Any) -> dict:
    """Check a backtest report (its ``--json`` form) against ``reference_report``: the runs
    warned, blocked and aborted per (agent, detector, tool) under each config, and the runs
    whose outcome changes with both outcomes.  Returns those runs (run -> (baseline,
    candidate))."""
    expected = reference_report(events, baseline, candidate)
    for name in ("baseline", "candidate"):
        got = {
            (r["agent"], r["detector"], r["tool"]): r[name]
            for r in report["by_agent_detector_tool"]
            if any(r[name].values())
        }
        assert got == expected[name][0], name
    names = ("none", "warn", "block", "abort")
    base, cand = expected["baseline"][1], expected["candidate"][1]
    changed = {
        f"run:{run}": (names[base.get(run, 0)], names[cand.get(run, 0)])
        for run in set(base) | set(cand)
        if base.get(run, 0) != cand.get(run, 0)
    }
    assert {r["run"]: (r["baseline"], r["candidate"]) for r in report["changed_runs"]} == changed
    return changed
