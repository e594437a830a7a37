"""``loopwatch tune``: a seeded search over profile configurable-final's settings on labelled runs
(``loopwatch plant`` writes them), chosen and judged by k-fold cross-validation by run.

Each trial is a config; each run is judged by it through ``evaluate.EngineRow`` (the engine's
shared drive path).  A planted loop (``run.ended`` reason ``planted:<shape>:<start>:<length>``)
is **caught** as ``loopwatch evaluate`` counts a catch (``evaluate.caught_at``): the run's first
stop (block or abort, in calls executed before it) falls inside the loop, from its first call
to the call right after its last (``start <= stop <= start + length``); "calls into the loop"
is ``stop - start``.  A stop before the loop is not a catch; it is counted on its own.  A stop
of a background run labelled successful is a false alarm: inside a strict loop of 3+ calls of
the run (``evaluate.STRICT_LOOP``) it stopped a real loop of a run that still succeeded; else
it is a **pure false alarm**.  The budget (``--max-false-alarms``) is on the pure false-alarm
rate (pure false alarms / successful background runs).

Runs are dealt into ``folds`` folds by a ``random.Random(seed)`` shuffle of their names, sorted,
within each class (planted, successful, other) so each fold holds its share of each.

Choosing: the best trial on some runs is the highest catch rate of planted loops of 5+ calls
among the trials whose pure false-alarm rate is within the budget, ties broken by fewer calls
into the loop (median, then p90), then fewer pure false alarms, then the earlier trial.

Every figure ``tune`` reports is **held out**, nested: for each fold, the best trial is chosen
on the other folds and scored on the fold (``cross_validated``); the folds' scores, each per
fold and pooled, are the figures of *choosing this way* on runs the choice did not see.  A
trial's figures on the runs it was chosen on would flatter it (the search picks whatever fits
those runs, noise included), so they are reported apart, as ``in_sample``.  The written config
is the best trial on all runs (the most data to choose on), with the held-out figures of the
choice beside it.  The front (``held_out_front``) is the same nested choice repeated at a range
of budgets: the held-out trade-off between loops stopped and pure false alarms.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any

from schemas.events import RunEnded, ToolCallCompleted

from ..engine import engine_for
from .evaluate import EngineRow, caught_at, is_successful, loop_spans, median, percentile
from .plant import parse_planted

__all__ = [
    "BUDGETS",
    "RunFacts",
    "TrialBar",
    "choose",
    "cross_validated",
    "facts",
    "figures",
    "folds_of",
    "held_out_front",
    "judge_trials",
    "sample_trials",
    "tune_report",
]

MIN_LOOP = 5
HISTORY = (3, 4, 5, 6, 8, 10, 12, 16, 20, 30)
"""A history no longer than the critical threshold counts only an unbroken run of one call
(the last ``historySize`` calls all the same, as Roo Code's consecutive rule): the short ones
are in the space for that."""
CRITICAL = (3, 4, 5, 6, 8, 10, 15, 20)
BREAKER = (10, 15, 20, 30, 50)
BUDGETS = (0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 1.0)
"""The pure false-alarm budgets the held-out front is drawn at (with the one asked for)."""


@dataclass(frozen=True, slots=True)
class RunFacts:
    key: str
    success: bool | None
    start: int | None
    length: int | None
    shape: str | None = None
    spans: tuple[tuple[int, int], ...] = ()
    """The run's strict loops of ``evaluate.STRICT_LOOP`` or more calls."""


def facts(key: str, events: Sequence[Any]) -> RunFacts:
    last = events[-1] if events else None
    reason = last.reason if type(last) is RunEnded else None
    calls = [(e.args_hash, e.result_hash, e.is_error) for e in events if type(e) is ToolCallCompleted]
    spans = tuple(loop_spans(calls))
    planted = parse_planted(reason)
    if planted is not None:
        return RunFacts(key, False, planted.start, planted.length, planted.shape, spans)
    return RunFacts(key, is_successful(reason), None, None, None, spans)


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
            "warningThreshold": rng.randint(1, critical - 1),
            "criticalThreshold": critical,
            "globalCircuitBreakerThreshold": breaker,
            "detectors": {
                "genericRepeat": rng.random() < 0.5,
                "knownPollNoProgress": rng.random() < 0.5,
                "pingPong": rng.random() < 0.5,
            },
        }
        own = {"cycle": rng.random() < 0.5, "nearIdentical": rng.random() < 0.5}
        config = {"tools": {"loopDetection": block}, "loopwatch": {"detectors": own}}
        if repr(config) not in seen:
            seen.add(repr(config))
            out.append(config)
    return out


def judge_trials(
    configs: Sequence[dict], runs: Sequence[tuple[str, Sequence[Any]]], done: Callable[[], None] | None = None
) -> list[list[int | None]]:
    """Per config, per run: the first stop (calls executed before it; None: never); ``done``
    is called after each config (progress)."""
    out = []
    for config in configs:
        row = EngineRow("trial", engine_for(config))
        out.append([row.judge(events, ()).stop for _key, events in runs])
        if done is not None:
            done()
    return out


