"""bench/placement.py: finding the broker by its port, and pinning every thread of a process tree."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from bench.placement import listening_pid, pin

# a child with a second thread and a grandchild, both alive until their stdin closes
TREE = """
import subprocess, sys, threading
threading.Thread(target=sys.stdin.read, daemon=True).start()
grandchild = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
print(grandchild.pid, flush=True)
sys.stdin.read()
grandchild.stdin.close()
grandchild.wait()
"""


def test_listening_pid_finds_the_process_listening_on_a_port():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        assert listening_pid(port) is None  # bound, not listening
        listener.listen()
        assert listening_pid(port) == os.getpid()
    assert listening_pid(port) is None


def test_pin_reaches_every_thread_of_the_process_and_its_descendants():
    cpus = sorted(os.sched_getaffinity(0))
    child = subprocess.Popen([sys.executable, "-c", TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(child.stdout.readline())
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{child.pid}/task")) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        threads = [int(t) for pid in (child.pid, grandchild) for t in os.listdir(f"/proc/{pid}/task")]
        assert len(threads) >= 3
        assert pin(child.pid, {cpus[-1]}) == len(threads)
        assert {tid: os.sched_getaffinity(tid) for tid in threads} == {tid: {cpus[-1]} for tid in threads}
        assert os.sched_getaffinity(0) == set(cpus)  # the caller is not in the tree
    finally:
        child.stdin.close()
        child.wait(timeout=10)
