"""``loopwatch replay``: run the engine over a JSONL file of ``tool-calls`` events, no Kafka."""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator

import msgspec

from schemas.events import InvalidEvent, decode_event
from schemas.verdicts import Decision

from .engine import LoopEngine, RunDriver, Step, state_key


@dataclass
class ReplaySummary:
    events: int = 0
    rejected: int = 0
    runs: int = 0
    actions: Counter = field(default_factory=Counter)
    detectors: Counter = field(default_factory=Counter)
    aborts: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "rejected": self.rejected,
            "runs": self.runs,
            "actions": dict(self.actions),
            "detections": dict(self.detectors),
            "aborts": dict(self.aborts),
        }


@dataclass
class ReplayLine:
    """One replay result: a decision/abort, or a rejected line."""

    line: int
    key: str | None
    step: Step | None = None
    error: InvalidEvent | None = None


def replay_lines(lines: Iterator[bytes], engine: LoopEngine) -> Iterator[ReplayLine]:
    runs = RunDriver(engine)
    for number, raw in enumerate(lines, start=1):
        raw = raw.strip()
        if not raw:
            continue
        try:
            event = decode_event(raw)
        except InvalidEvent as exc:
            yield ReplayLine(number, None, error=exc)
            continue
        key = state_key(event)
        yield ReplayLine(number, key, step=runs.handle(event, key, validated=True))


def describe(decision: Decision) -> str:
    who = decision.run_id or decision.session_key or "-"
    head = f"{decision.action.upper():5} run={who} tool={decision.tool_name}"
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
    with open(path, "rb") as fh:
        for item in replay_lines(iter(fh), engine):
            if item.error is not None:
                summary.rejected += 1
                if as_json:
                    out.write(json.dumps({"line": item.line, "rejected": item.error.reason, "detail": item.error.detail}) + "\n")
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
            if as_json:
                for verdict in (d, step.abort):
                    if verdict is not None and (verdict is step.abort or verbose or d.action != "allow" or d.detector):
                        out.write(msgspec.json.encode(verdict).decode() + "\n")
            else:
                if d is not None and (verbose or d.action != "allow" or d.detector):
                    out.write(f"line {item.line}: {describe(d)}\n")
                if step.abort is not None:
                    a = step.abort
                    out.write(f"line {item.line}: ABORT run={a.run_id or a.session_key} {a.detector} count={a.count}\n      {a.message}\n")
    summary.runs = len(seen)
    return summary


def print_summary(summary: ReplaySummary, out: IO[str] = sys.stdout) -> None:
    out.write(
        f"\n{summary.events} events, {summary.runs} runs, {summary.rejected} rejected; "
        f"decisions: {dict(sorted(summary.actions.items())) or '{}'}; aborts: {dict(summary.aborts) or '{}'}\n"
    )
    for name, n in sorted(summary.detectors.items()):
        out.write(f"  {name}: {n}\n")
