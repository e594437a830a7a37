"""The Faust app: topics, the run table, the batch handler, timers, health and metrics.

A thin shell.  The detection is ``streams.engine``; the per-record logic is
``streams.app.processor`` (no I/O); this module only moves bytes between Kafka, RocksDB and
the processor:

* topics ``tool-calls`` (consumed), ``loop-verdicts`` and ``tool-calls-dlq`` (produced),
  created by the app with ``LOOPWATCH_PARTITIONS`` partitions (the broker does not
  auto-create);
* the ``runs`` table: RocksDB through faust-streaming's ``rocksdb://`` store with the
  ``rocksdict`` driver, raw bytes keys (state keys) and values (see the envelope in
  ``processor``), with a compacted changelog topic ``<app id>-runs-changelog``; Faust
  recovers it on start and on rebalance, and keeps standby copies on other workers;
* one handler for ``tool-calls`` batches (``handle_batch``), called by the batching consumer
  (``streams.app.transport``) with every fetch, one batch at a time (concurrency 1); the
  consumer runs on the app's event loop, not in Faust's consumer thread.

Why the writes bypass ``table[key] = value``: Faust's per-key write sends one changelog
record through its producer buffer per call and resolves the partition from the "current
event" of a stream; here each run touched since the last checkpoint is written once per
checkpoint, straight to its partition's RocksDB with a ``WriteBatch``, and the changelog
records go out as one Kafka record batch per partition.  Recovery, standbys and the
persisted changelog offsets are Faust's, unchanged.

Batches and checkpoints (what makes redelivery after a crash safe, see ``processor``):
every batch is processed at once and its verdicts and dead letters are queued without
waiting (the verdicts on a producer of their own: aiokafka has one produce request in
flight per broker, and a decision must not wait behind a checkpoint's changelog records).
A checkpoint (every ``LOOPWATCH_CHECKPOINT_S``, 5 s, sooner with 50,000 runs pending or
once the worker has caught up, and always before a rebalance or a shutdown proceeds) waits
for the delivery of those records, then writes the touched runs' states (RocksDB, then the
changelog), then acks the batches' records; Faust flushes the producer before it commits
the acked offsets.  A crash loses at most the work since the last checkpoint, which is
redone from the last committed offsets with the same verdict ids.  A checkpoint does its
work in small slices and lets batches run in between (``CHECKPOINT_SLICE_S``, ``BUSY_BATCH``),
so decisions do not wait for it; a batch that touches a run not yet encoded copies it
(``copy_state``) rather than encoding it itself.  A checkpoint acks nothing until the broker
has taken its changelog records: a state the changelog refuses stops the worker (which then
restarts from the last good offsets) instead of vanishing at the next restore.

No record can stop the worker: the processor dead-letters what it cannot apply, a state
that cannot be stored drops its run, and a dead letter larger than the dead-letter topic
takes is cut (``DeadLetter.to_record``).  Only Kafka failures (a verdict, dead letter or
changelog record not delivered) stop it, and those are redone after a restart.

Health: ``/healthz`` (the process is up) and ``/readyz`` (tables recovered, no rebalance, a
broker answered within ``LOOPWATCH_BROKER_UNREACHABLE_S``) on the web port, ``/metrics`` on
the metrics port, nothing else: Faust's own views (``/router``, ``/table/<name>/<key>``,
``/graph``, its index) are not served, since they show raw state to anyone who can connect.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import defaultdict
from typing import Any, Callable, ClassVar, Iterable, Sequence

import faust
from aiokafka.errors import MessageSizeTooLargeError, RecordListTooLargeError, RecordTooLargeError
from faust.types import TP
from faust.web.drivers.aiohttp import Web as AiohttpWeb

from schemas.signing import Keyring
from streams.broker_access import BrokerAccessError, broker_access
from streams.engine import LoopEngine

from . import logs
from .metrics import Metrics
from .processor import BatchProcessor, DeadLetter, VerdictOut, idle_since_ms
from .reload import ConfigWatcher, KeyringWatcher
from .settings import Settings
from .transport import BatchingTransport

__all__ = ["LoopwatchApp", "Loopwatch", "create_app", "ensure_topics"]

log = logging.getLogger("loopwatch.worker")

TABLE_NAME = "runs"
DLQ_MAX_MESSAGE_BYTES = 2 * 1024 * 1024
CHANGELOG_MAX_MESSAGE_BYTES = 2 * 1024 * 1024
"""``max.message.bytes`` of the run table's changelog (set when Faust creates it): twice
what a stored state may take (``processor.MAX_STATE_BYTES``, 1 MB)."""
DEAD_LETTER_VALUE_LIMIT = 1024 * 1024
"""A dead letter's key and value are cut to this many bytes each (``DeadLetter.to_record``)."""
_TOO_LARGE = (MessageSizeTooLargeError, RecordListTooLargeError, RecordTooLargeError)
BROKER_PROBE_S = 1.0
"""How often the worker asks a broker for cluster metadata (``/readyz``)."""
SWEEP_CHUNK = 2000
MAX_DIRTY_RUNS = 50_000
"""A checkpoint is taken early (and waited for) when this many runs wait for one."""
IDLE_CHECKPOINT_S = 0.5
"""A checkpoint is taken early once no batch came for this long (the worker caught up)."""
CHECKPOINT_SLICE_S = 0.0005
"""How long a checkpoint encodes runs before it yields to the event loop.  In time, not in
runs: one run took 60 us on an idle machine and 250 us on a busy one, and a slice of 8 runs
then held every hop of an arriving event for 2 ms."""
CHECKPOINT_PAUSE_S = 0.002
"""A checkpoint's pause after each slice while the worker keeps up: it then takes at most a
fifth of the event loop, and the ~0.1 s of encoding of 400 runs spreads over ~0.5 s (with 1
ms, a third of the loop, the batches during a checkpoint still came 6-7 ms apart, not 2)."""
BUSY_BATCH = 256
"""While batches stay under this many records (the worker keeps up), a checkpoint steps
aside for ``CHECKPOINT_PAUSE_S`` after each slice; otherwise it only lets the next batch
in.  With ``sleep(0)`` alone, the checkpoint task is back in the ready queue at once and
each hop of an arriving event (fetch response, fetcher, batch handler, producer) waits
behind one more slice: at 2,000 events/s the events that arrived during a checkpoint made
up nearly all of the decision-latency tail.  Catching up, latency is the backlog's anyway
and the checkpoint must not fall behind."""
_NO_HEADERS: list = []  # aiokafka's batch builder wants a list; never mutated


