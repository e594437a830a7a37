"""Alert rules: promtool check/test rules, plus the conventions every alert must follow."""

from __future__ import annotations

import re

import pytest
import yaml
from opsutil import CHART, REPO, contract_metrics, promql_metric_names, run, series_names

RULES = CHART / "files" / "alerts.rules.yml"
TESTS = CHART / "files" / "alerts.test.yml"
ALERTS = {
    "LoopwatchLoopStorm",
    "LoopwatchRunAborts",
    "LoopwatchDecisionLatencyHigh",
    "LoopwatchDeadLettersRising",
    "LoopwatchWorkerNotReady",
    "LoopwatchRunStateTrimmed",
    "LoopwatchAgentRunsCapped",
    "LoopwatchRunnerClockAhead",
    "LoopwatchConfigRefused",
    "LoopwatchDetectionOff",
    "LoopwatchToolOutage",
    "LoopwatchFleetIncidentsLimited",
}
RUNBOOK_BASE = "https://github.com/loopwatch/loopwatch/blob/main/docs/operations.md#alert-"


def alert_rules() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


def test_promtool_check_rules(promtool: str) -> None:
    result = run([promtool, "check", "rules", str(RULES)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_promtool_test_rules(promtool: str) -> None:
    result = run([promtool, "test", "rules", TESTS.name], cwd=TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_expected_alerts() -> None:
    assert {r["alert"] for r in alert_rules()} == ALERTS


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda r: f"{r['alert']}-{r['labels'].get('cause', '')}")
def test_alert_conventions(rule: dict) -> None:
    assert rule["labels"]["severity"] in {"info", "warning", "critical"}
    annotations = rule["annotations"]
    assert annotations["summary"].strip() and annotations["description"].strip()
    assert annotations["runbook_url"] == RUNBOOK_BASE + rule["alert"].lower()
    assert re.fullmatch(r"\d+[smh]", rule["for"]), "every alert needs a `for:` to ride out blips"


def test_alerts_use_only_contract_metrics() -> None:
    known = series_names(contract_metrics()) | {"up"}
    for rule in alert_rules():
        names = promql_metric_names(rule["expr"])
        assert names, rule["expr"]
        assert names <= known, (rule["alert"], names - known)


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    cases: dict[str, set[bool]] = {}
    for test in yaml.safe_load(TESTS.read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    for alert in ALERTS:
        assert cases.get(alert) == {True, False}, f"{alert}: needs a firing and a not-firing test case"
    # Every rule behind LoopwatchWorkerNotReady (one per `cause`) fires in some test.
    fired_causes = {
        a["exp_labels"].get("cause")
        for test in yaml.safe_load(TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case["alertname"] == "LoopwatchWorkerNotReady"
        for a in case.get("exp_alerts") or []
    }
    causes = {r["labels"]["cause"] for r in alert_rules() if r["alert"] == "LoopwatchWorkerNotReady"}
    assert fired_causes == causes


def test_runbook_sections_exist() -> None:
    """docs/operations.md has a section per alert, titled with the runbook_url's anchor."""
    text = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    headings = set(re.findall(r"^##+ (alert-[a-z0-9-]+)\s*$", text, re.M))
    assert {"alert-" + a.lower() for a in ALERTS} <= headings
