"""The worker's wiring: its Faust app, topics, run table and parts, and the timers that drive them.

Nothing here does work; each part has its own module (docs/design.md has the picture):

``processor``   a batch of records in, verdicts and dead letters out, no I/O;
``records``     the record types those are (a consumed record, a verdict, a dead letter);
``live_runs``   the runs changed since the last checkpoint, in memory, and their encoding;
``checkpoint``  when and in which order the work is made durable; the batch handler;
``run_store``   the run table: RocksDB and its changelog, the state envelope;
``output``      the verdict and dead-letter producers;
``expiry``      the idle sweep;
``health``      readiness, broker reachability, lag, ``/healthz`` and ``/readyz``;
``watchdog``    a worker out of its group (or whose stop hangs) for too long exits;
``reload``      hot reload of the config files (live and candidate) and the signing keys;
``fleet``       the fleet topology (fleet incidents, agent rings) and every
                worker's mirror of what it finds;
``faust_options``, ``gc_policy``  what the Faust app is told; the cyclic GC's thresholds and freezes;
``streams.app.faust_adapter``  every touch of Faust's and aiokafka's internals.

The config's fleet-wide options (``loopwatch.scope``, ``fleetIncidents``, ``agentRings``:
``ConfigSet.topology``) decide the topics, tables and agents built here, at start; a reload
that changes them is refused (restart the workers to apply it).

Faust provides the consumer group (assignment, co-partitioning of ``tool-calls`` with the
run table's changelog), the table's recovery and standbys, the worker process, the web
server and the timers; the Faust app is ``faust_adapter.WorkerApp``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from schemas.config import SESSION_SCOPE
from schemas.names import CANDIDATE, LIVE
from streams.app import faust_adapter
from streams.engine.fleet import FleetView

from . import logs
from .checkpoint import Checkpointer, NotAMember
from .expiry import Expiry
from .faust_options import faust_settings
from .fleet import TICK_S, FleetMirror, FleetTopology
from .gc_policy import freeze_before_first_batch, freeze_start_up
from .health import BROKER_PROBE_S, Health
from .metrics import Metrics
from .output import DLQ_MAX_MESSAGE_BYTES, Output
from .processor import BatchProcessor
from .reload import ConfigWatcher, KeyringWatcher
from .run_store import CHANGELOG_MAX_MESSAGE_BYTES, TABLE_NAME, RunStore, state_disk_full
from .settings import Settings
from .watchdog import Standing, Watchdog

__all__ = ["Worker", "build_worker"]

log = logging.getLogger("loopwatch.worker")


@dataclass
class Worker:
    """The Faust app and the parts the wiring connected (not started)."""

    app: Any
    settings: Settings
    metrics: Metrics
    tool_calls: Any
    verdicts: Any
    dead_letters: Any
    table: Any
    processor: BatchProcessor
    store: RunStore
    output: Output
    checkpoints: Checkpointer
    expiry: Expiry
    health: Health
    config: ConfigWatcher
    keys: KeyringWatcher | None
    candidate: ConfigWatcher | None = None
    fleet: FleetTopology | None = None
    mirror: FleetMirror | None = None
    sessions: Any = None
    """Under session scope, the repartition topic."""
    watchdog: Watchdog | None = None
    """Started by ``streams.app.worker`` with the event loop."""

    def uses_shadow_topic(self) -> bool:
        """A candidate config, or an agent in shadow mode under the live config."""
        return self.candidate is not None or self.processor.engine.config.uses_shadow()

    def extra_topics(self) -> dict[str, dict[str, str]]:
        """The topics loopwatch's own options add and every table's changelog, by name, with
        their configs (``topics.ensure_topics``, before the worker starts).

        Faust declares a changelog itself as the table starts, a moment before the consumer
        subscribes: the broker's metadata did not show it yet on a busy machine, and the
        group leader kept that answer (no partitions assigned; Faust refused the table's
        writes with ``PartitionsMismatch``, "the changelog topic has 0 partitions")."""
        out: dict[str, dict[str, str]] = {}
        if self.sessions is not None:
            out[self.sessions.get_topic_name()] = {}
        if self.fleet is not None:
            for topic in self.fleet.input_topics:
                out[topic.get_topic_name()] = {}
            for topic in self.fleet.output_topics:
                out[topic.get_topic_name()] = {"cleanup.policy": "compact"}
        for table in self.app.tables.values():
            out[table.changelog_topic.get_topic_name()] = changelog_config(table.changelog_topic)
        return out


def changelog_config(topic: Any) -> dict[str, str]:
    """The configs Faust gives a table's changelog topic when it declares it (compacted, and
    for a windowed table also deleted after the window expires; the table's own, such as the
    run table's ``max.message.bytes``)."""
    policies = [name for name, on in (("compact", topic.compacting), ("delete", topic.deleting)) if on]
    config = {str(key): str(value) for key, value in (topic.config or {}).items()}
    if policies:
        config["cleanup.policy"] = ",".join(policies)
    retention = topic.retention  # seconds, as a number or a timedelta
    if retention is not None:
        seconds = retention.total_seconds() if hasattr(retention, "total_seconds") else float(retention)
        config["retention.ms"] = str(int(seconds * 1000))
    return config


