"""Integration tests against the real local broker (``scripts/kafka.sh``); Kafka is never mocked.

* ``kafka_broker`` (session): starts the broker (idempotent) and returns its bootstrap address;
* ``lw`` (per test): unique app id and topic names, worker subprocesses that are always
  killed (by process group) when the test ends, pass or fail, and topics deleted afterwards;
* ``lw_module`` (per module): the same, shared by the tests of one module;
* ``secure_kafka`` (session): the secured broker (``scripts/kafka.sh --secure``: TLS,
  SCRAM-SHA-512, ACLs), its CA file and its users' passwords;
* ``node`` (session): the Node.js that runs the TypeScript client's end-to-end runner
  (``node_runner.py``), which ``make ts-client`` builds.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from node_runner import RUNNER

from harness import REPO, WorkerNames, WorkerProcess, delete_topics, write_config
from streams.client import LoopwatchClient

KAFKA_SH = REPO / "scripts" / "kafka.sh"
WAIT_FOR_SCRIPT_S = 15 * 60


def _kafka_env(*flags: str) -> dict[str, str]:
    out = subprocess.run([str(KAFKA_SH), *flags, "env"], capture_output=True, text=True, check=True).stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    if "KAFKA_BOOTSTRAP" not in env:
        raise RuntimeError(f"scripts/kafka.sh env printed no KAFKA_BOOTSTRAP: {out!r}")
    return env


def _bootstrap() -> str:
    return _kafka_env()["KAFKA_BOOTSTRAP"]


@pytest.fixture(scope="session")
def kafka_broker() -> str:
    deadline = time.monotonic() + WAIT_FOR_SCRIPT_S
    while not os.access(KAFKA_SH, os.X_OK):  # written by another engineer: wait for it
        if time.monotonic() > deadline:
            pytest.fail(f"{KAFKA_SH} did not appear within {WAIT_FOR_SCRIPT_S}s")
        time.sleep(5)
    started = subprocess.run([str(KAFKA_SH), "start"], capture_output=True, text=True)
    if started.returncode != 0:
        pytest.fail(f"scripts/kafka.sh start failed:\n{started.stdout}\n{started.stderr}")
    return os.environ.get("LOOPWATCH_TEST_BROKER") or _bootstrap()


class Loopwatch:
    """One test's names, workers and scratch directory."""

    def __init__(self, broker: str, tmp: Path, request: pytest.FixtureRequest) -> None:
        self.broker = broker
        self.tmp = tmp
        self.names = WorkerNames(prefix="lwit")
        self.workers: list[WorkerProcess] = []
        self._request = request

    def worker(self, label: str = "worker", **kwargs) -> WorkerProcess:
        kwargs.setdefault("data_dir", self.tmp / f"{label}-data")
        kwargs.setdefault("log_dir", self.tmp / "logs")
        w = WorkerProcess(self.broker, self.names, label=label, **kwargs)
        self.workers.append(w)
        return w

    def configured_worker(self, config: Any, label: str = "worker", ready_timeout: float = 90) -> WorkerProcess:
        """A worker started on ``config`` (written to the scratch directory) and ready."""
        path = self.tmp / f"{label}-loop-detection.json"
        write_config(path, config)
        w = self.worker(label, config=path).start()
        w.wait_ready(ready_timeout)
        return w

    def client(self, **options: Any) -> LoopwatchClient:
        """A runner client on this test's topics.  Its timeout is 10 s unless given: a verdict
        takes milliseconds; 10 s only rides out a loaded host."""
        options.setdefault("timeout", 10.0)
        return LoopwatchClient(
            self.broker, tool_calls_topic=self.names.tool_calls, verdicts_topic=self.names.verdicts, **options
        )

    def cleanup(self) -> None:
        for w in self.workers:
            try:
                w.stop(timeout=15)
            except Exception:  # noqa: BLE001 - keep killing the others
                w.kill()

    def dump_logs(self) -> str:
        return "\n".join(f"----- {w.label} (pid {w.pid}) -----\n{w.log_tail(80)}" for w in self.workers)

    def delete_topics(self) -> None:
        try:  # every topic of the run (and the changelog) starts with the app id
            asyncio.run(asyncio.wait_for(delete_topics(self.broker, [self.names.app_id]), 30))
        except Exception:  # noqa: BLE001 - best effort
            pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture
def lw(kafka_broker, request):
    tmp = Path(tempfile.mkdtemp(prefix="lwit-"))
    state = Loopwatch(kafka_broker, tmp, request)
    try:
        yield state
    finally:
        state.cleanup()
        failed = getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed
        if failed:
            print(f"\nworker logs kept in {tmp / 'logs'}\n{state.dump_logs()}")
        state.delete_topics()
        if os.environ.get("LOOPWATCH_TEST_KEEP_LOGS"):
            print(f"\nworker logs kept in {tmp / 'logs'} (LOOPWATCH_TEST_KEEP_LOGS)")
        elif not failed:
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def lw_module(kafka_broker, request):
    """Like ``lw``, but shared by the tests of one module: one set of workers (and whatever the
    module starts next to them) serves many checks.  Workers are killed and topics deleted
    when the module is done; logs are printed and kept if any of its tests failed."""
    tmp = Path(tempfile.mkdtemp(prefix="lwit-"))
    state = Loopwatch(kafka_broker, tmp, request)
    failed_before = request.session.testsfailed
    try:
        yield state
    finally:
        state.cleanup()
        failed = request.session.testsfailed > failed_before
        if failed:
            print(f"\nworker logs kept in {tmp / 'logs'}\n{state.dump_logs()}")
        state.delete_topics()
        if not failed:
            shutil.rmtree(tmp, ignore_errors=True)


@dataclass(frozen=True)
class SecureKafka:
    """The secured broker: SASL_SSL, SCRAM-SHA-512, users admin (super user), loopwatch
    (the worker), runner and outsider (no ACLs), ACLs from scripts/kafka/secure-acls.conf."""

    bootstrap: str
    cafile: Path
    secrets_dir: Path

    def password(self, user: str) -> str:
        return (self.secrets_dir / f"{user}.password").read_text().strip()

    def client_options(self, user: str, *, password: str | None = None, cafile: Path | None = None) -> dict[str, Any]:
        """aiokafka keyword arguments for ``user`` (``password``/``cafile`` to get them wrong)."""
        return dict(
            security_protocol="SASL_SSL",
            ssl_context=ssl.create_default_context(cafile=str(cafile or self.cafile)),
            sasl_mechanism="SCRAM-SHA-512",
            sasl_plain_username=user,
            sasl_plain_password=self.password(user) if password is None else password,
        )

    def start(self) -> None:
        """(Re)start or re-set-up the broker: users, ACLs and missing topics (idempotent)."""
        started = subprocess.run([str(KAFKA_SH), "--secure", "start"], capture_output=True, text=True)
        if started.returncode != 0:
            pytest.fail(f"scripts/kafka.sh --secure start failed:\n{started.stdout}\n{started.stderr}")


@pytest.fixture(scope="session")
def secure_kafka() -> SecureKafka:
    env = _kafka_env("--secure")
    broker = SecureKafka(env["KAFKA_BOOTSTRAP"], Path(env["KAFKA_SSL_CAFILE"]), Path(env["KAFKA_SECRETS_DIR"]))
    broker.start()
    return broker


@pytest.fixture(scope="session")
def node() -> str:
    path = shutil.which("node")
    if path is None:
        pytest.fail("node (20 or newer) is not installed; the TypeScript client's tests need it")
    if not RUNNER.exists():
        pytest.fail(f"{RUNNER.relative_to(REPO)} is not built: run `make ts-client` (make test does)")
    return path
