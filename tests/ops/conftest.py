"""Fixtures of the ops checks: the external tools, found by opsutil.find_tool."""

from __future__ import annotations

from pathlib import Path

import pytest
from opsutil import CACHE, KUBE_VERSION, find_tool, missing


@pytest.fixture(scope="session")
def helm() -> str:
    return find_tool("helm")


@pytest.fixture(scope="session")
def kubeconform() -> str:
    return find_tool("kubeconform")


@pytest.fixture(scope="session")
def promtool() -> str:
    return find_tool("promtool")


@pytest.fixture(scope="session")
def k8s_schema_root() -> Path:
    root = CACHE / "kubernetes-json-schema"
    schemas = root / f"v{KUBE_VERSION}-standalone-strict"
    if not (schemas / ".complete").is_file():
        missing(f"offline Kubernetes {KUBE_VERSION} JSON schemas in {root}")
    if not list(schemas.glob(".complete-monitoring-*")):
        missing(f"offline monitoring.coreos.com (Prometheus Operator) JSON schemas in {schemas}")
    return root
