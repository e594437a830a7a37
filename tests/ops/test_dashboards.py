"""Grafana dashboards: the checked-in JSON is what streams.ops.dashboards generates, and every
panel queries only metrics of the contract in docs/metrics.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from opsutil import CHART, contract_metrics, missing, promql_metric_names, run, series_names

DASHBOARDS = CHART / "dashboards"
FILES = ("loopwatch-fleet.json", "loopwatch-agent.json")


@pytest.fixture(scope="module")
def sdk() -> None:
    try:
        import grafana_foundation_sdk  # noqa: F401
    except ImportError:
        missing("the grafana-foundation-sdk Python package")


def generator(*args: str) -> list[str]:
    return [sys.executable, "-m", "streams.ops.dashboards", *args]


def load(name: str) -> dict:
    return json.loads((DASHBOARDS / name).read_text(encoding="utf-8"))


def panels(dashboard: dict) -> list[dict]:
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # collapsed rows
    return [p for p in out if p["type"] != "row"]


def test_checked_in_dashboards_are_fresh(sdk: None) -> None:
    result = run(generator("--check"))
    assert result.returncode == 0, result.stdout + result.stderr + "\nregenerate with: python -m streams.ops.dashboards"


def test_check_detects_stale_and_generation_is_deterministic(sdk: None, tmp_path: Path) -> None:
    first = run(generator("--out-dir", str(tmp_path / "a")))
    second = run(generator("--out-dir", str(tmp_path / "b")))
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    for name in FILES:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    stale = tmp_path / "a" / FILES[0]
    stale.write_text(stale.read_text().replace("Fleet overview", "Fleet overview (edited by hand)"))
    result = run(generator("--check", "--out-dir", str(tmp_path / "a")))
    assert result.returncode == 1
    assert FILES[0] in result.stderr
    (tmp_path / "a" / FILES[1]).unlink()
    result = run(generator("--check", "--out-dir", str(tmp_path / "a")))
    assert result.returncode == 1 and FILES[1] in result.stderr


def test_files_are_sorted_and_stable() -> None:
    assert sorted(p.name for p in DASHBOARDS.glob("*.json")) == sorted(FILES)
    for name in FILES:
        text = (DASHBOARDS / name).read_text(encoding="utf-8")
        assert text == json.dumps(json.loads(text), sort_keys=True, indent=2, ensure_ascii=False) + "\n"


@pytest.mark.parametrize("name", FILES)
def test_panels_query_contract_metrics(name: str) -> None:
    known = series_names(contract_metrics())
    dashboard = load(name)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel.get("title") and panel.get("description"), panel
        assert panel["targets"], f"{panel['title']}: no query"
        for target in panel["targets"]:
            expr = target.get("expr", "").strip()
            assert expr, f"{panel['title']}: empty expr"
            names = promql_metric_names(expr)
            assert names, f"{panel['title']}: no metric in {expr!r}"
            assert names <= known, f"{panel['title']}: not in docs/metrics.md: {sorted(names - known)}"


def test_every_contract_metric_is_on_a_dashboard() -> None:
    used = set()
    for name in FILES:
        for panel in panels(load(name)):
            for target in panel["targets"]:
                used |= promql_metric_names(target["expr"])
    base = {n.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") for n in used}
    assert set(contract_metrics()) - base == set()


def test_datasource_variable_everywhere() -> None:
    for name in FILES:
        variables = {v["name"]: v for v in load(name)["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"


def test_fleet_overview_panels() -> None:
    dashboard = load("loopwatch-fleet.json")
    assert dashboard["uid"] == "loopwatch-fleet"
    exprs = "\n".join(t["expr"] for p in panels(dashboard) for t in p["targets"])
    for needle in (
        "sum by (detector) (rate(loopwatch_loop_detections_total",  # loops by detector
        'loopwatch_decisions_total{action="block"}',  # blocked calls
        "loopwatch_run_aborts_total",  # aborts
        "topk(10, sum by (tool) (increase(loopwatch_loop_detections_total",  # top tools
        "histogram_quantile(0.5,",
        "histogram_quantile(0.99,",
        "histogram_quantile(0.999,",
        "sum by (reason) (rate(loopwatch_dead_letters_total",  # dead letters
        "loopwatch_ready",
        "loopwatch_table_recovery_in_progress",  # worker health
        "loopwatch_consumer_lag_records",  # lag
    ):
        assert needle in exprs, needle


def test_drilldown_has_detector_and_tool_variables() -> None:
    dashboard = load("loopwatch-agent.json")
    assert dashboard["uid"] == "loopwatch-drilldown"
    assert "no per-agent" in dashboard["description"] and "docs/metrics.md" in dashboard["description"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    for var, label in (("detector", "detector"), ("tool", "tool")):
        v = variables[var]
        assert v["type"] == "query" and v["multi"] and v["includeAll"]
        assert v["query"]["query"].startswith("label_values(loopwatch_loop_detections_total")
        assert v["query"]["query"].endswith(f", {label})")
    exprs = [t["expr"] for p in panels(dashboard) for t in p["targets"]]
    assert any('detector=~"$detector"' in e and 'tool=~"$tool"' in e for e in exprs)


def test_promql_metric_name_parser() -> None:
    assert promql_metric_names(
        'histogram_quantile(0.99, sum by (le) (rate(loopwatch_decision_latency_seconds_bucket{job="x"}[5m])))'
    ) == {"loopwatch_decision_latency_seconds_bucket"}
    assert promql_metric_names('sum(increase(a_total{tool=~"$tool"}[$__range])) / sum(b_total)') == {
        "a_total",
        "b_total",
    }
    assert promql_metric_names("topk(10, sum by (tool) (increase(c_total[1h]))) * 60") == {"c_total"}
