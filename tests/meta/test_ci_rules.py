"""The rules `make test` and `.ci/run` rely on: CI fails on a skipped test, and no test or
Makefile target reads data from outside the repository."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


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
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
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
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup"]
        + ["--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout
    workers = record.read_text().split()
    assert len(workers) == 8 and len(set(workers)) == 1, workers
