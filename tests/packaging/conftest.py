"""The wheel as users get it: built once per session, installed into fresh venvs (one per
extra) with pip, its dependencies from PyPI (pip's cache makes a reinstall quick).

* ``dist`` (session): the directory holding the sdist and the wheel: ``make dist``'s when its
  wheel is newer than every source file, else one built here (so a lone ``pytest`` works);
* ``fresh_venv`` (session): ``fresh_venv(extra)``, a venv with ``loopwatch[extra]`` installed
  from that wheel (``None``: the base install), made once per extra;
* ``kafka_broker`` (session): the local broker's bootstrap address (``scripts/kafka.sh``).

A venv's commands run without the repository on the path (no ``PYTHONPATH``, a working
directory outside the tree): what they import is what the wheel installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness import REPO

KAFKA_SH = REPO / "scripts" / "kafka.sh"
PIP_TIMEOUT_S = 900  # a cold pip cache downloads the worker's and the MCP SDK's dependencies


@pytest.fixture(scope="session")
def version() -> str:
    """pyproject.toml's version, the one the distribution carries."""
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["project"]["version"]


def _newest_source() -> float:
    files = [REPO / "pyproject.toml", REPO / "README.md"]
    for package in ("streams", "schemas"):
        files += [p for p in (REPO / package).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return max(p.stat().st_mtime for p in files)


def _failed(what: str, proc: subprocess.CompletedProcess[str]) -> str:
    return f"{what} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="session")
def dist(version: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    made = REPO / "dist"
    name = f"loopwatch-{version}"
    wheel = made / f"{name}-py3-none-any.whl"
    if wheel.exists() and (made / f"{name}.tar.gz").exists() and wheel.stat().st_mtime >= _newest_source():
        return made
    out = tmp_path_factory.mktemp("dist")
    # sdist, then the wheel from the unpacked sdist: the repository's build/ never leaks into it
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--quiet", "--outdir", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
    )
    if proc.returncode != 0:
        pytest.fail(_failed("python -m build", proc))
    return out


@pytest.fixture(scope="session")
def wheel(dist: Path, version: str) -> Path:
    return dist / f"loopwatch-{version}-py3-none-any.whl"


@dataclass(frozen=True)
class Venv:
    """A fresh venv with loopwatch installed from the wheel."""

    path: Path

    def bin(self, name: str) -> str:
        return str(self.path / "bin" / name)

    @property
    def python(self) -> str:
        return self.bin("python")

    @property
    def env(self) -> dict[str, str]:
        """The caller's environment without the repository on the path, the venv first on PATH."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env["PATH"] = f"{self.path / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return env

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, cwd=self.path, env=self.env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def fresh_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str | None], Venv]:
    made: dict[str | None, Venv] = {}

    def venv(extra: str | None) -> Venv:
        if extra in made:
            return made[extra]
        venv = Venv(tmp_path_factory.mktemp(f"venv-{extra or 'base'}"))
        created = subprocess.run(
            [sys.executable, "-m", "venv", str(venv.path)], capture_output=True, text=True, timeout=300
        )
        if created.returncode != 0:
            pytest.fail(_failed("python -m venv", created))
        spec = str(wheel) if extra is None else f"{wheel}[{extra}]"
        installed = venv.run(
            venv.python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", spec, timeout=PIP_TIMEOUT_S
        )
        if installed.returncode != 0:
            pytest.fail(_failed(f"pip install {spec}", installed))
        where = venv.run(venv.python, "-c", "import streams, schemas; print(streams.__file__, schemas.__file__)")
        assert where.returncode == 0, where.stderr
        assert all(Path(p).is_relative_to(venv.path) for p in where.stdout.split()), where.stdout
        made[extra] = venv
        return venv

    return venv


@pytest.fixture(scope="session")
def kafka_broker() -> str:
    started = subprocess.run([str(KAFKA_SH), "start"], capture_output=True, text=True)
    if started.returncode != 0:
        pytest.fail(_failed("scripts/kafka.sh start", started))
    if broker := os.environ.get("LOOPWATCH_TEST_BROKER"):
        return broker
    out = subprocess.run([str(KAFKA_SH), "env"], capture_output=True, text=True, check=True).stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    if "KAFKA_BOOTSTRAP" not in env:
        pytest.fail(f"scripts/kafka.sh env printed no KAFKA_BOOTSTRAP: {out!r}")
    return env["KAFKA_BOOTSTRAP"]
