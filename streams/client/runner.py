"""An async runner client.

It hashes arguments and outcomes at the edge (``streams.edge.events``), publishes ``tool-calls``
events under their record key (``schemas.keys.record_key``), and reads ``loop-verdicts``,
whose Kafka key is the run's state key (``schemas.keys.state_key``, the same function the
worker keys them with):

* **gate mode**: ``before_tool_call`` publishes the request and waits for its decision, both
  within ``timeout`` seconds; when none arrives (loopwatch or Kafka down or slow) it fails
  open (the call runs) unless ``fail_closed=True`` (``NoDecisionError``).  A block raises
  ``LoopBlocked`` (or is returned, with ``raise_on_block=False``).
* **advisory mode**: ``before_tool_call`` publishes and returns; verdicts are applied as they
  arrive: the next call of a run that was aborted raises ``RunAbortedError``, and warnings
  collect in ``RunHandle.warnings``.

No call waits on Kafka longer than ``timeout``: an event that is not delivered by then goes on
in the background (up to ``delivery_timeout``, aiokafka's request timeout) and a failed
delivery is logged with the event's id.  Verdicts are de-duplicated by ``verdict_id`` (Kafka
delivers at least once).  The client depends only on ``schemas`` and ``streams.edge.events``.

Verdicts are read only from the partitions this client's runs' verdicts land on
(``verdict_partitions="runs"``, ``schemas.keys.verdict_partitions``): a partition is positioned
at its end before a run's first event is published and read until its last run ends, so a
gateway serving one run reads one or two partitions, not the fleet's verdicts.
``verdict_partitions="all"`` reads every partition from the start, as clients before did: for a
client that only watches runs other processes publish (its runs publish nothing).

Security: ``kafka_options`` go to aiokafka as they are (``security_protocol``,
``ssl_context``, ``sasl_mechanism``, ``sasl_plain_username``, ``sasl_plain_password``); a
refused password or an untrusted certificate makes ``start`` raise ``BrokerAccessError``
with the reason, at once.  With ``signing_key`` (``schemas.signing.SigningKey``) every event
is signed with the agent's key, for workers that only accept signed events.

    async with LoopwatchClient("127.0.0.1:19092") as client:
        run = client.run("run-1", session_key="agent:main:1", agent_id="main")
        decision = await run.before_tool_call("read", {"path": "/x"}, tool_call_id="c1")
        ... execute the tool ...
        await run.after_tool_call("read", {"path": "/x"}, tool_call_id="c1", result=result)
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any, Literal

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, UnknownTopicOrPartitionError

from schemas.events import UNSET, ToolCallEvent, encode_event
from schemas.keys import partition_for, record_key, session_scope_key, state_key
from schemas.keys import verdict_partitions as partitions_of_run
from schemas.signing import SigningKey
from schemas.verdicts import Decision, RunAborted, decode_verdict

from ..edge.broker import BrokerAccessError, broker_access, redact_sasl_exchanges, speaks_tls
from ..edge.content_windows import ContentEdge
from ..edge.events import (
    UNDEFINED,
    agent_message_event,
    blocked_result,
    compaction_event,
    completed_event,
    model_text_event,
    requested_event,
    run_ended_event,
)
from ..edge.sequence import next_seq
from .errors import LoopBlocked, LoopwatchUnavailable, NoDecisionError, RunAbortedError

log = logging.getLogger("loopwatch.client")

_SEEN_VERDICTS = 100_000


class LoopwatchClient:
    def __init__(
        self,
        bootstrap_servers: str = "127.0.0.1:19092",
        *,
        mode: str = "gate",
        timeout: float = 1.0,
        fail_closed: bool = False,
        raise_on_block: bool = True,
        provider_send_tools: Iterable[str] = (),
        tool_calls_topic: str = "tool-calls",
        verdicts_topic: str = "loop-verdicts",
        delivery_timeout: float = 10.0,
        start_timeout: float = 30.0,
        signing_key: SigningKey | None = None,
        key_by_session: bool = False,
        linger_ms: int = 0,
        verdict_partitions: str = "runs",
        **kafka_options: Any,
    ) -> None:
        if mode not in ("gate", "advisory"):
            raise ValueError("mode is 'gate' or 'advisory'")
        if verdict_partitions not in ("runs", "all"):
            raise ValueError("verdict_partitions is 'runs' or 'all'")
        self.verdict_partitions = verdict_partitions
        """``runs``: read only the verdict partitions of this client's runs; ``all``: every one."""
        self.mode = mode
        self.timeout = timeout
        self.fail_closed = fail_closed
        self.raise_on_block = raise_on_block
        self.provider_send_tools = frozenset(provider_send_tools)
        self.tool_calls_topic = tool_calls_topic
        self.verdicts_topic = verdicts_topic
        self.bootstrap_servers = bootstrap_servers
        self.delivery_timeout = delivery_timeout
        self.start_timeout = start_timeout
        self.signing_key = signing_key
        self.key_by_session = key_by_session
        """Publish a run's events under its session's key (``schemas.keys.session_scope_key``):
        for workers with ``loopwatch.scope: session``, whose repartition hop it saves (the
        worker accepts the key under either scope)."""
        redact_sasl_exchanges()  # aiokafka's DEBUG log would show a SASL PLAIN password
        self._access: dict[str, Any] = dict(
            username=kafka_options.get("sasl_plain_username"),
            mechanism=kafka_options.get("sasl_mechanism"),
            tls=speaks_tls(kafka_options.get("security_protocol")),
        )
        # aiokafka's request timeout is also how long an undelivered batch is kept (40 s by
        # default); a runner's events are worth little later, and stop() waits for them.
        producer_options = {"request_timeout_ms": int(delivery_timeout * 1000), **kafka_options}
        # linger 0: a gated request goes out at once.  An advisory runner that waits on no
        # delivery can linger, so a call's request and completion go in one produce request.
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers, linger_ms=linger_ms, **producer_options)
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap_servers, enable_auto_commit=False, **kafka_options
        )
        self._prefix = uuid.uuid4().hex[:12]
        self._seq = itertools.count(1)
        self._waiting: dict[str, asyncio.Future] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._runs: dict[str, RunHandle] = {}
        self._partition_counts = (0, 0)
        """``tool-calls``' and ``loop-verdicts``' partitions (``_start``)."""
        self._readers: dict[int, int] = {}
        """Verdict partition: how many of this client's runs read it (``verdict_partitions="runs"``)."""
        self._readable: dict[int, asyncio.Task] = {}
        """Verdict partition read by some run: its positioning, done once it is being read."""
        self._reader: asyncio.Task | None = None
        self._sending: set[asyncio.Task] = set()
        self.duplicates_dropped = 0
        self.undelivered = 0
        """Events whose delivery failed (each is logged with its id)."""

    async def __aenter__(self) -> LoopwatchClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Connect and position the verdict reader; ``LoopwatchUnavailable`` when Kafka or the
        verdicts topic cannot be reached within ``start_timeout``, ``BrokerAccessError`` at once
        when the broker refuses this client for good (nothing is left open either way)."""
        try:
            await asyncio.wait_for(self._start(), self.start_timeout)
        except BaseException as exc:
            await self.stop()
            if isinstance(exc, (KafkaError, OSError, asyncio.TimeoutError)) and not isinstance(exc, BrokerAccessError):
                raise LoopwatchUnavailable(
                    f"loopwatch client: cannot start on {self.bootstrap_servers}: {_describe(exc)}"
                ) from None
            raise

    async def _start(self) -> None:
        async with broker_access(self.bootstrap_servers, **self._access):
            await self._producer.start()
            await self._consumer.start()
        # Every partition is assigned once (aiokafka's assign replaces the positions of the
        # partitions assigned before) and positioned at its current end before anything is
        # sent, so no decision for our own requests can be missed.  Under "runs", all are
        # paused, and a partition is sought to its end again and resumed when a run needs it.
        partitions = await self._partitions(self.verdicts_topic)
        if self.verdict_partitions == "runs":
            self._partition_counts = (len(await self._partitions(self.tool_calls_topic)), len(partitions))
        assigned = [TopicPartition(self.verdicts_topic, p) for p in sorted(partitions)]
        self._consumer.assign(assigned)
        await self._consumer.seek_to_end(*assigned)
        for tp in assigned:
            await self._consumer.position(tp)
        if self.verdict_partitions == "runs":
            self._consumer.pause(*assigned)
        self._reader = asyncio.create_task(self._read_verdicts(), name="loopwatch-verdicts")

    @property
    def reading(self) -> frozenset[int]:
        """The ``loop-verdicts`` partitions being read now: those of the runs that have published
        and not ended (every partition under ``verdict_partitions="all"``)."""
        return frozenset(tp.partition for tp in self._consumer.assignment() - self._consumer.paused())

    async def _partitions(self, topic: str) -> set[int]:
        try:
            return await self._producer.partitions_for(topic)
        except UnknownTopicOrPartitionError:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} does not exist (is the loopwatch worker running?)"
            ) from None

    def read_for(self, run: RunHandle) -> frozenset[int]:
        """Count ``run`` as a reader of its verdict partitions; returns them (for ``RunHandle``,
        as are the client's other methods that take a run's events or partitions)."""
        if self.verdict_partitions == "all":
            return frozenset()
        partitions = partitions_of_run(SimpleNamespace(**run.fields), *self._partition_counts)
        for p in partitions:
            self._readers[p] = self._readers.get(p, 0) + 1
        return partitions

    def done_reading_for(self, partitions: frozenset[int]) -> None:
        """A run has ended: pause the partitions no other run of this client reads."""
        for p in partitions:
            left = self._readers.get(p, 0) - 1
            if left > 0:
                self._readers[p] = left
                continue
            self._readers.pop(p, None)
            positioning = self._readable.pop(p, None)
            if positioning is not None and not positioning.done():
                positioning.cancel()  # still paused: it resumes only once positioned
            tp = TopicPartition(self.verdicts_topic, p)
            if tp in self._consumer.assignment():
                self._consumer.pause(tp)

    def positioning(self, partitions: frozenset[int]) -> list[asyncio.Task]:
        """The tasks that position ``partitions`` at their end and resume them (started once per
        partition, again after one failed)."""
        tasks = []
        for p in partitions:
            task = self._readable.get(p)
            if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
                task = self._readable[p] = asyncio.ensure_future(self._resume(p))
                task.add_done_callback(_retrieved)
            tasks.append(task)
        return tasks

    async def _resume(self, partition: int) -> None:
        tp = TopicPartition(self.verdicts_topic, partition)
        await self._consumer.seek_to_end(tp)
        await self._consumer.position(tp)
        self._consumer.resume(tp)

    async def stop(self) -> None:
        """Stop reading, deliver what can still be delivered (within ``delivery_timeout``),
        close both Kafka clients.  Never raises for a broker that is gone."""
        reader, self._reader = self._reader, None
        positioning = [task for task in self._readable.values() if not task.done()]
        self._readable.clear()
        for task in (reader, *positioning):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (reader, *positioning) if t is not None), return_exceptions=True)
        try:
            await _quietly(self._consumer.stop(), "consumer")
        finally:
            # Sends still in progress end by themselves within delivery_timeout (delivered, or
            # failed and logged).  Those still waiting for the topic's metadata would wait for
            # ever once the producer is closed, so whatever is left then is cancelled.
            if self._sending:
                await asyncio.wait(set(self._sending), timeout=self.delivery_timeout)
            await _quietly(self._producer.stop(), "producer")
            left = list(self._sending)
            for task in left:
                task.cancel()
            if left:
                await asyncio.gather(*left, return_exceptions=True)
                self.undelivered += len(left)
                log.warning("%d event(s) not delivered before the client stopped", len(left))

    def run(
        self,
        run_id: str | None,
        *,
        session_key: str | None,
        agent_id: str | None = None,
        session_id: str | None = None,
        trace_id: str | None = None,
    ) -> RunHandle:
        """A run's handle.  ``trace_id``: the conversation or task the run shares with the
        agents it messages (``loopwatch.agentRings``); give sends their ``target``."""
        if self.signing_key is not None and agent_id != self.signing_key.agent_id:
            raise ValueError(
                f"this client signs with key {self.signing_key.key_id} of agent {self.signing_key.agent_id!r};"
                f" a run of agent {agent_id!r} needs that agent's key"
            )
        handle = RunHandle(self, run_id, session_key, agent_id, session_id, trace_id)
        self._runs[handle.key] = handle
        return handle

    def next_event_id(self) -> str:
        """A new event id, unique to this client."""
        return f"{self._prefix}-{next(self._seq)}"

    def expect_decision(self, event_id: str) -> asyncio.Future:
        """The future the decision on the gated request ``event_id`` is set on when it is read
        (``forget_decision`` once it is no longer waited for)."""
        future = asyncio.get_running_loop().create_future()
        self._waiting[event_id] = future
        return future

    def forget_decision(self, event_id: str) -> None:
        self._waiting.pop(event_id, None)

    def run_ended(self, run: RunHandle, partitions: frozenset[int] | None) -> None:
        """``run`` has ended: its verdicts no longer reach it, and ``partitions`` (those read
        for it, if any) are read for it no longer."""
        if self._runs.get(run.key) is run:
            self._runs.pop(run.key)
        if partitions:
            self.done_reading_for(partitions)

    async def publish(self, event: ToolCallEvent, timeout: float, *, ahead: Sequence[ToolCallEvent] = ()) -> bool:
        """Publish ``event``, waiting at most ``timeout`` seconds; False when it was not
        delivered by then (delivery goes on in the background and a failure is logged).
        ``ahead``: events queued (``enqueue``) just before it, in the same step, so in the
        same produce request unless the batch is full."""
        task = asyncio.ensure_future(self._send(event, ahead))
        self._sending.add(task)
        task.add_done_callback(self._sent)
        try:
            await asyncio.wait_for(asyncio.shield(task), max(timeout, 0.0))
        except TimeoutError:
            log.warning("event %s not delivered within %ss; still trying in the background", event.event_id, timeout)
            return False
        except (KafkaError, OSError):
            return False  # logged by _sent
        return True

    def _record(self, event: ToolCallEvent) -> tuple[bytes, bytes, Any]:
        """The record ``event`` is published as: its Kafka key, its value and its signature
        headers (None unsigned).  An event without a ``seq`` gets the process's next
        (``streams.edge.sequence``) here, where every publisher's events pass: the producer
        queues a record without yielding to the event loop once the topic's metadata is
        known, so the numbers follow the order the records are queued in, the order the
        worker compares them in."""
        if event.seq is UNSET:
            event = msgspec.structs.replace(event, seq=next_seq())
        value = encode_event(event)
        headers = None if self.signing_key is None else self.signing_key.headers(value)
        key = session_scope_key(event) if self.key_by_session and event.session_key else record_key(event)
        return key.encode("utf-8", "surrogatepass"), value, headers

    async def _send(self, event: ToolCallEvent, ahead: Sequence[ToolCallEvent] = ()) -> None:
        for earlier in ahead:
            await self.enqueue(earlier)
        key, value, headers = self._record(event)
        try:
            await self._producer.send_and_wait(self.tool_calls_topic, value, key=key, headers=headers)
        except (KafkaError, OSError) as exc:
            self.undelivered += 1
            log.warning("event %s (%s) not delivered: %s", event.event_id, type(event).__name__, _describe(exc))
            raise

    async def enqueue(self, event: ToolCallEvent) -> None:
        """Hand ``event`` to the producer and return once it is queued, not delivered: the
        producer sends a partition's records in the order they were queued (one request in
        flight per partition), so a run's events keep their order without waiting for each
        other's delivery, and those queued meanwhile go in one produce request.  A failed
        delivery is logged and counted, as ``publish``'s; ``stop`` waits for what is queued."""
        key, value, headers = self._record(event)
        try:
            delivery = await self._producer.send(self.tool_calls_topic, value, key=key, headers=headers)
        except (KafkaError, OSError) as exc:
            self.undelivered += 1
            log.warning("event %s (%s) not delivered: %s", event.event_id, type(event).__name__, _describe(exc))
            return
        self._sending.add(delivery)

        def delivered(future: asyncio.Future, event=event) -> None:
            self._sending.discard(future)
            exc = None if future.cancelled() else future.exception()
            if exc is not None:
                self.undelivered += 1
                log.warning("event %s (%s) not delivered: %s", event.event_id, type(event).__name__, _describe(exc))

        delivery.add_done_callback(delivered)

    async def enqueue_batch(self, events: Sequence[ToolCallEvent]) -> None:
        """Hand many events to the producer at once, one record batch per partition: far
        cheaper per event than ``enqueue`` (for a receiver of whole exports).  A run's events
        share its partition, so they keep their order; a failed delivery is logged and
        counted for each event of the batch; ``stop`` waits for what is queued."""
        partitions = self._partition_counts[0]
        if not partitions:
            raise LoopwatchUnavailable("the client is not started")
        batches: dict[int, tuple[Any, list[ToolCallEvent]]] = {}
        partition_of: dict[bytes, int] = {}  # a run's events share its key: hash it once
        for event in events:
            key_bytes, value, headers = self._record(event)
            partition = partition_of.get(key_bytes)
            if partition is None:
                partition = partition_of[key_bytes] = partition_for(key_bytes, partitions)
            batch = batches.get(partition)
            if batch is None:
                batch = batches[partition] = (self._producer.create_batch(), [])
            if batch[0].append(key=key_bytes, value=value, timestamp=None, headers=headers or []) is None:
                await self._send_batch(partition, *batch)  # full: a fresh one takes any single event
                batch = batches[partition] = (self._producer.create_batch(), [])
                batch[0].append(key=key_bytes, value=value, timestamp=None, headers=headers or [])
            batch[1].append(event)
        for partition, batch in batches.items():
            await self._send_batch(partition, *batch)

    async def _send_batch(self, partition: int, batch: Any, events: list[ToolCallEvent]) -> None:
        try:
            delivery = await self._producer.send_batch(batch, self.tool_calls_topic, partition=partition)
        except (KafkaError, OSError) as exc:
            self.undelivered += len(events)
            log.warning("%d events (from %s) not delivered: %s", len(events), events[0].event_id, _describe(exc))
            return
        self._sending.add(delivery)

        def delivered(future: asyncio.Future) -> None:
            self._sending.discard(future)
            exc = None if future.cancelled() else future.exception()
            if exc is not None:
                self.undelivered += len(events)
                log.warning("%d events (from %s) not delivered: %s", len(events), events[0].event_id, _describe(exc))

        delivery.add_done_callback(delivered)

    def _sent(self, task: asyncio.Task) -> None:
        self._sending.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: _send logged it

    async def _read_verdicts(self) -> None:
        while True:
            try:
                batches = await self._consumer.getmany(timeout_ms=200)
            except KafkaError as exc:  # the broker may come back: keep reading
                log.warning("reading %s: %s", self.verdicts_topic, _describe(exc))
                await asyncio.sleep(1.0)
                continue
            for records in batches.values():
                for record in records:
                    try:
                        verdict = decode_verdict(record.value)
                    except Exception:  # not ours to judge; never kill the reader
                        log.warning("undecodable verdict at %s:%s", record.partition, record.offset)
                        continue
                    key = record.key.decode("utf-8", "surrogatepass") if record.key is not None else None
                    self._dispatch(verdict, key)

    def _dispatch(self, verdict: Decision | RunAborted, key: str | None) -> None:
        """Apply one verdict; ``key`` is its Kafka key, the run's state key."""
        if verdict.verdict_id in self._seen:
            self.duplicates_dropped += 1
            return
        self._seen[verdict.verdict_id] = None
        if len(self._seen) > _SEEN_VERDICTS:
            self._seen.popitem(last=False)
        run = self._runs.get(key) if key is not None else None
        if isinstance(verdict, RunAborted):
            if run is not None:
                run.aborted = verdict
            return
        future = self._waiting.pop(verdict.cause_event_id, None)
        if future is not None and not future.done():
            future.set_result(verdict)
        elif run is not None:
            run.apply_advisory(verdict)


