"""Health: readiness, broker reachability, consumer lag and the worker's status line.

``/healthz`` (liveness) answers 200 while the worker is a working member of its group or
on its way to being one (starting, rejoining); 503 with a ``reason`` while it stops, and in
the grace before its membership watchdog ends it (``streams.app.watchdog``: out of its group
for longer than ``LOOPWATCH_MEMBER_WATCHDOG_S``).  ``/readyz`` (readiness) answers 200 once
the run table is recovered, no rebalance is in progress, a broker answered within
``LOOPWATCH_BROKER_UNREACHABLE_S`` and no batch or checkpoint failed, else 503 (with the
reasons in its JSON body).  ``loopwatch_ready`` says the same to Prometheus.

A check that fails (Faust not started yet, a partition revoked between two calls) counts as
"not ready" or "no figure", and is logged once with its cause (``logs.FailureLog``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from streams.app.faust_adapter import fetch_topic_metadata

from .checkpoint import describe_failure
from .logs import FailureLog

if TYPE_CHECKING:
    from .checkpoint import Checkpointer
    from .metrics import Metrics
    from .output import Output
    from .run_store import RunStore
    from .watchdog import Watchdog

__all__ = ["BROKER_PROBE_S", "Health"]

log = logging.getLogger("loopwatch.worker")

BROKER_PROBE_S = 1.0
"""How often the worker asks a broker for cluster metadata (``/readyz``)."""
REPORT_S = 60.0
"""How often the worker logs what it did (``report``)."""


class Health:
    """Readiness and lag of one worker.

    ``group``: the consumer and group (``streams.app.faust_adapter.ConsumerView``);
    ``checkpoints``: whether a batch or checkpoint failed, and the work done;
    ``output``: the verdict producer, whose connections the broker probe uses.
    """

    def __init__(
        self,
        group: Any,
        checkpoints: Checkpointer,
        output: Output,
        store: RunStore,
        metrics: Metrics,
        *,
        tool_calls_topic: str,
        broker_unreachable_s: float,
        probe: Callable[[Any, str], Any] = fetch_topic_metadata,
        watchdog: Watchdog | None = None,
    ) -> None:
        self.group = group
        self.checkpoints = checkpoints
        self.output = output
        self.store = store
        self.metrics = metrics
        self.tool_calls_topic = tool_calls_topic
        self.broker_unreachable_s = broker_unreachable_s
        self._probe = probe
        self.watchdog = watchdog
        self._broker_answered_at = time.monotonic()
        """When a broker last answered the readiness probe (``probe_broker``)."""
        self._broker_lost_logged = False
        self._lag_partitions: set[str] = set()
        """The partitions ``loopwatch_consumer_lag_records`` has a series for."""
        self._reported = (time.monotonic(), 0, 0, 0, 0)
        self._recovery_check = FailureLog(log, "the readiness check of table recovery")
        self._lag_check = FailureLog(log, "the consumer lag metric")

    # -- readiness --------------------------------------------------------------------------------

    def is_ready(self) -> bool:
        """Table recovery finished, no rebalance in progress, a broker answered lately, and no
        batch or checkpoint failed.  (Also called from the metrics server's thread.)"""
        if self.checkpoints.failed is not None or not self.broker_reachable():
            return False
        group = self.group
        try:
            recovered = group.recovered()
        except Exception as exc:  # noqa: BLE001 - Faust not started yet
            self._recovery_check.failed(exc)
            return False
        self._recovery_check.ok()
        return bool(recovered and not group.rebalancing and not group.in_recovery)

    def broker_reachable(self) -> bool:
        """A broker answered within ``LOOPWATCH_BROKER_UNREACHABLE_S``."""
        return time.monotonic() - self._broker_answered_at <= self.broker_unreachable_s

    def status(self) -> tuple[dict, bool]:
        """``/readyz``'s body and whether the worker is ready."""
        ready = self.is_ready()
        group = self.group
        body = {
            "ready": ready,
            "rebalancing": group.rebalancing,
            "in_recovery": group.in_recovery,
            "broker_reachable": self.broker_reachable(),
        }
        failure = describe_failure(self.checkpoints.failed)
        if failure is not None:
            body["error"] = failure  # a full state disk among them: the worker stops soon
        return body, ready

    async def probe_broker(self) -> None:
        """Ask a broker for the ``tool-calls`` topic's metadata, on the verdict producer's
        connections (the same brokers the consumer and producers use; one small request a
        second, whatever the number of topics in the cluster).

        A metadata request rather than the consumer's fetches: a worker with no partitions
        (a warm standby) fetches nothing, and a partition's fetches pause during recovery.
        """
        producer = self.output.verdict_producer
        if producer is None:
            return  # not started yet: recovery, which needs the broker, keeps it unready anyway
        timeout = min(5.0, self.broker_unreachable_s)
        try:
            await asyncio.wait_for(self._probe(producer, self.tool_calls_topic), timeout)
        except Exception as exc:  # noqa: BLE001 - every failure means the same: no answer
            silent = time.monotonic() - self._broker_answered_at
            if not self._broker_lost_logged and silent > self.broker_unreachable_s:
                self._broker_lost_logged = True
                log.error(
                    "no Kafka broker has answered for %.0f s (last error: %r): not ready until one does", silent, exc
                )
            return
        if self._broker_lost_logged:
            self._broker_lost_logged = False
            log.info("a Kafka broker answers again")
        self._broker_answered_at = time.monotonic()

    # -- lag and the status line ---------------------------------------------------------------------

    def update_lag(self) -> None:
        """``loopwatch_consumer_lag_records`` per assigned ``tool-calls`` partition: its end
        offset minus the group's committed offset; partitions no longer assigned lose theirs."""
        group, topic = self.group, self.tool_calls_topic
        gauge = self.metrics.consumer_lag
        try:
            lags = {}
            for tp in group.assignment():
                if tp.topic != topic:
                    continue
                highwater = group.highwater(topic, tp.partition)
                if highwater is None:
                    continue
                lags[str(tp.partition)] = max(0, highwater - (group.committed_offset(topic, tp.partition) or 0))
        except Exception as exc:  # noqa: BLE001 - consumer not started, or mid-rebalance
            self._lag_check.failed(exc)
            return
        self._lag_check.ok()
        for partition, lag in lags.items():
            gauge.labels(partition).set(lag)
        for partition in self._lag_partitions - lags.keys():
            gauge.remove(partition)
        self._lag_partitions = set(lags)

    def report(self) -> None:
        """One info line a minute: what the worker did since the last one."""
        now = time.monotonic()
        then, batches, records, verdicts, dead = self._reported
        if now - then < REPORT_S:
            return
        cp = self.checkpoints
        self._reported = (now, cp.batches, cp.records, cp.verdicts_sent, cp.dead_lettered)
        n = cp.records - records
        if n:
            log.info(
                "%d records in %d batches (%.0f/s), %d verdicts, %d dead letters; %d runs tracked",
                n,
                cp.batches - batches,
                n / (now - then),
                cp.verdicts_sent - verdicts,
                cp.dead_lettered - dead,
                self.store.runs_tracked,
            )

    # -- web pages --------------------------------------------------------------------------------------

    def pages(self) -> dict[str, Callable[[Any, Any], Any]]:
        """Faust page handlers (``app.page(path)(handler)``): ``(view, request) -> response``."""

        async def healthz(view: Any, request: Any) -> Any:
            """200 while the worker is, or is becoming, a working member of its group; 503
            with the reason while it stops or is about to be ended by its watchdog."""
            decision = None if self.watchdog is None else self.watchdog.decision()
            if decision is None or decision.kind == "ok":
                return view.json({"status": "ok"})
            status = "leaving" if decision.kind == "exit" else "stopping"
            return view.json({"status": status, "reason": decision.reason}, status=503)

        async def readyz(view: Any, request: Any) -> Any:
            """200 when ready (``Health.is_ready``), else 503."""
            body, ready = self.status()
            return view.json(body, status=200 if ready else 503)

        return {"/healthz": healthz, "/readyz": readyz}
