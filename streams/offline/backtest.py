"""``loopwatch backtest``: a baseline config and a candidate config over the same recorded events.

Each config gets its own engine and fresh state (``streams.engine.RunDriver``), and every
record goes through the worker's own checks first (``streams.engine.intake.check_record``):
what it refuses is counted by the reason the worker would dead-letter it with, and an event
whose id its run already applied (a runner's retry) is skipped as the worker skips it
(``streams.app.run_store``'s per-run event-id digests).  Records come from JSONL files (plain
or gzip: one ``tool-calls`` event a line, no Kafka key, so the key check is not made) or from
a range of a ``tool-calls`` topic (``KafkaRange``), checked with their keys.

The report (``Report``) compares what the two configs publish (``streams.engine.published``):

* per agent, detector and tool, the runs each config warned, blocked and aborted;
* each run's outcome (``streams.engine.outcome``: its strongest verdict, none < warn < block
  < abort) under each config, the runs whose outcome changes, and for each the first event
  where the two configs disagree (the first step whose outcome ranks differ);
* blocks in runs that later ended normally (``run.ended`` with a reason in
  ``NORMAL_END_REASONS``): the likely false positives of each config;
* verdicts per minute of event time, for ``--plot``.

An agent whose settings the candidate leaves as they are (``LoopEngine.settings_for`` equal
under both) is judged once: until a run gets an event of an agent whose settings differ, its
candidate state would be its baseline state, step for step, so the candidate reuses the
baseline's steps; at that event the candidate takes a copy of the run's state and goes on
with its own (``_Side``).  Trying a change for one agent of many costs little more than one
config's run.

Signatures: with the worker's keyring (``keyring``: ``--signing-keys``), a topic's records are
verified as the worker verifies them (``schemas.signing``), and one that fails is counted
``bad_signature``; without it, the records that carry a signature are counted (``signed``),
unchecked.  A file of events holds no Kafka headers, so no signature.

Not reproduced: the worker's clock (a far-future ``ts_ms`` is clamped to the worker's clock
when it is processed; here event times are taken as they are), and with a keyring, its
freshness check of signed events against their records' Kafka timestamps.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import multiprocessing
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import IO, Any, TypeVar

from schemas.errors import LoopwatchError
from schemas.events import EVENT_TYPE_OF, InvalidEvent, RunEnded
from schemas.names import OUTCOMES, PROCESSING_ERROR
from schemas.signing import SIGNATURE_HEADER, Keyring

from ..engine import LoopEngine, RunDriver, copy_state, outcome
from ..engine.drive import NONE
from ..engine.intake import check_record, event_digest, remember, seen_before
from .files import MAX_LINE_BYTES, OverlongLine, decompressed, read_lines
from .sharded import ShardError, run_sharded, run_split, value_state_key

__all__ = [
    "Backtest",
    "BacktestError",
    "FileRecords",
    "FileSource",
    "KafkaRange",
    "NORMAL_END_REASONS",
    "Report",
    "checked",
    "records_sharded",
    "render_table",
]

T = TypeVar("T")

NORMAL_END_REASONS = ("completed",)
"""``run.ended`` reasons of a run that finished its work (the clients' ``completed``; the
OpenClaw plugin sends ``failed`` for an unsuccessful end, and a runner ends an aborted run
with ``aborted``)."""
BASELINE, CANDIDATE = "baseline", "candidate"
SIDES = (BASELINE, CANDIDATE)
NO_AGENT = "(none)"
EXAMPLES = 20
"""Runs listed per list in the terminal table (``--json`` lists them all)."""


class BacktestError(LoopwatchError):
    """Input the backtest cannot use: the message is one line for the user; ``code`` the exit
    status (2: bad input, 1: nothing to compare)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


# -- sources -------------------------------------------------------------------------------------


class _Line:
    """A line of a file as the worker's record check reads a record (no key, no headers)."""

    __slots__ = ("value", "topic", "partition", "offset")
    key = None
    headers = ()

    def __init__(self, path: str) -> None:
        self.topic = path
        self.partition = 0
        self.offset = 0
        self.value = b""


OVERLONG = b" " * (MAX_LINE_BYTES + 1)
"""What an over-long line is checked as: a record over the limit, refused as ``oversized`` by
the event check before any parsing (one shared buffer; the line itself was never held)."""


