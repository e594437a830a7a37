"""The membership watchdog: a worker that is no longer in its group leaves.

A worker that finds it is no longer a member of its generation stops (``NotAMember``,
docs/reliability.md) and its supervisor starts it again.  If that stop, or a rejoin, never
completes, the process would stay up for ever, holding its ports, with nothing left to do:
this watchdog is the backstop.  It has two halves:

* on the event loop, every ``TICK_S``, a plain ``call_later`` callback (no Faust timer: those
  stop with the app, and none awaits anything here) records where the worker stands
  (``observe``): a member of its group (the group coordinator under the consumer holds a
  generation and a member id: with partitions, or idle as a member), and not stopping;
* in a thread of its own, twice a second, ``decide``: once the worker has not been a member
  that is not stopping for longer than the bound (``LOOPWATCH_MEMBER_WATCHDOG_S``; by default
  twice the session timeout plus the rebalance timeout), or the event loop has not run for that
  long, it logs one line saying why, dumps what the loop's tasks were waiting for, and exits
  the process with ``EXIT_CODE`` after ``GRACE_S``, whatever the event loop is doing.

``/healthz`` answers 503 with the reason as soon as ``decide`` does not say ``ok``: while the
worker stops, and in the grace before the exit.

A broker outage is not a loss of membership: the coordinator keeps its generation until the
broker answers (and refuses it), a restart would only wait for the broker again, and
``/readyz`` already says the worker is unready.  The bound is at least the session timeout
(``Settings``): within it a member the broker expelled always learns so at its next heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "EXIT_CODE",
    "GRACE_S",
    "TICK_S",
    "Decision",
    "Standing",
    "Watch",
    "Watchdog",
    "awaiting",
    "decide",
    "observe",
    "print_task_stacks",
]

log = logging.getLogger("loopwatch.worker")

TICK_S = 1.0
"""How often the event loop records where the worker stands."""
CHECK_S = 0.5
"""How often the watchdog's thread decides."""
GRACE_S = 2.0
"""Between the decision to exit and the exit: the log line is flushed and ``/healthz`` says why."""
EXIT_CODE = 75
"""The exit code of a worker the watchdog ended (EX_TEMPFAIL: start it again)."""
REASON_CHARS = 300
"""A reason is cut to this many characters (it goes into a log line and ``/healthz``'s body)."""


@dataclass(frozen=True)
class Standing:
    """Where the worker stands, as the event loop sees it."""

    member: bool
    """The group coordinator holds a generation and a member id for this worker."""
    stopping: bool
    """The worker is stopping (a crash, ``NotAMember``, SIGTERM)."""
    why: str = ""
    """Why it is not a member, or why it stops (a line)."""


@dataclass(frozen=True)
class Watch:
    """What the watchdog knows: when the loop last ran, when the worker was last a member
    that was not stopping, and the latest standing."""

    last_tick: float
    last_good: float
    standing: Standing

    @classmethod
    def starting(cls, now: float) -> Watch:
        """A worker starting: it has the bound to join its group."""
        return cls(now, now, Standing(member=False, stopping=False, why="it has not joined its group yet"))


@dataclass(frozen=True)
class Decision:
    kind: str
    """``ok``, ``unhealthy`` (``/healthz`` 503, the worker still has time) or ``exit``."""
    reason: str = ""


OK = Decision("ok")


def observe(watch: Watch, now: float, standing: Standing) -> Watch:
    """The watch after the event loop saw ``standing`` at ``now``."""
    good = standing.member and not standing.stopping
    return replace(watch, last_tick=now, last_good=now if good else watch.last_good, standing=standing)


def decide(watch: Watch, now: float, bound_s: float) -> Decision:
    """What to do at ``now``: exit once the worker has not been a member that is not stopping
    for longer than ``bound_s`` (a silent event loop counts as neither), ``unhealthy`` while
    it stops, else ``ok`` (also while it rejoins its group, within the bound)."""
    silent = now - watch.last_tick
    lost = now - watch.last_good
    standing = watch.standing
    if lost > bound_s:
        if silent > bound_s:
            why = f"the event loop has not run for {silent:.0f} s"
        elif standing.stopping:
            why = f"its stop has not finished ({standing.why})"
        else:
            why = f"it is not a member of its consumer group ({standing.why})"
        return Decision(
            "exit", _line(f"not a working member of its group for {lost:.0f} s (bound {bound_s:.0f} s): {why}")
        )
    if standing.stopping:
        return Decision("unhealthy", _line(f"stopping for {lost:.0f} s: {standing.why}"))
    return OK


def _line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


