"""The one module that touches Faust's, mode's and aiokafka's private internals.

Everything else in loopwatch uses these libraries through their public API, or through the
objects below; ``tests/app/test_faust_adapter.py`` checks that every private name listed in
``PRIVATE_NAMES`` still exists with the shape this module relies on, that the list is
complete, and that no other module touches a dependency's private name.

At import the installed versions are checked against the ones this module was written for
(``WRITTEN_FOR``): a Faust patch release may rename any of these internals, and the worker
would then fail in ways that look like something else (a worker that is never ready).  A
version that differs raises ``DependencyVersionError`` with one line saying what to do.

What is here, and why (docs/design.md has the decision, docs/benchmarks.md the
measurements behind it):

* **Batch delivery** (``BatchingConsumer``, ``BatchingTransport``): Faust's consumer hands
  records of the worker's topic to a handler as one list per fetch, acks them as a
  per-partition watermark and commits in the background; everything else of Faust's
  consumer (group membership, co-partitioning assignor, table recovery, standbys, offset
  commits) is kept.  Faust's per-record path was several times too slow for the worker.
* **The worker's topic fetched in bulk** (``FetchedRecord``, ``bulk_getall``): aiokafka turns
  each record of a fetch into a ``ConsumerRecord`` through a generator and two Python calls;
  for the batch topics a record batch is turned into ``FetchedRecord``s (the same
  attributes, built in C) in one comprehension.
* **The consumer on the app's event loop** (``InlineConsumerThread``): Faust's consumer thread
  and its hand-offs were most of the decision latency.
* **A consumer's metadata that lacks a topic it subscribes to is asked for again**
  (``AskAgainForMissingTopics``), and a table write Faust would refuse is waited for before
  the act that precedes it (``until_table_accepts_writes``): aiokafka otherwise keeps such
  metadata for 5 minutes, and Faust refuses the table's writes meanwhile.
* **The web server without Faust's views** (``HealthOnlyWeb``, through ``WorkerApp._new_web``).
* **A commit that cannot succeed is given up** (``InlineConsumerThread._commit``): once Faust
  has closed the aiokafka consumer and its group coordinator is unknown, aiokafka retried the
  commit for ever and the worker's stop waited for it (docs/reliability.md).
* **SIGUSR2 prints every thread's and task's stack** (``Worker``) instead of mode's pdb.
* **Direct access to the run table and the producers** (``TableAccess``, ``Producers``): one
  RocksDB ``WriteBatch`` and one record batch per partition per checkpoint instead of a
  changelog send per ``table[key] = value``, and the verdicts on a producer of their own.
* **Where the consumer is** (``ConsumerView``): read and committed offsets, for the idle
  sweep's backlog check and the lag metric; and whether the group coordinator still counts
  this worker a member of its generation (``still_member``: a heartbeat, generation-checked
  by the broker), which every checkpoint asks before it writes (docs/reliability.md); and
  whether it holds a membership at all (``holds_membership``: the watchdog's question).

Faust's classes (``WorkerApp`` and the consumer, transport and web classes) are composed on
first use (``__getattr__``): their method code is in the mixins below, readable like any
class, but importing this module (``fetch_topic_metadata``, the version check) must not load
Faust, aiohttp and their 300 modules.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import random
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import cache, partial
from importlib.metadata import PackageNotFoundError, version
from inspect import GEN_CREATED, getgeneratorstate
from types import SimpleNamespace
from typing import Any, ClassVar

import msgspec

from schemas.errors import LoopwatchError

__all__ = [
    "AskAgainForMissingTopics",
    "BatchHandler",
    "ConsumerView",
    "DependencyVersionError",
    "FetchedRecord",
    "PRIVATE_NAMES",
    "Producers",
    "TableAccess",
    "WRITTEN_FOR",
    "WorkerHooks",
    "aiokafka_getall",
    "bulk_getall",
    "fetch_topic_metadata",
    "fetch_in_bulk",
    "until_table_accepts_writes",
]

log = logging.getLogger("loopwatch.transport")


# -- versions -----------------------------------------------------------------------------------

WRITTEN_FOR = {
    "faust-streaming": ("0.15.3",),
    "mode-streaming": ("0.7.1",),
    "aiokafka": ("0.14.0",),
}
"""The versions whose internals this module was checked against (``PRIVATE_NAMES``).  To
allow another: install it, run ``pytest tests/app/test_faust_adapter.py`` and the worker's
integration tests, then add it here and to pyproject.toml."""


class DependencyVersionError(LoopwatchError, ImportError):
    """An installed Faust, mode or aiokafka is not a version this module was written for."""


def check_versions(installed: Callable[[str], str] = version) -> None:
    """Raise ``DependencyVersionError`` (one line) unless every package of ``WRITTEN_FOR``
    is installed in one of its versions."""
    for package, versions in WRITTEN_FOR.items():
        try:
            found = installed(package)
        except PackageNotFoundError:
            raise DependencyVersionError(
                f"loopwatch needs {package} {' or '.join(versions)}, which is not installed (pip install 'loopwatch[worker]')"
            ) from None
        if found not in versions:
            raise DependencyVersionError(
                f"{package} {found} is installed, but streams/app/faust_adapter.py was written for {' or '.join(versions)}: "
                f"install that (pip install 'loopwatch[worker]'), or check the adapter against {found} "
                f"(pytest tests/app/test_faust_adapter.py) and add it to WRITTEN_FOR"
            )


check_versions()


# -- the private names used here ----------------------------------------------------------------


@dataclass(frozen=True)
class PrivateName:
    """A private name of a dependency that this module uses.

    ``owner``: ``module:Class``; ``kind``: ``method``/``async method`` (checked: its parameter
    names are ``params``) or ``attribute`` (checked on a live object: an instance of
    ``type_name``; ``override`` names are overridden here)."""

    owner: str
    name: str
    kind: str
    params: tuple[str, ...] = ()
    type_name: str = ""
    override: bool = False


_CONSUMER = "faust.transport.consumer:Consumer"
_AIOKAFKA_CONSUMER = "faust.transport.drivers.aiokafka:Consumer"
_SERVICE = "mode.services:Service"
_SERVICE_THREAD = "mode.threads:ServiceThread"
_FETCH_RESULT = "aiokafka.consumer.fetcher:FetchResult"
_PARTITION_RECORDS = "aiokafka.consumer.fetcher:PartitionRecords"

PRIVATE_NAMES: tuple[PrivateName, ...] = (
    # faust.App: where the transport and the web driver are made
    PrivateName("faust.app.base:App", "_new_transport", "method", ("self",), override=True),
    PrivateName("faust.app.base:App", "_new_web", "method", ("self",), override=True),
    # Faust's consumer: the fetch loop, offsets and acks (BatchingConsumer)
    PrivateName(_CONSUMER, "_drain_messages", "async method", ("self", "fetcher"), override=True),
    PrivateName(_CONSUMER, "_new_offset", "method", ("self", "tp"), override=True),
    PrivateName(_AIOKAFKA_CONSUMER, "_new_consumer_thread", "method", ("self",), override=True),
    PrivateName(_CONSUMER, "_wait_next_records", "async method", ("self", "timeout")),
    PrivateName(_AIOKAFKA_CONSUMER, "_to_message", "method", ("self", "tp", "record")),
    PrivateName(_CONSUMER, "_add_gap", "async method", ("self", "tp", "offset_from", "offset_to")),
    PrivateName(_CONSUMER, "_read_offset", "attribute", type_name="collections:defaultdict"),
    PrivateName(_CONSUMER, "_committed_offset", "attribute", type_name="collections:defaultdict"),
    PrivateName(_CONSUMER, "_acked", "attribute", type_name="collections:defaultdict"),
    PrivateName(_CONSUMER, "_n_acked", "attribute", type_name="builtins:int"),
    PrivateName(_CONSUMER, "_commit_every", "attribute", type_name="builtins:int"),
    PrivateName(_CONSUMER, "_unacked_messages", "attribute", type_name="weakref:WeakSet"),
    PrivateName(_CONSUMER, "_buffered_partitions", "attribute", type_name="builtins:set"),
    PrivateName(_CONSUMER, "_waiting_for_ack", "attribute", type_name="types:NoneType"),
    # mode's Service and ServiceThread (InlineConsumerThread: a thread service without a thread)
    PrivateName(_SERVICE, "_stopped", "attribute", type_name="mode.utils.locks:Event"),
    PrivateName(_SERVICE, "_default_start", "async method", ("self",)),
    PrivateName(_SERVICE, "_default_stop_children", "async method", ("self",)),
    PrivateName(_SERVICE, "_default_stop_futures", "async method", ("self",)),
    PrivateName(_SERVICE, "_default_stop_exit_stacks", "async method", ("self",)),
    PrivateName(_SERVICE_THREAD, "_stop_children", "async method", ("self",), override=True),
    PrivateName(_SERVICE_THREAD, "_stop_futures", "async method", ("self",), override=True),
    PrivateName(_SERVICE_THREAD, "_stop_exit_stacks", "async method", ("self",), override=True),
    PrivateName(_SERVICE_THREAD, "_thread_started", "attribute", type_name="mode.utils.locks:Event"),
    # the RocksDB store of a table (TableAccess)
    PrivateName("faust.stores.rocksdb:Store", "_db_for_partition", "method", ("self", "partition")),
    PrivateName("faust.stores.rocksdb:Store", "_dbs", "attribute", type_name="builtins:dict"),
    # aiokafka's fetched records (bulk_getall)
    PrivateName(_FETCH_RESULT, "_topic_partition", "attribute", type_name="aiokafka.structs:TopicPartition"),
    PrivateName(_FETCH_RESULT, "_partition_records", "attribute", type_name=_PARTITION_RECORDS),
    PrivateName(_FETCH_RESULT, "_update_position", "method", ("self",)),
    PrivateName(_PARTITION_RECORDS, "_records", "attribute", type_name="aiokafka.record.memory_records:MemoryRecords"),
    PrivateName(_PARTITION_RECORDS, "_records_iterator", "attribute", type_name="types:GeneratorType"),
    PrivateName(_PARTITION_RECORDS, "_isolation_level", "attribute", type_name="builtins:int"),
    PrivateName(_PARTITION_RECORDS, "_check_crcs", "attribute", type_name="builtins:bool"),
    PrivateName(_PARTITION_RECORDS, "_key_deserializer", "attribute", type_name="types:NoneType"),
    PrivateName(_PARTITION_RECORDS, "_value_deserializer", "attribute", type_name="types:NoneType"),
    # the group coordinator under Faust's consumer (ConsumerView.still_member)
    PrivateName(
        "faust.transport.consumer:ThreadDelegateConsumer",
        "_thread",
        "attribute",
        type_name="faust.transport.drivers.aiokafka:AIOKafkaConsumerThread",
    ),
    PrivateName("faust.transport.drivers.aiokafka:AIOKafkaConsumerThread", "_ensure_consumer", "method", ("self",)),
    PrivateName("aiokafka.consumer.consumer:AIOKafkaConsumer", "_coordinator", "attribute", type_name="types:NoneType"),
    # a commit that can no longer succeed is given up (InlineConsumerThread._commit)
    PrivateName(
        "faust.transport.drivers.aiokafka:AIOKafkaConsumerThread",
        "_commit",
        "async method",
        ("self", "offsets"),
        override=True,
    ),
    PrivateName("aiokafka.consumer.consumer:AIOKafkaConsumer", "_closed", "attribute", type_name="builtins:bool"),
    # a consumer's metadata that lacks a subscribed topic is asked for again (AskAgainForMissingTopics)
    PrivateName(
        "faust.transport.drivers.aiokafka:AIOKafkaConsumerThread",
        "_create_worker_consumer",
        "method",
        ("self", "transport"),
        override=True,
    ),
    PrivateName(
        "aiokafka.consumer.consumer:AIOKafkaConsumer",
        "_client",
        "attribute",
        type_name="aiokafka.client:AIOKafkaClient",
    ),
    PrivateName("aiokafka.consumer.group_coordinator:GroupCoordinator", "_do_heartbeat", "async method", ("self",)),
    # the consumer, if Faust has made it (ConsumerView.holds_membership: never makes it)
    PrivateName("faust.app.base:App", "_consumer", "attribute", type_name=_CONSUMER),
    # mode's worker: SIGUSR2 dumps stacks instead of entering pdb (StackDumpingWorker)
    PrivateName("mode.worker:Worker", "_on_sigusr2", "method", ("self",), override=True),
    # Faust's producer (Producers)
    PrivateName("faust.transport.drivers.aiokafka:Producer", "_ensure_producer", "method", ("self",)),
    PrivateName("faust.transport.drivers.aiokafka:Producer", "_new_producer", "method", ("self", "transactional_id")),
)
"""Checked by ``tests/app/test_faust_adapter.py`` against the installed versions; the test
also fails when this module uses a private name that is missing here."""

OWN_NAMES = frozenset(
    {
        "_watermarks",
        "_open_batches",
        "_batch_message",
        "_commit_task",
        "_ack_batch",
        "_batch_closed",
        "_commit_in_background",
        "_bulk_rest",
        "_bulk_end",
        "_fetch_again",
    }
)
"""Private names this module adds to Faust's objects: the test checks that Faust has none of
them (a same-named internal in a later version would be silently replaced)."""


# -- aiokafka: a topic's metadata ------------------------------------------------------------------


async def fetch_topic_metadata(producer: Any, topic: str) -> None:
    """Ask a broker for ``topic``'s metadata on ``producer``'s connections (aiokafka's client
    under its producer), each known broker in turn until one answers; ``KafkaError`` if none
    does.

    aiokafka's ``fetch_all_metadata`` asks for every topic of the cluster: an answer that grows
    with the cluster, decoded in Python, every second, by every worker.  The request never
    creates the topic on a broker that creates topics on first use."""
    from aiokafka.errors import KafkaError
    from aiokafka.protocol.metadata import MetadataRequest

    client = producer.client
    request = MetadataRequest([topic], allow_auto_topic_creation=False)
    nodes = [broker.nodeId for broker in client.cluster.brokers()]
    random.shuffle(nodes)
    failures: list[str] = []
    for node in nodes:
        try:
            await client.send(node, request)
        except KafkaError as exc:
            failures.append(f"node {node}: {exc!r}")
            continue
        return
    raise KafkaError(f"no broker answered a metadata request for {topic} ({'; '.join(failures) or 'no broker known'})")


# -- aiokafka: a consumer whose metadata lacks a topic it subscribes to asks again -----------------

METADATA_ASK_AGAIN_S = (1.0, 30.0)
"""How long ``AskAgainForMissingTopics`` first waits before it asks again, and at most (the
wait doubles while a topic is still missing)."""


class AskAgainForMissingTopics:
    """A listener on a consumer's cluster metadata: while a topic the consumer subscribes to is
    missing from it, the consumer's metadata is asked for again, after 1 s, then 2, 4 ... 30 s.

    aiokafka refreshes a consumer's metadata every ``metadata_max_age_ms`` (Faust's default: 5
    minutes) or when an error forces it, so a topic missing from one answer stays missing
    until then.  A topic created moments before the worker started was missing from the
    broker's first answer (seen on a busy 2-core machine, a second after its creation).  The
    group leader then assigns none of its partitions ("Ignoring missing topic"), and Faust
    refuses every write to a table whose changelog the leader's metadata shows with no
    partitions (``PartitionsMismatch``).  That crashed the fleet limiter's agent on every
    outcome, after its forward: the per-agent limit admitted every outcome, for minutes."""

    def __init__(self, client: Any, subscription: Callable[[], Any]) -> None:
        self.client = client
        self.subscription = subscription
        self.wait_s = METADATA_ASK_AGAIN_S[0]
        self.pending: asyncio.TimerHandle | None = None
        self.reported: frozenset[str] = frozenset()
        """The missing topics last logged (logged again only when they change)."""

    def __call__(self, cluster: Any) -> None:
        missing = frozenset(topic for topic in self.subscription() if not cluster.partitions_for_topic(topic))
        if not missing:
            if self.reported:
                log.info("the consumer's metadata shows every topic it subscribes to again")
            self.reported = frozenset()
            self.wait_s = METADATA_ASK_AGAIN_S[0]
            return
        if missing != self.reported:
            log.warning(
                "the consumer's metadata lacks topics it subscribes to (%s): asking again in %.0f s",
                ", ".join(sorted(missing)),
                self.wait_s,
            )
            self.reported = missing
        if self.pending is None:
            self.pending = asyncio.get_running_loop().call_later(self.wait_s, self.ask_again)
            self.wait_s = min(2 * self.wait_s, METADATA_ASK_AGAIN_S[1])

    def ask_again(self) -> None:
        self.pending = None
        self.client.force_metadata_update()

    @classmethod
    def watch(cls, consumer: Any) -> AskAgainForMissingTopics:
        """Listen to ``consumer``'s (an aiokafka consumer, not started yet) metadata."""
        listener = cls(consumer._client, consumer.subscription)
        consumer._client.cluster.add_listener(listener)
        return listener