class FileSource:
    """JSONL files of ``tool-calls`` events (``.gz``: gzip), one event a line, in order."""

    keyed = False

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.total = 0
        for path in paths:
            try:
                self.total += path.stat().st_size
            except OSError as exc:
                raise BacktestError(f"cannot read {path}: {exc.strerror or exc}") from None
            if path.is_dir():
                raise BacktestError(f"cannot read {path}: is a directory")
        self._done = 0
        self._raw: Any = None
        self.overlong = 0
        """Lines over ``streams.offline.files.MAX_LINE_BYTES``, skipped unread (counted ``oversized``)."""
        self.shard_progress: Any = None
        """While shards read the files (``records_sharded``): each shard's (records read, bytes
        on disk read), for ``progress``."""

    def progress(self) -> float | None:
        """The share of the input read (by bytes on disk; in shards, by the slowest shard)."""
        if not self.total:
            return None
        return min(1.0, (self._shared_at() if self.shard_progress is not None else self.bytes_read()) / self.total)

    def any_gzip(self) -> bool:
        """Whether any of the files is gzip (by its magic bytes, as ``decompressed`` decides)."""
        for path in self.paths:
            try:
                with open(path, "rb") as fh:
                    if fh.read(2) == b"\x1f\x8b":
                        return True
            except OSError:
                return True  # the one-process reader names the error as it always has
        return False

    def bytes_read(self) -> int:
        """Bytes on disk read so far (in this process)."""
        return self._done + (self._raw.tell() if self._raw is not None and not self._raw.closed else 0)

    def _shared_at(self) -> int:
        shared = self.shard_progress
        return min(shared[i] for i in range(1, len(shared), 2))

    def records(self) -> FileRecords:
        """The records, in order (iterable; ``loopwatch backtest --jobs`` hands each shard
        the files themselves: ``records_sharded``)."""
        return FileRecords(self)

    def lines(self) -> Iterator[_Line]:
        """One pass over the files' lines, as records (``records()`` is the view to iterate)."""
        for path in self.paths:
            line = _Line(str(path))
            try:
                raw = open(path, "rb")
            except OSError as exc:
                raise BacktestError(f"cannot read {path}: {exc.strerror or exc}") from None
            self._raw = raw
            with raw:
                try:
                    for number, value in enumerate(read_lines(decompressed(raw)), 1):
                        if value.__class__ is OverlongLine:  # counted as the worker would: oversized
                            self.overlong += 1
                            line.offset, line.value = number, OVERLONG
                            yield line
                        elif value.strip():
                            line.offset, line.value = number, value
                            yield line
                except (OSError, EOFError, gzip.BadGzipFile) as exc:
                    raise BacktestError(f"cannot read {path}: {exc}") from None
            self._done += self.total and path.stat().st_size


class FileRecords:
    """``FileSource.records()``: its lines as records, in order, each time it is iterated."""

    __slots__ = ("source",)

    def __init__(self, source: FileSource) -> None:
        self.source = source

    def __iter__(self) -> Iterator[_Line]:
        return self.source.lines()


def parse_time(text: str, now: float | None = None) -> int:
    """Epoch milliseconds of ``--since``/``--until``: an ISO 8601 time (UTC unless it says
    otherwise), epoch milliseconds, or a duration ago (``90s``, ``30m``, ``2h``, ``7d``)."""
    from datetime import datetime

    text = text.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text[:-1].isdigit() and text[-1:] in units:
        return int(((time.time() if now is None else now) - int(text[:-1]) * units[text[-1]]) * 1000)
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BacktestError(
            f"cannot read the time {text!r}: use ISO 8601 (2026-12-01T10:00:00Z), epoch milliseconds, or 30m/2h/7d ago"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


@dataclass
class KafkaRange:
    """A range of a topic's records, the same on every partition: from ``start`` (an offset)
    or ``since_ms`` (the first record at or after that time) or the beginning, to ``end``
    (exclusive) or ``until_ms`` (the first record at or after it, exclusive) or the end offsets
    when the backtest begins."""

    broker: str
    topic: str
    start: int | None = None
    end: int | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    timeout_s: float = 15.0
    client_options: dict = field(default_factory=dict)
    keyed = True

    def __post_init__(self) -> None:
        self.total = 0
        self.read = 0

    def progress(self) -> float | None:
        return min(1.0, self.read / self.total) if self.total else None

    def records(self) -> Iterator[Any]:
        """The range's records, fetched on a loop of their own (the backtest is synchronous)."""
        loop = asyncio.new_event_loop()
        try:
            consumer, bounds = loop.run_until_complete(self._open())
            try:
                while bounds:
                    for record in loop.run_until_complete(self._fetch(consumer, bounds)):
                        self.read += 1
                        yield record
            finally:
                loop.run_until_complete(consumer.stop())
        finally:
            loop.close()

    async def _partitions(self) -> set[int]:
        """The topic's partitions, asked of the broker: a consumer that has just started may not
        know the topic yet, and only its client's private methods would ask (an admin client's
        public ``describe_topics`` does).  Empty when the topic does not exist."""
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.broker, request_timeout_ms=int(self.timeout_s * 1000), **self.client_options
        )
        await asyncio.wait_for(admin.start(), self.timeout_s)
        try:
            described = await admin.describe_topics([self.topic])
        finally:
            await admin.close()
        info = described[0] if described else {}
        if info.get("error_code", 1) != 0:
            return set()
        return {p["partition"] for p in info.get("partitions", ())}

    async def _open(self) -> tuple[Any, dict]:
        from aiokafka import AIOKafkaConsumer, TopicPartition
        from aiokafka.errors import KafkaError

        from ..edge.broker import BrokerAccessError, broker_access, speaks_tls

        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.broker,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            request_timeout_ms=int(self.timeout_s * 1000),
            max_partition_fetch_bytes=4 * 1024 * 1024,
            fetch_max_bytes=16 * 1024 * 1024,
            **self.client_options,
        )
        aiokafka_log = logging.getLogger("aiokafka")
        level = aiokafka_log.level
        aiokafka_log.setLevel(logging.CRITICAL)  # its connection errors: the one line below says it
        try:
            async with broker_access(
                self.broker,
                username=self.client_options.get("sasl_plain_username"),
                mechanism=self.client_options.get("sasl_mechanism"),
                tls=speaks_tls(self.client_options.get("security_protocol")),
            ):
                await asyncio.wait_for(consumer.start(), self.timeout_s)
        except BrokerAccessError as exc:
            await consumer.stop()
            raise BacktestError(f"cannot use the broker: {exc}") from None
        except (TimeoutError, KafkaError, OSError) as exc:
            await consumer.stop()
            raise BacktestError(f"cannot reach the broker at {self.broker}: {_one_line(exc) or 'timed out'}") from None
        finally:
            aiokafka_log.setLevel(level)
        try:
            partitions = consumer.partitions_for_topic(self.topic) or await self._partitions()
            if not partitions:
                raise BacktestError(f"topic {self.topic} does not exist on {self.broker}")
            tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
            consumer.assign(tps)
            first = await consumer.beginning_offsets(tps)
            last = await consumer.end_offsets(tps)
            starts, ends = dict(first), dict(last)
            if self.since_ms is not None:
                found = await consumer.offsets_for_times({tp: self.since_ms for tp in tps})
                starts = {tp: last[tp] if found[tp] is None else found[tp].offset for tp in tps}
            if self.until_ms is not None:
                found = await consumer.offsets_for_times({tp: self.until_ms for tp in tps})
                ends = {tp: last[tp] if found[tp] is None else found[tp].offset for tp in tps}
            if self.start is not None:
                starts = {tp: max(first[tp], self.start) for tp in tps}
            if self.end is not None:
                ends = {tp: min(last[tp], self.end) for tp in tps}
            bounds = {tp: ends[tp] for tp in tps if starts[tp] < ends[tp]}
            self.total = sum(ends[tp] - starts[tp] for tp in bounds)
            for tp in bounds:
                consumer.seek(tp, starts[tp])
        except BaseException:
            await consumer.stop()
            raise
        if not bounds:
            await consumer.stop()
            raise BacktestError(f"the range holds no events: {self.describe()}", code=1)
        return consumer, bounds

    async def _fetch(self, consumer: Any, bounds: dict) -> list:
        fetched = await consumer.getmany(*bounds, timeout_ms=1000, max_records=10_000)
        out = []
        for tp, records in fetched.items():
            end = bounds.get(tp)
            if end is None:
                continue
            for record in records:
                if record.offset >= end:
                    break
                out.append(record)
            if (records and records[-1].offset + 1 >= end) or await consumer.position(tp) >= end:
                del bounds[tp]
                consumer.pause(tp)
        return out

    def describe(self) -> str:
        parts = [f"topic {self.topic}"]
        if self.start is not None or self.end is not None:
            parts.append(
                f"offsets {self.start if self.start is not None else 'beginning'} to "
                f"{self.end if self.end is not None else 'end'}"
            )
        if self.since_ms is not None or self.until_ms is not None:
            parts.append(
                f"times {_iso(self.since_ms) if self.since_ms is not None else 'beginning'} to "
                f"{_iso(self.until_ms) if self.until_ms is not None else 'now'}"
            )
        return ", ".join(parts)