async def _quietly(stopping: Any, what: str) -> None:
    """Await an aiokafka ``stop()``.  With the broker gone, the consumer's stop re-raises the
    CancelledError of its own fetch tasks (aiokafka 0.14: the fetcher awaits the tasks it
    cancelled): swallowed here unless this task itself is being cancelled."""
    try:
        await stopping
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
        log.debug("the %s's stop raised CancelledError (its own tasks); ignored", what)
    except (KafkaError, OSError) as exc:
        log.warning("stopping the %s: %s", what, _describe(exc))


def _retrieved(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()  # a failed positioning is reported by the run that waits for it


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


class RunHandle:
    """One agent run's side of the conversation with loopwatch."""

    def __init__(self, client: LoopwatchClient, run_id, session_key, agent_id, session_id, trace_id=None) -> None:
        self.client = client
        self.fields = {"run_id": run_id, "session_key": session_key, "agent_id": agent_id, "session_id": session_id}
        self.key = state_key(SimpleNamespace(**self.fields))
        """The run's state key: the Kafka key of its verdicts."""
        self.trace_id = trace_id
        self.aborted: RunAborted | None = None
        self.warnings: list[Decision] = []
        self.blocked: list[Decision] = []
        self.incidents: list[Decision] = []
        """Decisions that carried a fleet incident (the tool is failing across the fleet:
        ``message`` says so, ``incident_id`` names it)."""
        self.detection_off = False
        """loopwatch answered this run's calls without checking them: its config runs no
        detection for the agent (``Decision.detection_off``; logged once per agent and client)."""
        self._vetoed: set[str | None] = set()
        self._verdict_partitions: frozenset[int] | None = None
        """The verdict partitions read for this run, once it has published (``_watched``)."""
        self._read = False
        """Its verdict partitions are positioned and being read."""
        self._content: ContentEdge | None = None
        """Gemini's content tracking of the run's streamed text (``model_text``), once it sends any."""

    def _warn_detection_off(self) -> None:
        """One WARNING per agent and client: every call is allowed, and nothing else would tell."""
        agent = self.fields["agent_id"]
        warned = self.client.__dict__.setdefault("_detection_off_warned", set())
        if agent in warned or len(warned) >= 1000:  # bounded: at most 1,000 agents' lines
            return
        warned.add(agent)
        log.warning(
            "loopwatch detection is OFF for agent %s: its calls are allowed without a check "
            "(start the worker with --config examples/getting-started.yaml, or set tools.loopDetection.enabled: "
            "true in its config; loopwatch config check shows it)",
            agent or "*",
        )

    async def _watched(self, timeout: float) -> None:
        """Before the run's events go out: its verdict partitions positioned at their end and
        read, so none of its verdicts is published before the reader's position.  The run's
        first event waits for this (a round trip to the broker), at most ``timeout``; after
        that, a run whose partitions could not be positioned goes on (its decisions may then
        time out: fail open, or closed), and the next event tries again."""
        if self._read:
            return
        client = self.client
        if self._verdict_partitions is None:
            self._verdict_partitions = client.read_for(self)
        tasks = client.positioning(self._verdict_partitions)
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=max(timeout, 0.0))
            if pending or any(t.cancelled() or t.exception() is not None for t in done):
                log.warning(
                    "verdict partition(s) %s of %s not positioned within %ss; its verdicts may be missed",
                    sorted(self._verdict_partitions),
                    self.key,
                    timeout,
                )
                return
        self._read = True

    def apply_advisory(self, decision: Decision) -> None:
        """A decision read for this run that no call waited for (the client applies it)."""
        if decision.detection_off and not self.detection_off:
            self.detection_off = True
            self._warn_detection_off()
        if decision.incident_id:
            self.incidents.append(decision)
        if decision.action == "warn":
            self.warnings.append(decision)
        elif decision.action == "block":
            self.blocked.append(decision)

    def check(self) -> None:
        """Raise ``RunAbortedError`` if loopwatch has ended this run."""
        if self.aborted is not None:
            raise RunAbortedError.from_verdict(self.aborted)

    async def before_tool_call(
        self,
        tool: str,
        args: Any,
        *,
        tool_call_id: str | None = None,
        target: str | None = None,
        completions: Sequence[Mapping[str, Any]] = (),
    ) -> Decision | None:
        """``target``: on a send, the session key or agent id the message goes to.

        ``completions``: the completions of the run's earlier calls, not yet queued, each as
        ``queue_after_tool_call``'s keyword arguments (with ``tool`` and ``args``).  They are
        queued just ahead of this request, in its produce request: a gateway holds a call's
        completion for the run's next request, because queued on its own it would be one
        produce request in flight, which the request then waits behind (one per broker)."""
        client = self.client
        loop = asyncio.get_running_loop()
        deadline = loop.time() + client.timeout
        await self._watched(client.timeout)
        ahead = [self._completed(**c) for c in completions if c.get("tool_call_id") not in self._vetoed]
        self._vetoed.difference_update(c.get("tool_call_id") for c in completions)
        try:
            self.check()
        except RunAbortedError:
            for event in ahead:  # what the run did is published all the same
                await client.enqueue(event)
            raise
        gate = client.mode == "gate"
        if self._content is not None:
            self._content.tool_call()  # a tool call resets Gemini's content tracking
        event = requested_event(
            client.next_event_id(),
            tool,
            args,
            tool_call_id=tool_call_id,
            gate=gate,
            ts_ms=int(time.time() * 1000),
            trace_id=self.trace_id,
            target=target,
            **self.fields,
        )
        if not gate:
            await client.publish(event, deadline - loop.time(), ahead=ahead)
            return None
        future = client.expect_decision(event.event_id)
        decision = None
        try:
            if await client.publish(event, deadline - loop.time(), ahead=ahead):
                decision = await asyncio.wait_for(future, max(deadline - loop.time(), 0.0))
        except TimeoutError:
            pass
        finally:
            client.forget_decision(event.event_id)
        if decision is None:
            if client.fail_closed:
                raise NoDecisionError(f"no loopwatch decision for {tool} within {client.timeout}s (fail-closed)")
            log.warning("no loopwatch decision for %s within %ss; failing open", tool, client.timeout)
            return None
        if decision.detection_off and not self.detection_off:
            self.detection_off = True
            self._warn_detection_off()
        if decision.incident_id:
            self.incidents.append(decision)
        if decision.action == "warn":
            self.warnings.append(decision)
        if decision.action == "block":
            self.blocked.append(decision)
            # The vetoed call will not run: complete it now with the blocked result, as
            # upstream's wrapper records its own (profile latest counts it as a veto record;
            # configurable-final ignores it).  A later after_tool_call for it is a no-op.
            self._vetoed.add(tool_call_id)
            await self._complete(tool, args, tool_call_id, result=blocked_result(decision.message or ""), target=target)
            if client.raise_on_block:
                raise LoopBlocked(decision)
        return decision

    async def queue_before_tool_call(
        self, tool: str, args: Any, *, tool_call_id: str | None = None, target: str | None = None
    ) -> None:
        """Advisory mode's ``before_tool_call`` that returns once the request is queued for
        delivery (``LoopwatchClient.enqueue``), never waiting on the broker."""
        self.check()
        client = self.client
        if client.mode == "gate":
            raise RuntimeError("queue_before_tool_call is advisory mode's: gate mode waits for the decision")
        await self._watched(client.timeout)
        await client.enqueue(
            requested_event(
                client.next_event_id(),
                tool,
                args,
                tool_call_id=tool_call_id,
                gate=False,
                ts_ms=int(time.time() * 1000),
                trace_id=self.trace_id,
                target=target,
                **self.fields,
            )
        )

    async def queue_after_tool_call(
        self,
        tool: str,
        args: Any,
        *,
        tool_call_id: str | None = None,
        result: Any = None,
        error: Any = UNDEFINED,
        returned: bool = True,
        target: str | None = None,
    ) -> None:
        """``after_tool_call`` that returns once the completion is queued for delivery; a later
        gated request of the run is delivered after it all the same (one partition, in order)."""
        if tool_call_id in self._vetoed:
            self._vetoed.discard(tool_call_id)
            return
        await self._watched(self.client.timeout)
        await self.client.enqueue(
            self._completed(
                tool, args, tool_call_id=tool_call_id, result=result, error=error, returned=returned, target=target
            )
        )

    def _completed(
        self,
        tool: str,
        args: Any,
        *,
        tool_call_id: str | None = None,
        result: Any = None,
        error: Any = UNDEFINED,
        returned: bool = True,
        target: str | None = None,
    ) -> ToolCallEvent:
        client = self.client
        return completed_event(
            client.next_event_id(),
            tool,
            args,
            result=result,
            error=error,
            returned=returned,
            provider_send_tools=client.provider_send_tools,
            tool_call_id=tool_call_id,
            ts_ms=int(time.time() * 1000),
            trace_id=self.trace_id,
            target=target,
            **self.fields,
        )

    async def after_tool_call(
        self,
        tool: str,
        args: Any,
        *,
        tool_call_id: str | None = None,
        result: Any = None,
        error: Any = UNDEFINED,
        returned: bool = True,
        target: str | None = None,
    ) -> None:
        if tool_call_id in self._vetoed:
            self._vetoed.discard(tool_call_id)  # completed when it was blocked
            return
        await self._complete(tool, args, tool_call_id, result=result, error=error, returned=returned, target=target)

    async def _complete(
        self,
        tool: str,
        args: Any,
        tool_call_id: str | None,
        *,
        result: Any = None,
        error: Any = UNDEFINED,
        returned: bool = True,
        target: str | None = None,
    ) -> None:
        event = self._completed(
            tool, args, tool_call_id=tool_call_id, result=result, error=error, returned=returned, target=target
        )
        await self._watched(self.client.timeout)
        await self.client.publish(event, self.client.timeout)

    async def agent_message(
        self, text: str, *, source: Literal["agent", "user"] = "agent", empty: bool | None = None
    ) -> str:
        """A message of the agent (or, ``source="user"``, a user prompt) as its hash: profile
        openhands' monologue and empty-response rules read it, gemini-cli's a prompt's start.
        The text stays here.  Returns the event's id (its verdicts' cause)."""
        if source == "user" and self._content is not None:
            self._content.user_prompt()
        await self._watched(self.client.timeout)
        event = agent_message_event(
            self.client.next_event_id(), text, source=source, empty=empty, ts_ms=int(time.time() * 1000), **self.fields
        )
        await self.client.publish(event, self.client.timeout)
        return event.event_id

    async def model_text(self, text: str) -> str:
        """A chunk of the model's streamed text, as window hashes (``streams.edge.content_windows``):
        profile gemini-cli's content loop detector reads it; a detection comes back as a warning
        (``warnings``, Gemini's feedback to the model) and the second as the run's abort.
        The text stays here.  Returns the event's id (its verdicts' cause)."""
        if self._content is None:
            self._content = ContentEdge()
        await self._watched(self.client.timeout)
        event = model_text_event(
            self.client.next_event_id(), self._content, text, ts_ms=int(time.time() * 1000), **self.fields
        )
        await self.client.publish(event, self.client.timeout)
        return event.event_id

    async def compaction_retried(self) -> None:
        await self._watched(self.client.timeout)
        event = compaction_event(self.client.next_event_id(), ts_ms=int(time.time() * 1000), **self.fields)
        await self.client.publish(event, self.client.timeout)

    async def end(self, reason: str | None = None) -> None:
        event = run_ended_event(self.client.next_event_id(), reason, ts_ms=int(time.time() * 1000), **self.fields)
        await self.client.publish(event, self.client.timeout)
        partitions, self._verdict_partitions, self._read = self._verdict_partitions, None, False
        self.client.run_ended(self, partitions)
