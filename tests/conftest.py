"""Fixtures every test directory shares, and the CI rule that nothing is skipped."""

from __future__ import annotations

import hashlib
import json
import os
from collections import defaultdict
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


def pytest_make_parametrize_id(config: pytest.Config, val: object, argname: str) -> str | None:
    """A long text or bytes parameter (a 4 MiB input, a 50,000-deep document) is named by its
    length and digest: pytest would spell it whole into the test's id, which every xdist
    process then sends to the controller, and the durations file and reports repeat."""
    if isinstance(val, (str, bytes)) and len(val) > 60:
        data = val if isinstance(val, bytes) else val.encode("utf-8", "surrogatepass")
        return f"{argname}-{len(val)}-{hashlib.sha256(data).hexdigest()[:8]}"
    return None


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
    _durations[_plain(report.nodeid)] += report.duration


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _record_skip(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skipped and os.environ.get("CI") and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    target = session.config.getoption("record_durations", None)
    if target and not hasattr(session.config, "workerinput"):  # the controller saw every report
        _write_durations(Path(target))


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
# * the tests that install the wheel (``fresh_venv``): it makes a venv once per process, so
#   spread over processes they made the same venv in each (four base installs in one run).
# The gateway's module is the exception to the first: its tests are independent (each has its
# own run ids) and, at a fifth of the suite, one process would be the whole run's critical path.
SPREAD_MODULES = frozenset({"test_mcp_gateway"})
SECURE_BROKER_GROUP = "secured-broker"
WHEEL_VENVS_GROUP = "wheel-venvs"


def _group(item: pytest.Item) -> str | None:
    marked = item.get_closest_marker("xdist_group")  # a module that says its tests run in order
    if marked is not None:
        return str(marked.args[0] if marked.args else marked.kwargs.get("name", "default"))
    module = getattr(item, "module", None)
    info = getattr(item, "_fixtureinfo", None)
    if module is None or info is None:
        return None
    defs = [d for defs in info.name2fixturedefs.values() for d in defs]
    if any(d.argname == "secure_kafka" for d in defs):
        return SECURE_BROKER_GROUP
    if any(d.argname == "fresh_venv" for d in defs):
        return WHEEL_VENVS_GROUP
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
            group = groups[item] = SECURE_BROKER_GROUP
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
    if hasattr(config, "workerinput"):  # an xdist worker: the controller schedules what it collects
        _longest_first(items, groups)
    return (yield)


# -- pytest-xdist: the longest work first ---------------------------------------------------------
# xdist hands out work units (a group, or one test) in collection order (with
# --no-loadscope-reorder; by default it orders them by their number of tests, which puts a
# group of three 2-minute fault cases behind a hundred quick ones).  A run's length is then set
# by whatever long unit starts last, so the units go out longest first (LPT scheduling), by the
# durations a previous run recorded (tests/durations.json, rewritten with
# `pytest -n 6 --record-durations tests/durations.json`).  A test it does not know counts as
# short; the order inside a group is kept, since its tests may rely on it.
DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN_S = 0.5


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        default=None,
        help="write each test's setup+call+teardown seconds to PATH (JSON), for ordering later runs",
    )


_durations: defaultdict[str, float] = defaultdict(float)


def _plain(nodeid: str) -> str:
    """A test's id without the ``@group`` suffix xdist adds to grouped tests."""
    head, at, group = nodeid.rpartition("@")
    return head if at and ("/" in group or group in (SECURE_BROKER_GROUP, WHEEL_VENVS_GROUP)) else nodeid


def _write_durations(path: Path) -> None:
    # Tests under a second are left out: they count as UNKNOWN_S, and the file stays readable.
    kept = {nodeid: round(s, 1) for nodeid, s in sorted(_durations.items()) if s >= 1.0}
    path.write_text(json.dumps(kept, indent=0, ensure_ascii=False) + "\n")


def _longest_first(items: list[pytest.Item], groups: dict[pytest.Item, str | None]) -> None:
    try:
        known = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        known = {}
    unit_of = {item: groups[item] or item.nodeid for item in items}
    seconds: defaultdict[str, float] = defaultdict(float)
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        unit = unit_of[item]
        seconds[unit] += known.get(item.nodeid, UNKNOWN_S)
        first.setdefault(unit, index)
    order = {item: index for index, item in enumerate(items)}
    items.sort(key=lambda item: (-seconds[unit_of[item]], first[unit_of[item]], order[item]))