def _iso(ms: int) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


# -- the comparison ------------------------------------------------------------------------------


@dataclass(eq=False)
class RunRecord:
    """One run that got a verdict under either config (other runs are only counted)."""

    key: bytes
    agent: str
    outcome: list[int] = field(default_factory=lambda: [NONE, NONE])
    """The run's strongest verdict so far, per config (baseline, candidate)."""
    first: dict | None = None
    """The first event where the configs disagree."""
    ended: str | None = None
    """The reason of the run's ``run.ended`` (None: not ended in the input)."""
    seen_at: int = 0
    """The number in the stream of the run's first event with a verdict."""
    ended_at: int | None = None
    """The number in the stream of its ``run.ended``."""


@dataclass
class _Tally:
    """A shard's counts and runs (``Backtest._tally``), merged by ``Backtest._merge``."""

    records: int
    events: int
    duplicates: int
    other_agents: int
    dead: Counter
    signed: int
    runs: int
    agents_seen: set
    ended: Counter
    verdicts: tuple[list, list]
    finished: list[RunRecord]
    judged: list[RunRecord]
    first_at: int | None
    first_ms: int | None
    last_at: int | None
    last_ms: int | None
    earliest_ms: int | None
    latest_ms: int | None


class _Record:
    """A topic's record as a shard rebuilds it (what the worker's record check reads)."""

    __slots__ = ("topic", "partition", "offset", "key", "value", "headers")

    def __init__(
        self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None, headers: Any = ()
    ) -> None:
        self.topic, self.partition, self.offset, self.key, self.value = topic, partition, offset, key, value
        self.headers = headers


def _rebuilt(numbered: Iterator[tuple[int, tuple]], keyed: bool) -> Iterator[tuple[int, Any]]:
    """A shard's payloads as records again: a file's lines as ``_Line`` (one, reused, as
    ``FileSource`` does), a topic's records as ``_Record``."""
    if keyed:
        for seq, fields in numbered:
            yield seq, _Record(*fields)
        return
    line = _Line("")
    for seq, (topic, _partition, offset, _key, value, _headers) in numbered:
        line.topic, line.offset, line.value = topic, offset, value
        yield seq, line


