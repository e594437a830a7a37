"""The Prometheus metrics of docs/metrics.md, on a registry of their own.

Hot-path counts are aggregated per batch by the processor (plain dicts) and added here once
per batch, so a 5,000-record batch costs a handful of ``inc`` calls, not 5,000.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from collections import Counter as Tally
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from itertools import accumulate
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    make_wsgi_app,
)
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from schemas.names import (
    ABORT_DETECTORS,
    ARGUMENT_CHURN,
    CANDIDATE,
    CONFIGS,
    DEAD_LETTER_REASONS,
    EVENT_TYPES,
    KNOWN_POLL_NO_PROGRESS,
    LEVELS,
    MODES,
    OUTCOMES,
    PING_PONG,
    WARNING_DETECTORS,
)

__all__ = ["BatchHistogram", "Metrics", "TOOL_LABEL_CAP", "LATENCY_BUCKETS"]

TOOL_LABEL_CAP = 200
"""``tool`` label values are the first 200 distinct tool names; later ones are ``other``."""

CONFIG_RELOAD_RESULTS = ("applied", "refused")
FLEET_RECORD_KINDS = ("outcome", "send")
ERROR_STAGES = ("decode", "state_decode", "state_encode", "engine", CANDIDATE)
VERDICT_LABELS = ["config", "mode"]
"""The labels every verdict metric ends with: which config decided (``live``, ``candidate``)
and in which mode (``enforce``, ``shadow``) that config runs the agent."""
LIVENESS_SIGNALS = (
    (ARGUMENT_CHURN, KNOWN_POLL_NO_PROGRESS),
    (ARGUMENT_CHURN, PING_PONG),
    (ARGUMENT_CHURN, ARGUMENT_CHURN),
)
"""(signal, detector) pairs a decision can carry (profile latest, openclaw-latest.md §5.1)."""

LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None, *, process_metrics: bool = True) -> None:
        self.registry = registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        if process_metrics:
            for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
                try:
                    registry.register(collector)
                except ValueError:  # already registered on a shared registry
                    pass
        self.events_consumed = Counter(
            "loopwatch_events_consumed", "valid events processed", ["type"], registry=registry
        )
        self.decisions = Counter(
            "loopwatch_decisions",
            "decisions made for requested calls (and, under profile latest, write-churn warnings raised by an outcome)",
            ["detector", "level", "action", *VERDICT_LABELS],
            registry=registry,
        )
        self.liveness_signals = Counter(
            "loopwatch_liveness_signals",
            "decisions flagging stalled run activity (profile latest's livenessSignal)",
            ["signal", "detector", *VERDICT_LABELS],
            registry=registry,
        )
        self.loop_detections = Counter(
            "loopwatch_loop_detections",
            "detections (emitted or bucket-suppressed) by tool",
            ["detector", "level", "tool", *VERDICT_LABELS],
            registry=registry,
        )
        self.warnings_suppressed = Counter(
            "loopwatch_warnings_suppressed",
            "warnings hidden by upstream's warning-bucket rule",
            ["detector", *VERDICT_LABELS],
            registry=registry,
        )
        self.run_aborts = Counter(
            "loopwatch_run_aborts", "run aborts published", ["detector", *VERDICT_LABELS], registry=registry
        )
        self.candidate_outcome_changes = Counter(
            "loopwatch_candidate_outcome_changes",
            "runs ended (run.ended) whose outcome under the candidate config "
            "differs from the live config's, by each one's outcome",
            ["live", "candidate"],
            registry=registry,
        )
        self.shadow_verdicts_lost = Counter(
            "loopwatch_shadow_verdicts_lost",
            "verdicts for the shadow topic not delivered (the topic missing or refusing them); the worker goes on",
            ["config"],
            registry=registry,
        )
        self.runs_tracked = Gauge("loopwatch_runs_tracked", "runs with state on this worker", registry=registry)
        self.guard_armings = Counter("loopwatch_guard_armings", "post-compaction guard armings", registry=registry)
        self.dead_letters = Counter(
            "loopwatch_dead_letters", "records sent to the dead-letter topic", ["reason"], registry=registry
        )
        self.decision_latency = BatchHistogram(
            "loopwatch_decision_latency_seconds",
            "event timestamp -> verdict produced",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.table_recovery_in_progress = Gauge(
            "loopwatch_table_recovery_in_progress", "1 while tables recover from changelogs", registry=registry
        )
        self.ready = Gauge("loopwatch_ready", "1 when /readyz would answer 200", registry=registry)
        self.processing_errors = Counter(
            "loopwatch_processing_errors",
            "unexpected errors (the record is dead-lettered, the worker continues)",
            ["stage"],
            registry=registry,
        )
        self.duplicate_events = Counter(
            "loopwatch_duplicate_events",
            "events skipped because their run already applied an event with the same id",
            registry=registry,
        )
        self.event_time_clamped = Counter(
            "loopwatch_event_time_clamped",
            "events whose ts_ms was too far ahead of the worker's clock (clamped to it)",
            registry=registry,
        )
        self.runs_evicted = Counter(
            "loopwatch_runs_evicted",
            "runs deleted because their agent held more than LOOPWATCH_MAX_RUNS_PER_AGENT on this worker",
            registry=registry,
        )
        self.states_trimmed = Counter(
            "loopwatch_state_trimmed",
            "run states over the size limit whose oldest history was dropped",
            registry=registry,
        )
        self.consumer_lag = Gauge(
            "loopwatch_consumer_lag_records",
            "end offset - committed offset of tool-calls",
            ["partition"],
            registry=registry,
        )
        self.config_reloads = Counter(
            "loopwatch_config_reloads",
            "config file changes applied or refused (the running config stays)",
            ["result", "config"],
            registry=registry,
        )
        self.config_file_refused = Gauge(
            "loopwatch_config_file_refused",
            "1 while the config file on disk is one this worker refused",
            ["config"],
            registry=registry,
        )
        self.detection_enabled = Gauge(
            "loopwatch_detection_enabled",
            "1 when the live config checks this agent's calls (tools.loopDetection.enabled), 0 when it allows them all",
            ["agent"],
            registry=registry,
        )
        # The fleet options' metrics (loopwatch.scope, fleetIncidents, agentRings): declared (and
        # their known label values at 0) on every worker; they move only where the config turns
        # the option on.
        self.events_forwarded = Counter(
            "loopwatch_events_forwarded",
            "tool-calls records repartitioned by session (loopwatch.scope: session)",
            registry=registry,
        )
        self.events_forwarded_again = Counter(
            "loopwatch_events_forwarded_again",
            "records forwarded by session again (a batch redone after a crash or "
            "a rebalance) that their session's state already holds: not applied twice",
            registry=registry,
        )
        self.fleet_records = Counter(
            "loopwatch_fleet_records",
            "records sent to the fleet topology: failing outcomes by tool, sends by trace",
            ["kind"],
            registry=registry,
        )
        self.fleet_incidents_open = Gauge(
            "loopwatch_fleet_incidents_open",
            "open fleet incidents by tool, as this worker's view holds them "
            "(every worker holds the same view: aggregate with max)",
            ["tool"],
            registry=registry,
        )
        self.fleet_incidents_opened = Counter(
            "loopwatch_fleet_incidents_opened",
            "fleet incidents opened (by the worker owning the tool)",
            ["tool"],
            registry=registry,
        )
        self.state_disk_full = Gauge(
            "loopwatch_state_disk_full",
            "1 once a write of the run table failed for a full disk (the worker stops)",
            registry=registry,
        )
        self.fleet_incidents_capped = Counter(
            "loopwatch_fleet_incidents_capped",
            "outcomes that qualified a tool for a fleet incident while maxOpenIncidents were open (not opened)",
            registry=registry,
        )
        self.fleet_outcomes_limited = Counter(
            "loopwatch_fleet_outcomes_limited",
            "fleet outcomes not counted: their agent added outcomes for maxToolsPerAgentPerMinute tools this minute",
            registry=registry,
        )
        self.fleet_incidents_resolved = Counter(
            "loopwatch_fleet_incidents_resolved",
            "fleet incidents resolved (by the worker owning the tool)",
            ["tool"],
            registry=registry,
        )
        self.fleet_incident_decisions = Counter(
            "loopwatch_fleet_incident_decisions",
            "decisions that carried an open fleet incident",
            registry=registry,
        )
        self.agent_rings = Counter(
            "loopwatch_agent_rings",
            "agent-ring notices published (a ring reaching a level or a new round)",
            ["level"],
            registry=registry,
        )
        self._tools: set[str] = set()
        # Export every known label value at 0 from the start: a series that first appears at
        # 1 hides that first increase from rate()/increase(), so a single abort or dead letter
        # would never raise its alert, and a healthy worker's error panel would show no data.
        for counter, values in (
            (self.events_consumed, EVENT_TYPES),
            (self.dead_letters, DEAD_LETTER_REASONS),
            (self.processing_errors, ERROR_STAGES),
            (self.shadow_verdicts_lost, CONFIGS),
        ):
            for value in values:
                counter.labels(value)
        for config in CONFIGS:
            for mode in MODES:
                for detector in ABORT_DETECTORS:
                    self.run_aborts.labels(detector, config, mode)
                for detector in WARNING_DETECTORS:
                    self.warnings_suppressed.labels(detector, config, mode)
                for signal, detector in LIVENESS_SIGNALS:
                    self.liveness_signals.labels(signal, detector, config, mode)
            for result in CONFIG_RELOAD_RESULTS:
                self.config_reloads.labels(result, config)
        for live in OUTCOMES:
            for candidate in OUTCOMES:
                if live != candidate:
                    self.candidate_outcome_changes.labels(live, candidate)
        for kind in FLEET_RECORD_KINDS:
            self.fleet_records.labels(kind)
        for level in LEVELS:
            self.agent_rings.labels(level)
        self._open_labels: set[str] = set()

    def set_open_incidents(self, tools: list[str]) -> None:
        """``loopwatch_fleet_incidents_open``: the open incidents by (bounded) tool label."""
        counts: dict[str, int] = defaultdict(int)
        for tool in tools:
            counts[self.tool_label(tool)] += 1
        for label in self._open_labels - set(counts):
            self.fleet_incidents_open.labels(label).set(0)
        for label, n in counts.items():
            self.fleet_incidents_open.labels(label).set(n)
        self._open_labels |= set(counts)

    # -- label hygiene ------------------------------------------------------------------------

    def tool_label(self, tool: str) -> str:
        """The bounded ``tool`` label: the first 200 distinct names, then ``other``."""
        tools = self._tools
        if tool in tools:
            return tool
        if len(tools) < TOOL_LABEL_CAP:
            tools.add(tool)
            return tool
        return "other"

    # -- per-batch application ----------------------------------------------------------------

    def count_error(self, stage: str) -> None:
        """An unexpected error at ``stage`` (one of ``ERROR_STAGES``)."""
        self.processing_errors.labels(stage).inc()

    def add(self, counter: Counter, counts: Mapping[tuple[str, ...] | str, int]) -> None:
        for labels, n in counts.items():
            if n:
                if isinstance(labels, tuple):
                    counter.labels(*labels).inc(n)
                else:
                    counter.labels(labels).inc(n)

    def serve(self, port: int, host: str = "0.0.0.0") -> object | None:
        """Serve ``/metrics`` on ``port`` (0: don't), in a thread.  Returns the server, or None.

        prometheus_client's own ``start_http_server`` answers every path with the metrics;
        this one answers only ``/metrics`` (and 404 elsewhere)."""
        if not port:
            return None
        server = make_server(host, port, _only_metrics(make_wsgi_app(self.registry)), _MetricsServer, _QuietHandler)
        threading.Thread(target=server.serve_forever, name="loopwatch-metrics", daemon=True).start()
        return server


class BatchHistogram:
    """A histogram observed a batch of values at a time (``observe_many``).

    prometheus_client's ``Histogram.observe`` takes a lock and walks the buckets in Python for
    every value: one call per verdict was a few per cent of the worker.  Here a batch's values
    are sorted into buckets with ``bisect`` and added under one lock, and the registry reads
    them as a custom collector, with the same samples (``_bucket`` with ``le``, ``_count``,
    ``_sum``) as prometheus_client's histogram (except its ``_created``).
    """

    def __init__(self, name: str, documentation: str, *, buckets: Sequence[float], registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self._bounds = [float(b) for b in buckets]
        if self._bounds != sorted(set(self._bounds)) or not self._bounds:
            raise ValueError(f"{name}: buckets must be increasing: {buckets!r}")
        if self._bounds[-1] != math.inf:
            self._bounds.append(math.inf)
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe_many(self, values: Iterable[float]) -> None:
        values = list(values)
        if not values:
            return
        bounds = self._bounds
        # A value goes into the first bucket whose bound is >= it (Prometheus' ``le``).
        slots = Tally(map(partial(bisect_left, bounds), values))
        total = sum(values)
        with self._lock:
            counts = self._counts
            for slot, n in slots.items():
                counts[slot] += n
            self._sum += total

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self.name, self.documentation)]

    def collect(self) -> list[HistogramMetricFamily]:
        with self._lock:
            counts = list(self._counts)
            total = self._sum
        cumulative = list(accumulate(counts))
        family = HistogramMetricFamily(
            self.name,
            self.documentation,
            buckets=[(floatToGoString(bound), n) for bound, n in zip(self._bounds, cumulative)],
            sum_value=total,
        )
        return [family]


class _MetricsServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass  # a scrape every few seconds would flood the worker's log


def _only_metrics(app):
    def serve(environ, start_response):
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"not found: metrics are on /metrics\n"]
        return app(environ, start_response)

    return serve
