"""Worker subprocesses for tests and benchmarks: unique topic names, a worker in its own
process group with its own ports and data directory, its health and metrics over HTTP."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streams.app.processes import signal_group, stop_group, wait_http_ok

__all__ = ["FAST_GROUP_ENV", "REPO", "WorkerNames", "WorkerProcess", "free_port", "write_config"]

REPO = Path(__file__).resolve().parents[1]


# Ports for the servers tests start (workers' web and metrics ports, gateways, servers).  The
# kernel's ephemeral range (32768-60999 here) is left out: a port found free there can be
# taken by any outgoing connection (a Kafka client's) before the server binds it, which
# crashed a worker with "Address already in use" under xdist.  Each xdist process takes its
# own slice, so two processes never hand out the same port; each slice is walked in turn.
PORTS_FROM, PORTS_PER_PROCESS, PROCESS_SLICES = 20_000, 800, 10  # 20000-27999, below the brokers'


def _port_slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else PROCESS_SLICES - 1
    start = PORTS_FROM + (index % PROCESS_SLICES) * PORTS_PER_PROCESS
    return range(start, start + PORTS_PER_PROCESS)


_next_port = [0]


def free_port() -> int:
    """A port no one listens on now, from this process's slice."""
    ports = _port_slice()
    for _ in range(len(ports)):
        port = ports[_next_port[0] % len(ports)]
        _next_port[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # the whole slice taken: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class WorkerNames:
    """Unique app id and topic names, so runs never see each other's data."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    prefix: str = "lwt"

    @property
    def app_id(self) -> str:
        return f"{self.prefix}-{self.tag}"

    @property
    def tool_calls(self) -> str:
        return f"{self.prefix}-{self.tag}-tool-calls"

    @property
    def verdicts(self) -> str:
        return f"{self.prefix}-{self.tag}-verdicts"

    @property
    def dead_letters(self) -> str:
        return f"{self.prefix}-{self.tag}-dlq"

    @property
    def incidents(self) -> str:
        return f"{self.prefix}-{self.tag}-incidents"

    @property
    def shadow_verdicts(self) -> str:
        return f"{self.prefix}-{self.tag}-verdicts-shadow"

    @property
    def changelog(self) -> str:
        return f"{self.app_id}-runs-changelog"

    def env(self) -> dict[str, str]:
        return {
            "LOOPWATCH_APP_ID": self.app_id,
            "LOOPWATCH_TOOL_CALLS_TOPIC": self.tool_calls,
            "LOOPWATCH_VERDICTS_TOPIC": self.verdicts,
            "LOOPWATCH_DEAD_LETTER_TOPIC": self.dead_letters,
            "LOOPWATCH_INCIDENTS_TOPIC": self.incidents,
            "LOOPWATCH_SHADOW_VERDICTS_TOPIC": self.shadow_verdicts,
        }


# Kafka client timeouts that make joins, failovers and restarts quick on a local broker.
FAST_GROUP_ENV = {
    "LOOPWATCH_SESSION_TIMEOUT_S": "6",
    "LOOPWATCH_HEARTBEAT_INTERVAL_S": "0.5",
    "LOOPWATCH_REBALANCE_TIMEOUT_S": "10",
    "LOOPWATCH_COMMIT_INTERVAL_S": "0.5",
}


class WorkerProcess:
    """``python -m streams.app.worker`` in its own process group, with its own ports and
    data directory.  ``stop()`` / ``kill()`` always target the group by its id."""

    def __init__(
        self,
        broker: str,
        names: WorkerNames,
        *,
        data_dir: Path | None = None,
        config: Path | None = None,
        env: dict[str, str] | None = None,
        log_dir: Path | None = None,
        loglevel: str = "info",
        label: str = "worker",
        command: list[str] | None = None,
    ) -> None:
        self.broker = broker
        self.names = names
        self.data_dir = data_dir or Path(tempfile.mkdtemp(prefix=f"lw-{names.tag}-"))
        self.config = config
        self.extra_env = dict(env or {})
        self.log_dir = log_dir or self.data_dir
        self.loglevel = loglevel
        self.label = label
        self.command = command or [sys.executable, "-m", "streams.app.worker"]
        """What starts the worker (a test's launcher may wrap ``streams.app.worker.main``)."""
        self.web_port = free_port()
        self.metrics_port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = self.log_dir / f"{label}.log"
        self.starts = 0

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.names.env())
        env.update(FAST_GROUP_ENV)
        env.update(
            LOOPWATCH_BOOTSTRAP=self.broker,
            # One static group member per label: a restart rejoins as the same member, and
            # two workers of one test never fence each other (they share a host name).
            LOOPWATCH_INSTANCE_ID=f"{self.names.app_id}-{self.label}",
            LOOPWATCH_DATA_DIR=str(self.data_dir),
            LOOPWATCH_WEB_HOST="127.0.0.1",
            LOOPWATCH_WEB_PORT=str(self.web_port),
            LOOPWATCH_METRICS_PORT=str(self.metrics_port),
        )
        if self.config is not None:
            env["LOOPWATCH_CONFIG"] = str(self.config)
        env.update(self.extra_env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def start(self) -> WorkerProcess:
        if self.running:
            raise RuntimeError(f"{self.label} is already running")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        log = open(self.log_path, "ab")
        log.write(f"\n===== start #{self.starts} at {time.strftime('%H:%M:%S')} =====\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            [*self.command, "--loglevel", self.loglevel, "--quiet"],
            cwd=str(REPO),
            env=self.environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: kill the group, never by name
        )
        log.close()
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def kill(self) -> None:
        """SIGKILL the worker's process group (a crash: nothing is flushed or committed)."""
        if self.proc is None:
            return
        signal_group(self.proc, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (a graceful stop), SIGKILL after ``timeout``.  Returns the exit code."""
        return None if self.proc is None else stop_group(self.proc, timeout)

    def http(self, path: str, port: int | None = None) -> tuple[int, str]:
        url = f"http://127.0.0.1:{port or self.web_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=3) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except (OSError, urllib.error.URLError):
            return 0, ""

    def wait_ready(self, timeout: float = 60.0) -> None:
        wait_http_ok(
            f"http://127.0.0.1:{self.web_port}/readyz",
            self.proc,
            what=self.label,
            timeout=timeout,
            log_tail=self.log_tail,
        )

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Parsed ``/metrics``: (name, sorted labels) -> value."""
        status, text = self.http("/metrics", self.metrics_port)
        if status != 200:
            return {}
        out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            head, _, value = line.rpartition(" ")
            name, _, labels = head.partition("{")
            pairs: list[tuple[str, str]] = []
            if labels:
                for item in labels.rstrip("}").split('",'):
                    if item:
                        k, _, v = item.partition("=")
                        pairs.append((k, v.strip('"')))
            out[(name, tuple(sorted(pairs)))] = float(value)
        return out

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples matching ``labels``."""
        total = 0.0
        for (n, pairs), value in self.metrics().items():
            if n == name and all(dict(pairs).get(k) == v for k, v in labels.items()):
                total += value
        return total

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def write_config(path: Path, root: Any) -> None:
    """Write a config file atomically (rename into place), as a config-map update would."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(root))
    os.replace(tmp, path)