def records_sharded(
    records: Iterable[Any],
    work: Callable[[Iterator[tuple[int, Any]]], T],
    jobs: int,
    *,
    keyed: bool,
    progress: Callable[[int], None] | None,
    what: str,
    cpu_s: list[float] | None = None,
) -> list[T]:
    """``streams.offline.sharded.run_sharded`` over a source's records (``FileSource``, ``KafkaRange``):
    each shard's ``work`` gets ``(number in the stream, record)`` of its runs, rebuilt as the
    worker's record check reads them; ``progress`` counts the records read here.  A shard's
    failure is a ``BacktestError`` naming ``what`` failed (``loopwatch backtest`` and
    ``loopwatch evaluate --jobs``)."""

    def items() -> Iterator[tuple[bytes | None, tuple]]:
        n = 0
        for record in records:
            n += 1
            if progress is not None and n & 0x3FFF == 0:
                progress(n)
            value = record.value
            fields = (record.topic, record.partition, record.offset, record.key, value, tuple(record.headers or ()))
            yield value_state_key(value), fields
        if progress is not None:
            progress(n)

    if isinstance(records, FileRecords) and not keyed and not records.source.any_gzip():
        # gzip: this process inflates each file once and sends the lines (measured faster on
        # two cores than every shard inflating all of it: docs/benchmarks.md)
        return _files_sharded(records.source, work, jobs, progress=progress, what=what, cpu_s=cpu_s)
    try:
        return run_sharded(items(), lambda numbered: work(_rebuilt(numbered, keyed)), jobs, cpu_s=cpu_s)
    except ShardError as exc:
        raise BacktestError(f"{what} process failed: {exc}", code=1) from None


def _shard_lines(source: FileSource, shard: int, jobs: int, shared: Any) -> Iterator[tuple[int, _Line]]:
    """The lines of shard ``shard`` of ``jobs``, numbered by their place among all the file's
    records: every shard reads every line (``FileSource`` as one process reads it, the bound on
    each line included) and keeps those whose state key, read from the run fields alone
    (``value_state_key``, as ``run_sharded``'s parent reads it: the same shard for every line),
    falls to it.  (A byte scan for the run id, with a decode wherever the scan is not certain,
    cost more per line than this decode: docs/benchmarks.md)  ``shared`` gets
    its records read and bytes on disk read every 16,384 records and at the end."""
    crc32 = zlib.crc32
    n = 0
    at = 2 * shard
    for line in source.lines():
        if n & 0x3FFF == 0:
            shared[at], shared[at + 1] = n, source.bytes_read()
        key = value_state_key(line.value)
        if (crc32(key) % jobs if key else 0) == shard:
            yield n, line
        n += 1
    shared[at], shared[at + 1] = n, source.total


def _files_sharded(
    source: FileSource,
    work: Callable[[Iterator[tuple[int, Any]]], T],
    jobs: int,
    *,
    progress: Callable[[int], None] | None,
    what: str,
    cpu_s: list[float] | None,
) -> list[T]:
    """``records_sharded`` over files without a record through this process: each shard
    reads the files itself (``_shard_lines``).  Its result comes back with the over-long lines
    it met (every shard meets them all) or the read error it met (raised here as when one
    process reads: ``cannot read ...``, code 2)."""
    shared = multiprocessing.RawArray("q", 2 * jobs)

    def shard_work(shard: int) -> tuple:
        try:
            return True, work(_shard_lines(source, shard, jobs, shared)), source.overlong
        except BacktestError as exc:
            return False, str(exc), exc.code

    def poll() -> None:
        if progress is not None:
            progress(min(shared[i] for i in range(0, 2 * jobs, 2)))

    source.shard_progress = shared
    try:
        results = run_split(shard_work, jobs, cpu_s=cpu_s, poll=poll if progress is not None else None)
        for ok, result, extra in results:
            if not ok:
                raise BacktestError(result, code=extra)
        source.overlong += results[0][2]
        if progress is not None:
            progress(shared[0])
    except ShardError as exc:
        raise BacktestError(f"{what} process failed: {exc}", code=1) from None
    finally:
        source.shard_progress = None
    return [result for _ok, result, _extra in results]


class _Side:
    """One config's engine, and every warning, block and abort it published, as
    ``(run, action, detector, tool, minute of event time)`` (counted for the report at the end:
    appending is all a verdict costs while the records stream by)."""

    def __init__(self, engine: LoopEngine) -> None:
        self.driver = RunDriver(engine)
        self.verdicts: list[tuple[RunRecord, str, str, str, int]] = []

    def note(self, run: RunRecord, step: Any, minute: int) -> None:
        """What a step with a verdict published."""
        decision = step.published_decision
        if decision is not None and decision.action != "allow":
            self.verdicts.append((run, decision.action, decision.detector or "none", decision.tool_name, minute))
        abort = step.abort
        if abort is not None:
            self.verdicts.append((run, "abort", abort.detector, abort.tool_name, minute))


