"""SIGUSR2 shows where a running worker waits (docs/operations.md: a worker that hangs), on the
real broker: every thread's stack (``faulthandler``, from the signal handler) and every asyncio
task's, on its stderr, and the worker goes on (mode's own SIGUSR2 entered pdb instead)."""

from __future__ import annotations

import os
import signal
import time

import pytest

pytestmark = pytest.mark.kafka

CONFIG = {"tools": {"loopDetection": {"enabled": True}}}


def test_sigusr2_dumps_every_threads_and_every_tasks_stack_and_the_worker_goes_on(lw):
    worker = lw.configured_worker(CONFIG)
    before = len(worker.log_text())
    os.kill(worker.pid, signal.SIGUSR2)  # what the runbook says: kill -USR2 <pid>
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
