"""SIGUSR2 shows where a running worker waits (docs/operations.md: a worker that hangs), on the
real broker: every thread's stack (``faulthandler``, from the signal handler) and every asyncio
task's, on its stderr, and the worker goes on (mode's own SIGUSR2 entered pdb instead)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.kafka

CONFIG = {"tools": {"loopDetection": {"enabled": True}}}
RUNBOOK = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_sigusr2_dumps_every_threads_and_every_tasks_stack_and_the_worker_goes_on(lw):
    worker = lw.configured_worker(CONFIG)
    before = len(worker.log_text())
    subprocess.run(["kill", "-USR2", str(worker.pid)], check=True)  # the runbook's command, as written
    deadline = time.monotonic() + 30
    while "--- asyncio: end of tasks ---" not in worker.log_text()[before:]:
        assert worker.running, f"the worker exited on SIGUSR2:\n{worker.log_tail()}"
        assert time.monotonic() < deadline, f"no task dump 30 s after SIGUSR2:\n{worker.log_tail()}"
        time.sleep(0.2)
    dump = worker.log_text()[before:]
    # faulthandler's format: the main thread (the event loop's) and the watchdog's thread
    assert "Current thread 0x" in dump or "Thread 0x" in dump, dump[:3000]
    assert "(most recent call first):" in dump, dump[:3000]
    assert 'File "' in dump and "in run_forever" in dump, dump[:3000]
    # the tasks: the fetch loop waits for records
    assert "--- asyncio: " in dump and " waits in:" in dump, dump[:3000]
    assert "_drain_messages" in dump, dump[:3000]
    assert "pdb" not in dump.lower(), dump[:3000]
    status, _ = worker.http("/readyz")
    assert worker.running and status == 200, worker.log_tail()

    # The runbook's command for a container without kill (the worker is PID 1 there; here, its pid).
    one_liner = re.search(r'`python -c "(import os, signal; os\.kill\(1, signal\.SIGUSR2\))"`', RUNBOOK.read_text())
    assert one_liner, "docs/operations.md no longer has the python one-liner"
    before = len(worker.log_text())
    code = one_liner.group(1).replace("os.kill(1,", f"os.kill({worker.pid},")
    subprocess.run([sys.executable, "-c", code], check=True)
    deadline = time.monotonic() + 30
    while "--- asyncio: end of tasks ---" not in worker.log_text()[before:]:
        assert worker.running and time.monotonic() < deadline, worker.log_tail()
        time.sleep(0.2)