def checked(
    numbered: Iterable[tuple[int, Any]],
    *,
    keyed: bool,
    dead: Counter,
    progress: Callable[[int], None] | None = None,
    counted: list[int] | None = None,
    keyring: Keyring | None = None,
    signed: list[int] | None = None,
) -> Iterator[tuple[int, Any, Any, bytes]]:
    """``(number, record, event, state key)`` of every ``(number, record)`` the worker would
    accept (``check_record``, with the worker's ``keyring`` if given); what it would
    dead-letter is counted in ``dead`` by reason.  ``progress`` gets the records read every
    16,384 and at the end; ``counted[0]``, the records read so far (``loopwatch backtest`` and
    ``loopwatch evaluate`` read alike); ``signed[0]``, without a keyring, the records read that
    carry a signature (left unchecked)."""
    n = 0
    try:
        for seq, record in numbered:
            n += 1
            if progress is not None and n & 0x3FFF == 0:
                progress(n)
            if keyring is None and signed is not None and record.headers:
                signed[0] += any(name == SIGNATURE_HEADER for name, _value in record.headers)
            try:
                event, key = check_record(record, keyring, keyed)
            except InvalidEvent as exc:
                dead[exc.reason] += 1
                continue
            except Exception:  # noqa: BLE001 - the worker dead-letters what it cannot decode
                dead[PROCESSING_ERROR] += 1
                continue
            yield seq, record, event, key
    finally:
        if counted is not None:
            counted[0] = n
    if progress is not None:
        progress(n)


