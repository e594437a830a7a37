"""Grafana dashboards for loopwatch, as code.

    python -m streams.ops.dashboards            # (re)write helm/loopwatch/dashboards/*.json
    python -m streams.ops.dashboards --check    # exit 1 if the checked-in JSON is stale

Built with Grafana's ``grafana-foundation-sdk`` (typed builders generated from Grafana's own
schemas; the pinned release targets Grafana 11.6, installed by scripts/install-ops-tools.sh).
Output is deterministic: sorted keys, fixed uids, panel ids numbered in layout order, no
timestamps, so the files diff cleanly and ``--check`` can guard them in CI.

Every query uses only the metrics of docs/metrics.md, whose labels are bounded on purpose:
there is no agent, run or session label. That is why the second dashboard is a detector & tool
drill-down (template variables ``detector`` and ``tool``), not a per-agent view.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import bargauge as bargauge_b
from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.builders import prometheus as prometheus_b
from grafana_foundation_sdk.builders import stat as stat_b
from grafana_foundation_sdk.builders import table as table_b
from grafana_foundation_sdk.builders import timeseries as timeseries_b
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dashboard_m
from grafana_foundation_sdk.models import prometheus as prometheus_m

REPO_ROOT = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = REPO_ROOT / "helm" / "loopwatch" / "dashboards"
OPERATIONS_URL = "https://github.com/loopwatch/loopwatch/blob/main/docs/operations.md"

# Every panel queries the Prometheus data source picked in the `datasource` variable.
DATASOURCE = dashboard_m.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
ENFORCED = 'config="live", mode="enforce"'
"""The verdicts runners were given: the live config's, for agents in enforce mode (docs/metrics.md).
Every other panel of verdicts counts only these; the shadow row shows the rest."""
LATENCY_OBJECTIVE_S = 0.05  # keep in line with LoopwatchDecisionLatencyHigh

# Threshold colour steps; the first step's value is null (= from -infinity).
GREEN, YELLOW, RED = "green", "yellow", "red"


def _steps(*steps: tuple[float | None, str]) -> dashboard_b.ThresholdsConfig:
    return (
        dashboard_b.ThresholdsConfig()
        .mode(dashboard_m.ThresholdsMode.ABSOLUTE)
        .steps([dashboard_m.Threshold(value=v, color=c) for v, c in steps])
    )


def _query(expr: str, legend: str = "__auto", ref: str = "A", instant: bool = False) -> prometheus_b.Dataquery:
    q = prometheus_b.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)
    if instant:
        q = q.instant().format(prometheus_m.PromQueryFormat.TABLE)
    else:
        q = q.range()
    return q


@dataclass(frozen=True)
class Q:
    """One PromQL query of a panel."""

    expr: str
    legend: str = "__auto"


class Layout:
    """Numbers panels in the order they are added, so ids are stable across runs."""

    def __init__(self) -> None:
        self.next_id = 1

    def id(self) -> int:
        value = self.next_id
        self.next_id += 1
        return value


def _targets(queries: Sequence[Q], instant: bool = False) -> list[prometheus_b.Dataquery]:
    return [_query(q.expr, q.legend, chr(ord("A") + i), instant) for i, q in enumerate(queries)]


def timeseries(
    layout: Layout,
    title: str,
    description: str,
    queries: Sequence[Q],
    unit: str = "short",
    width: int = 12,
    height: int = 8,
    stack: bool = False,
    thresholds: dashboard_b.ThresholdsConfig | None = None,
    bars: bool = False,
    max_val: float | None = None,
) -> timeseries_b.Panel:
    panel = (
        timeseries_b.Panel()
        .id(layout.id())
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(queries))
        .unit(unit)
        .min(0)
        .span(width)
        .height(height)
        .fill_opacity(10)
        .line_width(1)
        .show_points(common_m.VisibilityMode.NEVER)
        .legend(
            common_b.VizLegendOptions()
            .display_mode(common_m.LegendDisplayMode.TABLE)
            .placement(common_m.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["mean", "max", "lastNotNull"])
        )
        .tooltip(
            common_b.VizTooltipOptions().mode(common_m.TooltipDisplayMode.MULTI).sort(common_m.SortOrder.DESCENDING)
        )
    )
    if max_val is not None:
        panel = panel.max(max_val)
    if stack:
        panel = panel.stacking(common_b.StackingConfig().mode(common_m.StackingMode.NORMAL))
    if bars:
        panel = panel.draw_style(common_m.GraphDrawStyle.BARS).fill_opacity(80)
    if thresholds is not None:
        panel = panel.thresholds(thresholds).thresholds_style(
            common_b.GraphThresholdsStyleConfig().mode(common_m.GraphThresholdsStyleMode.LINE)
        )
    return panel


def stat(
    layout: Layout,
    title: str,
    description: str,
    query: Q,
    unit: str = "short",
    thresholds: dashboard_b.ThresholdsConfig | None = None,
    width: int = 4,
    decimals: float | None = None,
) -> stat_b.Panel:
    panel = (
        stat_b.Panel()
        .id(layout.id())
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets([query]))
        .unit(unit)
        .span(width)
        .height(4)
        .graph_mode(common_m.BigValueGraphMode.AREA)
        .color_mode(common_m.BigValueColorMode.VALUE)
        .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(thresholds or _steps((None, GREEN)))
    )
    if decimals is not None:
        panel = panel.decimals(decimals)
    return panel


def row(title: str, layout: Layout) -> dashboard_b.Row:
    return dashboard_b.Row(title).id(layout.id())


def datasource_variable() -> dashboard_b.DatasourceVariable:
    return (
        dashboard_b.DatasourceVariable("datasource")
        .label("Data source")
        .type("prometheus")
        .description("Prometheus that scrapes the loopwatch workers")
    )


def dashboard(uid: str, title: str, description: str, tags: list[str]) -> dashboard_b.Dashboard:
    return (
        dashboard_b.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(tags)
        .editable()
        .timezone("browser")
        .time("now-6h", "now")
        .refresh("30s")
        .tooltip(dashboard_m.DashboardCursorSync.CROSSHAIR)
        .link(
            dashboard_b.DashboardLink("Loopwatch dashboards")
            .type(dashboard_m.DashboardLinkType.DASHBOARDS)
            .tags(["loopwatch"])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
        .link(
            dashboard_b.DashboardLink("Runbooks")
            .type(dashboard_m.DashboardLinkType.LINK)
            .url(OPERATIONS_URL)
            .icon("doc")
            .target_blank(True)
        )
        .with_variable(datasource_variable())
    )


# --------------------------------------------------------------------------------------------
# Fleet overview
# --------------------------------------------------------------------------------------------


def fleet() -> dashboard_b.Dashboard:
    L = Layout()
    d = dashboard(
        "loopwatch-fleet",
        "Loopwatch / Fleet overview",
        "Tool-call loops across the whole fleet of agent runners, as seen by the loopwatch "
        "stream processor: detections, blocks, run aborts, decision latency, dead letters and "
        "worker health. Metrics: docs/metrics.md.",
        ["loopwatch", "kafka"],
    )

    d = d.with_row(row("Overview", L))
    for panel in (
        stat(
            L,
            "Blocked calls / min",
            "Tool calls blocked per minute, whole fleet (LoopwatchLoopStorm fires above 30 for 10m).",
            Q(f'sum(rate(loopwatch_decisions_total{{action="block", {ENFORCED}}}[5m])) * 60'),
            unit="short",
            thresholds=_steps((None, GREEN), (10, YELLOW), (30, RED)),
            decimals=1,
        ),
        stat(
            L,
            "Loops detected / min",
            "Loop detections per minute (all detectors, levels and tools).",
            Q(f"sum(rate(loopwatch_loop_detections_total{{{ENFORCED}}}[5m])) * 60"),
            decimals=1,
        ),
        stat(
            L,
            "Run aborts (range)",
            "Agent runs aborted by loopwatch in the selected time range.",
            Q(f"sum(increase(loopwatch_run_aborts_total{{{ENFORCED}}}[$__range]))"),
            thresholds=_steps((None, GREEN), (1, YELLOW)),
            decimals=0,
        ),
        stat(
            L,
            "p99 decision latency",
            "99th percentile of event timestamp -> verdict over 5m (objective 50 ms).",
            Q("histogram_quantile(0.99, sum by (le) (rate(loopwatch_decision_latency_seconds_bucket[5m])))"),
            unit="s",
            thresholds=_steps((None, GREEN), (LATENCY_OBJECTIVE_S, RED)),
        ),
        stat(
            L,
            "Workers ready",
            "Workers whose /readyz answers 200, out of the workers Prometheus sees.",
            Q("sum(loopwatch_ready)"),
            thresholds=_steps((None, RED), (1, GREEN)),
            decimals=0,
        ),
        stat(
            L,
            "Consumer lag",
            "Records of tool-calls not yet processed, summed over partitions.",
            Q("sum(max by (partition) (loopwatch_consumer_lag_records))"),
            thresholds=_steps((None, GREEN), (1000, YELLOW), (10000, RED)),
            decimals=0,
        ),
    ):
        d = d.with_panel(panel)

    d = d.with_row(row("Loops", L))
    d = d.with_panel(
        timeseries(
            L,
            "Loops per minute by detector",
            "Loop detections per minute by detector (emitted or suppressed by the warning bucket).",
            [
                Q(
                    f"sum by (detector) (rate(loopwatch_loop_detections_total{{{ENFORCED}}}[{RATE}])) * 60",
                    "{{detector}}",
                )
            ],
            stack=True,
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Blocked calls per minute by detector",
            "Requested tool calls that got a block verdict, per minute, by the detector that blocked them.",
            [
                Q(
                    f'sum by (detector) (rate(loopwatch_decisions_total{{action="block", {ENFORCED}}}[{RATE}])) * 60',
                    "{{detector}}",
                )
            ],
            stack=True,
            thresholds=_steps((None, GREEN), (30, RED)),
        )
    )
    d = d.with_panel(
        bargauge_b.Panel()
        .id(L.id())
        .title("Top tools in loops")
        .description(
            "The 10 tools with the most loop detections in the selected range. `other` "
            "collects tools beyond the first 200 distinct names a worker saw."
        )
        .datasource(DATASOURCE)
        .targets(
            _targets(
                [
                    Q(
                        f"topk(10, sum by (tool) (increase(loopwatch_loop_detections_total{{{ENFORCED}}}[$__range])))",
                        "{{tool}}",
                    )
                ],
                instant=True,
            )
        )
        .unit("short")
        .decimals(0)
        .min(0)
        .span(12)
        .height(8)
        .orientation(common_m.VizOrientation.HORIZONTAL)
        .display_mode(common_m.BarGaugeDisplayMode.GRADIENT)
        .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(_steps((None, GREEN), (100, YELLOW), (1000, RED)))
    )
    d = d.with_panel(
        timeseries(
            L,
            "Decisions per second by action",
            "All verdicts for requested calls: allow, warn and block.",
            [Q(f"sum by (action) (rate(loopwatch_decisions_total{{{ENFORCED}}}[{RATE}]))", "{{action}}")],
            unit="ops",
            stack=True,
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Run aborts by detector",
            "Agent runs aborted per 5 minutes: compaction_loop_persisted (loop survived a compaction) "
            "or critical_block_limit (loopwatch.abortAfterCriticalBlocks reached).",
            [Q(f"sum by (detector) (increase(loopwatch_run_aborts_total{{{ENFORCED}}}[5m]))", "{{detector}}")],
            bars=True,
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Warnings suppressed and guard armings per minute",
            "Warnings hidden by upstream's warning-bucket rule, by detector, and post-compaction guard armings.",
            [
                Q(
                    f"sum by (detector) (rate(loopwatch_warnings_suppressed_total{{{ENFORCED}}}[{RATE}])) * 60",
                    "suppressed {{detector}}",
                ),
                Q(f"sum(rate(loopwatch_guard_armings_total[{RATE}])) * 60", "guard armings"),
            ],
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Argument churn per minute (liveness signal)",
            "Profile latest: decisions flagging a run that cycles through argument variants without "
            "getting anywhere (livenessSignal argument_churn), by the detector that decided: "
            "argument_churn warnings, and poll or ping-pong warnings that also churn.",
            [
                Q(
                    f"sum by (detector) (rate(loopwatch_liveness_signals_total{{{ENFORCED}}}[{RATE}])) * 60",
                    "{{detector}}",
                )
            ],
            stack=True,
            width=24,
        )
    )

    d = d.with_row(row("Fleet-wide (loopwatch.fleetIncidents, agentRings, scope)", L))
    d = d.with_panel(
        timeseries(
            L,
            "Fleet incidents open by tool",
            "Tools failing the same way in many runs of several agents (loopwatch.fleetIncidents), as every "
            "worker's view holds them (max over workers). Details on the loop-incidents topic; see "
            "LoopwatchToolOutage.",
            # (A tool's series exists from its first incident on: "none" at 0 until then, so that
            # the panel shows no incidents rather than no data.)
            [
                Q(
                    'max by (tool) (loopwatch_fleet_incidents_open) or on() label_replace(vector(0), "tool", "none", "", "")',
                    "{{tool}}",
                )
            ],
            width=8,
            stack=True,
            thresholds=_steps((None, GREEN), (1, RED)),
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Fleet incidents and agent rings per 10 minutes",
            "Incidents opened and resolved (by the worker owning the tool), decisions that told a run its "
            "tool is failing across the fleet, and agent-ring notices by level (a ring reaching a level, "
            "or a new round at it). The limits' refusals (alert LoopwatchFleetIncidentsLimited): outcomes "
            "of a tool that qualified while maxOpenIncidents were open, and outcomes not counted by the "
            "per-agent rate limit (maxToolsPerAgentPerMinute).",
            [
                Q("sum(increase(loopwatch_fleet_incidents_opened_total[10m])) or vector(0)", "incidents opened"),
                Q("sum(increase(loopwatch_fleet_incidents_resolved_total[10m])) or vector(0)", "incidents resolved"),
                Q("sum(increase(loopwatch_fleet_incident_decisions_total[10m]))", "decisions carrying an incident"),
                Q("sum by (level) (increase(loopwatch_agent_rings_total[10m]))", "ring notices ({{level}})"),
                Q("sum(increase(loopwatch_fleet_incidents_capped_total[10m]))", "refused: maxOpenIncidents open"),
                Q("sum(increase(loopwatch_fleet_outcomes_limited_total[10m]))", "refused: per-agent rate limit"),
            ],
            width=8,
            bars=True,
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Repartitioned records per second",
            "What the options send through the workers' internal topics: tool-calls records repartitioned "
            "by session (loopwatch.scope: session; 'forwarded again': copies after a crash or a rebalance "
            "that their session's state already held, not applied twice), and completed calls for the fleet "
            "topology (failing outcomes by tool, sends by trace).",
            [
                Q(f"sum(rate(loopwatch_events_forwarded_total[{RATE}]))", "by session"),
                Q(f"sum(rate(loopwatch_events_forwarded_again_total[{RATE}]))", "forwarded again"),
                Q(f"sum by (kind) (rate(loopwatch_fleet_records_total[{RATE}]))", "fleet {{kind}}"),
            ],
            unit="ops",
            width=8,
        )
    )

    d = d.with_row(row("Latency", L))
    d = d.with_panel(
        timeseries(
            L,
            "Decision latency p50 / p99 / p99.9",
            "Event timestamp -> verdict produced. Includes consumer lag, so it rises when workers fall "
            "behind. The line marks the 50 ms objective of LoopwatchDecisionLatencyHigh.",
            [
                Q(
                    f"histogram_quantile({q}, sum by (le) (rate(loopwatch_decision_latency_seconds_bucket[{RATE}])))",
                    name,
                )
                for q, name in (("0.5", "p50"), ("0.99", "p99"), ("0.999", "p99.9"))
            ],
            unit="s",
            thresholds=_steps((None, GREEN), (LATENCY_OBJECTIVE_S, RED)),
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Events consumed per second by type",
            "Valid events processed, by event type.",
            [Q(f"sum by (type) (rate(loopwatch_events_consumed_total[{RATE}]))", "{{type}}")],
            unit="ops",
            stack=True,
        )
    )

    d = d.with_row(row("Input quality", L))
    d = d.with_panel(
        timeseries(
            L,
            "Dead letters per minute by reason",
            "Records sent to the dead-letter topic. These tool calls get no loop protection.",
            [Q(f"sum by (reason) (rate(loopwatch_dead_letters_total[{RATE}])) * 60", "{{reason}}")],
            width=8,
            stack=True,
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Processing errors per minute by stage",
            "Unexpected errors; the worker continues (decode/engine: the record is dead-lettered; "
            "state_decode: the run starts afresh; state_encode: a run whose state cannot be stored is dropped).",
            [Q(f"sum by (stage) (rate(loopwatch_processing_errors_total[{RATE}])) * 60", "{{stage}}")],
            width=8,
            stack=True,
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Retries, runner clocks and state limits per minute",
            "Events skipped as duplicates of an event id their run already applied (runner retries), "
            "event times clamped to the worker's clock (a runner's clock far ahead), run states "
            "trimmed to the 1 MB limit, and runs deleted because their agent held more than "
            "LOOPWATCH_MAX_RUNS_PER_AGENT on a worker.",
            [
                Q(f"sum(rate(loopwatch_duplicate_events_total[{RATE}])) * 60", "duplicate events"),
                Q(f"sum(rate(loopwatch_event_time_clamped_total[{RATE}])) * 60", "event times clamped"),
                Q(f"sum(rate(loopwatch_state_trimmed_total[{RATE}])) * 60", "states trimmed"),
                Q(f"sum(rate(loopwatch_runs_evicted_total[{RATE}])) * 60", "runs over the per-agent cap deleted"),
            ],
            width=8,
        )
    )

    d = shadow_row(d, L)

    d = d.with_row(row("Workers", L))
    d = d.with_panel(
        timeseries(
            L,
            "Worker ready",
            "1 when the worker's /readyz answers 200 (tables recovered, not rebalancing, a broker answers). "
            '"state disk full": 1 once a run-table write failed for a full disk, in the 30 s before the '
            "worker stops (docs/operations.md: alert-loopwatchworkernotready).",
            [Q("loopwatch_ready", "{{instance}}"), Q("loopwatch_state_disk_full", "state disk full {{instance}}")],
            width=8,
            max_val=1,
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Table recovery in progress",
            "1 while a worker restores its RocksDB tables from the changelog topics.",
            [Q("loopwatch_table_recovery_in_progress", "{{instance}}")],
            width=8,
            max_val=1,
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Runs tracked per worker",
            "Runs with state on each worker; uneven values mean skewed partitions.",
            [Q("loopwatch_runs_tracked", "{{instance}}")],
            width=8,
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Consumer lag by partition",
            "End offset - committed offset of tool-calls, per partition (max over workers, "
            "as a partition that just moved may still be reported by its previous owner).",
            [Q("max by (partition) (loopwatch_consumer_lag_records)", "partition {{partition}}")],
            width=24,
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Config reloads and refusals",
            "Changes of the loop-detection config file per 10 minutes: applied, or refused (empty, "
            "unparsable, not UTF-8, invalid) while the running config stays. See LoopwatchConfigRefused.",
            [Q("sum by (config, result) (increase(loopwatch_config_reloads_total[10m]))", "{{config}} {{result}}")],
            bars=True,
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Config file refused",
            "1 while the config file on disk is one the worker refused: it runs its previous config.",
            [Q("loopwatch_config_file_refused", "{{config}} {{instance}}")],
            max_val=1,
            thresholds=_steps((None, GREEN), (1, RED)),
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Detection on, per agent",
            "1 when the live config checks the agent's calls, 0 when tools.loopDetection.enabled is not true "
            "and every call is allowed unchecked (alert LoopwatchDetectionOff).",
            [Q("loopwatch_detection_enabled", "{{agent}} {{instance}}")],
            max_val=1,
            thresholds=_steps((None, RED), (1, GREEN)),
        )
    )
    return d


def shadow_row(d: dashboard_b.Dashboard, L: Layout) -> dashboard_b.Dashboard:
    """What runners were not told: the candidate config against the live one, and the agents in
    shadow mode.  Live means the live config in either mode (what it decides), so the two
    configs compare on the same stream."""
    d = d.with_row(row("Shadow: candidate config against live, agents in shadow mode", L))
    for action, title in (("warn", "Warnings"), ("block", "Blocks")):
        d = d.with_panel(
            timeseries(
                L,
                f"{title} per minute by detector: live vs candidate",
                f"{title} per minute the live config and the candidate config (LOOPWATCH_CANDIDATE_CONFIG) decide on "
                "the same events, by detector. Only the live config's, for agents in enforce mode, reached runners.",
                [
                    Q(
                        f'sum by (config, detector) (rate(loopwatch_decisions_total{{action="{action}"}}[{RATE}])) * 60',
                        "{{config}} {{detector}}",
                    )
                ],
                width=8,
            )
        )
    d = d.with_panel(
        timeseries(
            L,
            "Aborts per minute by detector: live vs candidate",
            "Run aborts per minute under the live config and under the candidate config, by detector.",
            [
                Q(
                    f"sum by (config, detector) (rate(loopwatch_run_aborts_total[{RATE}])) * 60",
                    "{{config}} {{detector}}",
                )
            ],
            width=8,
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Runs whose outcome would differ",
            "Runs ended per 10 minutes whose outcome (strongest verdict: none, warn, block, abort) under the candidate "
            "config differs from the live config's, as live -> candidate. Only runs the candidate saw from their "
            "first event count.",
            [
                Q(
                    "sum by (live, candidate) (increase(loopwatch_candidate_outcome_changes_total[10m]))",
                    "{{live}} -> {{candidate}}",
                )
            ],
            width=12,
            bars=True,
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Agents in shadow mode: would-fire per minute",
            "Warnings, blocks and aborts the live config decided for agents in loopwatch.mode shadow: published to "
            "the shadow topic only, their runners got an allow.",
            [
                Q(
                    f'sum by (action) (rate(loopwatch_decisions_total{{config="live", mode="shadow", action!="allow"}}'
                    f"[{RATE}])) * 60",
                    "{{action}}",
                ),
                Q(f'sum(rate(loopwatch_run_aborts_total{{config="live", mode="shadow"}}[{RATE}])) * 60', "abort"),
            ],
            width=12,
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Shadow verdicts lost",
            "Verdicts for the shadow topic not delivered per 10 minutes (the topic missing, or this worker not "
            "allowed to write it). Runners are never affected; the comparison is incomplete.",
            [Q("sum by (config) (increase(loopwatch_shadow_verdicts_lost_total[10m]))", "{{config}}")],
            width=24,
            bars=True,
        )
    )
    return d


# --------------------------------------------------------------------------------------------
# Detector & tool drill-down
# --------------------------------------------------------------------------------------------

DETECTION_SELECTOR = f'detector=~"$detector", tool=~"$tool", {ENFORCED}'


def drilldown() -> dashboard_b.Dashboard:
    L = Layout()
    d = dashboard(
        "loopwatch-drilldown",
        "Loopwatch / Detector & tool drill-down",
        "Drill into loop detections by detector and tool. There is deliberately no per-agent "
        "or per-run view: the metrics contract (docs/metrics.md) keeps labels bounded and "
        "carries no agent, run or session label, so cardinality stays flat however many agents "
        "run. To follow one agent or run, read its verdicts on the loop-verdicts topic; here, "
        "pick detectors and tools to see how and where loops happen.",
        ["loopwatch", "kafka"],
    )
    d = d.with_variable(
        dashboard_b.QueryVariable("detector")
        .label("Detector")
        .description("Detector(s) to drill into")
        .datasource(DATASOURCE)
        .query(
            {
                "qryType": 1,
                "query": "label_values(loopwatch_loop_detections_total, detector)",
                "refId": "PrometheusVariableQueryEditor-VariableQuery",
            }
        )
        .refresh(dashboard_m.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard_m.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(dashboard_m.VariableOption(selected=True, text=["All"], value=["$__all"]))
    ).with_variable(
        dashboard_b.QueryVariable("tool")
        .label("Tool")
        .description("Tool(s) to drill into; only tools seen by the selected detectors")
        .datasource(DATASOURCE)
        .query(
            {
                "qryType": 1,
                "query": 'label_values(loopwatch_loop_detections_total{detector=~"$detector"}, tool)',
                "refId": "PrometheusVariableQueryEditor-VariableQuery",
            }
        )
        .refresh(dashboard_m.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard_m.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(dashboard_m.VariableOption(selected=True, text=["All"], value=["$__all"]))
    )

    d = d.with_row(row("Selected detectors and tools", L))
    for panel in (
        stat(
            L,
            "Detections / min",
            "Detections per minute for the selection.",
            Q(f"sum(rate(loopwatch_loop_detections_total{{{DETECTION_SELECTOR}}}[5m])) * 60"),
            width=6,
            decimals=1,
        ),
        stat(
            L,
            "Critical detections (range)",
            "Critical-level detections for the selection in the range.",
            Q(f'sum(increase(loopwatch_loop_detections_total{{{DETECTION_SELECTOR}, level="critical"}}[$__range]))'),
            thresholds=_steps((None, GREEN), (1, YELLOW)),
            width=6,
            decimals=0,
        ),
        stat(
            L,
            "Share of all detections",
            "Selection's share of all loop detections in the range.",
            Q(
                f"sum(increase(loopwatch_loop_detections_total{{{DETECTION_SELECTOR}}}[$__range])) "
                f"/ sum(increase(loopwatch_loop_detections_total{{{ENFORCED}}}[$__range]))"
            ),
            unit="percentunit",
            width=6,
        ),
        stat(
            L,
            "Blocks / min (selected detectors)",
            "Block verdicts per minute from the selected detectors (decisions carry no tool label).",
            Q(f'sum(rate(loopwatch_decisions_total{{detector=~"$detector", action="block", {ENFORCED}}}[5m])) * 60'),
            width=6,
            decimals=1,
        ),
    ):
        d = d.with_panel(panel)

    d = d.with_panel(
        timeseries(
            L,
            "Detections per minute by level",
            "Warning vs critical detections for the selection.",
            [
                Q(
                    f"sum by (level) (rate(loopwatch_loop_detections_total{{{DETECTION_SELECTOR}}}[{RATE}])) * 60",
                    "{{level}}",
                )
            ],
            stack=True,
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Detections per minute by tool",
            "Which of the selected tools loop, and when.",
            [
                Q(
                    f"sum by (tool) (rate(loopwatch_loop_detections_total{{{DETECTION_SELECTOR}}}[{RATE}])) * 60",
                    "{{tool}}",
                )
            ],
            stack=True,
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Detections per minute by detector",
            "Which detectors fire for the selected tools.",
            [
                Q(
                    f"sum by (detector) (rate(loopwatch_loop_detections_total{{{DETECTION_SELECTOR}}}[{RATE}])) * 60",
                    "{{detector}}",
                )
            ],
            stack=True,
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Decisions per minute by action (selected detectors)",
            "Verdicts made by the selected detectors: warn vs block.",
            [
                Q(
                    f'sum by (action) (rate(loopwatch_decisions_total{{detector=~"$detector", action!="allow", {ENFORCED}}}[{RATE}])) * 60',
                    "{{action}}",
                )
            ],
            stack=True,
        )
    )

    d = d.with_row(row("Details", L))
    d = d.with_panel(
        table_b.Panel()
        .id(L.id())
        .title("Detections by detector, level and tool")
        .description("Detections in the selected range, largest first.")
        .datasource(DATASOURCE)
        .targets(
            _targets(
                [
                    Q(
                        f"sort_desc(sum by (detector, level, tool) "
                        f"(increase(loopwatch_loop_detections_total{{{DETECTION_SELECTOR}}}[$__range])))"
                    )
                ],
                instant=True,
            )
        )
        .decimals(0)
        .span(12)
        .height(10)
        .with_transformation(
            dashboard_m.DataTransformerConfig(
                id_val="organize", options={"excludeByName": {"Time": True}, "renameByName": {"Value": "detections"}}
            )
        )
    )
    d = d.with_panel(
        timeseries(
            L,
            "Warnings suppressed per minute (selected detectors)",
            "Warnings hidden by the warning-bucket rule; high values mean runs keep looping just "
            "below the critical threshold.",
            [
                Q(
                    f'sum by (detector) (rate(loopwatch_warnings_suppressed_total{{detector=~"$detector", {ENFORCED}}}[{RATE}])) * 60',
                    "{{detector}}",
                )
            ],
            height=10,
        )
    )
    return d


DASHBOARDS: dict[str, Callable[[], dashboard_b.Dashboard]] = {
    "loopwatch-fleet.json": fleet,
    # File name kept from the chart's first layout; the content is the detector & tool
    # drill-down, since the metrics carry no agent label (see module docstring).
    "loopwatch-agent.json": drilldown,
}


def render(builder: dashboard_b.Dashboard) -> str:
    return json.dumps(builder.build(), cls=JSONEncoder, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def render_all() -> dict[str, str]:
    return {name: render(build()) for name, build in sorted(DASHBOARDS.items())}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streams.ops.dashboards", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="do not write; exit 1 if the files differ from what the generator produces"
    )
    parser.add_argument("--out-dir", type=Path, default=DASHBOARD_DIR, help=f"default: {DASHBOARD_DIR}")
    args = parser.parse_args(argv)

    stale = []
    for name, text in render_all().items():
        path = args.out_dir / name
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        for path in stale:
            print(f"stale: {path}", file=sys.stderr)
        print("run `python -m streams.ops.dashboards` and commit the result", file=sys.stderr)
        return 1
    if args.check:
        print(f"dashboards up to date in {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