def build_worker(settings: Settings | None = None, *, metrics: Metrics | None = None) -> Worker:
    """Build the worker's Faust app and parts (nothing is started)."""
    settings = settings or Settings.from_env()
    metrics = metrics or Metrics()
    app = faust_adapter.WorkerApp(settings.app_id, **faust_settings(settings))

    # Topics and the run table: raw bytes in and out, partitions as configured.
    raw = dict(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
    declared = dict(partitions=settings.partitions, replicas=settings.replication, internal=True)
    tool_calls = app.topic(settings.tool_calls_topic, **declared, **raw)
    verdicts = app.topic(settings.verdicts_topic, **declared, **raw)
    dead_letters = app.topic(
        settings.dead_letter_topic, **declared, **raw, config={"max.message.bytes": str(DLQ_MAX_MESSAGE_BYTES)}
    )
    table = app.Table(
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
    # Subscribe tool-calls through the conductor (so the assignor co-partitions it with the
    # changelog and the consumer fetches it); its records go to the checkpointer in batches.
    app.topics.add(tool_calls)

    # The parts.
    group = faust_adapter.ConsumerView(app)
    producers = faust_adapter.Producers(app)
    view = FleetView()

    def use_engine(engine: Any) -> None:  # a new config: the next batch runs on it
        engine.fleet = view
        processor.use_config(engine, config.sha256)

    def use_candidate(engine: Any) -> None:  # a new candidate config: likewise
        engine.fleet = view
        processor.use_candidate(engine, candidate.sha256)

    def use_keyring(keyring: Any) -> None:  # new signing keys: the next batch checks with them
        processor.keyring = keyring

    config = ConfigWatcher(
        settings.config, use_engine, metrics, check=lambda engine: _topology_change(topology, engine), name=LIVE
    )
    candidate = None
    if settings.candidate_config is not None:
        # A candidate runs on the live config's topology and its states are grouped by the live
        # config's state keys, so its scope must be the live one (its fleet-wide options are
        # not applied).
        candidate = ConfigWatcher(
            settings.candidate_config,
            use_candidate,
            metrics,
            name=CANDIDATE,
            check=lambda engine: _scope_change(scope, engine),
        )
    keys = None if settings.signing_keys is None else KeyringWatcher(settings.signing_keys, use_keyring)
    keyring = (
        None if keys is None else keys.load_initial()
    )  # a bad key file stops the start before the config is announced
    engine = config.load_initial()
    engine.fleet = view
    topology = engine.config.topology()
    scope, incidents, rings = topology
    processor = BatchProcessor(
        engine,
        metrics,
        clock_skew_s=settings.clock_skew_s,
        signed_max_age_s=settings.signed_max_age_s,
        keyring=keyring,
    )
    processor.use_config(processor.engine, config.sha256)
    if candidate is not None:
        # A bad candidate is refused as on a reload (a line, the metric, the alert): the worker
        # starts on its live config and applies the candidate once its file is fixed.
        candidate_engine = candidate.load_or_refuse()
        if candidate_engine is not None:
            use_candidate(candidate_engine)
    batch_topics = {settings.tool_calls_topic}
    sessions = None
    if scope == SESSION_SCOPE:  # the repartition by session key (streams.app.processor)
        sessions = app.topic(settings.internal_topic("sessions"), **declared, **raw)
        app.topics.add(sessions)
        processor.sessions_topic = sessions.get_topic_name()
        processor.partitions = settings.partitions
        batch_topics.add(processor.sessions_topic)
    fleet = mirror = None
    if incidents is not None or rings is not None:
        fleet = FleetTopology(app, settings, incidents, rings, view, metrics)
        mirror = FleetMirror(
            settings,
            [t.get_topic_name() for t in fleet.output_topics],
            view,
            metrics,
            None if fleet.incidents_topic is None else fleet.incidents_topic.get_topic_name(),
        )
    store = RunStore(faust_adapter.TableAccess(table), producers.shared)
    output = Output(
        verdicts_topic=settings.verdicts_topic,
        dead_letter_topic=settings.dead_letter_topic,
        partitions=settings.partitions,
        shared_producer=producers.shared,
        new_producer=producers.new,
        sessions_topic=processor.sessions_topic,
        fleet_topic=None if fleet is None else fleet.topic.get_topic_name(),
        fleet_agents_topic=None if fleet is None or fleet.agents_topic is None else fleet.agents_topic.get_topic_name(),
        shadow_topic=settings.shadow_verdicts_topic,
        metrics=metrics,
        worker_id=settings.group_instance_id,
    )
    checkpoints = Checkpointer(
        processor, store, output, checkpoint_s=settings.checkpoint_s, spawn=app.add_future, group=group
    )
    watchdog = Watchdog(lambda: _standing(group, checkpoints), settings.member_watchdog_bound_s)
    health = Health(
        group,
        checkpoints,
        output,
        store,
        metrics,
        tool_calls_topic=settings.tool_calls_topic,
        broker_unreachable_s=settings.broker_unreachable_s,
        watchdog=watchdog,
    )
    expiry = Expiry(
        store,
        processor.runs,
        write_lock=checkpoints.write_lock,
        group=group,
        ready=health.is_ready,
        # the topic the states are fed from (a session's backlog in tool-calls is on other partitions)
        tool_calls_topic=processor.sessions_topic or settings.tool_calls_topic,
        idle_timeout_s=settings.idle_timeout_s,
        max_batch=settings.max_batch,
        max_runs_per_agent=settings.max_runs_per_agent,
        metrics=metrics,
    )
    app.attach(
        faust_adapter.WorkerHooks(
            batch_topics=frozenset(batch_topics),
            handle_batch=freeze_before_first_batch(checkpoints.handle_batch),
            before_wait_empty=checkpoints.checkpoint,  # rebalances and shutdown checkpoint first
            after_stop=output.close,
            leaving=lambda: isinstance(checkpoints.failed, NotAMember),
        )
    )

    # Evaluated at scrape time (in the metrics server's thread; plain attribute reads).
    metrics.ready.set_function(lambda: 1.0 if health.is_ready() else 0.0)
    metrics.table_recovery_in_progress.set_function(lambda: 1.0 if group.in_recovery else 0.0)
    metrics.runs_tracked.set_function(lambda: float(store.runs_tracked))
    metrics.state_disk_full.set_function(lambda: 1.0 if state_disk_full(checkpoints.failed) else 0.0)

    worker = Worker(
        app,
        settings,
        metrics,
        tool_calls,
        verdicts,
        dead_letters,
        table,
        processor,
        store,
        output,
        checkpoints,
        expiry,
        health,
        config,
        keys,
        candidate,
        fleet,
        mirror,
        sessions,
        watchdog,
    )
    _schedule(worker)
    return worker


def _standing(group: Any, checkpoints: Checkpointer) -> Standing:
    """Where the worker stands, for its watchdog (plain reads: called on the event loop every second)."""
    failed = checkpoints.failed
    crash = group.crash_reason or failed
    if group.stopping or isinstance(failed, NotAMember):
        why = "a stop was asked for" if crash is None else f"{type(crash).__name__}: {crash}"
        return Standing(member=group.holds_membership(), stopping=True, why=why)
    if group.holds_membership():
        return Standing(member=True, stopping=False)
    return Standing(member=False, stopping=False, why="the group coordinator holds no membership for it (joining)")


def _topology_change(topology: tuple, engine: Any) -> str | None:
    """Why a reloaded config cannot be applied to a running worker, or None."""
    if engine.config.topology() == topology:
        return None
    return (
        "loopwatch.scope, loopwatch.fleetIncidents or loopwatch.agentRings changed: they decide the worker's "
        "topics and tables, so restart the workers to apply them"
    )


def _scope_change(scope: str, engine: Any) -> str | None:
    """Why a candidate config cannot run beside a live config of ``scope``, or None."""
    if engine.config.scope == scope:
        return None
    return (
        f"the candidate's loopwatch.scope ({engine.config.scope}) is not the live config's ({scope}): "
        "a candidate runs on the live config's run states, so it must group events as the live config does"
    )


def _schedule(worker: Worker) -> None:
    """The worker's start-up task, timers and web pages."""
    app, settings = worker.app, worker.settings
    health, expiry = worker.health, worker.expiry
    metrics_served = False

    async def on_start() -> None:
        nonlocal metrics_served
        freeze_start_up()
        declared = [worker.verdicts, worker.dead_letters]
        if worker.fleet is not None:
            declared += worker.fleet.output_topics
        for topic in declared:
            await topic.maybe_declare()
        if worker.mirror is not None:  # after its topics exist
            worker.mirror.start()
        await worker.output.start()  # before the first decision, and for the broker probe
        if worker.uses_shadow_topic():
            await worker.output.find_shadow_topic()  # (created before the start: worker.py)
        if settings.metrics_port and not metrics_served:
            metrics_served = True
            worker.metrics.serve(settings.metrics_port, settings.web_host)
            log.info("metrics on http://%s:%d/metrics", settings.web_host, settings.metrics_port)

    async def poll_files() -> None:
        worker.config.poll()
        if worker.candidate is not None:
            worker.candidate.poll()
        if worker.keys is not None:
            worker.keys.poll()
        if worker.output.shadow_partitions is None and worker.uses_shadow_topic():
            # Shadow mode came with a reload (or the topic was missing at start): make sure of
            # the topic here, where waiting delays no decision.
            from .topics import ensure_topics

            await ensure_topics(settings, only_shadow=True)
            await worker.output.find_shadow_topic()

    async def every_second() -> None:
        health.report()
        await expiry.on_new_assignment()
        health.update_lag()

    async def flush_logs() -> None:
        logs.flush()

    app.task(on_start)
    app.timer(settings.config_poll_s, name="loopwatch.config_reload")(poll_files)
    app.timer(settings.sweep_interval_s, name="loopwatch.idle_sweep")(expiry.sweep)
    app.timer(1.0, name="loopwatch.lag")(every_second)
    app.timer(0.5, name="loopwatch.flush_logs")(flush_logs)
    app.timer(min(0.25, settings.checkpoint_s), name="loopwatch.checkpoint")(worker.checkpoints.tick)
    app.timer(BROKER_PROBE_S, name="loopwatch.broker_probe")(health.probe_broker)
    if worker.fleet is not None:
        app.timer(TICK_S, name="loopwatch.fleet_tick")(worker.fleet.tick)
    for path, handler in health.pages().items():
        app.page(path)(handler)
