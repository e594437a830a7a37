"""The ``loopwatch`` command as tests run it (a subprocess from the repository), and the
check that a failure is one clear line."""

from __future__ import annotations

import subprocess
import sys

from .workers import REPO

__all__ = ["loopwatch", "one_line_error"]


def loopwatch(*args: object, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streams.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
    )


def one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """The error line, after checking the exit status ``code``, that stderr is one line and no
    traceback, and that it says each of ``needles``."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr and err.count("\n") == 0, proc.stderr
    for needle in needles:
        assert needle in err, err
    return err