# -- Faust: a table write its metadata would refuse is waited for ----------------------------------


async def until_table_accepts_writes(table: Any, timeout_s: float = 30.0) -> None:
    """Return once Faust would accept a write to ``table`` from the event being processed.

    Faust refuses a table write while the consumer's metadata shows the table's changelog
    with another number of partitions than the event's topic (``PartitionsMismatch``), 0 when
    the changelog is missing from it (``AskAgainForMissingTopics`` asks again).  A caller that
    acts before it writes (the fleet limiter forwards, then records) asks first, so that a
    refused write cannot follow the act.  Faust remembers a topic that passed, so this costs
    a set lookup once it has.  Raises ``PartitionsMismatch`` after ``timeout_s``."""
    from faust.exceptions import PartitionsMismatch

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            table.partition_for_key(None)  # Faust's check (the key is not used)
            return
        except PartitionsMismatch:
            if loop.time() >= deadline:
                raise
            await asyncio.sleep(0.5)


# -- aiokafka: the batch topics' records fetched in bulk -------------------------------------------


class FetchedRecord(msgspec.Struct, gc=False):
    """A record of a batch topic as the consumer hands it over: the attributes of aiokafka's
    ``ConsumerRecord``, in a struct built in C (``bulk_getall``).  Untracked by the cyclic GC:
    it holds bytes, numbers and a tuple of header pairs only."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    checksum: int | None
    serialized_key_size: int
    serialized_value_size: int
    headers: tuple


_BULK_TOPICS: set[str] = set()
"""Topics whose fetched records ``bulk_getall`` unpacks (the worker's batch topics)."""


def bulk_getall(self: Any, max_records: int | None = None) -> list[Any]:
    """``aiokafka.consumer.fetcher.FetchResult.getall`` for the batch topics.

    aiokafka yields each record from a generator and builds its ``ConsumerRecord`` in two
    Python calls; here a whole record batch becomes ``FetchedRecord``s in one comprehension,
    and what ``max_records`` leaves of it waits on the ``PartitionRecords`` (``_bulk_rest``)
    for the next call.  Everything else is aiokafka's: CRC checks, control batches skipped,
    records below the fetch offset skipped, the position moved to the next record to return
    and, once every record is returned, to the end of the last batch.  Other topics, a read
    of committed records only (transactions), deserializers, or records aiokafka's own
    iterator has started on go to aiokafka's ``getall``.
    """
    tp = self._topic_partition
    records = self._partition_records
    if records is None or tp.topic not in _BULK_TOPICS:
        return _aiokafka.getall(self, max_records)
    if not hasattr(records, "_bulk_end"):  # the first call on these records
        iterator = records._records_iterator
        if (
            records._isolation_level != _aiokafka.READ_UNCOMMITTED
            or records._key_deserializer is not None
            or records._value_deserializer is not None
            or iterator is None
            or getgeneratorstate(iterator) != GEN_CREATED
        ):
            return _aiokafka.getall(self, max_records)
        # aiokafka's generator over the records is never used here.  Kept, it and the records
        # (the whole fetch response) would stay alive in a reference cycle until the cyclic
        # GC finds them: aiokafka breaks that cycle only once its generator is exhausted.
        records._records_iterator = None
        records._bulk_rest = None
        records._bulk_end = records.next_fetch_offset
    if max_records is not None and max_records < 1:
        return []  # (aiokafka's fetcher never asks for fewer than one)
    if not self.check_assignment(tp):
        return []
    room = max_records if max_records is not None else -1
    out: list[Any] = []
    memory = records._records
    rest = records._bulk_rest
    while True:
        if rest is not None:
            if rest and 0 <= room <= len(rest):
                # ``max_records`` is reached in this batch.  Cut at its last record, what is
                # left is [] and, as with aiokafka, the position moves past the batch's end
                # (records compacted away there) only on the next call.
                out += rest[:room]
                del rest[:room]
                records._bulk_rest = rest
                records.next_fetch_offset = out[-1].offset + 1
                self._update_position()
                return out
            out += rest
            room -= len(rest)
            records._bulk_rest = rest = None
            records.next_fetch_offset = records._bulk_end
        if not memory.has_next():
            self._update_position()
            self._partition_records = None
            return out
        batch = memory.next_batch()
        if records._check_crcs and not batch.validate_crc():
            raise _aiokafka.CorruptRecordException(f"Invalid CRC - {tp}")
        if not batch.is_control_batch:
            topic, partition, first = tp.topic, tp.partition, records.next_fetch_offset
            rest = [
                FetchedRecord(
                    topic,
                    partition,
                    r.offset,
                    r.timestamp,
                    r.timestamp_type,
                    r.key,
                    r.value,
                    r.checksum,
                    -1 if r.key is None else len(r.key),
                    -1 if r.value is None else len(r.value),
                    tuple(r.headers),
                )
                for r in batch
                if r.offset >= first
            ]
        else:
            rest = []
        records._bulk_end = batch.next_offset


def fetch_in_bulk(topics: frozenset[str]) -> None:
    """Unpack the records of ``topics`` with ``bulk_getall`` in every aiokafka consumer of the
    process (its ``FetchResult.getall`` is replaced once; other topics are unchanged)."""
    from aiokafka import errors
    from aiokafka.consumer.fetcher import READ_UNCOMMITTED, FetchResult

    if FetchResult.getall is not bulk_getall:
        _aiokafka.getall = FetchResult.getall
        _aiokafka.CorruptRecordException = errors.CorruptRecordException
        _aiokafka.READ_UNCOMMITTED = READ_UNCOMMITTED
        FetchResult.getall = bulk_getall
    _BULK_TOPICS.update(topics)


_aiokafka = SimpleNamespace()
"""Filled by ``fetch_in_bulk``: aiokafka's own ``getall``, its CRC error and its
read-uncommitted isolation level."""


def aiokafka_getall(result: Any, max_records: int | None = None) -> list[Any]:
    """aiokafka's own ``FetchResult.getall``, which ``bulk_getall`` replaced (after
    ``fetch_in_bulk``): what the bulk path is checked and measured against."""
    return _aiokafka.getall(result, max_records)


# -- Faust: batch delivery ------------------------------------------------------------------------

BatchHandler = Callable[[Sequence[Any], Callable[[], None]], Awaitable[None]]
"""``handler(batch, done)``: ``done()`` acks the batch; call it once the batch's effects are
safe (the handler may return before that, e.g. to overlap the next batch)."""


@dataclass(frozen=True)
class WorkerHooks:
    """What the worker gives its Faust app (``WorkerApp.attach``)."""

    batch_topics: frozenset[str]
    """The topics whose records go to ``handle_batch`` as lists (the others: Faust's per-record
    path): ``tool-calls``, and under session scope the worker's repartition topic."""
    handle_batch: BatchHandler
    before_wait_empty: Callable[[], Awaitable[None]]
    """Awaited before Faust waits for in-flight records (before a rebalance and on shutdown):
    the worker makes its pending batches durable and acks them there."""
    after_stop: Callable[[], Awaitable[None]]
    """Awaited once Faust has stopped (after the consumer, hence after the last checkpoint)."""
    leaving: Callable[[], bool] = lambda: False
    """True once the worker has lost its group for good (``NotAMember``: it stops): its
    unacked batches will never be acked and its commits would be refused, so Faust's wait for
    them (``wait_empty``) is skipped: it would wait for as long as the consumer is not stopped."""


# Filled by ``_compose`` with the Faust names the mixins use (Faust is not imported before).
_faust = SimpleNamespace()


COMMIT_CHECK_S = 0.1
"""How often a commit in flight looks whether it can still succeed (aiokafka's own retry backoff)."""


def _commit_hopeless(consumer: Any, coordinator: Any) -> bool:
    """aiokafka's ``commit_offsets`` would retry for ever: the consumer is closed (Faust's
    ``close`` or aiokafka's ``stop``: its coordinator is closing, or about to) and no
    coordinator is known (a closing coordinator never looks one up again)."""
    return bool(consumer._closed) and coordinator.coordinator_id is None


class _InlineConsumerThread:
    """Faust's aiokafka consumer "thread", run on the worker's own event loop.

    Faust runs aiokafka in a thread with its own event loop and reaches it through method
    queues: every fetch, commit and position query is a call into that thread and a result
    posted back.  Here the thread's methods are awaited directly and the aiokafka consumer
    lives on the app's loop; the rest of Faust's consumer (group membership, assignor,
    recovery, commits) is unchanged.
    """

    wait_for_shutdown = False  # no thread to report its shutdown

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        loop = kwargs.pop("loop", None) or consumer.loop
        super().__init__(consumer, loop=loop, thread_loop=loop, **kwargs)

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)  # type: ignore[misc]
        AskAgainForMissingTopics.watch(consumer)
        return consumer

    async def start(self) -> None:
        self._thread_started.set()
        await self._default_start()

    async def on_stop(self) -> None:
        await self.on_thread_stop()  # stops the aiokafka consumer (and an unused method queue)

    # ServiceThread leaves these to its thread; with no thread, Service's own steps apply.
    async def _stop_children(self) -> None:
        await self._default_stop_children()

    async def _stop_futures(self) -> None:
        await self._default_stop_futures()

    async def _stop_exit_stacks(self) -> None:
        await self._default_stop_exit_stacks()

    async def call_thread(self, fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await _faust.maybe_async(fun(*args, **kwargs))

    async def cast_thread(self, fun: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.add_future(_faust.maybe_async(fun(*args, **kwargs)))

    async def _commit(self, offsets: Any) -> bool:
        """Faust's commit, given up once the consumer is closed and its group coordinator unknown.

        Faust closes the aiokafka consumer (``AIOKafkaConsumerThread.close``: its client, then
        its group coordinator) when a rebalance callback comes while the app stops, and a
        request in flight on the closed client (a JoinGroup, typically) fails and marks the
        coordinator dead.  From then on aiokafka's ``commit_offsets`` retries for ever:
        ``ensure_coordinator_known`` returns at once, without a coordinator, once the
        coordinator is closing, and the commit's ``GroupCoordinatorNotAvailableError`` is
        retriable.  Every later commit of Faust's waits for that one
        (``maybe_wait_for_commit_to_finish``), the stop's among them ("Wait for streams...").
        Nothing can be committed by then (the worker is leaving; what it does not commit is
        processed again, at least once), so the commit is not started, or no longer awaited."""
        consumer = self._ensure_consumer()
        coordinator = consumer._coordinator
        if coordinator is not None and _commit_hopeless(consumer, coordinator):
            log.info("not committing: the consumer is closed and its group coordinator unknown (it is leaving)")
            return False
        commit = asyncio.ensure_future(super()._commit(offsets))  # type: ignore[misc]
        while True:
            try:
                done, _ = await asyncio.wait({commit}, timeout=COMMIT_CHECK_S)
            except BaseException:
                commit.cancel()  # the caller was cancelled (a stop): so is its commit, as before
                raise
            if done:
                return commit.result()
            if coordinator is not None and _commit_hopeless(consumer, coordinator):
                commit.cancel()
                log.warning(
                    "commit abandoned: the consumer was closed while its group coordinator was unknown (it is leaving)"
                )
                return False

    async def on_partitions_revoked(self, revoked: set) -> None:
        await self.consumer.on_partitions_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set, generation_id: int = 0) -> None:
        await self.consumer.on_partitions_assigned(assigned, generation_id)


class _BatchingConsumer:
    """Faust's aiokafka consumer with batch delivery for the worker's topic, on the app's
    event loop (``InlineConsumerThread``).  Three changes:

    - the fetch loop: records of the batch topic are handed over as one list per fetch of
      aiokafka's own ``ConsumerRecord``s (timestamps in ms), with a ``done`` callback that
      acks them all, and are tracked in bulk (one Faust message per batch keeps rebalances
      waiting for it); records of every other topic (the table changelogs during recovery
      and for standbys) still take Faust's per-record path.  The handler is called strictly
      in order, one batch at a time (an agent with concurrency 1), so per-partition order
      is kept;
    - acks of the batch topic: a per-partition watermark instead of a list of offsets
      (``_ack_batch``), and commits every ``broker_commit_every`` acks in the background
      rather than inside the fetch loop;
    - where aiokafka runs: on the app's event loop, not in Faust's consumer thread.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._watermarks: dict[Any, int] = {}
        """Per partition of the batch topic: every offset up to here is acked."""
        self._open_batches = 0
        """Batches handed over and not acked yet."""
        self._batch_message: Any = None
        """The Faust message tracked while ``_open_batches`` > 0."""
        self._commit_task: asyncio.Future | None = None
        self.assignments = 0
        """Assignments received (a static member's rejoin may keep its generation)."""

    def _new_consumer_thread(self) -> Any:
        return _faust.classes["InlineConsumerThread"](self, loop=self.loop, beacon=self.beacon)

    async def _drain_messages(self, fetcher: Any) -> None:  # the fetcher's loop, replaced
        # Mirrors faust.transport.consumer.Consumer._drain_messages + getmany, but works per
        # topic-partition instead of per record.
        TP = _faust.TP
        callback = self.callback
        consumer_should_stop = self._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        read_offset = self._read_offset
        acks_enabled_for = self.app.topics.acks_enabled_for
        hooks = self.app.hooks
        batch_topics, handler = (hooks.batch_topics, hooks.handle_batch) if hooks is not None else ((), None)
        fetch_in_bulk(frozenset(batch_topics))
        unacked = self._unacked_messages
        flow_control = self.app.flow_control
        to_message = self._to_message
        monitor = self.app.monitor
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                await self.sleep(0)
                if self.should_stop:
                    break
                generation = self.app.consumer_generation_id
                records, active_partitions = await self._wait_next_records(1.0)
                if not records or self.should_stop:
                    continue
                if not self.flow_active:
                    # Faust's getmany: records fetched while the flow stopped are dropped and
                    # the partitions are sought back to their committed offsets.  aiokafka's
                    # seek_to_committed skips a partition whose committed offset is none or 0
                    # (never committed), whose position then stays past the dropped records:
                    # ``_fetch_again`` moves those back (a partition's first records
                    # lost when it moved to another worker before its first commit).
                    try:
                        await self.perform_seek()
                    except Exception as exc:  # noqa: BLE001 - as Faust does
                        self.log.warning("exception performing seek when flow not active %r", exc)
                    if not self.should_stop:
                        await self._fetch_again(records, "fetched while the flow was stopped")
                    continue
                if self.app.consumer_generation_id != generation:
                    await self._fetch_again(records)  # a rebalance came during the wait
                    continue
                batch: list[Any] = []
                offsets: list[tuple[Any, int, int]] = []
                for tp, tp_records in records.items():
                    if not tp_records:
                        continue
                    if (
                        active_partitions is not None
                        and tp not in active_partitions
                        and tp not in self._buffered_partitions
                    ):
                        continue
                    if self.app.consumer_generation_id != generation:
                        break
                    highwater = self.highwater(tp)
                    monitor.track_tp_end_offset(tp, highwater)
                    r_offset = read_offset[tp]
                    if r_offset is not None and tp_records[0].offset < r_offset:
                        tp_records = [r for r in tp_records if r.offset >= r_offset]
                        if not tp_records:
                            continue
                    if tp.topic in batch_topics:
                        # aiokafka's records go to the handler as they are: a Faust message
                        # per record (and a Faust ack per record) cost ~12 % of the worker.
                        # No gaps are recorded: a batch's ack is a watermark that covers the
                        # offsets in between (compacted away or transaction markers).
                        last = tp_records[-1].offset
                        batch.extend(tp_records)
                        offsets.append((tp, last, len(tp_records)))
                        read_offset[tp] = last
                        continue
                    first = tp_records[0].offset
                    if r_offset and first - r_offset > 1 and acks_enabled_for(tp.topic):
                        await self._add_gap(tp, r_offset + 1, first)
                    for record in tp_records:
                        offset = record.offset
                        r_offset = read_offset[tp]
                        if r_offset and offset - r_offset > 1 and acks_enabled_for(tp.topic):
                            await self._add_gap(tp, r_offset + 1, offset)
                        await self.wait_first(callback(to_message(tp, record)), self.suspend_flow.wait())
                        read_offset[tp] = offset
                if self.app.consumer_generation_id != generation and not batch:
                    await self._fetch_again(records)
                if batch:
                    # Rebalances happen between batches: wait out a suspended flow, then drop
                    # what was fetched for an older generation (fetched again: Faust's seek
                    # to the committed offsets, or ``_fetch_again`` if that seek came first).
                    await flow_control.acquire()
                    if self.app.consumer_generation_id != generation or self.should_stop:
                        log.debug("dropping %d records fetched before a rebalance", len(batch))
                        batch = []
                        if not self.should_stop:
                            await self._fetch_again(records)
                    else:
                        assignment = self.assignment()
                        if any(tp not in assignment for tp, _last, _n in offsets):
                            offsets = [entry for entry in offsets if entry[0] in assignment]
                            batch = [r for r in batch if TP(r.topic, r.partition) in assignment]
                if batch:
                    offsets = [entry for entry in offsets if acks_enabled_for(entry[0].topic)]
                    # While a batch is not acked, one tracked Faust message keeps Faust's
                    # rebalance (wait_empty) waiting; ``done`` acks the batch.
                    if self._batch_message is None:
                        self._batch_message = to_message(TP(batch[-1].topic, batch[-1].partition), batch[-1])
                        unacked.add(self._batch_message)
                    self._open_batches += 1
                    try:
                        await handler(batch, partial(self._ack_batch, offsets))
                    except BaseException:
                        self._batch_closed()  # never acked: the worker stops
                        raise
                if self._commit_every is not None and self._n_acked >= self._commit_every:
                    self._n_acked = 0
                    self._commit_in_background()
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                self.log.info("Broker stopped consumer, shutting down...")
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                self.log.info("Consumer shutting down for user cancel.")
                return
            raise
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise

    async def _fetch_again(self, records: dict[Any, list[Any]], why: str = "fetched across a rebalance") -> None:
        """Records dropped because a rebalance came while they were awaited: move each
        partition still assigned back to its first dropped record.

        The fetch loop waits up to a second for records, and the generation it checks them
        against is the one from before the wait.  A rebalance within that wait assigns the
        partitions, seeks them to their committed offsets and resumes them; aiokafka then
        returns the new owner's first records (from the committed offset on) to the waiting
        call and moves the position past them.  Faust's seek to the committed offsets came
        before, so dropping them without a seek skips them for good (the new
        owner's consumption jumped from the committed offset to about the partition's end).
        A partition whose position is no longer past the dropped records was sought since
        (to its committed offset) and is left alone.

        The same holds for records dropped because the flow was stopped: Faust seeks every
        partition to its committed offset, but aiokafka's ``seek_to_committed`` leaves a
        partition with none (or 0) where the dropped fetch put it.

        Every topic the worker consumes but the tables' changelogs (which Faust's recovery
        seeks itself): the batch topics and the agents' (the fleet topology's repartition
        topics, whose first records a new owner would skip just the same)."""
        from aiokafka.errors import IllegalStateError

        changelogs = self.app.tables.changelog_topics
        consumer = self._thread._ensure_consumer()
        assignment = consumer.assignment()
        for tp, tp_records in records.items():
            if not tp_records or tp.topic in changelogs or tp not in assignment:
                continue
            try:
                position = await asyncio.wait_for(consumer.position(tp), timeout=1.0)
            except (TimeoutError, IllegalStateError):
                continue  # being reset or no longer assigned: a seek will place it
            if position > tp_records[-1].offset:
                log.info("fetching %s again from %d (records %s)", tp, tp_records[0].offset, why)
                await self.seek(tp, tp_records[0].offset)

    def _commit_in_background(self) -> None:
        """Commit without holding up the fetch loop.

        Faust's fetch loop awaits its commit every ``broker_commit_every`` acks.  A commit
        first flushes the producer, so here the loop (and every decision with it) would
        wait for the last checkpoint's changelog records, then for the commit request.
        As a task of the consumer's, a failed commit still crashes the consumer.
        """
        if self._commit_task is None or self._commit_task.done():
            self._commit_task = self.add_future(self.commit())

    async def wait_empty(self) -> None:
        """Faust waits here for in-flight messages before a rebalance and on shutdown; let the
        worker make its pending batches durable (and ack them) first."""
        hooks = self.app.hooks
        if hooks is not None:
            await hooks.before_wait_empty()
            if hooks.leaving():
                # Faust waits until every tracked message is acked, for as long as the consumer
                # is not stopped, then commits.  A worker that lost its group never acks its
                # open batches (nothing of them may be written) and the broker refuses its
                # commits; on a rebalance or a stop that began before the consumer was told to
                # stop, that wait never ended (the log's last line "Wait for streams...").
                log.info("not waiting for unacked records: this worker is no longer a member of its group")
                return
        await super().wait_empty()

    def _ack_batch(self, offsets: list[tuple[Any, int, int]]) -> None:
        """``done`` for one batch: acks it up to its last offset in each partition.

        Faust acks each record and, at every commit, sorts the acked offsets and walks them in
        Python to find the first gap: about 5 ms per commit at 2,000 records/s, all on the
        event loop and so in the decision latency.  Batches are acked in the order they were
        fetched (the worker's checkpoints keep that order), so the acked offsets of a
        partition are always everything up to one watermark, and the commit offset is the
        watermark + 1 (``_new_offset``).
        """
        with _faust.ack_lock:
            watermarks = self._watermarks
            committed = self._committed_offset
            for tp, last, n in offsets:
                if last > watermarks.get(tp, -1) and (committed[tp] is None or last >= committed[tp]):
                    watermarks[tp] = last
                    self._acked[tp]  # noqa: B018 - lists tp among those with pending acks
                    self._n_acked += n
            self._batch_closed()

    def _batch_closed(self) -> None:
        self._open_batches -= 1
        if self._open_batches == 0 and self._batch_message is not None:
            self._batch_message.acked = True
            self._unacked_messages.discard(self._batch_message)
            self._batch_message = None
            _faust.notify(self._waiting_for_ack)

    def _new_offset(self, tp: Any) -> int | None:
        watermark = self._watermarks.get(tp)
        if watermark is None:
            return super()._new_offset(tp)  # a per-record topic (table changelogs)
        committed = self._committed_offset[tp]
        return watermark + 1 if committed is None or watermark + 1 > committed else None

    async def on_partitions_revoked(self, revoked: set) -> None:
        for tp in revoked:
            self._watermarks.pop(tp, None)  # as Faust drops its acked offsets
        await super().on_partitions_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set, generation_id: int = 0) -> None:
        self.assignments += 1  # (ConsumerView.epoch)
        await super().on_partitions_assigned(assigned, generation_id)


class _StackDumpingWorker:
    """Faust's worker whose SIGUSR2 shows where every thread and every asyncio task waits.

    mode's worker enters pdb on SIGUSR2, which a worker without a terminal cannot use.  Here
    ``faulthandler`` prints every thread's stack straight from the signal handler (also when
    the event loop is wedged), then the loop prints every task's stack; both to stderr, past the
    buffered log (docs/operations.md: a worker that hangs)."""

    def install_signal_handlers(self) -> None:
        super().install_signal_handlers()  # type: ignore[misc]
        # After mode's handlers: chained, faulthandler dumps the threads first, then mode's
        # handler (Python's, through the loop's wake-up) calls ``_on_sigusr2`` on the loop.
        faulthandler.register(signal.SIGUSR2, file=sys.stderr, all_threads=True, chain=True)

    def _on_sigusr2(self) -> None:
        from .watchdog import print_task_stacks

        print_task_stacks(self.loop, sys.stderr)  # type: ignore[attr-defined]


class _HealthOnlyWeb:
    """Faust's aiohttp web server without Faust's built-in views: only the worker's own pages
    (``/healthz``, ``/readyz``) are served, every other path is a 404.  (Faust's views,
    ``/router``, ``/table/<name>/<key>``, ``/graph`` and its index, show raw state to anyone
    who can connect; its ``web_*_enabled`` settings leave the index page on.)"""

    default_blueprints: ClassVar[list] = []
    production_blueprints: ClassVar[list] = []
    debug_blueprints: ClassVar[list] = []
    optional_blueprints: ClassVar[list] = []


class _WorkerApp:
    """``faust.App`` with the batching transport and the health-only web server; the worker
    gives it its batch handler and hooks with ``attach`` before it starts."""

    hooks: WorkerHooks | None = None

    def attach(self, hooks: WorkerHooks) -> None:
        """Deliver ``hooks.batch_topics`` in batches to ``hooks.handle_batch`` (call before the
        app starts: the consumer takes the hooks when Faust creates it)."""
        self.hooks = hooks

    def _new_transport(self) -> Any:
        return _faust.classes["BatchingTransport"](self.conf.broker_consumer, self)

    def _new_web(self) -> Any:
        return _faust.classes["HealthOnlyWeb"](self)

    async def on_stop(self) -> None:
        await super().on_stop()  # stops the consumer: the last checkpoint is taken there
        if self.hooks is not None:
            await self.hooks.after_stop()


_COMPOSED = ("WorkerApp", "BatchingTransport", "BatchingConsumer", "InlineConsumerThread", "HealthOnlyWeb", "Worker")


@cache
def _compose() -> dict[str, type]:
    """Faust's classes with the mixins above, and the Faust names the mixins use."""
    import faust
    from faust.transport.drivers import aiokafka as faust_aiokafka
    from faust.types import TP
    from faust.types.tuples import ack_lock
    from faust.web.drivers.aiohttp import Web as AiohttpWeb
    from mode.utils.futures import maybe_async, notify

    def compose(name: str, *bases: type, **attributes: Any) -> type:
        # Named as if defined here: mode registers a service's tasks under its module and name.
        return type(name, bases, {"__module__": __name__, "__qualname__": name, **attributes})

    inline = compose("InlineConsumerThread", _InlineConsumerThread, faust_aiokafka.AIOKafkaConsumerThread)
    consumer = compose("BatchingConsumer", _BatchingConsumer, faust_aiokafka.Consumer)
    classes = {
        "WorkerApp": compose("WorkerApp", _WorkerApp, faust.App),
        "BatchingTransport": compose("BatchingTransport", faust_aiokafka.Transport, Consumer=consumer),
        "BatchingConsumer": consumer,
        "InlineConsumerThread": inline,
        "HealthOnlyWeb": compose("HealthOnlyWeb", _HealthOnlyWeb, AiohttpWeb),
        "Worker": compose("Worker", _StackDumpingWorker, faust.Worker),
    }
    _faust.__dict__.update(TP=TP, ack_lock=ack_lock, maybe_async=maybe_async, notify=notify, classes=classes)
    return classes


def __getattr__(name: str) -> Any:
    if name in _COMPOSED:
        return _compose()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- Faust: the run table, the producers, the consumer's position ---------------------------------


class TableAccess:
    """A table's RocksDB partitions, written directly (``streams.app.run_store``).

    ``db(partition)`` opens the partition's database if it is not open; ``open_db`` only
    returns an open one (a revoked partition stays closed); ``open_partitions`` lists them.
    """

    def __init__(self, table: Any) -> None:
        store = table.data
        self._store = store
        self.db = store._db_for_partition
        """``db(partition)``: the partition's RocksDB (rocksdict ``Rdict``), opened if needed."""
        self.offset_key: bytes = store.offset_key
        """The key under which Faust keeps the partition's persisted changelog offset."""
        self.changelog_topic: str = table.changelog_topic.get_topic_name()

    def open_db(self, partition: int) -> Any:
        """The partition's database if it is open, else None."""
        return self._store._dbs.get(partition)

    def open_partitions(self) -> list[int]:
        return list(self._store._dbs)

    def set_persisted_offset(self, partition: int, offset: int) -> None:
        """Record the changelog offset the partition's database holds (Faust's recovery
        starts from it) unless the partition was revoked meanwhile (that would reopen it)."""
        if partition in self._store._dbs:
            self._store.set_persisted_offset(_faust_tp(self.changelog_topic, partition), offset)


class Producers:
    """The aiokafka producers behind Faust's producer.

    ``shared()``: the one Faust's producer sends with (started with the app): the changelog
    records and the dead letters, sent as record batches.  ``new()``: another one with the
    same settings and credentials, not started: the verdicts' own (aiokafka sends one
    produce request at a time per broker, and a decision must not wait behind a
    checkpoint's changelog records).
    """

    def __init__(self, app: Any) -> None:
        self._app = app

    def shared(self) -> Any:
        return self._app.producer._ensure_producer()

    def new(self) -> Any:
        return self._app.producer._new_producer()


class ConsumerView:
    """Where the worker's consumer and group are, for readiness, lag and the idle sweep."""

    def __init__(self, app: Any) -> None:
        self._app = app

    def read_offset(self, topic: str, partition: int) -> int | None:
        """The last offset fetched (and handed to the worker) on a partition, if any."""
        return self._app.consumer._read_offset.get(_faust_tp(topic, partition))

    def committed_offset(self, topic: str, partition: int) -> int | None:
        return self._app.consumer._committed_offset.get(_faust_tp(topic, partition))

    def highwater(self, topic: str, partition: int) -> int | None:
        return self._app.consumer.highwater(_faust_tp(topic, partition))

    def assignment(self) -> set:
        """The consumer's assigned topic-partitions (``.topic``, ``.partition``)."""
        return self._app.consumer.assignment()

    def assigned_actives(self) -> set:
        """The active (not standby) topic-partitions the assignor gave this worker."""
        return self._app.assignor.assigned_actives()

    @property
    def generation(self) -> int:
        return self._app.consumer_generation_id

    @property
    def epoch(self) -> tuple[int, int]:
        """(generation, assignments received): changes with every assignment, also a static
        member's rejoin that keeps its generation."""
        return self._app.consumer_generation_id, self._app.consumer.assignments

    @property
    def session_timeout_s(self) -> float:
        return float(self._app.conf.broker_session_timeout)

    async def still_member(self, generation: int) -> bool | None:
        """Whether the group coordinator still counts this worker a member of ``generation``:
        True (a member, also while the group rebalances: in the eager protocol nobody else
        gets its partitions before it rejoins), False (expelled, e.g. paused past its session
        timeout, or ``generation`` is over: its partitions may be another worker's), None (no
        answer, ask again).

        aiokafka's own heartbeat request (``GroupCoordinator._do_heartbeat``), sent now: the
        broker checks generation and member id, and on a refusal aiokafka resets the
        generation and rejoins, as after its periodic heartbeat.
        """
        if self._app.consumer_generation_id != generation:
            return False
        if generation <= 0:
            return True  # no group ever assigned this worker anything: nobody else can own it
        coordinator = self._app.consumer._thread._ensure_consumer()._coordinator
        if coordinator is None:
            return None
        if coordinator.generation != generation:  # reset by a refused heartbeat or commit
            return False
        answered = await coordinator._do_heartbeat()
        if coordinator.generation != generation:
            return False
        return True if answered else None

    def holds_membership(self) -> bool:
        """Whether the group coordinator under the consumer holds a generation and a member id
        for this worker: a member, with partitions or idle, also while the group rebalances.
        aiokafka drops both when the broker refuses them (a heartbeat or a commit answered
        "unknown member" or "illegal generation") and until it has joined again; during a
        broker outage it keeps them (no answer refuses them).  False before the consumer exists.
        (``streams.app.watchdog``; plain attribute reads, no request.)"""
        consumer = self._app._consumer
        if consumer is None:
            return False
        try:
            coordinator = consumer._thread._ensure_consumer()._coordinator
        except Exception:  # noqa: BLE001 - not started yet (ConsumerNotStarted), or stopped
            return False
        return coordinator is not None and coordinator.generation > 0 and bool(coordinator.member_id)

    @property
    def crash_reason(self) -> BaseException | None:
        """What crashed the app, if anything did (it is then stopping)."""
        return self._app.crash_reason

    @property
    def rebalancing(self) -> bool:
        return bool(self._app.rebalancing)

    @property
    def in_recovery(self) -> bool:
        return bool(self._app.in_recovery)

    @property
    def stopping(self) -> bool:
        return bool(self._app.should_stop)

    def recovered(self) -> bool:
        """Faust finished recovering the tables at least once."""
        return self._app.tables.recovery.completed.is_set()


def _faust_tp(topic: str, partition: int) -> Any:
    _compose()
    return _faust.TP(topic, partition)
