"""The Grafana dashboards and alert rules against a real Prometheus scraping a live worker.

One worker (real broker, ``lw_module``) and Debian's ``prometheus`` binary as subprocesses:
Prometheus scrapes the worker's ``/metrics`` every second as ``job="loopwatch"`` and loads
``helm/loopwatch/files/alerts.rules.yml``.  ``loopwatch demo``'s simulated runners
(``streams.ops.traffic``: every scenario, runner client in gate mode) and a few malformed
records keep the worker busy for ``TRAFFIC_S`` seconds.  Then every query of every panel of
every dashboard under ``helm/loopwatch/dashboards/`` goes through Prometheus' HTTP API, with
Grafana's variables substituted the way Grafana would (built-in intervals; query variables
resolved through Prometheus like Grafana's ``label_values``; ``All`` as the variable's
``allValue``): each must parse and return data.  The same queries with concrete variable
values must parse too, and the alert rules must be loaded and evaluate without errors.

The worker runs the example config with one agent in shadow mode (``trial``, which a probe
drives into a block and an abort) and a candidate config (stricter thresholds, ping-pong
off, runs ended at their second block), so that the shadow row of the fleet dashboard has
something to show.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from harness import REPO, encode_all, free_port, produce, wait_http_ok
from streams.offline.scenarios import run_events

pytestmark = pytest.mark.kafka

DASHBOARDS = REPO / "helm" / "loopwatch" / "dashboards"
RULES = REPO / "helm" / "loopwatch" / "files" / "alerts.rules.yml"
CONFIG = REPO / "examples" / "loop-detection.yaml"
SHADOW_AGENT = {"id": "trial", "loopwatch": {"mode": "shadow"}}
CANDIDATE = {
    "tools": {
        "loopDetection": {
            "enabled": True,
            "warningThreshold": 5,
            "criticalThreshold": 8,
            "detectors": {"pingPong": False},
        }
    },
    "loopwatch": {"abortAfterCriticalBlocks": 2},
}
"""Blocks loops earlier than the live config, and ends a run at its second block: the fleet's
looping runs, blocked under the live config, are aborted under this one."""
TRAFFIC_S = 35.0
SCRAPE_S = 1
# Grafana's built-in interval variables, as a ~1000 px wide panel would get them with a 1 s
# scrape interval: $__interval ~ range/1000 (capped here), $__rate_interval >= 4 scrapes.
# One minute of rate covers the whole traffic window, so rates are not zero at query time.
INTERVAL = "15s"
RATE_INTERVAL = "1m"
UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


# -- the dashboards ---------------------------------------------------------------------------


def load_dashboards() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(DASHBOARDS.glob("*.json"))}


def panels(dashboard: dict) -> list[dict]:
    out = []
    for p in dashboard.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []))  # panels inside collapsed rows
    return [p for p in out if p.get("type") != "row"]


@dataclass(frozen=True)
class Target:
    dashboard: str
    panel: str
    panel_id: int
    ref: str
    expr: str
    instant: bool
    range: bool

    def __str__(self) -> str:
        return f"{self.dashboard} / panel {self.panel_id} {self.panel!r} / {self.ref}: {self.expr}"


def all_targets() -> list[Target]:
    out = []
    for name, dashboard in load_dashboards().items():
        for panel in panels(dashboard):
            for target in panel.get("targets") or []:
                if target.get("hide") or not target.get("expr"):
                    continue
                out.append(
                    Target(
                        name,
                        panel.get("title", ""),
                        panel.get("id", 0),
                        target.get("refId", "?"),
                        target["expr"],
                        bool(target.get("instant")),
                        bool(target.get("range", not target.get("instant"))),
                    )
                )
    return out


TARGETS = all_targets()


def duration_s(text: str) -> int:
    m = re.fullmatch(r"(\d+)([smhdw])", text)
    if not m:
        raise ValueError(f"not a Grafana duration: {text!r}")
    return int(m.group(1)) * UNITS_S[m.group(2)]


def builtins(dashboard: dict) -> dict[str, str]:
    """Grafana's global variables for the dashboard's default time range."""
    start = dashboard.get("time", {}).get("from", "now-6h")
    m = re.fullmatch(r"now-(\d+[smhdw])", start)
    assert m, f"cannot derive $__range from time.from={start!r}"
    rng = duration_s(m.group(1))
    return {
        "__interval": INTERVAL,
        "__interval_ms": str(duration_s(INTERVAL) * 1000),
        "__rate_interval": RATE_INTERVAL,
        "__rate_interval_ms": str(duration_s(RATE_INTERVAL) * 1000),
        "__range": m.group(1),
        "__range_s": str(rng),
        "__range_ms": str(rng * 1000),
    }


VARIABLE = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\[\[(\w+)(?::(\w+))?\]\]|\$(\w+)")


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replace ``$var``, ``${var}``, ``${var:fmt}`` and ``[[var]]``; an unknown variable fails."""

    def repl(m: re.Match) -> str:
        name = m.group(1) or m.group(3) or m.group(5)
        if name not in values:
            raise KeyError(f"variable ${name} is neither a Grafana built-in nor in the dashboard's templating")
        return values[name]

    return VARIABLE.sub(repl, expr)


