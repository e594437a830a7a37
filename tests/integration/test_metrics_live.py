"""Every metric of docs/metrics.md moves as it should on a live worker (real broker).

One worker subprocess (own ports, topics and app id: the ``lw`` fixture) gets traffic of
every kind through Kafka: a healthy run, a generic repeat loop (warnings, suppressed
warnings, blocks), a known-poll loop, a ping-pong, an unknown-tool loop, a compaction
followed by a loop that survives it (abort), malformed records of every dead-letter reason,
and finally ``run.ended`` for every run.  Its ``/metrics`` is scraped as Prometheus would
(text format, ``prometheus_client.parser``) and every counter's increase is compared with
what the engine alone says the events cause; gauges are followed up and down.  Last, no
label anywhere may carry a run id, session key, args hash or event id.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from harness import REPO, encode_all, produce, write_config
from schemas import MAX_EVENT_BYTES
from schemas.events import CompactionRetried, RunEnded, ToolCallCompleted, ToolCallRequested
from streams.edge.events import run_ended_event
from streams.engine import engine_for, state_key
from streams.offline.scenarios import run_events
from streams.ops.scrape import Snapshot, scrape

pytestmark = pytest.mark.kafka

CONFIG = {"tools": {"loopDetection": {"enabled": True}}}
TYPES = {
    ToolCallRequested: "tool_call.requested",
    ToolCallCompleted: "tool_call.completed",
    CompactionRetried: "compaction.retried",
    RunEnded: "run.ended",
}
GUARD_SUBSYSTEM = "agents/post-compaction-guard"
WAIT_S = 60.0
RUNS = {  # scenario -> tool calls in the run
    "healthy": 12,
    "generic_repeat": 24,  # warning at 10 (emitted), 11..19 suppressed by the buckets, blocks from 20
    "polling_loop": 24,  # known_poll_no_progress
    "ping_pong": 24,
    "unknown_tool": 14,  # unknown_tool_repeat
    "post_compaction": 12,  # 6 reads, compaction (guard armed), 6 identical calls: abort
}


# -- the contract, read from docs/metrics.md --------------------------------------------------


def contract() -> dict[str, dict[str, Any]]:
    """metric -> {"type": …, "labels": {label: allowed values or None (open)}}."""
    out: dict[str, dict[str, Any]] = {}
    for line in (REPO / "docs" / "metrics.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.fullmatch(r"`(loopwatch_[a-z0-9_]+)`", cells[0]) if len(cells) >= 3 else None
        if not m:
            continue
        labels: dict[str, set[str] | None] = {}
        # `name` (`v1`, `v2`) or `name` (free text): a pure list of values is an enumeration.
        for name, paren in re.findall(r"`([a-z_]+)`(?:\s*\(([^)]*)\))?", cells[2]):
            values = [v.strip() for v in paren.split(",")] if paren else []
            enum = values and all(re.fullmatch(r"`[^`]+`", v) for v in values)
            labels[name] = {v.strip("`") for v in values} if enum else None
        out[m.group(1)] = {"type": cells[1], "labels": labels}
    assert len(out) >= 13, f"metrics table not found in docs/metrics.md: {sorted(out)}"
    return out


# -- traffic and what it must cause -----------------------------------------------------------


def stamped(events: list, ts_ms: int | None = None) -> list:
    """The events with the current time as event time (decision latency is measured from it)."""
    now = int(time.time() * 1000) if ts_ms is None else ts_ms
    return [msgspec.structs.replace(e, ts_ms=now) for e in events]


class Expected:
    """What a stream of events must add to each metric, from the engine alone (the worker's
    engine is conformance-checked elsewhere; this checks the counting and the wiring)."""

    def __init__(self, config: Any) -> None:
        self.engine = engine_for(config)
        self.states: dict[str, Any] = {}
        self.events: Counter = Counter()
        self.decisions: Counter = Counter()
        self.detections: Counter = Counter()
        self.suppressed: Counter = Counter()
        self.aborts: Counter = Counter()
        self.armings = 0
        self.latency_observations = 0

    def feed(self, events: list) -> None:
        for event in events:
            key = state_key(event)
            step = self.engine.handle(self.states.get(key), event)
            if step.state is None:
                self.states.pop(key, None)
            else:
                self.states[key] = step.state
            self.events[TYPES[type(event)]] += 1
            decision = step.decision
            if decision is not None:
                self.decisions[(decision.detector or "none", decision.level or "none", decision.action)] += 1
                detection = step.detection
                if detection is not None:
                    self.detections[(detection.detector, detection.level, event.tool_name)] += 1
                    if detection.level == "warning" and not decision.warning_emitted:
                        self.suppressed[detection.detector] += 1
                if event.gate or decision.action != "allow":
                    self.latency_observations += 1  # a published decision verdict
            if step.abort is not None:
                self.aborts[step.abort.detector] += 1
            if isinstance(event, CompactionRetried) and any(line.subsystem == GUARD_SUBSYSTEM for line in step.logs):
                self.armings += 1


def malformed_records(run_key: bytes) -> list[tuple[bytes | None, bytes, str]]:
    """One record per dead-letter reason of docs/metrics.md: (key, value, reason)."""
    return [
        (run_key, b"{not json", "invalid_json"),
        (
            run_key,
            json.dumps(
                {
                    "type": "tool_call.requested",
                    "event_id": "bad-1",
                    "run_id": "x",
                    "tool_name": "read",
                    "args_hash": "nothex",
                }
            ).encode(),
            "invalid_event",
        ),
        (
            run_key,
            json.dumps({"type": "tool_call.exploded", "event_id": "bad-2", "run_id": "x"}).encode(),
            "unknown_type",
        ),
        (
            run_key,
            json.dumps(
                {"type": "run.ended", "event_id": "bad-3", "run_id": "x", "reason": "y" * (MAX_EVENT_BYTES + 10)}
            ).encode(),
            "oversized",
        ),
        (None, json.dumps({"type": "run.ended", "event_id": "bad-4"}).encode(), "missing_key"),
        (
            b"another-run",
            json.dumps({"type": "run.ended", "event_id": "bad-5", "run_id": "x"}).encode(),
            "key_mismatch",
        ),
        (
            run_key,
            json.dumps({"type": "run.ended", "v": 2, "event_id": "bad-6", "run_id": "x"}).encode(),
            "unsupported_version",
        ),
    ]


# -- scraping with a deadline -----------------------------------------------------------------


async def until(port: int, check: Callable[[Snapshot], bool], what: str, timeout: float = WAIT_S) -> Snapshot:
    """Scrape every 0.2 s until ``check(snapshot)`` holds; fail naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    last: Snapshot | None = None
    while True:
        snap = scrape(port)
        if snap is not None:
            last = snap
            if check(snap):
                return snap
        if time.monotonic() > deadline:
            relevant = "\n".join(
                f"  {s.name}{s.labels} {s.value}"
                for s in (last.samples if last else [])
                if s.name.startswith("loopwatch_")
            )
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last scrape:\n{relevant}")
        await asyncio.sleep(0.2)


