"""The import contracts (``[tool.importlinter]`` in pyproject.toml) hold, and their check can fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_repository_keeps_every_contract():
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_a_forbidden_import_breaks_the_contracts_it_crosses(tmp_path):
    for name in ("streams", "schemas"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "streams" / "edge" / "events.py", "a") as fh:
        fh.write("\nimport streams.app.worker  # noqa: E402, F401\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0, done.stdout
    # The edge loading the worker crosses the layers and the client-and-edge rule.
    assert "the client and the edge never load the worker or Faust BROKEN" in done.stdout
    assert "rooms are layered from the wire contract up to the command line BROKEN" in done.stdout
    assert "streams.edge.events -> streams.app.worker" in done.stdout