class Watchdog:
    """The two halves of the module docstring for one worker.

    ``standing()``: where the worker stands (called on the event loop; must not raise);
    ``bound_s``: the bound; ``clock``, ``exit_`` and ``grace_s`` are the process's unless a test
    gives its own."""

    def __init__(
        self,
        standing: Callable[[], Standing],
        bound_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        exit_: Callable[[int], Any] = os._exit,
        grace_s: float = GRACE_S,
    ) -> None:
        self.standing = standing
        self.bound_s = bound_s
        self.clock = clock
        self._exit = exit_
        self.grace_s = grace_s
        self.watch = Watch.starting(clock())
        """Replaced (never mutated) by the loop's tick: the thread reads one consistent value."""
        self.exiting: Decision | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def decision(self) -> Decision:
        """What ``/healthz`` says (any thread); ``ok`` until started (a worker run by other
        means than ``streams.app.worker`` has no watchdog)."""
        if self.exiting is not None:
            return self.exiting
        if self._thread is None:
            return OK
        return decide(self.watch, self.clock(), self.bound_s)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Tick on ``loop`` and start the thread (once)."""
        if self._thread is not None:
            return
        self._loop = loop
        self.watch = Watch.starting(self.clock())
        loop.call_soon(self._tick)
        self._thread = threading.Thread(target=self._run, name="loopwatch-watchdog", daemon=True)
        self._thread.start()

    def _tick(self) -> None:
        try:
            standing = self.standing()
        except Exception as exc:  # noqa: BLE001 - a standing that cannot be read is no membership
            standing = Standing(member=False, stopping=False, why=f"its standing cannot be read: {exc!r}")
        self.watch = observe(self.watch, self.clock(), standing)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_later(TICK_S, self._tick)

    def _run(self) -> None:
        while True:
            time.sleep(CHECK_S)
            decision = decide(self.watch, self.clock(), self.bound_s)
            if decision.kind == "exit":
                self.leave(decision)
                return

    def leave(self, decision: Decision) -> None:
        """Say why, show what the loop waited for, wait ``grace_s``, exit with ``EXIT_CODE``."""
        self.exiting = decision
        line = f"loopwatch worker: leaving: {decision.reason}; exiting with code {EXIT_CODE}"
        log.critical("%s", line)
        self._dump_tasks()
        from . import logs

        logs.flush()
        time.sleep(self.grace_s)
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - the exit matters, not the line
            pass
        self._exit(EXIT_CODE)

    def _dump_tasks(self) -> None:
        """What every task of the loop was waiting for, to the log (read from this thread: the
        loop may be wedged; a task that moves meanwhile shows a stale frame at worst)."""
        loop = self._loop
        if loop is None:
            return
        try:
            tasks = list(asyncio.all_tasks(loop))
        except RuntimeError:
            return
        for task in tasks[:200]:
            try:
                frames = [f"{path.rsplit('/', 2)[-1]}:{line} {name}" for path, line, name in awaiting(task)]
            except Exception:  # noqa: BLE001 - best effort
                continue
            log.warning("watchdog: task %s waits in %s", task.get_name(), " -> ".join(frames) or "(not started)")


MAX_DEPTH = 60
"""Frames shown per task, outermost first."""


def awaiting(task: asyncio.Task) -> list[tuple[str, int, str]]:
    """Where ``task`` waits: (file, line, function) of its coroutine and of every coroutine or
    generator it awaits in turn, outermost first.  (``Task.get_stack`` shows only the outermost:
    a suspended coroutine's frame has no ``f_back``; the chain is ``cr_await``.)"""
    frames: list[tuple[str, int, str]] = []
    link: Any = task.get_coro()
    while link is not None and len(frames) < MAX_DEPTH:
        frame = getattr(link, "cr_frame", None) or getattr(link, "gi_frame", None) or getattr(link, "ag_frame", None)
        if frame is None:
            break
        frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        link = getattr(link, "cr_await", None) or getattr(link, "gi_yieldfrom", None) or getattr(link, "ag_await", None)
    return frames


def print_task_stacks(loop: asyncio.AbstractEventLoop, file: Any) -> None:
    """Every task of ``loop`` and where it waits (``awaiting``), to ``file`` (the worker's
    SIGUSR2, docs/operations.md: a worker that hangs)."""
    tasks = sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name())
    print(f"--- asyncio: {len(tasks)} tasks (SIGUSR2) ---", file=file)
    for task in tasks:
        print(f"Task {task.get_name()} ({task.get_coro()!r}) waits in:", file=file)
        for path, line, name in awaiting(task):
            print(f'  File "{path}", line {line}, in {name}', file=file)
    print("--- asyncio: end of tasks ---", file=file, flush=True)