class Backtest:
    """Feed records (``run``), then read the ``report``."""

    def __init__(
        self,
        baseline: LoopEngine,
        candidate: LoopEngine,
        *,
        agents: Iterable[str] | None = None,
        normal_reasons: Iterable[str] = NORMAL_END_REASONS,
        keyring: Keyring | None = None,
    ) -> None:
        self.sides = (_Side(baseline), _Side(candidate))
        self.keyring = keyring
        """The worker's keys: only records signed by their agent's key are applied."""
        self.signed = 0
        """Without a keyring: the records read that carry a signature, which nothing checked."""
        self.agents = None if agents is None else set(agents)
        self.normal_reasons = frozenset(normal_reasons)
        self.records = 0
        self.events = 0
        self.duplicates = 0
        self.other_agents = 0
        self.dead: Counter = Counter()
        self.runs = 0
        """Runs in the input: a state key's events up to its ``run.ended`` (a later event of
        the key begins another run, as the worker starts it afresh)."""
        self.judged: dict[bytes, RunRecord] = {}
        """Open runs that got a verdict under either config."""
        self.finished: list[RunRecord] = []
        """Ended runs that got a verdict under either config."""
        self.agents_seen: set[str | None] = set()
        self.ended: Counter = Counter()
        """run.ended reasons."""
        self._open: dict[bytes, bytearray] = {}
        """Open runs: their last applied event ids (``streams.engine.intake.remember``)."""
        self._same: dict[str | None, bool] = {}
        """Agent -> whether both configs give it the same settings."""
        self._apart: set[bytes] = set()
        """Open runs with a candidate state of their own (module docstring)."""
        self.first_ms: int | None = None
        self.last_ms: int | None = None
        self.first_at: int | None = None
        self.last_at: int | None = None
        """The numbers in the stream of the first and last event (``_run``)."""
        self.earliest_ms: int | None = None
        self.latest_ms: int | None = None
        """The earliest and latest event time: the span the report covers (events need not come
        in time order: a topic's partitions interleave, files are concatenated)."""
        self.shard_cpu_s: list[float] = []
        """CPU seconds of each process of the last ``run`` in shards (``bench.backtest``)."""

    def run(
        self, records: Iterable[Any], *, keyed: bool, progress: Callable[[int], None] | None = None, jobs: int = 1
    ) -> None:
        """Every record through the worker's checks and both configs, in order; with ``jobs``
        above 1, the runs split by state key over that many processes (``streams.offline.sharded``)
        and their tallies merged: the same report, field for field."""
        if jobs > 1:
            self._run_sharded(records, keyed=keyed, progress=progress, jobs=jobs)
        else:
            self._run(enumerate(records, self.records), keyed=keyed, progress=progress)

    def _run(
        self, numbered: Iterable[tuple[int, Any]], *, keyed: bool, progress: Callable[[int], None] | None = None
    ) -> None:
        """``run`` over ``(number in the stream, record)``: the numbers order what a merge of
        shards must put back in order (runs' first verdicts and ends, the first and last event)."""
        base, cand = self.sides
        base_handle, cand_handle = base.driver.handle, cand.driver.handle
        dead, open_runs, agents, agents_seen = self.dead, self._open, self.agents, self.agents_seen
        same, apart = self._same, self._apart
        events = 0
        counted = [0]
        signed = [0]
        last_at = None
        for seq, record, event, key in checked(
            numbered, keyed=keyed, dead=dead, progress=progress, counted=counted, keyring=self.keyring, signed=signed
        ):
            agent = event.agent_id
            agents_seen.add(agent)
            if agents is not None and agent not in agents:
                self.other_agents += 1
                continue
            seen = open_runs.get(key)
            if seen is None:
                seen = open_runs[key] = bytearray()
                self.runs += 1
            digest = event_digest(event.event_id)
            if seen_before(seen, digest):
                self.duplicates += 1
                continue
            alike = same.get(agent)
            if alike is None:
                alike = same[agent] = self._alike(agent)
            try:
                if alike and key not in apart:
                    bstep = cstep = base_handle(event, key, True)
                else:
                    if key not in apart:
                        self._part(key)
                    bstep = base_handle(event, key, True)
                    cstep = cand_handle(event, key, True)
            except InvalidEvent as exc:
                dead[exc.reason] += 1
                continue
            except Exception:  # noqa: BLE001 - an engine failure is the worker's processing_error
                dead[PROCESSING_ERROR] += 1
                continue
            events += 1
            b, c = outcome(bstep), outcome(cstep)
            if b or c:
                self._verdicts(key, record, event, bstep, cstep, b, c, seq)
            if type(event) is RunEnded:
                del open_runs[key]
                apart.discard(key)
                self._ended(key, event, seq)
            else:
                remember(seen, digest)
            ts = event.ts_ms
            if self.first_ms is None:
                self.first_ms, self.first_at = ts, seq
                self.earliest_ms = self.latest_ms = ts
            elif ts < self.earliest_ms:  # type: ignore[operator]  # set with first_ms
                self.earliest_ms = ts
            elif ts > self.latest_ms:  # type: ignore[operator]
                self.latest_ms = ts
            self.last_ms = ts
            last_at = seq
        self.records += counted[0]
        self.signed += signed[0]
        self.events += events
        if last_at is not None:
            self.last_at = last_at

    def _alike(self, agent: str | None) -> bool:
        base, cand = (side.driver.engine for side in self.sides)
        return type(base) is type(cand) and base.settings_for(agent) == cand.settings_for(agent)

    def _part(self, key: bytes) -> None:
        """The run's first event of an agent the configs set differently: the candidate's
        state so far is the baseline's (a copy: from here on they differ)."""
        self._apart.add(key)
        state = self.sides[0].driver.states.get(key)
        if state is not None:
            self.sides[1].driver.states[key] = copy_state(state)

    def _verdicts(self, key: bytes, record: Any, event: Any, bstep: Any, cstep: Any, b: int, c: int, seq: int) -> None:
        run = self.judged.get(key)
        if run is None:
            run = self.judged[key] = RunRecord(key, event.agent_id or NO_AGENT, seen_at=seq)
        minute = event.ts_ms // 60_000
        outcome = run.outcome
        base, cand = self.sides
        if b:
            base.note(run, bstep, minute)
            if b > outcome[0]:
                outcome[0] = b
        if c:
            cand.note(run, cstep, minute)
            if c > outcome[1]:
                outcome[1] = c
        if b != c and run.first is None:
            run.first = {
                "event_id": event.event_id,
                "at": _where(record),
                "ts_ms": event.ts_ms,
                "type": EVENT_TYPE_OF[type(event)],
                "tool": getattr(event, "tool_name", None),
                BASELINE: OUTCOMES[b],
                CANDIDATE: OUTCOMES[c],
            }

    def _ended(self, key: bytes, event: RunEnded, seq: int) -> None:
        reason = event.reason or ""
        self.ended[reason] += 1
        run = self.judged.pop(key, None)
        if run is not None:
            run.ended, run.ended_at = reason, seq
            self.finished.append(run)

    # -- in shards (``run(..., jobs=N)``) ----------------------------------------------------

    def _run_sharded(
        self, records: Iterable[Any], *, keyed: bool, progress: Callable[[int], None] | None, jobs: int
    ) -> None:
        """The records split by state key over ``jobs`` processes, each a ``Backtest`` of its
        own with these configs, their tallies merged into this one (``_merge``)."""
        base, cand = (side.driver.engine for side in self.sides)
        agents, normal, keyring = self.agents, self.normal_reasons, self.keyring

        def work(numbered: Iterator[tuple[int, Any]]) -> _Tally:
            shard = Backtest(base, cand, agents=agents, normal_reasons=normal, keyring=keyring)
            shard._run(numbered, keyed=keyed)
            return shard._tally()

        self._merge(
            records_sharded(
                records, work, jobs, keyed=keyed, progress=progress, what="a backtest", cpu_s=self.shard_cpu_s
            )
        )

    def _tally(self) -> _Tally:
        """What a shard's report needs, without its engines and open states (pickled back)."""
        return _Tally(
            self.records,
            self.events,
            self.duplicates,
            self.other_agents,
            self.dead,
            self.signed,
            self.runs,
            self.agents_seen,
            self.ended,
            (self.sides[0].verdicts, self.sides[1].verdicts),
            self.finished,
            list(self.judged.values()),
            self.first_at,
            self.first_ms,
            self.last_at,
            self.last_ms,
            self.earliest_ms,
            self.latest_ms,
        )

    def _merge(self, tallies: list[_Tally]) -> None:
        """Add the shards' tallies to this backtest as if it had run their records itself, in
        the stream's order: counts add up, runs that ended are listed in the order they ended,
        open runs in the order of their first verdicts, the first and last event are the
        stream's (the numbers of ``_run``)."""
        finished, judged = list(self.finished), list(self.judged.values())
        for t in tallies:
            self.records += t.records
            self.events += t.events
            self.duplicates += t.duplicates
            self.other_agents += t.other_agents
            self.dead.update(t.dead)
            self.signed += t.signed
            self.runs += t.runs
            self.agents_seen |= t.agents_seen
            self.ended.update(t.ended)
            for side, verdicts in zip(self.sides, t.verdicts):
                side.verdicts.extend(verdicts)
            finished.extend(t.finished)
            judged.extend(t.judged)
            if t.first_at is not None and (self.first_at is None or t.first_at < self.first_at):
                self.first_at, self.first_ms = t.first_at, t.first_ms
            if t.last_at is not None and (self.last_at is None or t.last_at > self.last_at):
                self.last_at, self.last_ms = t.last_at, t.last_ms
            if t.earliest_ms is not None:
                self.earliest_ms = t.earliest_ms if self.earliest_ms is None else min(self.earliest_ms, t.earliest_ms)
                self.latest_ms = t.latest_ms if self.latest_ms is None else max(self.latest_ms, t.latest_ms)  # type: ignore[type-var]
        finished.sort(key=lambda run: run.ended_at)
        judged.sort(key=lambda run: run.seen_at)
        self.finished = finished
        self.judged = {run.key: run for run in judged}

    def report(self) -> Report:
        return Report.of(self)


