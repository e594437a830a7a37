"""A gateway run and the guarding of its tool calls: what both agent-facing front ends share.

The SDK gateway (``gateway.py``: streamable HTTP, several upstreams, prefixes) and the stdio
relay (``relay.py``: one stdio upstream, messages passed on as they are) differ only in how a
``tools/call`` reaches them and how its answer goes back.  What loopwatch does with the call is
here, once: admit it (gate: publish and wait for the decision; advisory: queue the request),
complete it with its outcome, and the notices the model reads with the result.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from streams.client import (
    BrokerAccessError,
    LoopBlocked,
    LoopwatchClient,
    LoopwatchUnavailable,
    NoDecisionError,
    RunAbortedError,
    RunHandle,
)

from .options import GatewayOptions

log = logging.getLogger("loopwatch.mcp")

__all__ = ["BATCH_WAIT_MS", "GuardedRun", "KafkaLink", "UnguardedRun", "runner_client"]

RECONNECT_S = 2.0
"""How often the gateway tries Kafka again while it cannot reach it."""

BATCH_WAIT_MS = 5
"""How long an event may wait to share a produce request: advisory mode's linger, gate mode's
hold on a completion (``GuardedRun.complete``)."""


def runner_client(options: GatewayOptions) -> LoopwatchClient:
    """The runner client a gateway publishes through, from its options."""
    return LoopwatchClient(
        options.bootstrap_servers,
        mode=options.mode,
        timeout=options.timeout,
        fail_closed=options.fail_closed,
        tool_calls_topic=options.tool_calls_topic,
        verdicts_topic=options.verdicts_topic,
        # advisory: no call waits on a delivery, so a call's two events (and those of the
        # calls meanwhile) go in one produce request, at most BATCH_WAIT_MS later
        linger_ms=BATCH_WAIT_MS if options.mode == "advisory" else 0,
        **dict(options.kafka_options),
    )


class GuardedRun:
    """One run's handle and its publishing queue.

    The agent never waits for an event's delivery it does not need: a completion (and in
    advisory mode the request too) is hashed and queued in the background, in order behind the
    run's earlier events (``later``); queued, not delivered (``RunHandle.queue_*``): the
    producer delivers a partition's records in the order queued.  A gated request waits until
    the run's earlier events are queued (``settled``), not delivered, so the worker reads every
    run's events in the order they happened.  One task drains the queue while it has events:
    a broker that does not answer stalls the queue, never a call.

    Gate mode holds a completion (``complete``) for the run's next request, which takes it along
    in its own produce request (``RunHandle.before_tool_call``'s ``completions``), or queues it
    after ``BATCH_WAIT_MS``, or ahead of anything else queued meanwhile.  Sent on its own, it
    would be in flight when an agent's next call comes straight after (calls of one model turn),
    and the producer keeps one produce request in flight per broker: the request would wait for
    its acknowledgement, a broker round trip, before it went out."""

    __slots__ = (
        "handle",
        "last_used",
        "surfaced_warnings",
        "surfaced_blocks",
        "_tasks",
        "_queue",
        "_drainer",
        "_held",
        "_hold_timer",
    )

    def __init__(self, handle: RunHandle, tasks: set) -> None:
        self.handle = handle
        self.last_used = time.monotonic()
        self.surfaced_warnings = 0  # advisory mode: the verdicts already shown to the model
        self.surfaced_blocks = 0
        self._tasks = tasks
        """The owner's set of publishing tasks, which its ``stop`` waits for."""
        self._queue: collections.deque[Callable[[], Awaitable[Any]]] = collections.deque()
        self._drainer: asyncio.Task | None = None
        self._held: list[dict[str, Any]] = []
        """Gate mode: completions not yet queued, as ``queue_after_tool_call``'s arguments."""
        self._hold_timer: asyncio.TimerHandle | None = None

    @property
    def mode(self) -> str:
        return self.handle.client.mode

    def later(self, publish: Callable[[], Awaitable[Any]]) -> None:
        self._release()
        self._queue.append(publish)
        self._drain_soon()

    def _drain_soon(self) -> None:
        if self._drainer is None and self._queue:
            self._drainer = task = asyncio.ensure_future(self._drain())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _drain(self) -> None:
        try:
            while self._queue:
                publish = self._queue.popleft()
                try:
                    await publish()
                except RunAbortedError:
                    pass  # advisory mode: the abort arrived meanwhile; the next call is refused
                except Exception as exc:  # noqa: BLE001 - the client logs failed deliveries; nothing else may stop the queue
                    log.warning("run %s: event not published: %s", self.handle.fields["run_id"], exc)
        finally:
            self._drainer = None

    def _take_held(self) -> list[dict[str, Any]]:
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        held, self._held = self._held, []
        return held

    def _release(self) -> None:
        """Queue the held completions, ahead of anything queued after."""
        for completion in self._take_held():
            self._queue.append(lambda c=completion: self.handle.queue_after_tool_call(**c))
        self._drain_soon()

    async def settled(self) -> None:
        while self._drainer is not None:
            await asyncio.wait([self._drainer])

    async def admit(self, name: str, args: Any, call_id: str) -> tuple[str | None, str | None]:
        """``(refusal, notice)`` for a call about to be forwarded: ``refusal`` is the text the
        agent gets instead of running it (a block, the run's abort, no decision failing closed);
        ``notice`` is gate mode's warning for the model (``notify_model``)."""
        handle = self.handle
        try:
            if self.mode == "gate":
                await self.settled()
                decision = await handle.before_tool_call(
                    name, args, tool_call_id=call_id, completions=self._take_held()
                )
            else:
                handle.check()
                self.later(lambda: handle.queue_before_tool_call(name, args, tool_call_id=call_id))
                return None, None
        except RunAbortedError as aborted:
            return aborted.message, None
        except LoopBlocked as blocked:  # completed with upstream's blocked result by the client
            return blocked.decision.message or "blocked by loopwatch", None
        except NoDecisionError as exc:
            return f"{exc}; the call was not run", None
        if decision is not None and decision.action == "warn" and decision.notify_model:
            return None, decision.message
        return None, None

    def complete(self, name: str, args: Any, call_id: str, **outcome: Any) -> None:
        """Queue the call's completion (``RunHandle.after_tool_call``'s keyword arguments); gate
        mode holds it for the run's next request, at most ``BATCH_WAIT_MS``."""
        completion = {"tool": name, "args": args, "tool_call_id": call_id, **outcome}
        if self.mode != "gate":
            self.later(lambda: self.handle.queue_after_tool_call(**completion))
            return
        self._held.append(completion)
        if self._hold_timer is None:
            self._hold_timer = asyncio.get_running_loop().call_later(BATCH_WAIT_MS / 1000, self._release)

    def notices(self, notice: str | None) -> list[str]:
        """What the model reads after the result: gate mode, this call's warning when its
        decision says ``notify_model``; advisory mode, the warnings (with ``notify_model``) and
        blocks that arrived since the run's last result."""
        handle = self.handle
        notices = [notice] if notice else []
        if self.mode == "advisory":
            notices += [w.message for w in handle.warnings[self.surfaced_warnings :] if w.notify_model and w.message]
            notices += [b.message for b in handle.blocked[self.surfaced_blocks :] if b.message]
            self.surfaced_warnings, self.surfaced_blocks = len(handle.warnings), len(handle.blocked)
        return notices

    async def end(self, reason: str) -> None:
        self._release()
        await self.settled()
        await self.handle.end(reason)


class UnguardedRun:
    """A call's run while loopwatch cannot be reached: nothing is published, and the call runs
    (fail open) or is refused with the reason (fail closed), as a gated call that gets no
    decision in time would be."""

    def __init__(self, refusal: str | None) -> None:
        self.refusal = refusal

    async def admit(self, name: str, args: Any, call_id: str) -> tuple[str | None, str | None]:
        return self.refusal, None

    def complete(self, name: str, args: Any, call_id: str, **outcome: Any) -> None:
        pass

    def notices(self, notice: str | None) -> list[str]:
        return [notice] if notice else []

    async def end(self, reason: str) -> None:
        pass


class KafkaLink:
    """The gateway's runner client, reconnecting: a gateway that cannot reach Kafka at start
    serves its tools all the same, each call unguarded (``unguarded``), and tries again every
    ``RECONNECT_S`` until it can; from then on calls are guarded.  A broker that refuses the
    client for good (``BrokerAccessError``: credentials, TLS trust) still stops the start:
    waiting would not fix it."""

    def __init__(self, options: GatewayOptions, client: LoopwatchClient | None = None) -> None:
        self.options = options
        self.client = client or runner_client(options)
        self.connected = False
        self._reconnecting: asyncio.Task | None = None
        self._given_client = client is not None

    async def start(self) -> None:
        try:
            await self.client.start()
        except LoopwatchUnavailable as exc:
            how = "refused" if self.options.fail_closed else "run unguarded (fail open)"
            log.warning("%s; tool calls are %s until it is reached (trying every %gs)", exc, how, RECONNECT_S)
            self._reconnecting = asyncio.create_task(self._reconnect(), name="mcp-gateway-kafka")
            return
        self.connected = True

    async def _reconnect(self) -> None:
        while True:
            await asyncio.sleep(RECONNECT_S)
            # A client that failed to start is stopped for good: a new one is made per attempt.
            client = self.client if self._given_client else runner_client(self.options)
            try:
                await client.start()
            except (LoopwatchUnavailable, BrokerAccessError) as exc:
                log.debug("still no loopwatch: %s", exc)
                continue
            self.client, self.connected = client, True
            log.warning("reached loopwatch on %s: tool calls are guarded again", self.options.bootstrap_servers)
            return

    def unguarded(self) -> UnguardedRun:
        """The run of a call made while Kafka is out of reach."""
        refusal = None
        if self.options.fail_closed:
            refusal = (
                f"loopwatch is unavailable (Kafka at {self.options.bootstrap_servers} cannot be reached) and the "
                "gateway fails closed; the call was not run"
            )
        return UnguardedRun(refusal)

    async def stop(self) -> None:
        if self._reconnecting is not None:
            self._reconnecting.cancel()
            await asyncio.gather(self._reconnecting, return_exceptions=True)
        if self.connected:
            await self.client.stop()
