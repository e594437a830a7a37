"""Drive real workers from tests and benchmarks: worker subprocesses, producing events,
collecting verdicts and dead letters, and the engine-alone reference answers.

Nothing here mocks Kafka: these helpers talk to a real broker with plain aiokafka clients.
The Kafka helpers take ``client_options``, aiokafka's security keyword arguments
(``Settings.kafka_client_options()``'s form), for the secured broker.
"""

from __future__ import annotations

import asyncio
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
from typing import Any, Callable, Iterable, Mapping, Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from schemas import decode_verdict, encode_event
from schemas.events import ToolCallEvent
from schemas.keys import record_key
from streams.engine import LoopEngine, state_key

__all__ = [
    "WorkerProcess",
    "WorkerNames",
    "collect",
    "collect_verdicts",
    "committed_offsets",
    "dedupe",
    "encode_all",
    "end_offsets",
    "free_port",
    "header",
    "produce",
    "reference_verdicts",
    "wait_for_topic",
    "write_config",
]

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
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
    def changelog(self) -> str:
        return f"{self.app_id}-runs-changelog"

    def env(self) -> dict[str, str]:
        return {
            "LOOPWATCH_APP_ID": self.app_id,
            "LOOPWATCH_TOOL_CALLS_TOPIC": self.tool_calls,
            "LOOPWATCH_VERDICTS_TOPIC": self.verdicts,
            "LOOPWATCH_DEAD_LETTER_TOPIC": self.dead_letters,
        }


# Kafka client timeouts that make joins, failovers and restarts quick on a local broker.
FAST_GROUP_ENV = {
    "LOOPWATCH_SESSION_TIMEOUT_S": "6",
    "LOOPWATCH_HEARTBEAT_INTERVAL_S": "0.5",
    "LOOPWATCH_REBALANCE_TIMEOUT_S": "10",
    "LOOPWATCH_COMMIT_INTERVAL_S": "0.5",
}


def wait_http_ok(
    url: str, process: subprocess.Popen, *, what: str, timeout: float, interval: float = 0.2,
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
    ) -> None:
        self.broker = broker
        self.names = names
        self.data_dir = data_dir or Path(tempfile.mkdtemp(prefix=f"lw-{names.tag}-"))
        self.config = config
        self.extra_env = dict(env or {})
        self.log_dir = log_dir or self.data_dir
        self.loglevel = loglevel
        self.label = label
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
            LOOPWATCH_BROKER=self.broker,
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

    def start(self) -> "WorkerProcess":
        if self.running:
            raise RuntimeError(f"{self.label} is already running")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        log = open(self.log_path, "ab")
        log.write(f"\n===== start #{self.starts} at {time.strftime('%H:%M:%S')} =====\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streams.app.worker", "--loglevel", self.loglevel, "--quiet"],
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
        wait_http_ok(f"http://127.0.0.1:{self.web_port}/readyz", self.proc, what=self.label, timeout=timeout,
                     log_tail=self.log_tail)

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


# -- Kafka I/O --------------------------------------------------------------------------------


async def wait_for_topic(
    broker: str, topic: str, timeout: float = 60.0, *, client_options: Mapping[str, Any] | None = None
) -> int:
    """Wait until ``topic`` exists; returns its partition count."""
    admin = AIOKafkaAdminClient(bootstrap_servers=broker, **(client_options or {}))
    await admin.start()
    try:
        deadline = time.monotonic() + timeout
        while True:
            described = await admin.describe_topics([topic])
            info = described[0] if described else {}
            if info.get("error_code", 1) == 0 and info.get("partitions"):
                return len(info["partitions"])
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {topic} does not exist after {timeout}s")
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


async def delete_topics(
    broker: str, prefixes: Iterable[str], *, client_options: Mapping[str, Any] | None = None
) -> list[str]:
    """Delete every topic whose name starts with one of ``prefixes``; returns their names."""
    admin = AIOKafkaAdminClient(bootstrap_servers=broker, **(client_options or {}))
    await admin.start()
    try:
        doomed = [t for t in await admin.list_topics() if t.startswith(tuple(prefixes))]
        if doomed:
            await admin.delete_topics(doomed)
        return doomed
    finally:
        await admin.close()


async def committed_offsets(broker: str, group: str, topic: str) -> dict[int, int]:
    """Per partition of ``topic`` with a committed offset: the group's committed offset."""
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp.partition: meta.offset for tp, meta in committed.items() if tp.topic == topic and meta.offset >= 0}


async def end_offsets(broker: str, topic: str) -> dict[int, int]:
    """Per partition of ``topic``: its end offset (the number of records it ever had)."""
    tps = [TopicPartition(topic, p) for p in range(await wait_for_topic(broker, topic))]
    consumer = AIOKafkaConsumer(bootstrap_servers=broker, enable_auto_commit=False)
    await consumer.start()
    try:
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
    return {tp.partition: offset for tp, offset in ends.items()}