class HealthOnlyWeb(AiohttpWeb):
    """Faust's aiohttp web server without Faust's built-in views: only the app's own pages
    (``/healthz``, ``/readyz``) are served, every other path is a 404."""

    default_blueprints: ClassVar[list] = []
    production_blueprints: ClassVar[list] = []
    debug_blueprints: ClassVar[list] = []
    optional_blueprints: ClassVar[list] = []


class LoopwatchApp(faust.App):
    """``faust.App`` whose consumer delivers registered topics in batches."""

    batch_handlers: dict[str, Any]
    loopwatch: "Loopwatch"
    before_wait_empty: Any = None

    def _new_transport(self) -> BatchingTransport:
        return BatchingTransport(self.conf.broker_consumer, self)

    def _new_web(self) -> HealthOnlyWeb:
        # Faust's one hook for the web driver (private, like _new_transport above; the
        # ``web_*_enabled`` settings leave its index page at "/" on).
        return HealthOnlyWeb(self)

    async def on_stop(self) -> None:
        await super().on_stop()  # stops the consumer: the last checkpoint is taken there
        await self.loopwatch.close()


def faust_settings(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for ``faust.App``."""
    return dict(
        broker=settings.broker_url,
        broker_credentials=settings.broker_credentials(),
        store="rocksdb://",  # faust-streaming 0.15.3 has no "rocksdict://" scheme: see the table options
        datadir=str(settings.data_dir),
        autodiscover=False,
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication,
        topic_disable_leader=True,
        table_standby_replicas=settings.standby_replicas,
        processing_guarantee="at_least_once",
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=settings.heartbeat_interval_s,
        broker_rebalance_timeout=settings.rebalance_timeout_s,
        broker_commit_interval=settings.commit_interval_s,
        broker_max_poll_records=settings.max_batch,
        consumer_max_fetch_size=4 * 1024 * 1024,
        producer_acks=-1,
        producer_linger=0.0,  # latency: verdict and changelog batches are built explicitly anyway
        producer_max_batch_size=512 * 1024,
        producer_max_request_size=4 * 1024 * 1024,
        # Static membership: a restarted worker rejoins as itself, without a rebalance.
        consumer_group_instance_id=settings.group_instance_id,
        web_enabled=True,
        web_router_enabled=False,
        web_tables_enabled=False,
        web_graph_enabled=False,
        web_stats_enabled=False,
        web_metrics_enabled=False,
        web_bind=settings.web_host,
        web_host=settings.web_host,
        web_port=settings.web_port,
        canonical_url=settings.web_url,
    )


def create_app(settings: Settings | None = None, *, metrics: Metrics | None = None) -> LoopwatchApp:
    """Build the worker's Faust app (not started)."""
    settings = settings or Settings.from_env()
    app = LoopwatchApp(settings.app_id, **faust_settings(settings))
    app.batch_handlers = {}
    app.loopwatch = Loopwatch(app, settings, metrics or Metrics())
    return app


async def ensure_topics(settings: Settings, timeout: float = 30.0) -> list[str]:
    """Create ``tool-calls``, ``loop-verdicts`` and the dead-letter topic when missing.

    Faust declares them too, but only just before it subscribes, and the consumer's metadata
    may not show a brand-new topic yet: the first assignment then misses ``tool-calls``
    ("Ignoring missing topic") until a second rebalance.  Creating them before the worker
    starts avoids that.  Returns the topics created.

    This is also the worker's first connection, so it fails the start (``BrokerAccessError``,
    one line) when the broker refuses the credentials or its certificate is not trusted, or
    when a topic is missing and the worker may not create it.  Other errors are logged, not
    raised (an unreachable broker may come up; Faust declares the topics again).
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError, TopicAuthorizationFailedError

    wanted = {
        settings.tool_calls_topic: {},
        settings.verdicts_topic: {},
        settings.dead_letter_topic: {"max.message.bytes": str(DLQ_MAX_MESSAGE_BYTES)},
    }
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.broker_hosts, request_timeout_ms=int(timeout * 1000),
        **settings.kafka_client_options(),
    )
    created: list[str] = []
    try:
        async with broker_access(settings.broker_hosts, username=settings.sasl_username, mechanism=settings.sasl_mechanism):
            await asyncio.wait_for(admin.start(), timeout)
        existing = set(await admin.list_topics())  # those this principal may describe
        missing = [name for name in wanted if name not in existing]
        for name in missing:
            response = await admin.create_topics(
                [NewTopic(name, settings.partitions, settings.replication, topic_configs=wanted[name])]
            )
            for entry in response.topic_errors:  # (topic, error_code[, error_message])
                code, message = entry[1], entry[2] if len(entry) > 2 else ""
                if code == TopicAuthorizationFailedError.errno:
                    who = f"user {settings.sasl_username!r}" if settings.sasl_username else "this worker"
                    raise BrokerAccessError(
                        f"topic {name} does not exist (or may not be described) and {who} may not create it:"
                        " create it first and grant the ACLs (README, Securing Kafka)"
                    )
                if code == 0:
                    created.append(name)
                elif code != TopicAlreadyExistsError.errno:
                    log.warning("could not create topic %s (error %d: %s); Faust will declare it", name, code, message)
        if created:
            log.info("created topics %s (%d partitions)", ", ".join(created), settings.partitions)
    except BrokerAccessError:
        raise
    except Exception as exc:  # noqa: BLE001 - Faust declares them again
        log.warning("could not check/create topics before start (%r); Faust will declare them", exc)
    finally:
        try:
            await admin.close()
        except Exception:  # noqa: BLE001
            pass
    return created


class Loopwatch:
    """Everything the worker adds to the Faust app."""

    def __init__(self, app: LoopwatchApp, settings: Settings, metrics: Metrics) -> None:
        self.app = app
        self.settings = settings
        self.metrics = metrics
        self.watcher = ConfigWatcher(settings.config, self._swap_engine, metrics)
        self.key_watcher = None if settings.signing_keys is None else KeyringWatcher(settings.signing_keys, self._swap_keyring)
        self.processor = BatchProcessor(
            self.watcher.load_initial(), metrics, clock_skew_s=settings.clock_skew_s,
            keyring=None if self.key_watcher is None else self.key_watcher.load_initial(),
        )
        self._write_lock = asyncio.Lock()
        self._partition_counts: dict[str, int] = {}
        self._verdict_producer: Any = None
        """The aiokafka producer of ``loop-verdicts`` (``_verdict_producer_started``)."""
        self._pending: list[asyncio.Future] = []
        """Delivery futures of the verdicts and dead letters produced since the last checkpoint
        and not delivered yet (or failed): the checkpoint waits for them and raises their errors."""
        self._dones: list[Callable[[], None]] = []
        """Ack callbacks of the batches processed since the last checkpoint."""
        self._checkpointed_at = time.monotonic()
        self._last_batch_at = 0.0
        self._last_batch_size = 0
        self._checkpoint_lock = asyncio.Lock()
        self._poisoned: BaseException | None = None
        """Set when a batch or a checkpoint was interrupted half-way: no more checkpoints."""
        self._checkpointing: asyncio.Future | None = None
        self._batches_wait = False
        """The batch handler waits for the checkpoint (``MAX_DIRTY_RUNS``): no pauses in it."""
        self.checkpoints = 0
        self._metrics_server: Any = None
        self._runs_tracked = 0
        self._counted_generation: int | None = None
        self._gc_frozen = False
        self._broker_answered_at = time.monotonic()
        """When a broker last answered the readiness probe (``_probe_broker``)."""
        self._broker_lost_logged = False
        self.batches = 0
        self.records = 0
        self.verdicts_sent = 0
        self.dead_lettered = 0
        self._reported = (time.monotonic(), 0, 0, 0, 0)

        raw = dict(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
        self.tool_calls = app.topic(
            settings.tool_calls_topic, partitions=settings.partitions, replicas=settings.replication,
            internal=True, **raw,
        )
        self.verdicts = app.topic(
            settings.verdicts_topic, partitions=settings.partitions, replicas=settings.replication,
            internal=True, **raw,
        )
        self.dead_letters = app.topic(
            settings.dead_letter_topic, partitions=settings.partitions, replicas=settings.replication,
            internal=True, config={"max.message.bytes": str(DLQ_MAX_MESSAGE_BYTES)}, **raw,
        )
        self.table = app.Table(
            TABLE_NAME,
            partitions=settings.partitions,
            help="loop-detection state per run (state key -> envelope around encode_state)",
            options={
                "driver": "rocksdict",
                "block_cache_size": 64 * 1024 * 1024,
                "write_buffer_size": 16 * 1024 * 1024,
            },
            key_type=bytes,
            value_type=bytes,  # bytes -> the "raw" codec for keys, values and the changelog
            extra_topic_configs={"max.message.bytes": str(CHANGELOG_MAX_MESSAGE_BYTES)},
        )
        # Subscribe tool-calls through the conductor (so the assignor co-partitions it with
        # the changelog and the consumer fetches it); its records go to handle_batch.
        app.topics.add(self.tool_calls)
        app.batch_handlers[settings.tool_calls_topic] = self.handle_batch
        app.before_wait_empty = self.checkpoint  # rebalances and shutdown checkpoint first

        # Evaluated at scrape time (in the metrics server's thread; plain attribute reads).
        metrics.ready.set_function(lambda: 1.0 if self.is_ready() else 0.0)
        metrics.table_recovery_in_progress.set_function(lambda: 1.0 if getattr(app, "in_recovery", False) else 0.0)
        metrics.runs_tracked.set_function(lambda: float(self._runs_tracked))

        app.task(self._on_start)
        app.timer(settings.config_poll_s, name="loopwatch.config_reload")(self._poll_config)
        app.timer(settings.sweep_interval_s, name="loopwatch.idle_sweep")(self.sweep)
        app.timer(1.0, name="loopwatch.lag")(self._update_lag)
        app.timer(0.5, name="loopwatch.flush_logs")(self._flush_logs)
        app.timer(min(0.25, settings.checkpoint_s), name="loopwatch.checkpoint")(self._checkpoint_timer)
        app.timer(BROKER_PROBE_S, name="loopwatch.broker_probe")(self._probe_broker)
        app.page("/healthz")(_healthz)
        app.page("/readyz")(_readyz)

    # -- lifecycle ------------------------------------------------------------------------------

    async def _on_start(self) -> None:
        for topic in (self.verdicts, self.dead_letters):
            await topic.maybe_declare()
        await self._verdict_producer_started()  # before the first decision, and for the probe
        if self._metrics_server is None and self.settings.metrics_port:
            self._metrics_server = self.metrics.serve(self.settings.metrics_port, self.settings.web_host)
            log.info("metrics on http://%s:%d/metrics", self.settings.web_host, self.settings.metrics_port)

    def _swap_engine(self, engine: LoopEngine) -> None:
        self.processor.engine = engine

    def _swap_keyring(self, keyring: Keyring) -> None:
        self.processor.keyring = keyring

    async def _poll_config(self) -> None:
        self.watcher.poll()
        if self.key_watcher is not None:
            self.key_watcher.poll()

    # -- health -------------------------------------------------------------------------------

    def is_ready(self) -> bool:
        """Table recovery finished, no rebalance in progress, a broker answered lately (and
        not failing)."""
        if self._poisoned is not None or not self.broker_reachable():
            return False
        app = self.app
        try:
            recovered = app.tables.recovery.completed.is_set()
        except Exception:  # noqa: BLE001 - not started yet
            return False
        return bool(recovered and not app.rebalancing and not getattr(app, "in_recovery", False))

    def broker_reachable(self) -> bool:
        """A broker answered within ``LOOPWATCH_BROKER_UNREACHABLE_S``."""
        return time.monotonic() - self._broker_answered_at <= self.settings.broker_unreachable_s

    async def _probe_broker(self) -> None:
        """Ask a broker for the cluster's metadata, on the verdict producer's connections
        (the same brokers the consumer and producers use; one small request a second).

        A metadata request rather than the consumer's fetches: a worker with no partitions
        (a warm standby) fetches nothing, and a partition's fetches pause during recovery.
        """
        producer = self._verdict_producer
        if producer is None:
            return  # not started yet: recovery, which needs the broker, keeps it unready anyway
        timeout = min(5.0, self.settings.broker_unreachable_s)
        try:
            await asyncio.wait_for(producer.client.fetch_all_metadata(), timeout)
        except Exception as exc:  # noqa: BLE001 - every failure means the same: no answer
            silent = time.monotonic() - self._broker_answered_at
            if not self._broker_lost_logged and silent > self.settings.broker_unreachable_s:
                self._broker_lost_logged = True
                log.error("no Kafka broker has answered for %.0f s (last error: %r): not ready until one does",
                          silent, exc)
            return
        if self._broker_lost_logged:
            self._broker_lost_logged = False
            log.info("a Kafka broker answers again")
        self._broker_answered_at = time.monotonic()

    def _report(self) -> None:
        """One info line a minute: what the worker did since the last one."""
        now = time.monotonic()
        then, batches, records, verdicts, dead = self._reported
        if now - then < 60.0:
            return
        self._reported = (now, self.batches, self.records, self.verdicts_sent, self.dead_lettered)
        n = self.records - records
        if n:
            log.info(
                "%d records in %d batches (%.0f/s), %d verdicts, %d dead letters; %d runs tracked",
                n, self.batches - batches, n / (now - then), self.verdicts_sent - verdicts,
                self.dead_lettered - dead, self._runs_tracked,
            )

    async def _flush_logs(self) -> None:
        logs.flush()

    async def _update_lag(self) -> None:
        self._report()
        if not self._gc_frozen and self.is_ready():
            # Everything alive once the worker is up (Faust, aiokafka, the engine, the config)
            # lives for good: keep it out of the cyclic GC's full collections, which otherwise
            # scan it all and paused the event loop for ~40-60 ms every few seconds.
            self._gc_frozen = True
            gc.collect()
            gc.freeze()
        generation = self.app.consumer_generation_id
        if generation != self._counted_generation and self.is_ready():
            # New assignment (or first start): recount the runs this worker now holds (and
            # expire idle ones) instead of waiting up to a minute for the next sweep.
            self._counted_generation = generation
            await self.sweep()
        m = self.metrics
        consumer = self.app.consumer
        try:
            assignment = consumer.assignment()
        except Exception:  # noqa: BLE001 - consumer not started
            return
        committed = getattr(consumer, "_committed_offset", {})
        seen = set()
        for tp in assignment:
            if tp.topic != self.settings.tool_calls_topic:
                continue
            highwater = consumer.highwater(tp)
            done = committed.get(tp)
            if highwater is None:
                continue
            seen.add(str(tp.partition))
            m.consumer_lag.labels(str(tp.partition)).set(max(0, highwater - (done or 0)))
        for labels in list(getattr(m.consumer_lag, "_metrics", {})):
            if labels[0] not in seen:
                m.consumer_lag.remove(*labels)

    # -- state access ---------------------------------------------------------------------------

    @property
    def store(self) -> Any:
        return self.table.data

    @property
    def changelog_topic(self) -> str:
        return self.table.changelog_topic.get_topic_name()

    def _read(self, partition: int, key: bytes) -> bytes | None:
        return self.store._db_for_partition(partition).get(key)

    def _producer(self) -> Any:
        """The aiokafka producer under Faust's producer (for record-batch sends): the
        changelog and the dead letters."""
        return self.app.producer._ensure_producer()

    async def _verdict_producer_started(self) -> Any:
        """The verdicts' own aiokafka producer, started at first use, with the settings (and
        credentials) of Faust's.

        Why not Faust's: aiokafka sends one produce request at a time per broker, and a
        checkpoint's changelog records (hundreds of KB of run states) would hold every
        decision produced behind them until the broker acknowledged them.  On a connection
        of their own, decisions never wait for state writes.

        Only batches send verdicts, under the write lock: one caller at a time.
        """
        producer = self._verdict_producer
        if producer is None:
            producer = self.app.producer._new_producer()
            await producer.start()
            self._verdict_producer = producer
        return producer

    async def close(self) -> None:
        """Stop the verdict producer (after the last checkpoint, which waited for its sends)."""
        producer, self._verdict_producer = self._verdict_producer, None
        if producer is not None:
            await producer.stop()

    # -- the batch handler ------------------------------------------------------------------------

    async def handle_batch(self, messages: Sequence[Any], done: Callable[[], None]) -> None:
        """Process one batch and publish its verdicts and dead letters (without waiting for
        their delivery); the records are acked by the next checkpoint (``done``).

        Shielded: a shutdown cancels the fetch loop, but a batch that was processed must also
        be registered (its delivery futures and ack) before a checkpoint may include it.
        """
        await asyncio.shield(self._handle(messages, done))

    async def _handle(self, messages: Sequence[Any], done: Callable[[], None]) -> None:
        async with self._write_lock:
            if self._poisoned is not None:
                raise RuntimeError("an earlier batch or checkpoint failed; restart the worker") from self._poisoned
            result = self.processor.process(messages, self._read)
            try:
                # Only sends in flight (or failed) wait for the checkpoint.  Kept until then,
                # thousands of delivered futures (and their record metadata) lived long enough
                # to reach the GC's oldest generation and make its full collections longer.
                self._pending = pending = [future for future in self._pending if not _delivered(future)]
                if result.verdicts:
                    self.processor.observe_latency(result.verdicts)
                    pending += await self._send_verdicts(result.verdicts)
                for letter in result.dead_letters:
                    pending.append(await self._send_dead_letter(letter))
                self._dones.append(done)
            except BaseException as exc:
                # The batch's states are in the processor but its verdicts may not be queued:
                # no checkpoint may write them now (their events would be skipped after a
                # restart, their verdicts never published).  The worker stops; everything
                # since the last checkpoint is processed again.
                self._poisoned = exc
                raise
        logs.flush()
        self._last_batch_at = time.monotonic()
        self._last_batch_size = len(messages)
        self.batches += 1
        self.records += len(messages)
        self.verdicts_sent += len(result.verdicts)
        self.dead_lettered += len(result.dead_letters)
        if result.skipped:
            log.info("skipped %d re-delivered events already applied to their runs", result.skipped)
        if self.processor.dirty >= MAX_DIRTY_RUNS:
            self._batches_wait = True  # backpressure: no batch runs until it is done
            try:
                await self.checkpoint()
            finally:
                self._batches_wait = False
        elif time.monotonic() - self._checkpointed_at >= self.settings.checkpoint_s:
            self._checkpoint_soon()

    def _checkpoint_soon(self) -> None:
        """Start a checkpoint in the background unless one is running."""
        if self._checkpointing is None or self._checkpointing.done():
            self._checkpointing = self.app.add_future(self.checkpoint())

    async def checkpoint(self) -> None:
        """Make everything processed so far durable, in this order: the verdicts and dead
        letters are delivered, the touched runs' states are written (RocksDB + changelog,
        once per run), the records are acked (Faust commits acked offsets).

        The states are encoded in slices with the event loop free in between, so batches
        keep flowing (the processor copies a frozen run first when a batch touches it).
        """
        async with self._checkpoint_lock:
            processor = self.processor
            # Under the write lock: a batch is either wholly in this checkpoint (its states,
            # its delivery futures, its acks) or wholly after it.
            async with self._write_lock:
                self._checkpointed_at = time.monotonic()
                if self._poisoned is not None:
                    log.warning("no checkpoint after an interrupted batch or checkpoint (%r): the work "
                                "since the last one is redone after a restart", self._poisoned)
                    return
                if not self._dones and not processor.dirty:
                    return
                pending, self._pending = self._pending, []
                dones, self._dones = self._dones, []
                processor.begin_checkpoint()
            # An error below (a verdict not delivered, a failed write, a cancellation)
            # propagates and stops the worker: nothing of this checkpoint is acked, so its
            # records are processed again after a restart.
            try:
                while not _encode_for(processor, CHECKPOINT_SLICE_S):
                    await self._step_aside()
                waiting = [future for future in pending if not future.done()]
                if waiting:
                    await asyncio.gather(*waiting)
                for future in pending:
                    future.result()  # raises a delivery error
                await self._step_aside()
                async with self._write_lock:
                    cp = processor.end_checkpoint()
                # Batches go on while the states are written: until ``checkpoint_written`` the
                # processor serves reads of these runs itself, and the next checkpoint waits
                # for this one (the checkpoint lock).
                if cp.writes:
                    sent = await self._write(cp.writes.items(), on_stored=processor.checkpoint_written, step_aside=True)
                    # Nothing is acked before the changelog has the states: a state it
                    # refused would be gone at the next restore while its records count as
                    # done.  The error stops the worker; it restarts from the last good offsets.
                    await asyncio.gather(*sent)
                else:
                    processor.checkpoint_written()
            except BaseException as exc:
                self._poisoned = exc
                raise
            for i, done in enumerate(dones, 1):
                done()
                if i % 256 == 0:
                    await self._step_aside()  # thousands of acks: let batches in between
            self._runs_tracked = max(0, self._runs_tracked + cp.created - cp.deleted)
            self.checkpoints += 1

    async def _step_aside(self) -> None:
        """A checkpoint's yield to the event loop between two slices of its work: a pause
        while batches are small, none while catching up or when a rebalance or a shutdown
        waits for the checkpoint (no decisions are being made then), nor when the batch
        handler itself waits for it (``MAX_DIRTY_RUNS``)."""
        app = self.app
        keeping_up = (
            self._last_batch_size < BUSY_BATCH and not self._batches_wait
            and not app.rebalancing and not app.should_stop
        )
        await asyncio.sleep(CHECKPOINT_PAUSE_S if keeping_up else 0)

    async def _checkpoint_timer(self) -> None:
        now = time.monotonic()
        if now - self._checkpointed_at >= self.settings.checkpoint_s:
            self._checkpoint_soon()
        elif self._dones and now - self._last_batch_at >= IDLE_CHECKPOINT_S:
            self._checkpoint_soon()  # caught up: a quiet moment costs nothing to use

    async def _partitions(self, topic: str) -> int:
        """The partition count of an output topic (from the producer's metadata, once)."""
        n = self._partition_counts.get(topic)
        if n is None:
            n = self._partition_counts[topic] = len(await self._producer().partitions_for(topic))
            if n != self.settings.partitions:
                log.warning("%s has %d partitions, not %d: verdicts go to source partition mod %d",
                            topic, n, self.settings.partitions, n)
        return n

    async def _send_verdicts(self, verdicts: list[VerdictOut]) -> list[asyncio.Future]:
        n_partitions = await self._partitions(self.settings.verdicts_topic)
        producer = await self._verdict_producer_started()
        by_partition: dict[int, list[tuple[bytes, bytes]]] = defaultdict(list)
        for out in verdicts:
            by_partition[out.partition % n_partitions].append((out.key, out.value))
        futures = []
        for partition, items in by_partition.items():
            for future, _n in await self._send_records(producer, self.settings.verdicts_topic, partition, items):
                futures.append(future)
        return futures

    async def _send_dead_letter(self, letter: DeadLetter) -> asyncio.Future:
        """Queue a dead letter; returns a future of its delivery."""
        partition = letter.record.partition % await self._partitions(self.settings.dead_letter_topic)
        key, value, headers = letter.to_record(DEAD_LETTER_VALUE_LIMIT)
        sent = await self._producer().send(
            self.settings.dead_letter_topic, value, key=key, partition=partition, headers=headers,
        )
        return asyncio.ensure_future(self._deliver_dead_letter(letter, sent, partition))

    async def _deliver_dead_letter(self, letter: DeadLetter, sent: asyncio.Future, partition: int) -> Any:
        """Wait for a dead letter's delivery.  When the topic refuses it as too large (its
        ``max.message.bytes`` set below ``DEAD_LETTER_VALUE_LIMIT`` by someone; the producer
        may also have put it in one request with others), it goes again on its own, then
        as its headers alone, rather than stopping the worker at every restart."""
        try:
            return await sent
        except _TOO_LARGE:
            pass
        try:
            return await self._send_alone(letter, DEAD_LETTER_VALUE_LIMIT, partition)
        except _TOO_LARGE as exc:
            record = letter.record
            log.error("dead letter of %s[%d]@%d refused by %s (%r): sending its headers without key or value",
                      record.topic, record.partition, record.offset, self.settings.dead_letter_topic, exc)
        return await self._send_alone(letter, 0, partition)

    async def _send_alone(self, letter: DeadLetter, limit: int, partition: int) -> Any:
        """Send a dead letter as a record batch of its own and wait for its delivery."""
        key, value, headers = letter.to_record(limit)
        producer = self._producer()
        batch = producer.create_batch()
        batch.append(key=key, value=value, timestamp=None, headers=headers)
        return await (await producer.send_batch(batch, self.settings.dead_letter_topic, partition=partition))

    async def _send_records(
        self, producer: Any, topic: str, partition: int, items: Iterable[tuple[bytes | None, bytes | None]]
    ) -> list[tuple[asyncio.Future, int]]:
        """Produce records to one partition as few record batches; returns (future, count)."""
        sent: list[tuple[asyncio.Future, int]] = []
        batch = producer.create_batch()
        append = batch.append
        n = 0
        for key, value in items:
            if append(key=key, value=value, timestamp=None, headers=_NO_HEADERS) is None:
                if n:
                    sent.append((await producer.send_batch(batch, topic, partition=partition), n))
                    batch = producer.create_batch()
                    append = batch.append
                    n = 0
                if append(key=key, value=value, timestamp=None, headers=_NO_HEADERS) is None:
                    # Larger than a whole batch: the per-record path sizes a batch for it.
                    sent.append((await producer.send(topic, value, key=key, partition=partition), 1))
                    continue
            n += 1
        if n:
            sent.append((await producer.send_batch(batch, topic, partition=partition), n))
        return sent

    async def _write(
        self,
        writes: Iterable[tuple[tuple[int, bytes], bytes | None]],
        on_stored: Callable[[], None] | None = None,
        *,
        step_aside: bool = False,
    ) -> list[asyncio.Future]:
        """Store states (None: delete) in RocksDB, then queue their changelog records;
        returns the futures of their delivery.

        ``step_aside``: yield to the event loop after each partition (a checkpoint, which
        holds no lock while it writes; the sweep writes under the write lock and does not).
        """
        import rocksdict

        store = self.store
        by_partition: dict[int, list[tuple[bytes, bytes | None]]] = defaultdict(list)
        for (partition, key), value in writes:
            by_partition[partition].append((key, value))
        for partition, items in by_partition.items():
            wb = rocksdict.WriteBatch(raw_mode=True)
            for key, value in items:
                if value is None:
                    wb.delete(key)
                else:
                    wb.put(key, value)
            store._db_for_partition(partition).write(wb)
            if step_aside:
                await self._step_aside()  # until on_stored the processor serves these runs
        if on_stored is not None:
            on_stored()  # every RocksDB write is done: reads go to the store from now on
        changelog = self.changelog_topic
        sent = []
        for partition, items in by_partition.items():
            for future, n in await self._send_records(self._producer(), changelog, partition, items):
                future.add_done_callback(self._persisted_callback(changelog, partition, n))
                sent.append(future)
            if step_aside:
                await self._step_aside()
        return sent

    def _persisted_callback(self, topic: str, partition: int, n: int):
        store = self.store

        def on_sent(future: asyncio.Future) -> None:
            if future.cancelled():
                return
            exc = future.exception()
            if exc is not None:
                # A checkpoint raises it (and stops the worker); a sweep's tombstones only
                # log it: the local store is then ahead of the changelog, and a restore
                # brings the expired runs back until the next sweep expires them again.
                log.error("%d changelog records for %s[%d] not written: %r", n, topic, partition, exc)
                return
            if partition in store._dbs:  # not revoked meanwhile (would reopen the db)
                store.set_persisted_offset(TP(topic, partition), future.result().offset + n - 1)

        return on_sent

    # -- idle expiry ------------------------------------------------------------------------------

    def _has_backlog(self, partition: int) -> bool:
        """More than a batch of ``tool-calls`` records not yet processed on this partition."""
        consumer = self.app.consumer
        tp = TP(self.settings.tool_calls_topic, partition)
        try:
            highwater = consumer.highwater(tp)
        except Exception:  # noqa: BLE001 - not fetched yet: assume the worst
            return True
        if highwater is None:
            return True
        done = consumer._read_offset.get(tp) if hasattr(consumer, "_read_offset") else None
        if done is None:
            done = getattr(consumer, "_committed_offset", {}).get(tp)
        if done is None:
            return highwater > 0
        return highwater - done > self.settings.max_batch

    async def sweep(self) -> int:
        """Delete runs idle for longer than LOOPWATCH_IDLE_TIMEOUT_S; returns how many.

        A periodic scan of the active partitions' RocksDB rather than Faust's windowed-table
        expiry: windows would cut one run's state into time buckets, while a run's history
        must live as long as the run.  The scan reads only each value's 25-byte envelope
        header (processing time and event time of the last event), yields to the event loop
        every 2,000 keys, re-checks a candidate under the write lock before deleting it, and
        deletes through the normal write path (RocksDB + changelog tombstone).  It also
        recounts ``loopwatch_runs_tracked``.  Partitions with a backlog are not expired (after
        an outage every run would look idle while its events still wait to be processed).
        """
        app = self.app
        if app.rebalancing or getattr(app, "in_recovery", False) or not self.is_ready():
            return 0
        store = self.store
        generation = app.consumer_generation_id
        cutoff = int(time.time() * 1000) - int(self.settings.idle_timeout_s * 1000)
        try:
            actives = app.assignor.assigned_actives()
        except Exception:  # noqa: BLE001
            return 0
        changelog = self.changelog_topic
        partitions = [p for p in list(store._dbs) if TP(changelog, p) in actives]
        total = deleted = 0
        offset_key = store.offset_key
        for partition in partitions:
            db = store._dbs.get(partition)
            if db is None:
                continue
            # Not while the partition has a backlog (after an outage, say): a run that looks
            # idle may have events waiting to be processed.  Count only.
            expire = not self._has_backlog(partition)
            candidates: list[bytes] = []
            seen = 0
            for key, value in db.items():
                if key == offset_key:
                    continue
                seen += 1
                try:
                    if expire and idle_since_ms(value) < cutoff:
                        candidates.append(key)
                except Exception:  # noqa: BLE001 - unreadable: leave it to the processor
                    pass
                if seen % SWEEP_CHUNK == 0:
                    await asyncio.sleep(0)
                    if app.consumer_generation_id != generation or store._dbs.get(partition) is not db:
                        return deleted  # rebalanced meanwhile: try again next time
            expired = 0
            if candidates:
                async with self._write_lock:
                    if app.consumer_generation_id != generation or store._dbs.get(partition) is not db:
                        return deleted
                    cutoff = int(time.time() * 1000) - int(self.settings.idle_timeout_s * 1000)
                    doomed = []
                    for key in candidates:
                        if self.processor.is_dirty(partition, key):
                            continue  # touched since the last checkpoint: active
                        value = db.get(key)
                        if value is not None and idle_since_ms(value) < cutoff:
                            doomed.append(((partition, key), None))
                    if doomed:
                        await self._write(doomed)
                        for (p, key), _ in doomed:
                            self.processor.forget(p, key)
                    expired = len(doomed)
            deleted += expired
            total += seen - expired
        self._runs_tracked = total
        if deleted:
            log.info("expired %d idle runs (idle > %ss)", deleted, self.settings.idle_timeout_s)
        return deleted


def _encode_for(processor: BatchProcessor, seconds: float) -> bool:
    """Encode frozen runs for about ``seconds`` (at least one); True when none is left."""
    clock = time.perf_counter
    deadline = clock() + seconds
    while not processor.encode_some(1):
        if clock() >= deadline:
            return False
    return True


def _delivered(future: asyncio.Future) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


async def _healthz(self: Any, request: Any) -> Any:
    """200 while the process is up."""
    return self.json({"status": "ok"})


async def _readyz(self: Any, request: Any) -> Any:
    """200 once the run table is recovered, no rebalance is in progress and a broker
    answered lately, else 503."""
    loopwatch = self.app.loopwatch
    ready = loopwatch.is_ready()
    body = {
        "ready": ready,
        "rebalancing": bool(self.app.rebalancing),
        "in_recovery": bool(getattr(self.app, "in_recovery", False)),
        "broker_reachable": loopwatch.broker_reachable(),
    }
    return self.json(body, status=200 if ready else 503)
