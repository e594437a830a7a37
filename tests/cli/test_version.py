"""``loopwatch --version``: the version of pyproject.toml (its one source), through the
installed distribution's metadata; ``streams.__version__`` says ``0+unknown`` when loopwatch
runs from a tree that was never installed."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _pyproject_version() -> str:
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["project"]["version"]


def test_version_prints_pyprojects_version():
    run = subprocess.run(
        [sys.executable, "-m", "streams.cli", "--version"], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == f"loopwatch {_pyproject_version()}\n"
    assert run.stderr == ""


def test_package_version_is_the_distributions():
    code = "import streams; print(streams.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert out == f"{_pyproject_version()}\n"


def test_package_version_without_an_installed_distribution_is_unknown(tmp_path):
    # -S -I: no site-packages and no working directory on the path, so no loopwatch metadata
    # (an editable install leaves loopwatch.egg-info beside the sources, hence the link to
    # streams alone rather than the repository on the path).
    (tmp_path / "streams").symlink_to(REPO / "streams")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import importlib.metadata as m, streams\n"
        "try:\n    m.version('loopwatch')\nexcept m.PackageNotFoundError:\n    print(streams.__version__)\n"
        "else:\n    print('installed')"
    )
    run = subprocess.run(
        [sys.executable, "-S", "-I", "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "0+unknown\n"
