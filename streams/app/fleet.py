"""The fleet topology: what no single runner can see, keyed by tool or by trace.

The per-run topology (``processor``) is partitioned by run; a fleet incident is about a tool
and an agent ring about a trace, whose events come from runs on every partition.  So the
processor sends the few records that matter (a completed call that failed or made no
progress, a completed send of a trace; ``BatchResult.fleet``) to ``<app id>-fleet``, keyed by
``tool:<name>`` or ``trace:<id>``: a repartition through an internal topic, co-partitioned
with the worker's other topics.  Faust agents consume it (Faust's per-record path: a few
records, where each one may change a table):

* **the per-agent limit** (``maxToolsPerAgentPerMinute``), first: a failing outcome goes to
  ``<app id>-fleet-agents`` keyed by ``agent:<digest>`` (``BatchResult.fleet_outcomes``), so
  all of one agent's outcomes meet on one partition, whichever workers' runs they came
  from.  A tumbling windowed table (``fleet-sources``: agent -> the distinct tools it added
  this minute, a minute of stream time, changelog) decides (``engine.fleet.admit_tool``);
  an outcome admitted is forwarded, unchanged and with its timestamp, to ``<app id>-fleet``
  keyed by ``tool:<name>``; one refused is counted (``loopwatch_fleet_outcomes_limited_total``).
  The forward is delivered before the table changes: after a crash the outcomes since the
  last commit are decided again, from a table that holds a prefix of what was decided, and
  so the same way; one forwarded twice is counted once (a window holds distinct runs and
  agents, and the copy's timestamp puts it in the same windows).

* **incidents**: a hopping windowed table (``fleet-outcomes``: tool and outcome -> the
  distinct runs and agents that had it, capped at the thresholds; windows of
  ``windowSeconds`` every ``hopSeconds``, stream time, changelog) and a table of open
  incidents by tool (``fleet-incidents``).  An outcome that makes the oldest window holding
  it reach the thresholds opens an incident (``fleet.incident_opened`` on
  ``loop-incidents``, key: the tool) or keeps the open one alive; ticks (below) resolve it
  once it has not qualified for ``quietSeconds`` (``fleet.incident_resolved``).
* **rings**: a tumbling windowed table of each trace's last sends (``fleet-traces``, a window
  of ``agentRings.windowSeconds``, seeded from the previous window); a ring at a level or a
  new round is published on ``<app id>-rings`` (key: the trace; a tombstone once broken).

**Back to the runs.**  Every worker reads every partition of ``loop-incidents`` and
``<app id>-rings`` (``FleetMirror``: a consumer without a group, from the beginning: both
topics are compacted and small) into its ``FleetView``, which its engine reads.  The delay
from the outcome that opens an incident to the first decision that carries it: the
outcome's batch, one produce and fetch on ``<app id>-fleet``, one on ``loop-incidents``
(the mirror waits at most ``MIRROR_WAIT_MS`` for a fetch), then the next batch; tens of
milliseconds on an idle local broker, up to about a second under load (docs/design.md).

**Ticks.**  Faust writes tables only from an agent's event, and a quiet window has none; so
every second each worker sends a tick for each open incident in its view to
``<app id>-fleet`` (key ``tool:<name>``), and the tool's owner resolves the incident when its
quiet window has passed.  Each worker ticks, so an incident is checked while any worker is
up; the owner's answer is the same for every tick.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec

from schemas.fleet import (
    FleetOutcome,
    FleetSend,
    FleetTick,
    IncidentOpened,
    IncidentResolved,
    decode_fleet_record,
    decode_incident,
    decode_ring_notice,
    encode_fleet_record,
    encode_incident,
    encode_ring_notice,
)
from streams.engine.config import AgentRingSettings, FleetIncidentSettings
from streams.engine.fleet import (
    MAX_TRACKED_SOURCES,
    WITHDRAWN,
    FleetView,
    IncidentState,
    TraceSends,
    admit_tool,
    count_outcome,
    observe_send,
    open_or_refresh,
    opening_refused,
    resolve_if_quiet,
)

from .faust_adapter import until_table_accepts_writes
from .metrics import Metrics
from .settings import Settings

__all__ = ["FleetMirror", "FleetTopology", "MIRROR_WAIT_MS"]

log = logging.getLogger("loopwatch.fleet")

MIRROR_WAIT_MS = 100
"""How long the mirror's fetch waits for records (the broker answers at once when it has some)."""
REFRESH_WRITE_MS = 1000
"""An open incident's ``last_qualified_ms`` is written to its table at most once a second."""
TICK_S = 1.0
SOURCE_WINDOW_S = 60
"""The per-agent limit's minute (``maxToolsPerAgentPerMinute``), in stream time."""
RECENT_MS = 10_000
"""How long an incident this worker opened counts towards ``maxOpenIncidents`` before its view
has it (the mirror's delay is about a second under load)."""


