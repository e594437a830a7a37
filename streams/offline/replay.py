"""``loopwatch replay``: run the engine over a JSONL file of ``tool-calls`` events, no Kafka.

The file is plain or gzip, and read a bounded line at a time (``streams.offline.files.read_lines``).

With ``loopwatch.fleetIncidents`` or ``loopwatch.agentRings`` on, the fleet topology runs
beside the engine (``streams.engine.fleet.FleetSimulator``): the events' times are its clock,
and what it finds is in the engine's view from the next event on (a worker's view lags by the
delay docs/design.md gives)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec

from schemas.events import InvalidEvent, decode_event
from schemas.fleet import IncidentOpened, IncidentResolved, RingNotice
from schemas.names import OVERSIZED
from schemas.verdicts import Decision

from ..engine import LoopEngine, RunDriver, Step
from ..engine.fleet import FleetSimulator, ring_members
from .files import OverlongLine, decompressed, read_lines


@dataclass
class ReplaySummary:
    events: int = 0
    rejected: int = 0
    runs: int = 0
    actions: Counter = field(default_factory=Counter)
    detectors: Counter = field(default_factory=Counter)
    aborts: Counter = field(default_factory=Counter)
    fleet: Counter = field(default_factory=Counter)
    """Fleet incidents opened and resolved, ring notices (with the fleet options on)."""

    def as_dict(self) -> dict[str, Any]:
        out = {
            "events": self.events,
            "rejected": self.rejected,
            "runs": self.runs,
            "actions": dict(self.actions),
            "detections": dict(self.detectors),
            "aborts": dict(self.aborts),
        }
        if self.fleet:
            out["fleet"] = dict(self.fleet)
        return out


@dataclass
class ReplayLine:
    """One replay result: a decision/abort, or a rejected line."""

    line: int
    key: str | None
    step: Step | None = None
    error: InvalidEvent | None = None
    fleet: list = field(default_factory=list)
    """What the fleet topology published after this event (incidents, ring notices, and
    ``(trace id, None)`` for a ring withdrawn)."""


def fleet_simulator(engine: LoopEngine) -> FleetSimulator | None:
    """The fleet topology for the engine's config, in the engine's view; None when off."""
    config = engine.config
    if config.fleet_incidents is None and config.agent_rings is None:
        return None
    simulator = FleetSimulator(config.fleet_incidents, config.agent_rings)
    engine.fleet = simulator.view
    return simulator


def replay_lines(lines: Iterator[bytes | OverlongLine], engine: LoopEngine) -> Iterator[ReplayLine]:
    """``lines``: ``streams.offline.files.read_lines``'s (an over-long line is rejected as ``oversized``)."""
    runs = RunDriver(engine)
    fleet = fleet_simulator(engine)
    for number, raw in enumerate(lines, start=1):
        if raw.__class__ is OverlongLine:
            yield ReplayLine(number, None, error=InvalidEvent(OVERSIZED, raw.describe()))
            continue
        raw = raw.strip()
        if not raw:
            continue
        try:
            event = decode_event(raw)
        except InvalidEvent as exc:
            yield ReplayLine(number, None, error=exc)
            continue
        key = engine.key_of(event)
        item = ReplayLine(number, key, step=runs.handle(event, key, validated=True))
        if fleet is not None:
            item.fleet = fleet.observe(event)
        yield item


def describe_fleet(record: Any) -> str:
    if isinstance(record, IncidentOpened):
        return (
            f"INCIDENT OPENED {record.incident_id} tool={record.tool_name} runs={record.runs} "
            f"agents={record.agents}\n      {record.message}"
        )
    if isinstance(record, IncidentResolved):
        return f"INCIDENT RESOLVED {record.incident_id} tool={record.tool_name}"
    if isinstance(record, RingNotice):
        return (
            f"RING {record.level} trace={record.trace_id} rounds={record.rounds} "
            f"agents={' -> '.join(ring_members(record))}"
        )
    return f"RING WITHDRAWN trace={record[0]}"


def fleet_kind(record: Any) -> str:
    if isinstance(record, (IncidentOpened, IncidentResolved)):
        return record.__struct_config__.tag
    return f"ring.{record.level}" if isinstance(record, RingNotice) else "ring.withdrawn"


def describe(decision: Decision) -> str:
    who = decision.run_id or decision.session_key or "-"
    head = f"{decision.action.upper():5} run={who} tool={decision.tool_name}"
    if decision.incident_id:
        head += f" incident={decision.incident_id}"
    if decision.detector:
        head += f" {decision.level}/{decision.detector} count={decision.count}"
        if decision.liveness_signal:
            head += f" liveness={decision.liveness_signal}"
        if decision.action == "allow":
            head += " (warning hidden by the bucket rule)"
        head += f"\n      {decision.message}"
    return head


def run_replay(path: Path, engine: LoopEngine, *, as_json: bool, verbose: bool, out: IO[str]) -> ReplaySummary:
    summary = ReplaySummary()
    seen: set[str] = set()
    with open(path, "rb") as raw, decompressed(raw) as fh:
        for item in replay_lines(read_lines(fh), engine):
            if item.error is not None:
                summary.rejected += 1
                if as_json:
                    out.write(
                        json.dumps({"line": item.line, "rejected": item.error.reason, "detail": item.error.detail})
                        + "\n"
                    )
                else:
                    out.write(f"line {item.line}: rejected ({item.error.reason}): {item.error.detail}\n")
                continue
            summary.events += 1
            seen.add(item.key)
            step = item.step
            d = step.decision
            if d is not None:
                summary.actions[d.action] += 1
                if d.detector:
                    summary.detectors[f"{d.level}/{d.detector}"] += 1
            if step.abort is not None:
                summary.aborts[step.abort.detector] += 1
            shown = d is not None and (verbose or d.action != "allow" or d.detector or d.incident_id)
            if as_json:
                for verdict in (d, step.abort):
                    if verdict is not None and (verdict is step.abort or shown):
                        out.write(msgspec.json.encode(verdict).decode() + "\n")
            else:
                if shown:
                    out.write(f"line {item.line}: {describe(d)}\n")
                if step.abort is not None:
                    a = step.abort
                    out.write(
                        f"line {item.line}: ABORT run={a.run_id or a.session_key} {a.detector} count={a.count}\n      {a.message}\n"
                    )
            for record in item.fleet:
                summary.fleet[fleet_kind(record)] += 1
                if as_json:
                    value = {"trace_id": record[0], "ring": None} if isinstance(record, tuple) else record
                    out.write(msgspec.json.encode(value).decode() + "\n")
                else:
                    out.write(f"line {item.line}: {describe_fleet(record)}\n")
    summary.runs = len(seen)
    return summary


def print_summary(summary: ReplaySummary, out: IO[str] = sys.stdout) -> None:
    out.write(
        f"\n{summary.events} events, {summary.runs} runs, {summary.rejected} rejected; "
        f"decisions: {dict(sorted(summary.actions.items())) or '{}'}; aborts: {dict(summary.aborts) or '{}'}\n"
    )
    for name, n in sorted(summary.detectors.items()):
        out.write(f"  {name}: {n}\n")
    for name, n in sorted(summary.fleet.items()):
        out.write(f"  {name}: {n}\n")