async def group_lag(broker: str, group: str, topic: str) -> dict[int, int]:
    """Per partition of ``topic``: end offset minus the group's committed offset (the whole
    partition when nothing is committed)."""
    ends = await end_offsets(broker, topic)
    committed = await committed_offsets(broker, group, topic)
    return {partition: end - committed.get(partition, 0) for partition, end in ends.items()}


def encode_all(events: Iterable[ToolCallEvent]) -> list[tuple[bytes, bytes]]:
    """(Kafka key, value) per event, keyed as the runner client keys them (``record_key``)."""
    return [(record_key(event).encode("utf-8", "surrogatepass"), encode_event(event)) for event in events]


async def produce(
    broker: str,
    topic: str,
    records: Sequence[tuple[bytes | None, bytes | None] | tuple[bytes | None, bytes | None, Any]],
    *,
    rate: float | None = None,
    on_sent: Callable[[int, float], None] | None = None,
    client_options: Mapping[str, Any] | None = None,
) -> float:
    """Produce records (in order, keyed; a third item is the record's headers); ``rate``
    events/s paces them.  Returns seconds taken."""
    producer = AIOKafkaProducer(
        bootstrap_servers=broker, linger_ms=2 if rate else 10, max_batch_size=512 * 1024,
        max_request_size=4 * 1024 * 1024, acks="all", **(client_options or {}),
    )
    await producer.start()
    start = time.perf_counter()
    try:
        futures = []
        for i, (key, value, *headers) in enumerate(records):
            if rate:
                due = start + i / rate
                delay = due - time.perf_counter()
                if delay > 0.001:
                    await asyncio.sleep(delay)
            futures.append(await producer.send(topic, value, key=key, headers=headers[0] if headers else None))
            if on_sent is not None:
                on_sent(i, time.time())
            if len(futures) >= 5000:
                await asyncio.gather(*futures)
                futures.clear()
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return time.perf_counter() - start


async def collect(
    broker: str,
    topic: str,
    *,
    until: Callable[[list], bool],
    timeout: float = 60.0,
    settle: float = 0.0,
    client_options: Mapping[str, Any] | None = None,
) -> list:
    """Read ``topic`` from the beginning until ``until(records)`` holds (then ``settle`` seconds
    more, to catch late duplicates) or ``timeout`` passes.  Returns aiokafka records."""
    await wait_for_topic(broker, topic, timeout=timeout, client_options=client_options)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=broker, enable_auto_commit=False, auto_offset_reset="earliest", **(client_options or {})
    )
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        while not partitions:
            await consumer._client.force_metadata_update()
            partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        out: list = []
        deadline = time.monotonic() + timeout
        settle_until = None
        while True:
            now = time.monotonic()
            if settle_until is None and until(out):
                settle_until = now + settle
            if settle_until is not None and now >= settle_until:
                return out
            if now > deadline:
                return out
            batch = await consumer.getmany(timeout_ms=200)
            for tp_records in batch.values():
                out.extend(tp_records)
    finally:
        await consumer.stop()


async def collect_verdicts(
    broker: str, topic: str, expected_ids: Iterable[str], *, timeout: float = 60.0, settle: float = 0.5,
) -> list:
    """Every verdict record of ``topic``, read until each of ``expected_ids`` has arrived."""
    want = set(expected_ids)

    def done(records: list) -> bool:
        return want <= {decode_verdict(r.value).verdict_id for r in records}

    return await collect(broker, topic, until=done, timeout=timeout, settle=settle)


# -- reference answers ------------------------------------------------------------------------


def reference_verdicts(events: Iterable[ToolCallEvent], config: Any = None) -> list:
    """What loopwatch publishes for these events, answered by the engine alone: every
    decision of a gate call, every warn/block, every abort, in event order."""
    engine = config if isinstance(config, LoopEngine) else LoopEngine(config)
    states: dict[str, Any] = {}
    out = []
    for event in events:
        key = state_key(event)
        step = engine.handle(states.get(key), event)
        if step.state is None:
            states.pop(key, None)
        else:
            states[key] = step.state
        if step.decision is not None and (getattr(event, "gate", False) or step.decision.action != "allow"):
            out.append(step.decision)
        if step.abort is not None:
            out.append(step.abort)
    return out


def dedupe(records: Iterable[Any]) -> tuple[dict[str, Any], int, int]:
    """Verdicts by id, first delivery kept.  Returns (by_id, duplicates, differing duplicates)."""
    by_id: dict[str, Any] = {}
    duplicates = differing = 0
    for record in records:
        verdict = decode_verdict(record.value)
        seen = by_id.get(verdict.verdict_id)
        if seen is None:
            by_id[verdict.verdict_id] = verdict
        else:
            duplicates += 1
            if seen != verdict:
                differing += 1
    return by_id, duplicates, differing


def header(record: Any, name: str) -> str | None:
    for key, value in record.headers or ():
        if key == name:
            return value.decode("utf-8", "replace")
    return None


def write_config(path: Path, root: Any) -> None:
    """Write a config file atomically (rename into place), as a config-map update would."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(root))
    os.replace(tmp, path)