def _where(record: Any) -> str:
    if isinstance(record, _Line):
        return f"{record.topic}:{record.offset}"
    return f"{record.topic}[{record.partition}]@{record.offset}"


# -- the report ----------------------------------------------------------------------------------


@dataclass
class Report:
    """What ``loopwatch backtest`` prints (``data``: its ``--json``)."""

    data: dict
    per_minute: tuple[Counter, Counter]

    @classmethod
    def of(cls, bt: Backtest) -> Report:
        normal = bt.normal_reasons
        rows: dict[tuple[str, str, str], dict[str, list[set]]] = defaultdict(
            lambda: {name: [set(), set(), set()] for name in SIDES}
        )
        kinds = {"warn": 0, "block": 1, "abort": 2}
        counts = {name: Counter() for name in SIDES}
        per_minute = (Counter(), Counter())
        false_positives: dict[str, dict] = {}
        for i, (name, side) in enumerate(zip(SIDES, bt.sides)):
            blocked: Counter = Counter()
            blocked_runs: list[str] = []
            for run, action, detector, tool, minute in side.verdicts:
                rows[(run.agent, detector, tool)][name][kinds[action]].add(run)
                counts[name][action] += 1
                per_minute[i][minute] += 1
                if action == "block" and run.ended in normal:
                    if not blocked_runs or blocked_runs[-1] is not run:
                        blocked_runs.append(run)
                    blocked[(run.agent, detector, tool)] += 1
            false_positives[name] = {
                "blocks": sum(blocked.values()),
                "runs": sorted({_run_name(run) for run in blocked_runs}),
                "by": [
                    {"agent": a, "detector": d, "tool": t, "blocks": n}
                    for (a, d, t), n in sorted(blocked.items(), key=lambda kv: (-kv[1], kv[0]))
                ],
            }
        table = []
        for (agent, detector, tool), sides in sorted(rows.items(), key=lambda kv: tuple(map(str, kv[0]))):
            row = {"agent": agent, "detector": detector, "tool": tool}
            for name in SIDES:
                warned, blocked_, aborted = sides[name]
                row[name] = {"warned": len(warned), "blocked": len(blocked_), "aborted": len(aborted)}
            table.append(row)
        judged = bt.finished + list(bt.judged.values())
        outcomes = {name: Counter({"none": bt.runs - len(judged)}) for name in SIDES}
        changed, disagreeing = [], 0
        for run in judged:
            for i, name in enumerate(SIDES):
                outcomes[name][OUTCOMES[run.outcome[i]]] += 1
            disagreeing += run.first is not None
            if run.outcome[0] != run.outcome[1]:
                changed.append(
                    {
                        "run": _run_name(run),
                        "agent": run.agent,
                        BASELINE: OUTCOMES[run.outcome[0]],
                        CANDIDATE: OUTCOMES[run.outcome[1]],
                        "ended": run.ended,
                        "first_disagreement": run.first,
                    }
                )
        data = {
            "records": bt.records,
            "events": bt.events,
            "runs": bt.runs,
            "duplicates": bt.duplicates,
            "other_agents": bt.other_agents,
            "dead_letters": dict(sorted(bt.dead.items())),
            "time_range_ms": [bt.earliest_ms, bt.latest_ms],
            "verdicts": {name: {k: counts[name][k] for k in ("warn", "block", "abort")} for name in SIDES},
            "outcomes": {name: {k: outcomes[name][k] for k in OUTCOMES} for name in SIDES},
            "by_agent_detector_tool": table,
            "changed_runs": changed,
            "runs_disagreeing": disagreeing,
            "likely_false_positives": false_positives,
            "normal_end_reasons": sorted(normal),
        }
        return cls(data, per_minute)


def _run_name(run: RunRecord) -> str:
    return run.key.decode("utf-8", "replace")


# -- output ----------------------------------------------------------------------------------------