def regex_escape(value: str) -> str:
    """Grafana's escaping of a multi-value variable's values for a PromQL regex string."""
    return re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\\\1", value)


def multi(values: list[str]) -> str:
    escaped = [regex_escape(v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


# -- Prometheus -------------------------------------------------------------------------------


class Prometheus:
    """Debian's ``prometheus`` in its own process group, on a free port, storage in ``tmp``."""

    def __init__(self, binary: str, tmp: Path, target_port: int) -> None:
        self.binary = binary
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = tmp / "prometheus.yml"
        self.log_path = tmp / "prometheus.log"
        self.config.write_text(
            yaml.safe_dump(
                {
                    "global": {
                        "scrape_interval": f"{SCRAPE_S}s",
                        "scrape_timeout": f"{SCRAPE_S}s",
                        "evaluation_interval": f"{SCRAPE_S}s",
                    },
                    "rule_files": [str(RULES)],
                    "scrape_configs": [
                        {
                            "job_name": "loopwatch",
                            "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}],
                        }
                    ],
                }
            )
        )
        self.proc: subprocess.Popen | None = None

    def start(self) -> Prometheus:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.tmp / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                cwd=str(self.tmp),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_ready(self, timeout: float = 60.0) -> None:
        wait_http_ok(f"{self.url}/-/ready", self.proc, what="prometheus", timeout=timeout, log_tail=self.log_tail)

    def api(self, path: str, **params: Any) -> dict:
        """GET /api/v1/<path>; returns the JSON body (errors included, with status "error")."""
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=15) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # 400/422 carry the PromQL error as JSON
            return json.loads(exc.read() or b'{"status": "error", "error": "no body"}')

    def query(self, expr: str, **params: Any) -> dict:
        return self.api("query", query=expr, **params)

    def stop(self) -> None:
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue


# -- the running stack ------------------------------------------------------------------------


@dataclass(repr=False)
class Stack:
    prometheus: Prometheus
    traffic_start: float
    traffic_end: float
    stats: dict
    first_abort: dict
    worker: Any = None

    def __repr__(self) -> str:
        return f"Stack(prometheus on :{self.prometheus.port})"


def malformed(tag: str, i: int) -> list[tuple[bytes | None, bytes]]:
    return [
        (f"{tag}-garbage".encode(), b"{not json %d" % i),
        (
            f"{tag}-garbage".encode(),
            json.dumps({"type": "tool_call.exploded", "event_id": f"x{i}", "run_id": "x"}).encode(),
        ),
    ]


async def drive(lw, tag: str) -> dict:
    """The fleet for TRAFFIC_S seconds, and malformed records every 5 s meanwhile."""
    from streams.ops.traffic import drive_fleet

    fleet = asyncio.create_task(
        drive_fleet(
            lw.broker,
            duration_s=TRAFFIC_S,
            tool_calls_topic=lw.names.tool_calls,
            verdicts_topic=lw.names.verdicts,
            concurrency=10,
            run_prefix=f"{tag}-",
        )
    )
    i = 0
    while not fleet.done():
        await produce(lw.broker, lw.names.tool_calls, malformed(tag, i))
        i += 1
        await asyncio.wait([fleet], timeout=5.0)
    return fleet.result()


def first_abort_probe(lw, prometheus: Prometheus) -> dict:
    """One aborted run (a loop surviving compaction) on a fresh worker, before any other
    traffic; then what Prometheus makes of it, as LoopwatchRunAborts would see it."""
    tag = lw.names.tag
    events = [
        msgspec.structs.replace(e, ts_ms=int(time.time() * 1000))
        for e in run_events("post_compaction", f"{tag}-first", gate=True, length=12, end=True)
    ]
    asyncio.run(produce(lw.broker, lw.names.tool_calls, encode_all(events)))

    def scraped_a_while() -> bool:  # the abort counted, and a few scrapes of it since
        r = prometheus.query("count_over_time(loopwatch_run_aborts_total[1m]) >= 4")
        return r.get("status") == "success" and bool(r["data"]["result"])

    wait_for(scraped_a_while, "4 scrapes of loopwatch_run_aborts_total after one abort", timeout=30)
    time.sleep(2 * SCRAPE_S)  # a rule evaluation or two
    r = prometheus.query("sum by (detector) (increase(loopwatch_run_aborts_total[1m]))")
    increase = {x["metric"].get("detector"): float(x["value"][1]) for x in r["data"]["result"]}
    raw = prometheus.query("loopwatch_run_aborts_total[1m]")["data"]["result"]
    alerts = prometheus.api("alerts")["data"]["alerts"]
    return {
        "increase": increase,
        "samples": {x["metric"].get("detector"): [v for _, v in x["values"]] for x in raw},
        "alert": [a["state"] for a in alerts if a["labels"].get("alertname") == "LoopwatchRunAborts"],
    }


def shadow_probe(lw) -> None:
    """Runs of the shadow agent: a loop blocked at its 21st call, a loop that survives a
    compaction (aborted); on the shadow topic only."""
    tag = lw.names.tag
    now = int(time.time() * 1000)
    events = [
        msgspec.structs.replace(e, ts_ms=now)
        for kind, length in (("generic_repeat", 25), ("post_compaction", 12))
        for e in run_events(kind, f"{tag}-trial-{kind}", agent_id="trial", gate=True, length=length, end=True)
    ]
    asyncio.run(produce(lw.broker, lw.names.tool_calls, encode_all(events)))


def configs(tmp: Path) -> tuple[Path, Path]:
    """The example config with the shadow agent added, and the candidate config."""
    root = yaml.safe_load(CONFIG.read_text())
    root["agents"]["list"].append(SHADOW_AGENT)
    live, candidate = tmp / "live.yaml", tmp / "candidate.json"
    live.write_text(yaml.safe_dump(root))
    candidate.write_text(json.dumps(CANDIDATE))
    return live, candidate


def wait_for(check, what: str, timeout: float = 30.0, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@pytest.fixture(scope="module")
def stack(lw_module) -> Stack:
    binary = shutil.which("prometheus")
    if binary is None:
        message = "prometheus is missing: run scripts/install-ops-tools.sh (Debian's prometheus package)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    live, candidate = configs(lw_module.tmp)
    worker = lw_module.worker(config=live, env={"LOOPWATCH_CANDIDATE_CONFIG": str(candidate)}).start()
    prom_dir = lw_module.tmp / "prometheus"
    prom_dir.mkdir()
    prometheus = Prometheus(binary, prom_dir, worker.metrics_port).start()
    try:
        worker.wait_ready(90)
        prometheus.wait_ready(60)

        def scraped() -> bool:
            r = prometheus.query('up{job="loopwatch"} == 1 and on() loopwatch_ready == 1')
            return r.get("status") == "success" and bool(r["data"]["result"])

        wait_for(scraped, "Prometheus to scrape a ready worker")
        first_abort = first_abort_probe(lw_module, prometheus)
        shadow_probe(lw_module)
        started = time.time()
        stats = asyncio.run(drive(lw_module, lw_module.names.tag))
        ended = time.time()

        def scraped_after_traffic() -> bool:
            r = prometheus.query("timestamp(loopwatch_ready)")
            values = [float(x["value"][1]) for x in r.get("data", {}).get("result", [])]
            return bool(values) and max(values) > ended + SCRAPE_S

        wait_for(scraped_after_traffic, "a scrape after the traffic", timeout=15)
        runs = sum(stats["started"].values())
        print(
            f"\nfleet: {runs} runs in {ended - started:.1f}s; "
            f"{sum(stats[k]['blocks'] for k in stats['started'])} blocks, "
            f"{sum(stats[k]['aborts'] for k in stats['started'])} aborts"
        )
        yield Stack(prometheus, started, ended, stats, first_abort, worker)
    except BaseException:
        print(f"\n----- prometheus log -----\n{prometheus.log_tail()}")
        raise
    finally:
        prometheus.stop()


# -- the checks -------------------------------------------------------------------------------


def test_alert_rules_are_loaded_and_healthy(stack: Stack) -> None:
    want = {g["name"]: len(g["rules"]) for g in yaml.safe_load(RULES.read_text())["groups"]}

    def evaluated():
        r = stack.prometheus.api("rules")
        assert r["status"] == "success", r
        groups = {g["name"]: g for g in r["data"]["groups"]}
        rules = [rule for g in groups.values() for rule in g["rules"]]
        if set(groups) >= set(want) and all(rule.get("health") == "ok" for rule in rules):
            return groups
        return None

    try:
        groups = wait_for(evaluated, "every rule evaluated with health ok", timeout=20)
    except TimeoutError:
        r = stack.prometheus.api("rules")
        bad = [
            (g["name"], rule["name"], rule.get("health"), rule.get("lastError"))
            for g in r["data"]["groups"]
            for rule in g["rules"]
            if rule.get("health") != "ok"
        ]
        pytest.fail(
            f"rules not loaded/healthy: want groups {sorted(want)}, got "
            f"{[g['name'] for g in r['data']['groups']]}; unhealthy: {bad}"
        )
    assert any(name.startswith("loopwatch") for name in want), f"no loopwatch rule groups in {RULES}"
    for name, n in want.items():
        assert len(groups[name]["rules"]) == n, f"group {name}: {len(groups[name]['rules'])} rules loaded, file has {n}"
        for rule in groups[name]["rules"]:
            assert not rule.get("lastError"), f"{name}/{rule['name']}: {rule['lastError']}"
    # traffic of a few seconds fires nothing that waits 5-10 minutes, but the abort rule (for: 1m)
    # must at least be pending: the fleet's post_compaction runs were aborted
    alerts = stack.prometheus.api("alerts")["data"]["alerts"]
    assert any(
        a["labels"].get("alertname") == "LoopwatchRunAborts"
        and a["labels"].get("detector") == "compaction_loop_persisted"
        for a in alerts
    ), alerts


def test_a_single_abort_raises_loopwatch_run_aborts(stack: Stack) -> None:
    """The first abort after a worker starts must count: LoopwatchRunAborts fires on
    ``increase(loopwatch_run_aborts_total[10m]) > 0``, i.e. on a single aborted run."""
    probe = stack.first_abort
    assert probe["increase"].get("compaction_loop_persisted", 0) > 0 and probe["alert"], (
        "one run was aborted (compaction_loop_persisted) on a fresh worker, but Prometheus sees no increase: "
        f"increase(loopwatch_run_aborts_total[1m]) by detector = {probe['increase']}, LoopwatchRunAborts states = "
        f"{probe['alert']}; the series' samples: {probe['samples']}. The worker exports "
        "loopwatch_run_aborts_total{detector=...} only from the first abort on, starting at 1, and rate()/increase() "
        "cannot count the step from a missing series to 1. Export the documented label values at 0 from the start."
    )


def variable_values(stack: Stack, dashboard: dict, *, concrete: bool) -> dict[str, str]:
    """Every variable of the dashboard's templating, resolved in order (later queries may use
    earlier variables): ``All`` (``allValue``) unless ``concrete``, else the first options."""
    values = builtins(dashboard)
    for var in dashboard.get("templating", {}).get("list", []):
        name, kind = var["name"], var.get("type")
        if kind == "datasource":
            values[name] = "prometheus"
        elif kind == "query":
            options = resolve_query_variable(stack, var, values)
            assert options, f"variable ${name} has no options"
            if not concrete and var.get("includeAll"):
                values[name] = var.get("allValue") or multi(options)
            else:
                values[name] = multi(options[:2] if var.get("multi") else options[:1])
        elif kind in ("custom", "interval"):
            options = [o["value"] for o in var.get("options", [])] or [
                v.strip() for v in str(var.get("query", "")).split(",") if v.strip()
            ]
            assert options, f"variable ${name} has no options"
            values[name] = (
                var.get("allValue") or multi(options) if (not concrete and var.get("includeAll")) else options[0]
            )
        elif kind in ("constant", "textbox"):
            values[name] = str(var.get("query", ""))
        else:
            pytest.fail(f"variable ${name}: type {kind!r} is not handled by this test; teach it")
    return values


def resolve_query_variable(stack: Stack, var: dict, values: dict[str, str]) -> list[str]:
    """Grafana's Prometheus ``label_values(selector, label)`` / ``label_values(label)``."""
    query = var.get("query")
    text = query.get("query") if isinstance(query, dict) else query
    m = re.fullmatch(r"\s*label_values\((?:(.*),\s*)?(\w+)\)\s*", substitute(text or "", values))
    assert m, f"variable ${var['name']}: only label_values() queries are handled, got {text!r}"
    selector, label = m.group(1), m.group(2)
    params: dict[str, Any] = {"match[]": selector} if selector else {}
    r = stack.prometheus.api(f"label/{label}/values", **params)
    assert r["status"] == "success", f"variable ${var['name']}: {r}"
    return sorted(r["data"])


def test_template_variables_resolve(stack: Stack) -> None:
    seen = set()
    for name, dashboard in load_dashboards().items():
        values = builtins(dashboard)
        for var in dashboard.get("templating", {}).get("list", []):
            if var.get("type") != "query":
                continue
            options = resolve_query_variable(stack, var, values)
            assert options, f"{name}: ${var['name']} has no options"
            values[var["name"]] = var.get("allValue") or multi(options)
            seen.add(var["name"])
            if var["name"] == "detector":
                assert {"generic_repeat", "known_poll_no_progress", "ping_pong", "unknown_tool_repeat"} <= set(options)
            if var["name"] == "tool":
                assert {"web_search", "process", "browser"} <= set(options)
    assert {"detector", "tool"} <= seen, f"the drill-down dashboard should have $detector and $tool, found {seen}"


def why_empty(prom: Prometheus, expr: str) -> str:
    """Which of the expression's metrics Prometheus has no series of at all."""
    notes = []
    for name in sorted(set(re.findall(r"\b(loopwatch_[a-z0-9_]+)", expr))):
        r = prom.query(f'count({{__name__="{name}"}})')
        if not r.get("data", {}).get("result"):
            notes.append(f"Prometheus has no series of {name} at all (the worker exports no sample of it)")
    return "; ".join(notes) or "its metrics have series, but the selection or arithmetic leaves none"


def finite_values(result: dict) -> list[float]:
    data = result["data"]
    if data["resultType"] == "scalar":
        return [float(data["result"][1])]
    out = []
    for series in data["result"]:
        points = series.get("values") or ([series["value"]] if "value" in series else [])
        out += [float(v) for _, v in points]
    return [v for v in out if math.isfinite(v)]


@pytest.mark.parametrize("target", TARGETS, ids=[f"{t.dashboard}:{t.panel_id}:{t.panel}:{t.ref}" for t in TARGETS])
def test_panel_query_returns_data(stack: Stack, target: Target) -> None:
    dashboard = load_dashboards()[target.dashboard]
    prom = stack.prometheus

    expr = substitute(target.expr, variable_values(stack, dashboard, concrete=False))
    instant = prom.query(expr)
    assert instant.get("status") == "success", f"{target}\n  as sent: {expr}\n  error: {instant.get('error')}"
    assert instant["data"]["result"], (
        f"{target}\n  as sent: {expr}\n  returned no data (empty result); {why_empty(prom, expr)}"
    )
    assert finite_values(instant), f"{target}\n  as sent: {expr}\n  only NaN/Inf: {instant['data']['result']}"

    if target.range:  # what a time-series panel asks for: the traffic window, 5 s steps
        ranged = prom.api(
            "query_range", query=expr, start=f"{stack.traffic_start - 5:.3f}", end=f"{time.time():.3f}", step="5"
        )
        assert ranged.get("status") == "success", f"{target}\n  query_range error: {ranged.get('error')}"
        assert ranged["data"]["result"], f"{target}\n  query_range returned no data"

    # a concrete selection of the dashboard's variables (first options) must parse as well
    if any(v.get("type") == "query" for v in dashboard.get("templating", {}).get("list", [])):
        concrete = substitute(target.expr, variable_values(stack, dashboard, concrete=True))
        r = prom.query(concrete)
        assert r.get("status") == "success", f"{target}\n  as sent: {concrete}\n  error: {r.get('error')}"


def test_the_shadow_row_shows_what_runners_were_not_told(stack: Stack) -> None:
    """The candidate's verdicts, the shadow agent's, and runs whose outcome the candidate
    changes reach Prometheus; the enforce-only panels leave them out."""
    prom = stack.prometheus

    def total(expr: str) -> float:
        r = prom.query(f"sum({expr})")
        assert r.get("status") == "success", r
        return sum(float(x["value"][1]) for x in r["data"]["result"])

    assert total('loopwatch_decisions_total{config="candidate", action="block"}') > 0
    shadow_blocks = total('loopwatch_decisions_total{config="live", mode="shadow", action="block"}')
    assert shadow_blocks >= 5  # calls 21-25 of the shadow agent's loop
    assert total('loopwatch_run_aborts_total{config="live", mode="shadow"}') == 1
    assert total('loopwatch_candidate_outcome_changes_total{live="block", candidate="abort"}') > 0
    enforced = total('loopwatch_decisions_total{config="live", mode="enforce", action="block"}')
    assert enforced + shadow_blocks == total('loopwatch_decisions_total{config="live", action="block"}')
    assert total("loopwatch_shadow_verdicts_lost_total") == 0
