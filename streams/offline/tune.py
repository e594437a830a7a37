"""``loopwatch tune``: a seeded search over profile configurable-final's settings on labelled runs
(``loopwatch plant`` writes them), judged by k-fold cross-validation by run.

Each trial is a config; each run is judged by it through ``evaluate.EngineRow`` (the engine's
shared drive path).  A planted loop (``run.ended`` reason ``planted:<shape>:<start>:<length>``)
is **caught** when the run's first stop (block or abort, in calls executed before it, as
``loopwatch evaluate`` counts) falls inside the loop: ``start <= stop < start + length``;
"calls into the loop" is ``stop - start``.  A stop before the loop is not a catch.  A **pure
false alarm** is a stop of a background run labelled successful.

Runs are dealt into ``folds`` folds by a ``random.Random(seed)`` shuffle of their names, sorted,
within each class (planted, successful, other) so each fold holds its share of each.  A trial
has nothing fitted, so its held-out figures (each fold's runs, pooled) are its figures on all
runs; what the folds check is the choice: in each fold the best trial on the other folds is
picked and measured on the fold (``cross_validated``), the estimate of what choosing does on
runs it was not chosen on.  The chosen config is the best on the pooled held-out figures: the
highest catch rate of planted loops of 5+ calls among the trials whose false-alarm rate is
within the budget, ties broken by fewer calls into the loop (median, then p90), then fewer
false alarms, then the earlier trial.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from schemas.events import RunEnded

from ..engine import engine_for
from .evaluate import EngineRow, _median, _percentile, is_successful
from .plant import parse_planted

__all__ = ["RunFacts", "figures", "folds_of", "sample_trials", "judge_trials", "choose", "cross_validated"]

MIN_LOOP = 5
HISTORY = (8, 10, 12, 16, 20, 30)
CRITICAL = (3, 4, 5, 6, 8, 10, 15, 20)
BREAKER = (10, 15, 20, 30, 50)


@dataclass(frozen=True, slots=True)
class RunFacts:
    key: str
    success: bool | None
    start: int | None
    length: int | None


def facts(key: str, events: Sequence[Any]) -> RunFacts:
    last = events[-1] if events else None
    reason = last.reason if type(last) is RunEnded else None
    planted = parse_planted(reason)
    if planted is not None:
        return RunFacts(key, False, planted.start, planted.length)
    return RunFacts(key, is_successful(reason), None, None)


def sample_trials(trials: int, seed: int) -> list[dict]:
    """``trials`` distinct configs (the first: upstream's defaults, enabled), drawn seeded."""
    rng = random.Random(seed)
    out = [{"tools": {"loopDetection": {"enabled": True}}}]
    seen = {repr(out[0])}
    attempts = 0
    while len(out) < trials and attempts < trials * 50:
        attempts += 1
        critical = rng.choice(CRITICAL)
        history = rng.choice([h for h in HISTORY if h >= critical] or [max(HISTORY)])
        breaker = rng.choice([b for b in BREAKER if b > critical] or [critical + 10])
        block = {
            "enabled": True,
            "historySize": history,
            "warningThreshold": max(1, critical - 1),
            "criticalThreshold": critical,
            "globalCircuitBreakerThreshold": breaker,
            "detectors": {
                "genericRepeat": rng.random() < 0.5,
                "knownPollNoProgress": rng.random() < 0.5,
                "pingPong": rng.random() < 0.5,
            },
        }
        config = {"tools": {"loopDetection": block}, "loopwatch": {"detectors": {"cycle": rng.random() < 0.5}}}
        if repr(config) not in seen:
            seen.add(repr(config))
            out.append(config)
    return out


def judge_trials(configs: Sequence[dict], runs: Sequence[tuple[str, Sequence[Any]]]) -> list[list[int | None]]:
    """Per config, per run: the first stop (calls executed before it; None: never)."""
    out = []
    for config in configs:
        row = EngineRow("trial", engine_for(config))
        out.append([row.judge(events, ()).stop for _key, events in runs])
    return out


def figures(stops: Sequence[int | None], runs: Sequence[RunFacts], members: Sequence[int]) -> dict:
    """The figures of one config over the runs ``members`` (indexes)."""
    loops = caught = alarms = successful = 0
    into: list[int] = []
    for i in members:
        run, stop = runs[i], stops[i]
        if run.start is not None:
            if run.length >= MIN_LOOP:
                loops += 1
                if stop is not None and run.start <= stop < run.start + run.length:
                    caught += 1
                    into.append(stop - run.start)
        elif run.success is True:
            successful += 1
            alarms += stop is not None
    return {
        "loops_5": loops,
        "caught_5": caught,
        "catch_rate": caught / loops if loops else None,
        "into_median": _median(into),
        "into_p90": _percentile(into, 0.9),
        "successful": successful,
        "false_alarms": alarms,
        "false_alarm_rate": alarms / successful if successful else 0.0,
    }


def folds_of(runs: Sequence[RunFacts], k: int, seed: int) -> list[list[int]]:
    """Run indexes per fold (module docstring)."""
    rng = random.Random(seed)
    folds: list[list[int]] = [[] for _ in range(k)]
    classes: dict[str, list[int]] = {"planted": [], "successful": [], "other": []}
    for i, run in enumerate(runs):
        kind = "planted" if run.start is not None else "successful" if run.success is True else "other"
        classes[kind].append(i)
    dealt = 0
    for kind in ("planted", "successful", "other"):
        members = sorted(classes[kind], key=lambda i: runs[i].key)
        rng.shuffle(members)
        for i in members:
            folds[dealt % k].append(i)
            dealt += 1
    return [sorted(f) for f in folds]


def _rank(fig: dict) -> tuple:
    inf = float("inf")
    return (
        -(fig["catch_rate"] or 0.0),
        inf if fig["into_median"] is None else fig["into_median"],
        inf if fig["into_p90"] is None else fig["into_p90"],
        fig["false_alarm_rate"],
    )


def choose(pooled: Sequence[dict], budget: float) -> int | None:
    """The best trial within the false-alarm budget (module docstring); None: none is."""
    within = [i for i, fig in enumerate(pooled) if fig["false_alarm_rate"] <= budget]
    return min(within, key=lambda i: (_rank(pooled[i]), i)) if within else None


def cross_validated(
    stops: Sequence[Sequence[int | None]], runs: Sequence[RunFacts], folds: Sequence[list[int]], budget: float
) -> dict:
    """Per fold, the trial chosen on the other folds and its figures on the fold; and those
    held-out figures pooled over the folds."""
    per_fold = []
    pooled_stops: list[int | None] = [None] * len(runs)
    for f, members in enumerate(folds):
        train = [i for g, other in enumerate(folds) if g != f for i in other]
        chosen = choose([figures(s, runs, train) for s in stops], budget)
        if chosen is None:
            per_fold.append({"fold": f, "trial": None})
            continue
        for i in members:
            pooled_stops[i] = stops[chosen][i]
        per_fold.append({"fold": f, "trial": chosen, **figures(stops[chosen], runs, members)})
    everyone = [i for members in folds for i in members]
    return {"folds": per_fold, "pooled": figures(pooled_stops, runs, everyone)}


def pareto(pooled: Sequence[dict]) -> list[int]:
    """The trials no other beats on catch rate, median calls into the loop and false alarms."""

    def key(fig: dict) -> tuple[float, float, float]:
        r = _rank(fig)
        return (r[0], r[1], r[3])

    keys = [key(fig) for fig in pooled]
    front = []
    for i, a in enumerate(keys):
        dominated = any(all(x <= y for x, y in zip(b, a)) and b != a for b in keys)
        if not dominated and a not in [keys[j] for j in front]:
            front.append(i)
    return sorted(front, key=lambda i: keys[i])
