"""``loopwatch worker`` on an install without the worker extra: one line that names the extra
and what is missing, exit code 2, no traceback (tests/packaging checks it on a real base
install of the wheel)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

from harness import REPO
from harness.cli import one_line_error


def worker_without(*modules: str) -> subprocess.CompletedProcess[str]:
    # the modules made unimportable in a child interpreter, as on an install without them
    hide = "; ".join(f"sys.modules[{m!r}] = None" for m in modules)
    code = f"import sys; {hide}; from streams.cli import main; sys.exit(main(['worker']))"
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_worker_without_any_of_its_packages_names_the_extra_in_one_line():
    proc = worker_without("faust", "mode", "rocksdict", "prometheus_client")
    line = one_line_error(proc, 2)
    assert line == (
        "loopwatch worker: needs the optional extra (missing faust-streaming, mode-streaming, rocksdict, "
        "prometheus-client): pip install 'loopwatch[worker]'"
    )
    assert proc.stdout == ""


def test_worker_missing_one_package_names_that_distribution():
    line = one_line_error(worker_without("rocksdict"), 2, "pip install 'loopwatch[worker]'")
    assert "(missing rocksdict)" in line


def test_the_packages_the_cli_looks_for_are_the_worker_extras():
    from streams.cli import WORKER_PACKAGES

    with (REPO / "pyproject.toml").open("rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["worker"]
    distributions = {re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0] for requirement in extra}
    assert set(WORKER_PACKAGES.values()) == distributions