def delta(after: Snapshot, before: Snapshot, name: str, *keys: str) -> Counter:
    """Per label tuple, how much a counter grew (zero entries dropped)."""
    a, b = after.by(name, *keys), before.by(name, *keys)
    grown = Counter({k: v - b.get(k, 0.0) for k, v in a.items()})
    return Counter({(k[0] if len(k) == 1 else k): v for k, v in grown.items() if v})


def as_float_counter(counter: Counter) -> Counter:
    return Counter({k: float(v) for k, v in counter.items() if v})


def belongs(sample: str, family: str) -> bool:
    """``sample`` is a series of ``family``: itself, a histogram's ``_bucket``/``_sum``/``_count``,
    or the ``_created`` timestamp prometheus_client adds to counters and histograms."""
    base = family[: -len("_total")] if family.endswith("_total") else family
    return sample == family or sample.startswith(family + "_") or sample == base + "_created"


# -- the test ---------------------------------------------------------------------------------


async def test_every_metric_of_the_contract_moves(lw):
    spec = contract()
    path = lw.tmp / "loop-detection.json"
    write_config(path, CONFIG)
    worker = lw.worker(config=path).start()
    worker.wait_ready()
    port = worker.metrics_port

    # -- after start: ready, not recovering, nothing tracked, every family declared ---------
    def started(s: Snapshot) -> bool:
        return s.value("loopwatch_ready") == 1 and len(s.labels("loopwatch_consumer_lag_records", "partition")) == 4

    base = await until(port, started, "loopwatch_ready == 1 and consumer lag for the 4 partitions")
    for name, entry in spec.items():
        assert base.declared(name) == entry["type"], (
            f"{name}: declared as {base.declared(name)}, contract says {entry['type']}"
        )
    assert base.value("loopwatch_table_recovery_in_progress") == 0 and base.has("loopwatch_table_recovery_in_progress")
    assert base.has("loopwatch_runs_tracked") and base.value("loopwatch_runs_tracked") == 0
    assert base.has("loopwatch_guard_armings_total")
    assert all(s.value >= 0 for s in base.select("loopwatch_processing_errors_total"))

    # -- runs of every kind (not ended yet) ---------------------------------------------------
    tag = lw.names.tag
    runs = {kind: f"{tag}-{kind}" for kind in RUNS}
    events: list = []
    for kind, run_id in runs.items():
        events += run_events(kind, run_id, gate=True, length=RUNS[kind], end=False, seed=3)
    events = stamped(events)
    expected = Expected(CONFIG)
    expected.feed(events)
    n_events = sum(expected.events.values())
    await produce(lw.broker, lw.names.tool_calls, encode_all(events))

    def consumed(s: Snapshot) -> bool:
        return s.value("loopwatch_events_consumed_total") - base.value("loopwatch_events_consumed_total") >= n_events

    await until(port, consumed, f"{n_events} events consumed")
    loops = await until(port, lambda s: s.value("loopwatch_runs_tracked") == len(runs), f"runs_tracked == {len(runs)}")

    # events by type, decisions by detector/level/action: exactly what the engine says
    assert delta(loops, base, "loopwatch_events_consumed_total", "type") == as_float_counter(expected.events)
    decisions = delta(loops, base, "loopwatch_decisions_total", "detector", "level", "action")
    assert decisions == as_float_counter(expected.decisions)
    assert decisions[("none", "none", "allow")] >= RUNS["healthy"]  # every healthy call allowed
    assert decisions[("generic_repeat", "warning", "warn")] >= 1
    assert decisions[("generic_repeat", "critical", "block")] >= 1
    for detector in ("known_poll_no_progress", "ping_pong", "unknown_tool_repeat"):
        assert decisions[(detector, "critical", "block")] >= 1, f"no {detector} block counted: {decisions}"
    assert any(action == "allow" and level == "warning" for _, level, action in decisions), (
        "bucket-suppressed warnings are decisions with action allow, level warning"
    )

    # detections carry the tool; warning suppression and the abort are counted
    detections = delta(loops, base, "loopwatch_loop_detections_total", "detector", "level", "tool")
    assert detections == as_float_counter(expected.detections)
    tools = {(d, t) for d, _, t in detections}
    for seen in [
        ("generic_repeat", "web_search"),
        ("known_poll_no_progress", "process"),
        ("ping_pong", "read"),
        ("ping_pong", "list"),
        ("unknown_tool_repeat", "browser"),
    ]:
        assert seen in tools, f"no detection {seen}: {sorted(tools)}"
    suppressed = delta(loops, base, "loopwatch_warnings_suppressed_total", "detector")
    assert suppressed == as_float_counter(expected.suppressed)
    assert suppressed["generic_repeat"] >= 1
    aborts = delta(loops, base, "loopwatch_run_aborts_total", "detector")
    assert aborts == Counter({"compaction_loop_persisted": 1.0})
    armings = loops.value("loopwatch_guard_armings_total") - base.value("loopwatch_guard_armings_total")
    assert armings == expected.armings == 1

    # decision latency: one observation per published decision, in the documented buckets
    n_obs = loops.value("loopwatch_decision_latency_seconds_count") - base.value(
        "loopwatch_decision_latency_seconds_count"
    )
    assert n_obs == expected.latency_observations > 0
    buckets = loops.buckets("loopwatch_decision_latency_seconds")
    les = [le for le, _ in buckets]
    assert les[0] == 0.001 and les[-2] == 10.0 and les[-1] == float("inf"), f"buckets 1 ms … 10 s: {les}"
    counts = [n for _, n in buckets]
    assert counts == sorted(counts), "histogram buckets must be cumulative"
    assert counts[-1] == loops.value("loopwatch_decision_latency_seconds_count")
    before = dict(base.buckets("loopwatch_decision_latency_seconds"))
    assert dict(buckets)[10.0] - before.get(10.0, 0.0) == n_obs, "every decision within 10 s of its event"
    assert loops.value("loopwatch_decision_latency_seconds_sum") > base.value("loopwatch_decision_latency_seconds_sum")

    # -- malformed records: one dead letter per reason ----------------------------------------
    bad = malformed_records(f"{tag}-garbage".encode())
    await produce(lw.broker, lw.names.tool_calls, [(k, v) for k, v, _ in bad])
    want_dead = Counter({reason: 1.0 for _, _, reason in bad})
    dead = await until(
        port,
        lambda s: delta(s, loops, "loopwatch_dead_letters_total", "reason") == want_dead,
        f"dead letters {dict(want_dead)}",
    )
    # processing_error is the worker's own failure, not something a malformed record causes;
    # bad_signature, stale_event and replayed_event need signed events switched on (counted in
    # test_secure_kafka.py and test_signed_freshness.py).
    documented = spec["loopwatch_dead_letters_total"]["labels"]["reason"] - {
        "processing_error",
        "bad_signature",
        "stale_event",
        "replayed_event",
    }
    assert set(want_dead) == documented, "one record per documented input reason"
    assert delta(dead, loops, "loopwatch_events_consumed_total", "type") == Counter(), (
        "malformed records are not events"
    )

    # -- run.ended: runs_tracked back to zero -------------------------------------------------
    ends = stamped(
        [
            run_ended_event(
                f"{run_id}:end", reason="completed", run_id=run_id, session_key=f"agent:main:{run_id}", agent_id="main"
            )
            for run_id in runs.values()
        ]
    )
    expected.feed(ends)
    await produce(lw.broker, lw.names.tool_calls, encode_all(ends))
    ended = await until(
        port, lambda s: s.value("loopwatch_runs_tracked") == 0, "runs_tracked back to 0 after run.ended"
    )
    assert delta(ended, dead, "loopwatch_events_consumed_total", "type") == Counter({"run.ended": float(len(runs))})

    # -- lag: one series per partition of tool-calls, back to zero once all is committed ------
    final = await until(
        port,
        lambda s: (
            s.labels("loopwatch_consumer_lag_records", "partition") == {"0", "1", "2", "3"}
            and s.value("loopwatch_consumer_lag_records") == 0
        ),
        "consumer lag 0 on partitions 0-3 after everything was processed",
    )
    assert final.value("loopwatch_ready") == 1
    assert final.value("loopwatch_table_recovery_in_progress") == 0
    assert all(s.value >= 0 for s in final.select("loopwatch_processing_errors_total"))
    assert final.value("loopwatch_processing_errors_total") == 0

    # -- bounded cardinality --------------------------------------------------------------------
    forbidden = set()
    for event in events + ends:
        forbidden |= {event.run_id, event.session_key, event.event_id}
        args_hash = getattr(event, "args_hash", None)
        if args_hash:
            forbidden |= {args_hash, args_hash.split(":", 1)[1]}
    forbidden.discard(None)
    problems = []
    for s in final.samples:
        if not s.name.startswith("loopwatch_"):
            continue
        family = next((f for f in spec if belongs(s.name, f)), None)
        if family is None:
            problems.append(f"{s.name}: not in docs/metrics.md")
            continue
        allowed = dict(spec[family]["labels"])
        if spec[family]["type"] == "histogram":
            allowed["le"] = None
        for label, value in s.labels.items():
            if label not in allowed:
                problems.append(f"{s.name}: undocumented label {label}={value!r}")
            elif allowed[label] is not None and value not in allowed[label]:
                problems.append(f"{s.name}: {label}={value!r} not one of {sorted(allowed[label])}")
            if value in forbidden or tag in value or re.search(r"[0-9a-f]{16,}", value):
                problems.append(f"{s.name}: {label}={value!r} carries a run id, session key, event id or hash")
    assert not problems, "\n".join(problems)
    detectors = final.labels("loopwatch_decisions_total", "detector") | final.labels(
        "loopwatch_loop_detections_total", "detector"
    )
    assert all(re.fullmatch(r"[a-z_]+", d) for d in detectors), detectors
    assert final.labels("loopwatch_loop_detections_total", "tool") <= {
        "web_search",
        "process",
        "read",
        "list",
        "browser",
        "gateway",
        "exec",
        "write",
    }


