"""Child processes started in their own process group: wait for one to serve HTTP, stop one.

``loopwatch demo`` starts its worker this way, and so do the tests' and benchmarks' harnesses
(``harness/``); a group is always signalled by its id, never by a process name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable

__all__ = ["signal_group", "stop_group", "wait_http_ok"]


def wait_http_ok(
    url: str,
    process: subprocess.Popen,
    *,
    what: str,
    timeout: float,
    interval: float = 0.2,
    log_tail: Callable[[], str] | None = None,
) -> None:
    """Poll ``url`` until it answers 200.  Raises ``RuntimeError`` when ``process`` exits
    first and ``TimeoutError`` after ``timeout`` seconds (both with ``log_tail()`` if given)."""
    tail = (lambda: "") if log_tail is None else (lambda: ":\n" + log_tail())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode}{tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:  # not listening yet, or 503 (HTTPError is an OSError)
            pass
        time.sleep(interval)
    raise TimeoutError(f"{what} not ready after {timeout:.0f} s{tail()}")


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Signal the process group led by ``proc`` (started with ``start_new_session``)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def stop_group(proc: subprocess.Popen, timeout: float = 30.0) -> int | None:
    """SIGTERM ``proc``'s group (a graceful stop), SIGKILL after ``timeout``, then reap
    anything left in the group.  Returns ``proc``'s exit code."""
    if proc.poll() is None:
        signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGKILL)
            proc.wait(timeout=30)
    signal_group(proc, signal.SIGKILL)  # the process's own children, if any
    return proc.returncode
