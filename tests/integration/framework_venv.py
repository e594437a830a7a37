"""Frameworks whose pins clash with the shared venv's (CrewAI's httpx, Google ADK's
OpenTelemetry) live in venvs of their own, which ``make frameworks`` builds under
``~/.cache/loopwatch/frameworks``: the test runs the framework's side there, as a subprocess on
the repository's tree, while the worker runs here on the real broker."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "framework_venvs"
VENVS = Path(os.environ.get("LOOPWATCH_FRAMEWORKS", Path.home() / ".cache" / "loopwatch" / "frameworks"))


def run_in_framework_venv(framework: str, script: str, lw: Any, **spec: Any) -> dict:
    """Runs ``framework_venvs/<script>`` in the framework's venv against ``lw``'s broker and
    topics; returns the JSON it prints."""
    python = VENVS / framework / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python} is missing: `make frameworks` builds the {framework} venv")
    spec |= {"broker": lw.broker, "tool_calls": lw.names.tool_calls, "verdicts": lw.names.verdicts}
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHONPATH"] = str(REPO)  # the tree under test, ahead of the venv's installed copy
    proc = subprocess.run(
        [str(python), str(SCRIPTS / script), json.dumps(spec)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, f"{script} failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])