def render_table(report: Report, out: IO[str], *, examples: int = EXAMPLES) -> None:
    """The report as a terminal table."""
    d = report.data
    w = out.write
    span = ""
    if d["time_range_ms"][0] is not None:
        span = f", event times {_iso(d['time_range_ms'][0])} to {_iso(d['time_range_ms'][1])}"
    w(f"{d['events']:,} events of {d['runs']:,} runs ({d['records']:,} records{span})\n")
    skipped = [f"{d['duplicates']:,} duplicates skipped (a run's event id seen again, as the worker skips them)"]
    if d["other_agents"]:
        skipped.append(f"{d['other_agents']:,} events of other agents")
    dead = d["dead_letters"]
    skipped.append(
        f"{sum(dead.values()):,} dead-letter-worthy records"
        + (" (" + ", ".join(f"{k} {v:,}" for k, v in dead.items()) + ")" if dead else "")
    )
    w("; ".join(skipped) + "\n\n")

    w(f"{'':<24}{'baseline':>12}{'candidate':>12}{'change':>10}\n")
    for kind in ("warn", "block", "abort"):
        b, c = d["verdicts"][BASELINE][kind], d["verdicts"][CANDIDATE][kind]
        w(f"{kind + ' verdicts':<24}{b:>12,}{c:>12,}{c - b:>+10,}\n")
    for kind in OUTCOMES:
        b, c = d["outcomes"][BASELINE][kind], d["outcomes"][CANDIDATE][kind]
        w(f"{'runs, outcome ' + kind:<24}{b:>12,}{c:>12,}{c - b:>+10,}\n")

    rows = d["by_agent_detector_tool"]
    if rows:
        names = [(r["agent"], r["detector"], r["tool"]) for r in rows]
        aw = max(5, *(len(n[0]) for n in names))
        dw = max(8, *(len(n[1]) for n in names))
        tw = max(4, *(len(n[2]) for n in names))
        w("\nruns warned, blocked and aborted, baseline -> candidate\n")
        w(f"{'agent':<{aw}}  {'detector':<{dw}}  {'tool':<{tw}}  {'warned':>15}  {'blocked':>15}  {'aborted':>15}\n")
        for r in rows:
            cells = "  ".join(
                f"{r[BASELINE][k]:>6,} -> {r[CANDIDATE][k]:<6,}" for k in ("warned", "blocked", "aborted")
            )
            w(f"{r['agent']:<{aw}}  {r['detector']:<{dw}}  {r['tool']:<{tw}}  {cells}\n")

    changed = d["changed_runs"]
    w(f"\nruns whose outcome changes: {len(changed):,} (verdicts differ somewhere in {d['runs_disagreeing']:,} runs)\n")
    for run in changed[:examples]:
        first = run["first_disagreement"]
        w(
            f"  {run['run']}  agent {run['agent']}: {run[BASELINE]} -> {run[CANDIDATE]}"
            + (
                f"; first disagreement at {first['at']} ({first['type']} {first['tool'] or ''} event {first['event_id']}):"
                f" baseline {first[BASELINE]}, candidate {first[CANDIDATE]}"
                if first
                else ""
            )
            + "\n"
        )
    if len(changed) > examples:
        w(f"  ... {len(changed) - examples:,} more (--json lists them all)\n")

    fp = d["likely_false_positives"]
    reasons = "/".join(d["normal_end_reasons"])
    w(f"\nlikely false positives: blocks in runs that later ended normally (run.ended {reasons})\n")
    for name in SIDES:
        w(f"  {name}: {fp[name]['blocks']:,} blocks in {len(fp[name]['runs']):,} runs\n")
        for row in fp[name]["by"][:examples]:
            w(f"    {row['agent']} {row['detector']} {row['tool']}: {row['blocks']:,}\n")


def plot(report: Report, path: Path, *, baseline: str, candidate: str) -> None:
    """Would-fire per minute of event time (warnings, blocks and aborts published), baseline
    and candidate (``streams.offline.plots``)."""
    from .plots import BASELINE_COLOR, CANDIDATE_COLOR, PlotError, Series, counts_per_bucket, save, time_chart

    times, (base, cand) = counts_per_bucket(report.per_minute, 60)
    series = [
        Series(f"baseline ({baseline}): {sum(base):,} verdicts", times, base, BASELINE_COLOR, hollow=True),
        Series(f"candidate ({candidate}): {sum(cand):,} verdicts", times, cand, CANDIDATE_COLOR),
    ]
    try:
        fig = time_chart(
            series,
            title="loopwatch backtest: would-fire per minute (warnings, blocks, aborts published)",
            ylabel="verdicts per minute",
            bucket_s=60,
            empty="no config would warn, block or abort",
        )
        save(fig, path)
    except PlotError as exc:
        raise BacktestError(str(exc)) from None


class Progress:
    """A progress line on ``out`` (records read, rate, ETA) once the work takes longer than
    ``after_s``; rewritten in place on a terminal, a line every ``every_s`` elsewhere."""

    def __init__(
        self, out: IO[str], share: Callable[[], float | None], *, after_s: float = 2.0, what: str = "backtest"
    ) -> None:
        self.what = what
        self.out = out
        self.share = share
        self.after_s = after_s
        self.started = time.monotonic()
        self.tty = hasattr(out, "isatty") and out.isatty()
        self.every_s = 0.5 if self.tty else 5.0
        self.shown_at: float | None = None

    def __call__(self, n: int) -> None:
        now = time.monotonic()
        elapsed = now - self.started
        if elapsed < self.after_s or (self.shown_at is not None and now - self.shown_at < self.every_s):
            return
        self.shown_at = now
        rate = n / elapsed
        line = f"{self.what}: {n:,} records read, {rate:,.0f}/s"
        share = self.share()
        if share:
            line += f", {share:.0%}, ETA {max(0.0, elapsed / share - elapsed):.0f} s"
        self.out.write(("\r" + line + "   ") if self.tty else line + "\n")
        self.out.flush()

    def done(self, n: int) -> None:
        if self.shown_at is not None:
            elapsed = time.monotonic() - self.started
            line = f"{self.what}: {n:,} records read in {elapsed:.1f} s, {n / elapsed:,.0f}/s"
            self.out.write(("\r" + line + "   \n") if self.tty else line + "\n")
            self.out.flush()
