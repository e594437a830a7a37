"""``--jobs 1`` against ``--jobs N``, alternated pass by pass (``bench.backtest``,
``bench.evaluate``): on a shared machine the neighbours change from minute to minute, so the
two are measured in turn, each pass in the other order than the one before."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

__all__ = ["alternate_jobs", "print_scaling"]


def alternate_jobs(
    timed: Callable[[int], tuple[float, float, int, Any]], jobs: int, repeat: int, *, unit: str, per: str
) -> tuple[dict[int, list[float]], dict[int, list[float]], dict[int, list[Any]]]:
    """``timed(jobs)`` gives (wall seconds, seconds on the cores alone, how many ``unit``, the
    report); each pass is printed.  Returns, by jobs, the rates in wall time, the rates on the
    cores alone, and the reports."""
    wall_rates: dict[int, list[float]] = {1: [], jobs: []}
    alone_rates: dict[int, list[float]] = {1: [], jobs: []}
    reports: dict[int, list[Any]] = {1: [], jobs: []}
    for attempt in range(repeat):
        for n in (1, jobs)[:: 1 if attempt % 2 == 0 else -1]:
            wall, alone, count, report = timed(n)
            wall_rates[n].append(count / wall)
            alone_rates[n].append(count / alone)
            reports[n].append(report)
            print(
                f"  pass {attempt + 1} --jobs {n}: {count:,} {unit} in {wall:.2f} s wall = {wall_rates[n][-1]:,.0f} "
                f"{per}; {alone:.2f} s on the cores alone = {alone_rates[n][-1]:,.0f} {per}"
            )
    return wall_rates, alone_rates, reports


def print_scaling(wall_rates: dict[int, list[float]], alone_rates: dict[int, list[float]], jobs: int) -> None:
    """``--jobs N`` over ``--jobs 1``, pass by pass, in wall time and on the cores alone."""
    for name, rates in (("wall time", wall_rates), ("on the cores alone", alone_rates)):
        scaling = [b / a for a, b in zip(rates[1], rates[jobs])]
        print(
            f"--jobs {jobs} / --jobs 1 ({name}): {', '.join(f'{x:.2f}' for x in scaling)} per pass, median "
            f"{statistics.median(scaling):.2f}"
        )
