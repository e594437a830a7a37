"""Helpers shared by the ops checks (chart, alerts, dashboards); fixtures are in conftest.py.

The external tools come from scripts/install-ops-tools.sh: helm and kubeconform in
${LOOPWATCH_CACHE:-~/.cache/loopwatch}/bin, promtool on PATH, and the offline Kubernetes JSON
schemas under ${LOOPWATCH_CACHE}/kubernetes-json-schema. When one is missing the test fails in CI
(env CI set) and is skipped elsewhere, with the reason and the fix.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "loopwatch"
CACHE = Path(os.environ.get("LOOPWATCH_CACHE") or Path.home() / ".cache" / "loopwatch")
INSTALL_HINT = "run scripts/install-ops-tools.sh"

# Kubernetes version the chart is rendered and validated for; must match K8S_API_VERSION in
# scripts/install-ops-tools.sh (k8s.io/api v0.37.2 == Kubernetes 1.37.2).
KUBE_VERSION = "1.37.2"


def missing(what: str) -> None:
    """Fail in CI, skip elsewhere."""
    message = f"{what} is missing: {INSTALL_HINT}"
    if os.environ.get("CI"):
        pytest.fail(message + " (CI is set, so this is a failure, not a skip)")
    pytest.skip(message)


def find_tool(name: str) -> str:
    candidate = CACHE / "bin" / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    missing(f"{name} (looked in {CACHE / 'bin'} and PATH)")
    raise AssertionError("unreachable")


def run(cmd: list[str], input: str | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, input=input, cwd=cwd, capture_output=True, text=True, timeout=300)


def contract_metrics() -> dict[str, str]:
    """Metric name -> type, parsed from the table in docs/metrics.md."""
    metrics: dict[str, str] = {}
    for line in (REPO / "docs" / "metrics.md").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\|\s*`([a-z_:][a-z0-9_:]*)`\s*\|\s*(counter|gauge|histogram|summary)\s*\|", line)
        if m:
            metrics[m.group(1)] = m.group(2)
    assert metrics, "no metrics table found in docs/metrics.md"
    return metrics


def series_names(metrics: dict[str, str]) -> set[str]:
    """Every series name the contract's metrics expose (histograms add _bucket/_sum/_count)."""
    names = set(metrics)
    for name, kind in metrics.items():
        if kind in ("histogram", "summary"):
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


# PromQL words that are not metric names.
PROMQL_WORDS = {
    # aggregations and their modifiers
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "atan2",
    # functions
    "abs",
    "absent",
    "absent_over_time",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "day_of_month",
    "day_of_week",
    "day_of_year",
    "days_in_month",
    "delta",
    "deriv",
    "exp",
    "floor",
    "histogram_quantile",
    "histogram_count",
    "histogram_sum",
    "histogram_fraction",
    "holt_winters",
    "hour",
    "idelta",
    "increase",
    "irate",
    "label_join",
    "label_replace",
    "ln",
    "log2",
    "log10",
    "minute",
    "month",
    "predict_linear",
    "rate",
    "resets",
    "round",
    "scalar",
    "sgn",
    "sort",
    "sort_desc",
    "sqrt",
    "time",
    "timestamp",
    "vector",
    "year",
    "avg_over_time",
    "min_over_time",
    "max_over_time",
    "sum_over_time",
    "count_over_time",
    "quantile_over_time",
    "stddev_over_time",
    "stdvar_over_time",
    "last_over_time",
    "present_over_time",
    "inf",
    "nan",
}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (good enough for the expressions of this repo)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\$\{?\w+\}?", "", text)  # Grafana variables
    words = set(re.findall(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*", text))
    return {w for w in words if w.lower() not in PROMQL_WORDS and not re.fullmatch(r"[0-9.e]+", w)}
