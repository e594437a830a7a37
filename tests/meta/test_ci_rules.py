"""The rules `make test` and `.ci/run` rely on: CI fails on a skipped test, and no test or
Makefile target reads data from outside the repository."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:langsmith_plugin"]
"""The small suites below, run as `make test` runs pytest.  langsmith's plugin (it comes with
the LangChain extra) imports its whole client into every pytest process, half of a small
run's start; none of these suites uses it."""


# `make test` runs the suite in several processes (pytest-xdist); a skip reported by one of
# them must fail the run as a skip in a single process does.
PROCESSES = pytest.mark.parametrize("processes", [[], ["-n", "2"]], ids=["one-process", "xdist"])


def _run_pytest(tmp_path: Path, ci: bool, processes: list[str]) -> subprocess.CompletedProcess[str]:
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_sample.py").write_text(
        "import pytest\ndef test_runs(): pass\ndef test_needs_a_tool(): pytest.skip('frobnicator is missing')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [
            *PYTEST,
            *processes,
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )


@PROCESSES
def test_a_skipped_test_fails_the_run_in_ci(tmp_path, processes):
    proc = _run_pytest(tmp_path, ci=True, processes=processes)
    assert proc.returncode == 1, proc.stdout
    assert "SKIPPED test_sample.py::test_needs_a_tool: Skipped: frobnicator is missing" in proc.stdout


@PROCESSES
def test_a_skipped_test_is_only_a_skip_outside_ci(tmp_path, processes):
    proc = _run_pytest(tmp_path, ci=False, processes=processes)
    assert proc.returncode == 0, proc.stdout
    assert "1 passed, 1 skipped" in proc.stdout


def test_the_conformance_data_is_the_listed_copy():
    data = REPO / "tests" / "data" / "conformance"
    listed = [line.split(maxsplit=1) for line in (data / "SHA256SUMS").read_text().splitlines() if line.strip()]
    assert listed, "SHA256SUMS lists no file"
    for digest, name in listed:
        assert hashlib.sha256((data / name).read_bytes()).hexdigest() == digest, f"{name} differs from SHA256SUMS"


def test_no_test_or_make_target_reads_outside_the_repository():
    sources = [REPO / "Makefile", REPO / ".ci" / "run", *(REPO / "tests").rglob("*.py")]
    outside = re.compile(r"\.\./shared|LOOPWATCH_SHARED|/work/shared")
    offenders = [
        f"{path.relative_to(REPO)}:{n}"
        for path in sources
        if path != Path(__file__)
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if outside.search(line)
    ]
    assert offenders == []


def test_tests_sharing_a_module_fixture_run_in_one_xdist_process(tmp_path):
    """`make test` runs `--dist loadgroup`: tests/conftest.py puts the tests of a module with a
    module-scoped fixture in one group, which xdist must keep in one process (it did not under
    pytest 9.2, which no longer reads the test id xdist 3.8 writes the group into)."""
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    record = tmp_path / "workers.txt"
    shared = "import os, pytest\n@pytest.fixture(scope='module')\ndef shared():\n    return object()\n" + "".join(
        f"def test_shared_{n}(shared):\n"
        f"    with open({str(record)!r}, 'a') as f:\n"
        f"        f.write(os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n"
        for n in range(8)
    )
    (tmp_path / "test_grouped.py").write_text(shared)
    (tmp_path / "test_spread.py").write_text("".join(f"def test_alone_{n}():\n    pass\n" for n in range(8)))
    proc = subprocess.run(
        [*PYTEST, "-n", "2", "--dist", "loadgroup", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout
    workers = record.read_text().split()
    assert len(workers) == 8 and len(set(workers)) == 1, workers


def test_xdist_hands_out_the_longest_work_first_and_keeps_a_groups_order(tmp_path):
    """`make test` runs `--no-loadscope-reorder`: tests/conftest.py orders the work units (a
    group, or one test) by the durations in durations.json, longest first, so that no long unit
    starts last; a group's own tests keep their order.  One process shows the order handed out."""
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    record = tmp_path / "order.txt"

    def body(name: str, fixture: str = "", sleep: float = 0) -> str:
        return (
            f"def {name}({fixture}):\n    time.sleep({sleep})\n"
            f"    with open({str(record)!r}, 'a') as f:\n        f.write({name!r} + '\\n')\n"
        )

    (tmp_path / "test_a_quick.py").write_text(
        "import time\n" + body("test_quick_1") + body("test_quick_2", sleep=1.2) + body("test_slow_alone")
    )
    grouped = "import time, pytest\n@pytest.fixture(scope='module')\ndef shared():\n    return object()\n"
    (tmp_path / "test_b_grouped.py").write_text(
        grouped + "".join(body(f"test_grouped_{n}", "shared") for n in (3, 1, 2))
    )
    (tmp_path / "durations.json").write_text(
        json.dumps(
            {
                "test_a_quick.py::test_slow_alone": 100.0,  # the longest unit, collected last of its file
                "test_b_grouped.py::test_grouped_1": 30.0,  # the group: 30 + 20 + 0.5, second
                "test_b_grouped.py::test_grouped_2": 20.0,
                "test_a_quick.py::test_quick_2": 2.0,
            }
        )
    )
    durations = tmp_path / "recorded.json"
    proc = subprocess.run(
        [*PYTEST, "-n", "1", "--dist", "loadgroup"]
        + ["--no-loadscope-reorder", "--record-durations", str(durations), "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout
    assert record.read_text().split() == [
        "test_slow_alone",
        "test_grouped_3",
        "test_grouped_1",
        "test_grouped_2",
        "test_quick_2",
        "test_quick_1",
    ]
    recorded = json.loads(durations.read_text())  # the tests of a second or more, as measured
    assert list(recorded) == ["test_a_quick.py::test_quick_2"] and recorded["test_a_quick.py::test_quick_2"] >= 1.2
