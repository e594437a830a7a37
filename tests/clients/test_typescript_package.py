"""The TypeScript client's own tests (clients/typescript, `npm test`): hashing against the
spec, the events against schemas/jsonschema, the cross-language hashing proof against
streams/edge/events.py, the client and the OpenClaw plugin with an unreachable broker. No broker
is needed; the end-to-end tests on the real one are tests/integration/test_typescript_client.py.
`make test` installs the npm dependencies from the lock file and builds the package first.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "clients" / "typescript"


def test_npm_test_passes():
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm (Node.js 20.19 or newer) is not installed; the TypeScript client's tests need it")
    if not (PACKAGE / "node_modules" / ".package-lock.json").exists():
        pytest.fail("clients/typescript has no node_modules: run `make ts-client` (make test does)")
    # The cross-language tests run streams/edge/events.py with this very interpreter.
    env = {**os.environ, "LOOPWATCH_PYTHON": sys.executable}
    run = subprocess.run([npm, "test"], cwd=PACKAGE, env=env, capture_output=True, text=True, timeout=900)
    summary = "\n".join(line for line in run.stdout.splitlines() if line.startswith(("ℹ", "✖", "#")))
    assert run.returncode == 0, f"npm test failed:\n{run.stdout[-20000:]}\n{run.stderr[-5000:]}"
    counts = {key: int(n) for key, n in re.findall(r"^ℹ (pass|fail|skipped|todo|cancelled) (\d+)$", run.stdout, re.M)}
    assert counts.get("fail") == 0 and counts.get("skipped") == 0 and counts.get("todo") == 0, summary
    assert counts.get("pass", 0) >= 40, summary  # the suite really ran