async def test_documented_label_values_are_exported_at_zero(lw):
    """Counters whose label values are known in advance must be exported at 0 from the start.

    Without a series, Prometheus has nothing: a panel shows "No data" instead of 0, and
    ``rate()``/``increase()`` cannot count the step from "no series" to the first value, so the
    first abort, dead letter or processing error after a worker starts is invisible to the
    alert rules (see test_dashboards_prometheus).  Checked: every counter of docs/metrics.md
    with one label whose values the contract lists, and processing_errors (any stage: "0 is
    fine" needs a 0 to exist)."""
    spec = contract()
    worker = lw.worker().start()
    worker.wait_ready()
    snap = await until(worker.metrics_port, lambda s: s.value("loopwatch_ready") == 1, "loopwatch_ready == 1")
    missing = []
    for name, entry in spec.items():
        labels = entry["labels"]
        if entry["type"] != "counter" or len(labels) != 1:
            continue
        ((label, values),) = labels.items()
        if values is None:
            if name == "loopwatch_processing_errors_total" and not snap.has(name):
                missing.append(f"{name}{{{label}=...}} (no series at all)")
            continue
        missing += [f'{name}{{{label}="{v}"}}' for v in sorted(values) if not snap.has(name, **{label: v})]
    assert not missing, "no series at start for:\n  " + "\n  ".join(missing)