def figures(stops: Sequence[int | None], runs: Sequence[RunFacts], members: Sequence[int]) -> dict:
    """The figures of one config's stops over the runs ``members`` (indexes)."""
    loops = caught = before = alarms = pure = successful = 0
    into: list[int] = []
    shapes: dict[str, list[int]] = {}
    for i in members:
        run, stop = runs[i], stops[i]
        if run.start is not None and run.length is not None:
            if run.length >= MIN_LOOP:
                loops += 1
                shape = shapes.setdefault(run.shape or "unknown", [0, 0])
                shape[1] += 1
                at = caught_at(stop, run.start, run.length)
                if at is not None:
                    caught += 1
                    shape[0] += 1
                    into.append(at)
                elif stop is not None and stop < run.start:
                    before += 1
        elif run.success is True:
            successful += 1
            if stop is not None:
                alarms += 1
                pure += all(caught_at(stop, start, length) is None for start, length in run.spans)
    return {
        "loops_5": loops,
        "caught_5": caught,
        "catch_rate": caught / loops if loops else None,
        "stopped_before_loop": before,
        "into_median": median(into),
        "into_p90": percentile(into, 0.9),
        "successful": successful,
        "false_alarms": alarms,
        "pure_false_alarms": pure,
        "pure_false_alarm_rate": pure / successful if successful else 0.0,
        "by_shape": {k: {"caught_5": c, "loops_5": n} for k, (c, n) in sorted(shapes.items())},
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
        fig["pure_false_alarm_rate"],
    )


def choose(figs: Sequence[dict], budget: float) -> int | None:
    """The best trial within the pure false-alarm budget (module docstring); None: none is."""
    within = [i for i, fig in enumerate(figs) if fig["pure_false_alarm_rate"] <= budget]
    return min(within, key=lambda i: (_rank(figs[i]), i)) if within else None


def cross_validated(
    stops: Sequence[Sequence[int | None]], runs: Sequence[RunFacts], folds: Sequence[list[int]], budget: float
) -> dict:
    """Nested: per fold, the trial chosen on the other folds, its figures there (``training``)
    and on the fold (the held-out figures); and the held-out figures pooled over the folds (a
    fold where no trial is within the budget stops nothing)."""
    per_fold = []
    pooled_stops: list[int | None] = [None] * len(runs)
    for f, members in enumerate(folds):
        train = [i for g, other in enumerate(folds) if g != f for i in other]
        on_train = [figures(s, runs, train) for s in stops]
        chosen = choose(on_train, budget)
        if chosen is None:
            per_fold.append({"fold": f, "trial": None, "training": None, **figures([None] * len(runs), runs, members)})
            continue
        for i in members:
            pooled_stops[i] = stops[chosen][i]
        per_fold.append(
            {"fold": f, "trial": chosen, "training": on_train[chosen], **figures(stops[chosen], runs, members)}
        )
    everyone = [i for members in folds for i in members]
    return {"budget": budget, "folds": per_fold, "pooled": figures(pooled_stops, runs, everyone)}


def _front_key(fig: dict) -> tuple[float, float, float]:
    r = _rank(fig)
    return (r[0], r[1], r[3])


def held_out_front(
    stops: Sequence[Sequence[int | None]],
    runs: Sequence[RunFacts],
    folds: Sequence[list[int]],
    budgets: Sequence[float],
) -> list[dict]:
    """The nested choice (``cross_validated``) at each budget, and whether its pooled held-out
    figures are on the Pareto front (no other budget's catch rate, median calls into the loop
    and pure false-alarm rate are all as good and one better), in the order of the budgets."""
    points = [cross_validated(stops, runs, folds, b) for b in sorted(set(budgets))]
    keys = [_front_key(p["pooled"]) for p in points]
    for p, a in zip(points, keys):
        p["on_front"] = not any(all(x <= y for x, y in zip(b, a)) and b != a for b in keys)
    return points


def tune_report(
    configs: Sequence[dict],
    stops: Sequence[Sequence[int | None]],
    runs: Sequence[RunFacts],
    folds: Sequence[list[int]],
    budget: float,
) -> dict:
    """What ``loopwatch tune`` reports (module docstring): the config chosen on all runs, and
    as its figures the held-out ones of choosing so (per fold and pooled); its figures on all
    runs apart, as ``in_sample``; the held-out front."""
    everyone = [i for members in folds for i in members]
    on_all = [figures(s, runs, everyone) for s in stops]
    chosen = choose(on_all, budget)
    cv = cross_validated(stops, runs, folds, budget)
    return {
        "runs": len(runs),
        "trials": len(configs),
        "folds": [[runs[i].key for i in members] for members in folds],
        "budget": budget,
        "chosen": chosen,
        "chosen_config": configs[chosen] if chosen is not None else None,
        "chosen_figures": cv["pooled"],
        "chosen_per_fold": cv["folds"],
        "in_sample": on_all[chosen] if chosen is not None else None,
        "front": held_out_front(stops, runs, folds, (*BUDGETS, budget)),
    }


class TrialBar:
    """A progress bar of trials judged on ``out``: rewritten in place on a terminal (every
    0.5 s), a line every 5 s elsewhere, and a last line when done."""

    WIDTH = 24

    def __init__(self, out: IO[str], total: int) -> None:
        self.out = out
        self.total = total
        self.started = time.monotonic()
        self.tty = hasattr(out, "isatty") and out.isatty()
        self.every_s = 0.5 if self.tty else 5.0
        self.shown_at = self.started

    def line(self, n: int) -> str:
        elapsed = time.monotonic() - self.started
        filled = self.WIDTH * n // max(1, self.total)
        text = f"tune: [{'#' * filled}{'-' * (self.WIDTH - filled)}] {n}/{self.total} trials, {elapsed:.0f} s"
        if 0 < n < self.total:
            text += f", ETA {elapsed / n * (self.total - n):.0f} s"
        return text

    def __call__(self, n: int) -> None:
        now = time.monotonic()
        if now - self.shown_at < self.every_s:
            return
        self.shown_at = now
        self.out.write(("\r" + self.line(n) + "   ") if self.tty else self.line(n) + "\n")
        self.out.flush()

    def done(self) -> None:
        self.out.write(("\r" + self.line(self.total) + "   \n") if self.tty else self.line(self.total) + "\n")
        self.out.flush()
