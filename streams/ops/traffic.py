"""A simulated fleet that keeps a worker busy for a while: ``loopwatch demo``'s runners
(``streams.offline.demo.simulate_run``: the runner client in gate mode, obeying verdicts) started
continuously, every scenario of ``streams.offline.scenarios`` in turn, on any topics.

Used by ``streams.ops.render`` (the README's metrics picture) and the dashboard test on a
real Prometheus.  ``concurrency`` may be a number or a function of the elapsed seconds, so a
run can ramp up and down; ``mix`` likewise picks the scenario of each new run.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import random
import time
from collections.abc import Callable, Sequence

from streams.client import LoopwatchClient
from streams.offline.demo import new_stats, simulate_run
from streams.offline.scenarios import SCENARIOS

__all__ = ["drive_fleet"]

Schedule = Callable[[float], int]
Mix = Callable[[float, random.Random], str]


async def drive_fleet(
    bootstrap: str,
    *,
    duration_s: float,
    tool_calls_topic: str = "tool-calls",
    verdicts_topic: str = "loop-verdicts",
    concurrency: int | Schedule = 7,
    mix: Sequence[str] | Mix = SCENARIOS,
    length: int = 26,
    pace: float = 0.05,
    run_prefix: str = "",
    seed: int = 1,
    quiet: bool = True,
) -> dict:
    """Start runs until ``duration_s`` has passed, then let the running ones finish.

    Returns demo-style stats: per scenario ``runs``, ``calls``, ``warns``, ``blocks``,
    ``aborts``, plus ``latency`` (gate round trips, seconds) and ``started`` (runs started
    per scenario).  A run that fails (Kafka errors) stops the fleet and is raised.
    """
    stats = new_stats()
    rng = random.Random(seed)
    want: Schedule = concurrency if callable(concurrency) else (lambda _t, n=concurrency: n)
    if callable(mix):
        pick: Mix = mix
    else:
        kinds = itertools.cycle(mix)
        pick = lambda _t, _rng: next(kinds)  # noqa: E731
    sink = io.StringIO()
    redirect = contextlib.redirect_stdout(sink) if quiet else contextlib.nullcontext()
    running: set[asyncio.Task] = set()
    failures: list[BaseException] = []
    numbers = itertools.count(1)

    def finished(task: asyncio.Task) -> None:
        running.discard(task)
        if not task.cancelled() and task.exception() is not None:
            failures.append(task.exception())

    with redirect:
        async with LoopwatchClient(
            bootstrap,
            mode="gate",
            timeout=5.0,
            tool_calls_topic=tool_calls_topic,
            verdicts_topic=verdicts_topic,
        ) as client:
            started = time.monotonic()
            while (elapsed := time.monotonic() - started) < duration_s:
                while len(running) < max(0, want(elapsed)):
                    kind = pick(elapsed, rng)
                    run_id = f"{run_prefix}{kind}-{next(numbers)}"
                    task = asyncio.create_task(simulate_run(client, kind, run_id, length, stats, pace))
                    running.add(task)
                    task.add_done_callback(finished)
                    stats["started"][kind] += 1
                if failures:
                    break
                await asyncio.sleep(0.05)
            if running:
                results = await asyncio.gather(*running, return_exceptions=True)
                failures += [r for r in results if isinstance(r, BaseException) and r not in failures]
    if failures:
        raise failures[0]
    return stats
