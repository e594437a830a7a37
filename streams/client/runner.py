"""An async runner client.

It hashes arguments and outcomes at the edge (``streams.edge``), publishes ``tool-calls``
events keyed by run id, and reads ``loop-verdicts``:

* **gate mode**: ``before_tool_call`` waits for the decision (``timeout`` seconds); when
  none arrives it fails open (the call runs) unless ``fail_closed=True``.  A block raises
  ``LoopBlocked`` (or is returned, with ``raise_on_block=False``).
* **advisory mode**: ``before_tool_call`` returns at once; verdicts are applied as they
  arrive: the next call of a run that was aborted raises ``RunAbortedError``, and warnings
  collect in ``RunHandle.warnings``.

Verdicts are de-duplicated by ``verdict_id`` (Kafka delivers at least once).

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
from typing import Any, Iterable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from schemas.events import ToolCallEvent, encode_event
from schemas.verdicts import Decision, RunAborted, decode_verdict

from ..edge import blocked_result, compaction_event, completed_event, requested_event, run_ended_event
from ..engine.canonical import UNDEFINED
from ..engine.engine import state_key
from .errors import LoopBlocked, RunAbortedError

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
        **kafka_options: Any,
    ) -> None:
        if mode not in ("gate", "advisory"):
            raise ValueError("mode is 'gate' or 'advisory'")
        self.mode = mode
        self.timeout = timeout
        self.fail_closed = fail_closed
        self.raise_on_block = raise_on_block
        self.provider_send_tools = frozenset(provider_send_tools)
        self.tool_calls_topic = tool_calls_topic
        self.verdicts_topic = verdicts_topic
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers, linger_ms=0, **kafka_options)
        self._consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False, **kafka_options)
        self._prefix = uuid.uuid4().hex[:12]
        self._seq = itertools.count(1)
        self._waiting: dict[str, asyncio.Future] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._runs: dict[str, RunHandle] = {}
        self._reader: asyncio.Task | None = None
        self.duplicates_dropped = 0

    async def __aenter__(self) -> "LoopwatchClient":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        await self._producer.start()
        await self._consumer.start()
        # Read every partition from its current end, positioned before anything is sent,
        # so no decision for our own requests can be missed.
        partitions = self._consumer.partitions_for_topic(self.verdicts_topic)
        deadline = time.monotonic() + 30
        while not partitions:
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {self.verdicts_topic!r} does not exist (is the loopwatch worker running?)")
            await asyncio.sleep(0.2)
            await self._consumer._client.force_metadata_update()
            partitions = self._consumer.partitions_for_topic(self.verdicts_topic)
        assigned = [TopicPartition(self.verdicts_topic, p) for p in sorted(partitions)]
        self._consumer.assign(assigned)
        await self._consumer.seek_to_end(*assigned)
        for tp in assigned:
            await self._consumer.position(tp)
        self._reader = asyncio.create_task(self._read_verdicts(), name="loopwatch-verdicts")

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except asyncio.CancelledError:
                pass
        await self._consumer.stop()
        await self._producer.stop()

    def run(self, run_id: str | None, *, session_key: str, agent_id: str | None = None, session_id: str | None = None) -> "RunHandle":
        handle = RunHandle(self, run_id, session_key, agent_id, session_id)
        self._runs[handle.key] = handle
        return handle

    def _next_event_id(self) -> str:
        return f"{self._prefix}-{next(self._seq)}"

    async def _publish(self, event: ToolCallEvent) -> None:
        key = event.run_id or event.session_key or event.session_id
        await self._producer.send_and_wait(self.tool_calls_topic, encode_event(event), key=key.encode())

    async def _read_verdicts(self) -> None:
        while True:
            batches = await self._consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for record in records:
                    try:
                        verdict = decode_verdict(record.value)
                    except Exception:  # not ours to judge; never kill the reader
                        log.warning("undecodable verdict at %s:%s", record.partition, record.offset)
                        continue
                    self._dispatch(verdict)

    def _dispatch(self, verdict: Decision | RunAborted) -> None:
        if verdict.verdict_id in self._seen:
            self.duplicates_dropped += 1
            return
        self._seen[verdict.verdict_id] = None
        if len(self._seen) > _SEEN_VERDICTS:
            self._seen.popitem(last=False)
        run = self._runs.get(_verdict_key(verdict))
        if isinstance(verdict, RunAborted):
            if run is not None:
                run.aborted = verdict
            return
        future = self._waiting.pop(verdict.cause_event_id, None)
        if future is not None and not future.done():
            future.set_result(verdict)
        elif run is not None:
            run._advisory(verdict)


def _verdict_key(verdict: Decision | RunAborted) -> str:
    return state_key(verdict)  # verdicts carry the same run_id/session fields as events


class RunHandle:
    """One agent run's side of the conversation with loopwatch."""

    def __init__(self, client: LoopwatchClient, run_id, session_key, agent_id, session_id) -> None:
        self.client = client
        self.fields = {"run_id": run_id, "session_key": session_key, "agent_id": agent_id, "session_id": session_id}
        self.key = state_key(requested_event("-", "-", None, **self.fields))
        self.aborted: RunAborted | None = None
        self.warnings: list[Decision] = []
        self.blocked: list[Decision] = []
        self._vetoed: set[str | None] = set()

    def _advisory(self, decision: Decision) -> None:
        if decision.action == "warn":
            self.warnings.append(decision)
        elif decision.action == "block":
            self.blocked.append(decision)

    def check(self) -> None:
        """Raise ``RunAbortedError`` if loopwatch has ended this run."""
        if self.aborted is not None:
            raise RunAbortedError.from_verdict(self.aborted)

    async def before_tool_call(self, tool: str, args: Any, *, tool_call_id: str | None = None) -> Decision | None:
        self.check()
        client = self.client
        gate = client.mode == "gate"
        event = requested_event(client._next_event_id(), tool, args, tool_call_id=tool_call_id, gate=gate,
                                ts_ms=int(time.time() * 1000), **self.fields)
        if not gate:
            await client._publish(event)
            return None
        future = asyncio.get_running_loop().create_future()
        client._waiting[event.event_id] = future
        await client._publish(event)
        try:
            decision = await asyncio.wait_for(future, client.timeout)
        except asyncio.TimeoutError:
            client._waiting.pop(event.event_id, None)
            if client.fail_closed:
                raise TimeoutError(f"no loopwatch decision for {tool} within {client.timeout}s (fail-closed)") from None
            log.warning("no loopwatch decision for %s within %ss; failing open", tool, client.timeout)
            return None
        if decision.action == "warn":
            self.warnings.append(decision)
        if decision.action == "block":
            self.blocked.append(decision)
            # The vetoed call will not run: complete it now with the blocked result, as
            # upstream's wrapper records its own (profile latest counts it as a veto record;
            # configurable-final ignores it).  A later after_tool_call for it is a no-op.
            self._vetoed.add(tool_call_id)
            await self._complete(tool, args, tool_call_id, result=blocked_result(decision.message or ""))
            if client.raise_on_block:
                raise LoopBlocked(decision)
        return decision

    async def after_tool_call(
        self, tool: str, args: Any, *, tool_call_id: str | None = None, result: Any = None, error: Any = UNDEFINED,
        returned: bool = True,
    ) -> None:
        if tool_call_id in self._vetoed:
            self._vetoed.discard(tool_call_id)  # completed when it was blocked
            return
        await self._complete(tool, args, tool_call_id, result=result, error=error, returned=returned)

    async def _complete(
        self, tool: str, args: Any, tool_call_id: str | None, *, result: Any = None, error: Any = UNDEFINED,
        returned: bool = True,
    ) -> None:
        client = self.client
        event = completed_event(client._next_event_id(), tool, args, result=result, error=error, returned=returned,
                                provider_send_tools=client.provider_send_tools, tool_call_id=tool_call_id,
                                ts_ms=int(time.time() * 1000), **self.fields)
        await client._publish(event)

    async def compaction_retried(self) -> None:
        await self.client._publish(compaction_event(self.client._next_event_id(), ts_ms=int(time.time() * 1000), **self.fields))

    async def end(self, reason: str | None = None) -> None:
        await self.client._publish(run_ended_event(self.client._next_event_id(), reason, ts_ms=int(time.time() * 1000), **self.fields))
        self.client._runs.pop(self.key, None)