class FleetTopology:
    """The fleet topology's topics, tables and agent on a worker's Faust app."""

    def __init__(
        self,
        app: Any,
        settings: Settings,
        incidents: FleetIncidentSettings | None,
        rings: AgentRingSettings | None,
        view: FleetView,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.incident_settings = incidents
        self.ring_settings = rings
        self.view = view
        self.metrics = metrics
        self.clock = clock
        raw = dict(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
        declared = dict(partitions=settings.partitions, replicas=settings.replication)
        self.topic = app.topic(settings.internal_topic("fleet"), **declared, internal=True, **raw)
        self.incidents_topic = self.rings_topic = None
        self.agents_topic = None
        self._new_sources = (-1, 0)
        """(minute, agents this worker's limiter started following in it): ``MAX_TRACKED_SOURCES``."""
        self._recent: dict[str, int] = {}
        """Tools whose incident this worker opened, until its view holds them (or RECENT_MS)."""
        self._cap_logged = False
        if incidents is not None:
            self.incidents_topic = app.topic(
                settings.incidents_topic, **declared, compacting=True, internal=True, **raw
            )
            self.outcomes = (
                app.Table(
                    "fleet-outcomes",
                    default=list,
                    partitions=settings.partitions,
                    help="tool and outcome -> [distinct runs, distinct agents] per hopping window",
                )
                .hopping(incidents.window_s, incidents.hop_s, expires=incidents.window_s + incidents.hop_s)
                .relative_to_stream()
            )
            self.incidents = app.Table(
                "fleet-incidents", partitions=settings.partitions, help="tool -> its open incident"
            )
            self.agents_topic = app.topic(settings.internal_topic("fleet-agents"), **declared, internal=True, **raw)
            self.sources = (
                app.Table(
                    "fleet-sources",
                    default=list,
                    partitions=settings.partitions,
                    help="agent -> the distinct tools it added fleet outcomes for, per minute",
                )
                .tumbling(SOURCE_WINDOW_S, expires=2 * SOURCE_WINDOW_S)
                .relative_to_stream()
            )
            app.agent(self.agents_topic, name="loopwatch.fleet_limit")(self._limit_agent)
        if rings is not None:
            self.rings_topic = app.topic(
                settings.internal_topic("rings"), **declared, compacting=True, internal=True, **raw
            )
            self.traces = (
                app.Table("fleet-traces", default=list, partitions=settings.partitions, help="trace -> its last sends")
                .tumbling(rings.window_s, expires=2 * rings.window_s)
                .relative_to_stream()
            )
        app.agent(self.topic, name="loopwatch.fleet")(self._agent)

    @property
    def output_topics(self) -> list[Any]:
        """The topics the agent publishes on (declared at start)."""
        return [t for t in (self.incidents_topic, self.rings_topic) if t is not None]

    @property
    def input_topics(self) -> list[Any]:
        """The topics the agents consume (created at start with the others)."""
        return [t for t in (self.topic, self.agents_topic) if t is not None]

    # -- the per-agent limit -----------------------------------------------------------------------

    async def _limit_agent(self, stream: Any) -> None:
        async for event in stream.events():
            try:
                record = decode_fleet_record(event.value)
            except (msgspec.MsgspecError, TypeError) as exc:
                record = exc
            if type(record) is not FleetOutcome:
                log.warning(
                    "not a fleet outcome at %s partition %d offset %d: %s",
                    event.message.topic,
                    event.message.partition,
                    event.message.offset,
                    record if isinstance(record, Exception) else type(record).__name__,
                )
                continue
            await self._limit(record, event)

    async def _limit(self, record: FleetOutcome, event: Any) -> None:
        timestamp = event.message.timestamp
        windows = self.sources[record.agent]
        tools = windows.current() or None
        if tools is None:
            minute = int(timestamp // SOURCE_WINDOW_S)
            seen_minute, started = self._new_sources
            started = started + 1 if minute == seen_minute else 1
            self._new_sources = (minute, started)
            if started > MAX_TRACKED_SOURCES:
                self.metrics.fleet_outcomes_limited.inc()
                return
        after = admit_tool(tools, record.tool_name, self.incident_settings.max_tools_per_agent)
        if after is None:
            self.metrics.fleet_outcomes_limited.inc()
            return
        # Delivered before the table changes (see the module docstring), with the outcome's
        # own timestamp: a copy sent again after a crash falls in the same windows.  So the
        # write must not be refused after the forward (the limit would admit everything).
        await until_table_accepts_writes(self.sources.table)
        key = f"tool:{record.tool_name}".encode("utf-8", "surrogatepass")
        await (await self.topic.send(key=key, value=event.value, timestamp=timestamp))
        if after is not tools:
            self.sources[record.agent] = after

    # -- the agent ------------------------------------------------------------------------------

    async def _agent(self, stream: Any) -> None:
        async for event in stream.events():
            try:
                record = decode_fleet_record(event.value)
            except (msgspec.MsgspecError, TypeError) as exc:
                log.warning(
                    "undecodable fleet record at partition %d offset %d: %s",
                    event.message.partition,
                    event.message.offset,
                    exc,
                )
                continue
            now_ms = int(self.clock() * 1000)
            kind = type(record)
            if kind is FleetOutcome:
                if self.incident_settings is not None:
                    await self._outcome(record, event, now_ms)
            elif kind is FleetTick:
                if self.incident_settings is not None:
                    await self._tick(record.incident, now_ms)
            elif kind is FleetSend and self.ring_settings is not None:
                await self._send(record, event, now_ms)

    async def _outcome(self, record: FleetOutcome, event: Any, now_ms: int) -> None:
        settings = self.incident_settings  # (the per-agent limit admitted it: ``_limit``)
        key = f"{record.tool_name}\x1f{record.fingerprint}"
        windows = self.outcomes[key]
        windows.apply(lambda value, seen: count_outcome(value, seen[0], seen[1], settings), (record.run, record.agent))
        table = self.outcomes.table
        value = table[key, table.window.earliest(event.message.timestamp)]
        tool = record.tool_name
        current = IncidentState.from_json(self.incidents.get(tool))
        before = None if current is None else current.last_qualified_ms
        # The open incidents: the view (every worker's, as mirrored) and those this worker
        # opened that the view does not hold yet (the mirror lags by a fetch).
        recent = self._recent
        for opened_tool in [t for t, ms in recent.items() if t in self.view.incidents or now_ms - ms > RECENT_MS]:
            del recent[opened_tool]
        open_now = len(self.view.incidents) + len(recent)
        if opening_refused(current, value, open_now, settings):
            self.metrics.fleet_incidents_capped.inc()
            if not self._cap_logged:
                self._cap_logged = True
                log.warning(
                    "fleet incidents: %d open, the maxOpenIncidents cap: tool %s qualifies but is not opened "
                    "(counted in loopwatch_fleet_incidents_capped_total; logged once)",
                    open_now,
                    tool,
                )
        state, opened = open_or_refresh(current, record, value, now_ms, settings, open_now)
        if opened is not None:
            recent[tool] = now_ms
            await self._publish_incident(opened)
            self.metrics.fleet_incidents_opened.labels(self.metrics.tool_label(tool)).inc()
            log.warning("fleet incident %s opened: %s", opened.incident_id, opened.message)
        if state is not None and (opened is not None or state.last_qualified_ms - before >= REFRESH_WRITE_MS):
            self.incidents[tool] = state.as_json()

    async def _tick(self, announced: IncidentOpened, now_ms: int) -> None:
        tool = announced.tool_name
        state = IncidentState.from_json(self.incidents.get(tool))
        if state is None:
            # Announced, but no state: nobody owns it (its table lost it), so it is resolved as
            # announced rather than left open for ever.
            resolved = IncidentResolved(**msgspec.structs.asdict(announced), resolved_ms=now_ms)
        elif state.incident_id != announced.incident_id:
            return  # an older announcement: the view has the newer one by now
        else:
            resolved = resolve_if_quiet(state, now_ms, self.incident_settings)
            if resolved is None:
                return
            del self.incidents[tool]
        await self._publish_incident(resolved)
        self.metrics.fleet_incidents_resolved.labels(self.metrics.tool_label(tool)).inc()
        log.info(
            "fleet incident %s resolved (tool %s quiet for %d s)",
            resolved.incident_id,
            tool,
            self.incident_settings.quiet_s,
        )

    async def _send(self, record: FleetSend, event: Any, now_ms: int) -> None:
        windows = self.traces[record.trace_id]
        value = windows.current()
        if not value:  # a new window: it starts from the previous one's sends
            value = windows.delta(self.ring_settings.window_s)
        trace = TraceSends.from_json(value)
        found = observe_send(trace, record, now_ms, self.ring_settings)
        self.traces[record.trace_id] = trace.as_json()
        if found is None:
            return
        key = record.trace_id.encode("utf-8", "surrogatepass")
        if found is WITHDRAWN:
            await self._publish(self.rings_topic, key, None)
            return
        await self._publish(self.rings_topic, key, encode_ring_notice(found))
        self.metrics.agent_rings.labels(found.level).inc()
        log.warning(
            "agent ring in trace %s: %d agents, %d rounds (%s)",
            found.trace_id,
            len(found.hops),
            found.rounds,
            found.level,
        )

    async def _publish_incident(self, incident: Any) -> None:
        await self._publish(
            self.incidents_topic, incident.tool_name.encode("utf-8", "surrogatepass"), encode_incident(incident)
        )

    @staticmethod
    async def _publish(topic: Any, key: bytes, value: bytes | None) -> None:
        # Delivered before the tables change with the agent's event: a record that is lost is
        # decided again when the event is redelivered.
        await (await topic.send(key=key, value=value))

    # -- ticks ----------------------------------------------------------------------------------

    async def tick(self) -> None:
        """Every second: a tick per open incident of the view (see the module docstring), and
        rings nobody continued forgotten."""
        if self.incident_settings is not None:
            for incident in list(self.view.incidents.values()):
                key = f"tool:{incident.tool_name}".encode("utf-8", "surrogatepass")
                await self.topic.send(key=key, value=encode_fleet_record(FleetTick(incident)))
        self.view.expire_rings(int(self.clock() * 1000), self.ring_settings)


class FleetMirror:
    """Every worker's copy of ``loop-incidents`` and ``<app id>-rings``: a consumer of every
    partition of both, without a consumer group, from the beginning, into a ``FleetView``."""

    def __init__(
        self, settings: Settings, topics: list[str], view: FleetView, metrics: Metrics, incidents_topic: str | None
    ) -> None:
        self.settings = settings
        self.topics = topics
        self.view = view
        self.metrics = metrics
        self.incidents_topic = incidents_topic
        self.records = 0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None and self.topics:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.errors import KafkaError

        consumer = AIOKafkaConsumer(
            *self.topics,
            bootstrap_servers=self.settings.broker_hosts,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=MIRROR_WAIT_MS,
            **self.settings.kafka_client_options(),
        )
        while True:
            try:
                await consumer.start()
                break
            except KafkaError as exc:
                log.warning("fleet mirror: cannot start (%s); retrying", exc)
                await asyncio.sleep(1.0)
        try:
            while True:
                try:
                    batches = await consumer.getmany(timeout_ms=500)
                except KafkaError as exc:
                    log.warning("fleet mirror: %s", exc)
                    await asyncio.sleep(1.0)
                    continue
                for records in batches.values():
                    for record in records:
                        self.apply(record.topic, record.key, record.value)
                if batches and self.incidents_topic is not None:
                    self.metrics.set_open_incidents(list(self.view.incidents))
        finally:
            await consumer.stop()

    def apply(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        self.records += 1
        try:
            if topic == self.incidents_topic:
                if value is not None:
                    self.view.apply_incident(decode_incident(value))
            elif key is not None:
                self.view.apply_ring(
                    key.decode("utf-8", "surrogatepass"), None if value is None else decode_ring_notice(value)
                )
        except msgspec.MsgspecError as exc:
            log.warning("fleet mirror: undecodable record on %s: %s", topic, exc)
