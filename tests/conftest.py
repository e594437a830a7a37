"""Fixtures every test directory shares, and the CI rule that nothing is skipped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# The machines are shared and noisy (and the suite runs beside a broker and workers): a
# per-example deadline measures the neighbours, not the code, so no hypothesis test has one.
settings.register_profile("loopwatch", deadline=None)
settings.load_profile("loopwatch")

REPO = Path(__file__).resolve().parents[1]
CONFORMANCE = REPO / "tests" / "data" / "conformance"


@pytest.fixture(scope="session")
def conformance_dir() -> Path:
    """The repository's copy of the shared conformance set (tests/data/README.md)."""
    return CONFORMANCE


# -- with CI set, a skipped test fails the run ---------------------------------------------------
# `make test` installs every tool the tests need, so in CI a skip can only mean something is
# missing (a tool, a package, a data file) and a test silently did not run.  Outside CI a skip
# stays a skip, with its reason listed by `pytest -rs`.

_skipped: list[str] = []


def _record_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skipped.append(f"{report.nodeid}: {reason}")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _record_skip(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _record_skip(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skipped and os.environ.get("CI") and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if _skipped and os.environ.get("CI"):
        terminalreporter.section("skipped tests fail the run in CI", sep="=", red=True)
        for line in _skipped:
            terminalreporter.line(f"SKIPPED {line}")


# -- pytest-xdist: what tests share stays in one process -----------------------------------------
# `make test` spreads tests over processes (--dist loadgroup).  Two kinds of tests share
# something, and run together, in order, in one process:
# * the tests of a module with a module-scoped fixture (a worker, a Prometheus, a set of
#   servers): they may rely on the order of their tests (a warmed-up fleet topology, a run
#   started by the test before), and each process would otherwise start its own copy;
# * every test on the secured broker: its ACLs name fixed topics (``tool-calls``,
#   ``loop-verdicts``, the dead letters), which one module deletes and recreates at its start
#   and whose records the others read.
# The gateway's module is the exception to the first: its tests are independent (each has its
# own run ids) and, at a fifth of the suite, one process would be the whole run's critical path.
SPREAD_MODULES = frozenset({"test_mcp_gateway"})
SECURE_BROKER_GROUP = "secured-broker"


def _group(item: pytest.Item) -> str | None:
    module = getattr(item, "module", None)
    info = getattr(item, "_fixtureinfo", None)
    if module is None or info is None:
        return None
    defs = [d for defs in info.name2fixturedefs.values() for d in defs]
    if any(d.argname == "secure_kafka" for d in defs):
        return SECURE_BROKER_GROUP
    if module.__name__.rsplit(".", 1)[-1] in SPREAD_MODULES:
        return None
    if any(d.scope == "module" for d in defs):
        return item.nodeid.split("::", 1)[0]
    return None


@pytest.hookimpl(wrapper=True)  # around xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    groups = {item: _group(item) for item in items}
    # A module any of whose tests is on the secured broker runs there whole: its other tests
    # share its module fixtures with those.
    secured = {item.nodeid.split("::", 1)[0] for item, group in groups.items() if group == SECURE_BROKER_GROUP}
    for item, group in groups.items():
        if item.nodeid.split("::", 1)[0] in secured:
            group = SECURE_BROKER_GROUP
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    return (yield)
