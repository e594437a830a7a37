"""``loopwatch evaluate``: several configs, profiles and the peers' simple rules side by side
over the same recorded runs, with what each would have caught and whom it would have stopped.

Records are read and checked as ``loopwatch backtest`` reads them (``backtest.FileSource``,
``streams.engine.intake.check_record``; duplicates by event id skipped), grouped into runs by
state key (a run ends at its ``run.ended``), and each run is judged alone:
``evaluate_run(events, rows)`` is a function of one run's events, so runs can be judged in any
order and split across processes.  Each config's engine is driven through ``RunDriver`` and
ranked by ``engine.outcome`` (what ``published`` puts on ``loop-verdicts``), the worker's path.

Where a rule stops a run is counted in **calls executed before the stop**: a block of a call
(decided at its ``tool_call.requested``) lets the calls before it run; a rule that judges an
outcome (OpenHands' stuck detector, after an observation) lets that call run too.  The calls a
stop would have saved are the run's calls from there to its end.

A **strict loop of k** is k calls in a row with the same call (``args_hash``: tool and
arguments) and the same result (``result_hash``).  A rule **catches** a loop (a run's first
strict loop of k, or a loop ``loopwatch plant`` planted) when its first stop falls inside it:
no earlier than the loop's first call (``stop >= start``, the loop's first call refused) and
no later than the call right after its last (``stop <= start + length``).  "Calls into the
loop" is how many of the loop's calls ran before the stop (``stop - start``, 0 to the loop's
length).  A first stop before the loop began is not a catch: it is counted on its own
(``stopped_before_loop``), as the stop of a run the rule would have ended for another reason.

A run's outcome label is its ``run.ended`` reason (``loopwatch import`` writes them):
successful is ``completed`` (the clients' normal end), ``resolved`` (SWE-bench) or
``reward:<r>`` with r >= 1 (tau-bench); ``unresolved``, ``failed``, ``max-iterations``,
``error``, ``reward:<r>`` below 1 and ``planted:...`` (``loopwatch plant``) are unsuccessful; anything
else is unlabelled.  A block or abort in a successful run is a **false alarm**, of one of two
kinds: a stop inside a strict loop of ``STRICT_LOOP`` (3) or more calls of the run (within the
loop or on the call right after it, as a catch is counted) is a stop of a real loop in a run
that still succeeded; any other is a **pure false alarm**, a stop with no loop to show for it.

A planted run (``run.ended`` reason ``planted:<shape>:<start>:<length>``) is also counted by
shape: the planted loops each row caught inside their span, those it stopped before the span,
and how many calls into the loop.  Planted loops need not be strict (edit/test alternation,
near-identical arguments and cycles of 3 are not), so this is where the rules that read more
than repeats show.

The calls-into-the-loop distribution of each row's catches is reported as nearest-rank
percentiles and a histogram (calls into the loop: catches).

A row whose config turns on ``loopwatch.detectors.earlyWarning`` (or ``evaluate --early-warning``)
also reports its **early warnings** (detector ``early_warning``, warn-only) on their own: on
planted runs, the share warned before the loop's first call (the last such warning's **lead**, in
calls: ``start - warned``, the warned call being the ``warned``-th), the share whose first warning
after that falls inside the loop instead (``start <= warned <= start + length``, calls into the
loop as for a catch), and the share never warned up to the loop's end; on successful runs, the
runs warned and the warnings per 1,000 calls, the rate at which a warning before a loop would
come by chance.

The reference rows are the peers' own simple rules, written here from their descriptions
(docs/evaluation.md cites the sources); they are not engine profiles and judge only the
hashes the events carry:

* **Roo Code** (``ToolRepetitionDetector``, ``consecutiveIdenticalToolCallLimit`` 3): a call
  identical to the one before counts up (the first of a streak counts 0); at 3 the call is
  refused and the count starts again.  So 3 identical calls run and the 4th is refused.
* **Gemini CLI** (``LoopDetectionService``): the 5th identical call in a row is a loop
  (``TOOL_CALL_LOOP_THRESHOLD`` 5), and so is a cycle of 1 to 5 calls repeated 5 times in a
  row; the call that completes it is not run (the turn is stopped).
* **OpenHands** (``StuckDetector``): after an observation, the last 4 actions identical with
  the last 4 observations identical, or the last 3 actions identical with 3 error observations,
  is stuck: the run ends (an abort).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from schemas.events import RunEnded, ToolCallCompleted
from schemas.names import EARLY_WARNING

from ..engine import LoopEngine, RunDriver, outcome
from ..engine.drive import BLOCK, WARN
from .backtest import BacktestError, checked, records_sharded
from .plant import SHAPES, Planted, parse_planted

__all__ = [
    "LOOP_LENGTHS",
    "STRICT_LOOP",
    "EngineRow",
    "Evaluation",
    "ReferenceRow",
    "RunResult",
    "REFERENCE_ROWS",
    "caught_at",
    "distribution",
    "distribution_path",
    "early_warned",
    "evaluate_run",
    "loop_spans",
    "is_successful",
    "median",
    "percentile",
    "plot",
    "render_table",
    "strict_loops",
]

LOOP_LENGTHS = (3, 5, 10)
STRICT_LOOP = 3
"""A stop on a successful run inside a strict loop of this many calls or more is not a pure
false alarm (module docstring)."""
PERCENTILES = (25, 50, 75, 90)
SUCCESSFUL = frozenset({"completed", "resolved"})
UNSUCCESSFUL = frozenset({"unresolved", "failed", "max-iterations", "error"})


def is_successful(reason: str | None, successful: frozenset[str] = SUCCESSFUL) -> bool | None:
    """True, False or None (unlabelled) for a ``run.ended`` reason (module docstring)."""
    if reason is None:
        return None
    if reason.startswith("planted:"):  # loopwatch plant: a loop was planted into the run
        return False
    if reason.startswith("reward:"):
        try:
            return float(reason[7:]) >= 1.0
        except ValueError:
            return None
    if reason in successful:
        return True
    if reason in UNSUCCESSFUL:
        return False
    return None


@dataclass(frozen=True, slots=True)
class Stops:
    """Where a row first warned, blocked and aborted a run (calls executed before; None:
    never), and how many blocks it gave."""

    warn: int | None = None
    block: int | None = None
    abort: int | None = None
    blocks: int = 0
    early: tuple[int, ...] = ()
    """Where each of the row's early warnings fell (calls executed before), in order."""

    @property
    def stop(self) -> int | None:
        """The first block or abort."""
        if self.block is None:
            return self.abort
        return self.block if self.abort is None else min(self.block, self.abort)


class EngineRow:
    """A config (or profile) through the engine, as the worker would run it."""

    kind = "config"

    def __init__(self, name: str, engine: LoopEngine) -> None:
        self.name = name
        self.engine = engine
        config = engine.config
        self.early = any(config.settings_for(agent).early_warning is not None for agent in (None, *config.agent_ids()))
        """Whether the row's config turns the early warning on (its figures are reported)."""

    def judge(self, events: Sequence[Any], calls: Sequence[tuple[str, str | None, bool]]) -> Stops:
        driver = RunDriver(self.engine)
        handle = driver.handle
        executed = blocks = 0
        warn = block = abort = None
        early: list[int] = []
        for event in events:
            step = handle(event, "run", validated=True)
            rank = outcome(step)
            if rank:
                if rank == WARN:
                    if warn is None:
                        warn = executed
                    if step.detection is not None and step.detection.detector == EARLY_WARNING:
                        early.append(executed)
                elif rank == BLOCK:
                    blocks += 1
                    if block is None:
                        block = executed
                elif abort is None:  # ABORT
                    abort = executed
            if type(event) is ToolCallCompleted:
                executed += 1
        return Stops(warn, block, abort, blocks, tuple(early))


class ReferenceRow:
    """A peer's simple rule over a run's calls (``(args_hash, result_hash, is_error)``)."""

    kind = "reference"
    early = False

    def __init__(self, name: str, rule: Callable[[Sequence[tuple[str, str | None, bool]]], Stops], source: str) -> None:
        self.name = name
        self.rule = rule
        self.source = source

    def judge(self, events: Sequence[Any], calls: Sequence[tuple[str, str | None, bool]]) -> Stops:
        return self.rule(calls)


def roo_code(calls: Sequence[tuple[str, str | None, bool]], limit: int = 3) -> Stops:
    """Roo Code's repetition rule: the call after ``limit`` identical calls in a row is refused
    (a block; the count starts again, as Roo's detector resets)."""
    first = None
    blocks = count = 0
    previous: str | None = None
    for i, (sig, _result, _error) in enumerate(calls):
        if sig == previous:
            count += 1
        else:
            count, previous = 0, sig
        if count >= limit:
            blocks += 1
            if first is None:
                first = i
            count, previous = 0, None
    return Stops(block=first, blocks=blocks)


def gemini_cli(calls: Sequence[tuple[str, str | None, bool]], repeats: int = 5, longest: int = 5) -> Stops:
    """Gemini CLI's loop rule: the call that makes 5 identical calls in a row, or a cycle of 1
    to ``longest`` calls repeated ``repeats`` times in a row, is stopped (a block)."""
    sigs = [c[0] for c in calls]
    first = None
    blocks = 0
    for i in range(len(sigs)):
        end = i + 1
        for period in range(1, longest + 1):
            span = period * repeats
            if end < span:
                break
            window = sigs[end - span : end]
            if window == sigs[end - period : end] * repeats:
                blocks += 1
                if first is None:
                    first = i
                break
    return Stops(block=first, blocks=blocks)


def openhands(calls: Sequence[tuple[str, str | None, bool]]) -> Stops:
    """OpenHands' stuck detector: after the 4th of 4 identical action/observation pairs, or the
    3rd of 3 identical actions that each ended in an error, the run ends (an abort)."""
    for i in range(len(calls)):
        end = i + 1
        if end >= 4 and len(set(calls[end - 4 : end])) == 1:
            return Stops(abort=end)
        if end >= 3:
            last = calls[end - 3 : end]
            if len({c[0] for c in last}) == 1 and all(c[2] for c in last):
                return Stops(abort=end)
    return Stops()


REFERENCE_ROWS = (
    ReferenceRow(
        "Roo Code (3 identical, 4th refused)", roo_code, "RooCodeInc/Roo-Code src/core/tools/ToolRepetitionDetector.ts"
    ),
    ReferenceRow(
        "Gemini CLI (5 identical; cycles of 1-5 x5)",
        gemini_cli,
        "google-gemini/gemini-cli packages/core/src/services/loopDetectionService.ts",
    ),
    ReferenceRow(
        "OpenHands (4 identical pairs; 3 identical errors)",
        openhands,
        "All-Hands-AI/OpenHands openhands/controller/stuck.py",
    ),
)


def caught_at(stop: int | None, start: int, length: int) -> int | None:
    """Calls into the loop at a stop that catches it (module docstring); None: no stop, or one
    outside the loop (before its first call, or after the call right after its last)."""
    if stop is None or stop < start or stop > start + length:
        return None
    return stop - start


def early_warned(positions: Sequence[int], start: int, length: int) -> tuple[str, int] | None:
    """A planted loop's early warning (module docstring): ``("before", lead)`` for the last
    warning before its first call, else ``("inside", calls into the loop)`` for the first one
    inside it, else None."""
    before = [p for p in positions if p < start]
    if before:
        return "before", start - before[-1]
    for p in positions:
        if start <= p <= start + length:
            return "inside", p - start
    return None


def loop_spans(calls: Sequence[tuple[str, str | None, bool]], least: int = STRICT_LOOP) -> list[tuple[int, int]]:
    """Every strict loop of at least ``least`` calls in the run: ``(calls before it, its
    length)``, in order (maximal: a loop is not also counted as its shorter parts)."""
    spans = []
    start, n = 0, len(calls)
    while start < n:
        key = calls[start][:2]
        end = start + 1
        while end < n and calls[end][:2] == key:
            end += 1
        if end - start >= least:
            spans.append((start, end - start))
        start = end
    return spans


def strict_loops(
    calls: Sequence[tuple[str, str | None, bool]], lengths: Iterable[int] = LOOP_LENGTHS
) -> dict[int, tuple[int, int]]:
    """For each k, the run's first strict loop of at least k calls: ``(calls before it, its
    length)`` (the same call with the same result, in a row)."""
    lengths = sorted(lengths)
    found: dict[int, tuple[int, int]] = {}
    start = 0
    n = len(calls)
    while start < n and len(found) < len(lengths):
        key = calls[start][:2]
        end = start + 1
        while end < n and calls[end][:2] == key:
            end += 1
        length = end - start
        for k in lengths:
            if k not in found and length >= k:
                found[k] = (start, length)
        start = end
    return found


@dataclass(slots=True)
class RunResult:
    """What one run contributes to the report."""

    key: str
    calls: int
    success: bool | None
    loops: dict[int, tuple[int, int]]
    stops: list[Stops]
    """Per row, in the rows' order."""
    spans: list[tuple[int, int]] = field(default_factory=list)
    """The run's strict loops of ``STRICT_LOOP`` or more calls (``loop_spans``)."""
    planted: Planted | None = None


def evaluate_run(
    key: str, events: Sequence[Any], rows: Sequence[Any], successful: frozenset[str] = SUCCESSFUL
) -> RunResult:
    """One run, every row: a function of the run's events only."""
    calls = [(e.args_hash, e.result_hash, e.is_error) for e in events if type(e) is ToolCallCompleted]
    last = events[-1] if events else None
    reason = last.reason if type(last) is RunEnded else None
    success = is_successful(reason, successful) if type(last) is RunEnded else None
    return RunResult(
        key,
        len(calls),
        success,
        strict_loops(calls),
        [row.judge(events, calls) for row in rows],
        loop_spans(calls),
        parse_planted(reason),
    )


def percentile(values: list[int], share: float) -> float | None:
    """The nearest-rank percentile (None: no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[max(0, math.ceil(share * len(ordered)) - 1)])


def median(values: list[int]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return float(ordered[mid]) if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def distribution(into: list[int]) -> dict:
    """Calls into the loop at each catch: nearest-rank percentiles and a histogram."""
    return {
        "percentiles": {f"p{p}": percentile(into, p / 100) for p in PERCENTILES},
        "histogram": {str(n): c for n, c in sorted(Counter(into).items())},
    }


@dataclass
class _Tally:
    warned: int = 0
    blocked: int = 0
    aborted: int = 0
    blocks: int = 0
    false_alarms: int = 0
    false_alarm_runs: list = field(default_factory=list)
    pure_false_alarm_runs: list = field(default_factory=list)
    stopped_runs: list = field(default_factory=list)
    saved: int = 0
    saved_unsuccessful: int = 0
    caught: dict = field(default_factory=lambda: {k: [] for k in LOOP_LENGTHS})
    before: dict = field(default_factory=lambda: {k: 0 for k in LOOP_LENGTHS})
    planted: dict = field(default_factory=lambda: {s: {"caught": [], "before": 0} for s in SHAPES})
    early_runs: int = 0
    early_warnings: int = 0
    early_successful_runs: list = field(default_factory=list)
    early_successful_warnings: int = 0
    early_lead: list = field(default_factory=list)
    early_into: list = field(default_factory=list)
    early_by_shape: dict = field(default_factory=lambda: {s: {"before": 0, "inside": 0} for s in SHAPES})


class Evaluation:
    """Feed records (``run``), then read the ``report``."""

    def __init__(self, rows: Sequence[Any], successful: Iterable[str] = SUCCESSFUL) -> None:
        self.rows = list(rows)
        self.successful = frozenset(successful)
        self.records = self.events = self.duplicates = 0
        self.dead: Counter = Counter()
        self.runs = self.calls = self.successful_calls = 0
        self.labels: Counter = Counter()
        self.loops = {k: 0 for k in LOOP_LENGTHS}
        self.loop_runs: dict[int, list[str]] = {k: [] for k in LOOP_LENGTHS}
        self.planted: Counter = Counter()
        self.tallies = [_Tally() for _ in self.rows]
        self.shard_cpu_s: list[float] = []
        """CPU seconds of each process of the last ``run`` in shards (``bench.evaluate``)."""

    def runs_of(
        self,
        numbered: Iterable[tuple[int, Any]],
        *,
        progress: Callable[[int], None] | None = None,
    ) -> Iterator[tuple[tuple[int, int], str, list]]:
        """Each run's events, checked as the worker checks them, when the run ends (at its
        ``run.ended``, or the end of the input), from ``(number in the stream, record)``; with
        the run's place in the order this yields the whole stream's runs: ``(0, number of its
        run.ended)``, or ``(1, number of its first event)`` for a run the input leaves open."""
        open_runs: dict[bytes, tuple[list, set, int]] = {}
        counted = [0]
        for seq, _record, event, key in checked(
            numbered, keyed=False, dead=self.dead, progress=progress, counted=counted
        ):
            run = open_runs.get(key)
            if run is None:
                run = open_runs[key] = ([], set(), seq)
            if event.event_id in run[1]:
                self.duplicates += 1
                continue
            run[1].add(event.event_id)
            run[0].append(event)
            self.events += 1
            if type(event) is RunEnded:
                del open_runs[key]
                yield (0, seq), _run_name(key), run[0]
        self.records += counted[0]
        for key, (events, _ids, first) in open_runs.items():
            yield (1, first), _run_name(key), events

    def run(self, records: Iterable[Any], *, progress: Callable[[int], None] | None = None, jobs: int = 1) -> None:
        """Every run judged by every row; with ``jobs`` above 1, the runs split by state key
        over that many processes (``streams.offline.backtest.records_sharded``) and their results
        added here in the order one process adds them: the same report, field for field."""
        if jobs <= 1:
            for _order, key, events in self.runs_of(enumerate(records), progress=progress):
                self.add(evaluate_run(key, events, self.rows, self.successful))
            return
        rows, successful = self.rows, self.successful

        def work(numbered: Iterator[tuple[int, Any]]) -> tuple[int, int, int, Counter, list]:
            shard = Evaluation(rows, successful)
            results = [
                (order, evaluate_run(key, events, rows, successful)) for order, key, events in shard.runs_of(numbered)
            ]
            return shard.records, shard.events, shard.duplicates, shard.dead, results

        merged = []
        for records_n, events, duplicates, dead, results in records_sharded(
            records, work, jobs, keyed=False, progress=progress, what="an evaluation", cpu_s=self.shard_cpu_s
        ):
            self.records += records_n
            self.events += events
            self.duplicates += duplicates
            self.dead.update(dead)
            merged.extend(results)
        merged.sort(key=lambda pair: pair[0])
        for _order, result in merged:
            self.add(result)

    def add(self, result: RunResult) -> None:
        """One run's result into the totals (in any order)."""
        self.runs += 1
        self.calls += result.calls
        self.labels[{True: "successful", False: "unsuccessful", None: "unlabelled"}[result.success]] += 1
        if result.success is True:
            self.successful_calls += result.calls
        for k, _loop in result.loops.items():
            self.loops[k] += 1
            self.loop_runs[k].append(result.key)
        planted = result.planted
        if planted is not None:
            self.planted[planted.shape] += 1
        for tally, stops in zip(self.tallies, result.stops):
            tally.warned += stops.warn is not None
            tally.blocked += stops.block is not None
            tally.aborted += stops.abort is not None
            tally.blocks += stops.blocks
            if stops.early:
                tally.early_runs += 1
                tally.early_warnings += len(stops.early)
                if result.success is True:
                    tally.early_successful_runs.append(result.key)
                    tally.early_successful_warnings += len(stops.early)
            if planted is not None:
                warned = early_warned(stops.early, planted.start, planted.length)
                if warned is not None:
                    (tally.early_lead if warned[0] == "before" else tally.early_into).append(warned[1])
                    tally.early_by_shape[planted.shape][warned[0]] += 1
            stop = stops.stop
            if stop is None:
                continue
            saved = result.calls - stop
            tally.saved += saved
            tally.stopped_runs.append(
                {"run": result.key, "successful": result.success, "calls": result.calls, "stopped_after": stop}
            )
            if result.success is True:
                tally.false_alarms += 1
                tally.false_alarm_runs.append(result.key)
                if all(caught_at(stop, start, length) is None for start, length in result.spans):
                    tally.pure_false_alarm_runs.append(result.key)
            elif result.success is False:
                tally.saved_unsuccessful += saved
            for k, (start, length) in result.loops.items():
                into = caught_at(stop, start, length)
                if into is not None:
                    tally.caught[k].append(into)
                elif stop < start:
                    tally.before[k] += 1
            if planted is not None:
                into = caught_at(stop, planted.start, planted.length)
                if into is not None:
                    tally.planted[planted.shape]["caught"].append(into)
                elif stop < planted.start:
                    tally.planted[planted.shape]["before"] += 1

    def report(self) -> dict:
        rows = []
        successful = self.labels["successful"]
        for row, tally in zip(self.rows, self.tallies):
            loops = {}
            for k in LOOP_LENGTHS:
                into = tally.caught[k]
                loops[str(k)] = {
                    "runs": self.loops[k],
                    "caught": len(into),
                    "rate": len(into) / self.loops[k] if self.loops[k] else None,
                    "stopped_before_loop": tally.before[k],
                    "calls_into_loop_median": median(into),
                    "calls_into_loop_p90": percentile(into, 0.9),
                    "calls_into_loop": distribution(into),
                }
            planted = {}
            for shape in SHAPES:
                if not self.planted[shape]:
                    continue
                into = tally.planted[shape]["caught"]
                planted[shape] = {
                    "runs": self.planted[shape],
                    "caught": len(into),
                    "rate": len(into) / self.planted[shape],
                    "stopped_before_loop": tally.planted[shape]["before"],
                    "calls_into_loop_median": median(into),
                    "calls_into_loop": distribution(into),
                }
            pure = len(tally.pure_false_alarm_runs)
            rows.append(
                {
                    "name": row.name,
                    "kind": row.kind,
                    "runs_warned": tally.warned,
                    "runs_blocked": tally.blocked,
                    "runs_aborted": tally.aborted,
                    "blocks": tally.blocks,
                    "loops": loops,
                    "planted": planted,
                    "false_alarms": tally.false_alarms,
                    "false_alarm_rate": tally.false_alarms / successful if successful else None,
                    "false_alarm_runs": sorted(tally.false_alarm_runs),
                    "false_alarms_in_strict_loops": tally.false_alarms - pure,
                    "pure_false_alarms": pure,
                    "pure_false_alarm_rate": pure / successful if successful else None,
                    "pure_false_alarm_runs": sorted(tally.pure_false_alarm_runs),
                    "stopped_runs": sorted(tally.stopped_runs, key=lambda r: r["run"]),
                    "calls_saved": tally.saved,
                    "calls_saved_in_unsuccessful_runs": tally.saved_unsuccessful,
                    **({"source": row.source} if row.kind == "reference" else {}),
                    **({"early_warning": self._early_report(tally)} if row.early else {}),
                }
            )
        return {
            "records": self.records,
            "events": self.events,
            "duplicates": self.duplicates,
            "dead_letters": dict(sorted(self.dead.items())),
            "runs": self.runs,
            "tool_calls": self.calls,
            "labels": {k: self.labels[k] for k in ("successful", "unsuccessful", "unlabelled")},
            "strict_loops": {
                str(k): {"runs": self.loops[k], "examples": sorted(self.loop_runs[k])[:20]} for k in LOOP_LENGTHS
            },
            "planted_loops": {shape: self.planted[shape] for shape in SHAPES if self.planted[shape]},
            "rows": rows,
        }

    def _early_report(self, tally: _Tally) -> dict:
        planted = sum(self.planted.values())
        successful = self.labels["successful"]
        lead, into = tally.early_lead, tally.early_into
        return {
            "runs_warned": tally.early_runs,
            "warnings": tally.early_warnings,
            "planted_runs": planted,
            "warned_before_loop": len(lead),
            "warned_before_loop_rate": len(lead) / planted if planted else None,
            "lead_calls_median": median(lead),
            "lead_calls_p90": percentile(lead, 0.9),
            "lead_calls": distribution(lead),
            "warned_in_loop": len(into),
            "calls_into_loop_median": median(into),
            "not_warned": planted - len(lead) - len(into),
            "by_shape": {
                shape: {"runs": self.planted[shape], **tally.early_by_shape[shape]}
                for shape in SHAPES
                if self.planted[shape]
            },
            "successful_runs": successful,
            "successful_runs_warned": len(tally.early_successful_runs),
            "successful_runs_warned_rate": len(tally.early_successful_runs) / successful if successful else None,
            "successful_warnings_per_1000_calls": 1000 * tally.early_successful_warnings / self.successful_calls
            if self.successful_calls
            else None,
            "successful_runs_warned_examples": sorted(tally.early_successful_runs)[:20],
        }


# -- output ----------------------------------------------------------------------------------------


def _cell(loop: dict) -> str:
    if not loop["runs"]:
        return "-"
    text = f"{loop['caught']}/{loop['runs']}"
    if loop["caught"]:
        text += f" ({loop['calls_into_loop_median']:g}, {loop['calls_into_loop_p90']:g})"
    return text


def render_table(report: dict, out: IO[str]) -> None:
    w = out.write
    labels = report["labels"]
    w(
        f"{report['runs']:,} runs, {report['tool_calls']:,} tool calls ({labels['successful']:,} successful, "
        f"{labels['unsuccessful']:,} unsuccessful, {labels['unlabelled']:,} unlabelled); strict loops "
        + ", ".join(f"of {k}+: {v['runs']:,} runs" for k, v in report["strict_loops"].items())
        + "\n"
    )
    dead = report["dead_letters"]
    if dead or report["duplicates"]:
        w(
            f"skipped: {report['duplicates']:,} duplicates, {sum(dead.values()):,} records the worker would refuse"
            + (" (" + ", ".join(f"{k} {v:,}" for k, v in dead.items()) + ")" if dead else "")
            + "\n"
        )
    w(
        "loops: caught/runs with one (median, p90 calls into the loop before the stop); a stop before the loop "
        "is not a catch (before 5+: such stops); false alarms: stops of successful runs, pure: outside any "
        f"strict loop of {STRICT_LOOP}+\n\n"
    )
    rows = report["rows"]
    nw = max(4, *(len(r["name"]) for r in rows))
    heads = (
        ("warned", "blocked", "aborted")
        + tuple(f"loops {k}+" for k in LOOP_LENGTHS)
        + ("before 5+", "false alarms", "pure", "calls saved")
    )
    widths = (7, 7, 7, 16, 16, 16, 9, 12, 6, 11)
    w(f"{'row':<{nw}}  " + "  ".join(f"{h:>{wd}}" for h, wd in zip(heads, widths)) + "\n")
    for r in rows:
        cells = (
            r["runs_warned"],
            r["runs_blocked"],
            r["runs_aborted"],
            *(_cell(r["loops"][str(k)]) for k in LOOP_LENGTHS),
            r["loops"]["5"]["stopped_before_loop"],
            r["false_alarms"],
            r["pure_false_alarms"],
            r["calls_saved"],
        )
        w(
            f"{r['name']:<{nw}}  "
            + "  ".join(f"{c:>{wd}}" if isinstance(c, str) else f"{c:>{wd},}" for c, wd in zip(cells, widths))
            + "\n"
        )
    shapes = list(report.get("planted_loops", {}))
    if shapes:
        w(
            "\nplanted loops caught inside their span, by shape: caught/planted (median calls into the loop) b<n>: n stopped before their loop\n"
        )
        sw = max(16, *(len(s) for s in shapes))
        w(f"{'row':<{nw}}  " + "  ".join(f"{s:>{sw}}" for s in shapes) + "\n")
        for r in rows:
            texts: list[str] = []
            for shape in shapes:
                p = r["planted"][shape]
                text = f"{p['caught']}/{p['runs']}"
                if p["caught"]:
                    text += f" ({p['calls_into_loop_median']:g})"
                if p["stopped_before_loop"]:
                    text += f" b{p['stopped_before_loop']}"
                texts.append(text)
            w(f"{r['name']:<{nw}}  " + "  ".join(f"{c:>{sw}}" for c in texts) + "\n")
    early = [r for r in rows if "early_warning" in r]
    if early:
        w(
            "\nearly warnings (loopwatch.detectors.earlyWarning, warn-only): planted loops warned before their first "
            "call (median, p90 lead in calls), warned inside the loop instead, never; successful runs warned, "
            "warnings per 1,000 calls of successful runs\n"
        )
        for r in early:
            e = r["early_warning"]
            before = f"{e['warned_before_loop']}/{e['planted_runs']}"
            if e["warned_before_loop"]:
                before += f" ({e['lead_calls_median']:g}, {e['lead_calls_p90']:g})"
            rate = e["successful_warnings_per_1000_calls"]
            w(
                f"  {r['name']}: before the loop {before}; inside it {e['warned_in_loop']}; never {e['not_warned']}; "
                f"successful runs warned {e['successful_runs_warned']}/{e['successful_runs']}"
                + (f", {rate:.2f} per 1,000 calls" if rate is not None else "")
                + "\n"
            )
    if any(r["false_alarm_runs"] for r in rows):
        w("\nfalse alarms (blocked or aborted runs labelled successful; *: pure, outside any strict loop):\n")
        for r in rows:
            runs = r["false_alarm_runs"]
            if not runs:
                continue
            pure = set(r["pure_false_alarm_runs"])
            shown = [f"{run}*" if run in pure else run for run in runs[:10]]
            w(f"  {r['name']}: {', '.join(shown)}" + (f" ... {len(runs) - 10} more" if len(runs) > 10 else "") + "\n")


def distribution_path(path: Path) -> Path:
    """Where ``plot`` writes the calls-into-the-loop chart beside the catch-rate chart."""
    return path.with_name(f"{path.stem}-calls-into-loop{path.suffix or '.png'}")


def plot(report: dict, path: Path) -> None:
    """Catch rate against false-alarm rate, each row its own colour and marker shape, a size
    per loop length (3+, 5+, 10+; ``streams.offline.plots.scatter_chart``); and beside it
    (``distribution_path``) each row's calls into the loop at its catches of strict loops of 5+
    (percentiles 25, 50, 75, 90; ``distribution_chart``)."""
    from .plots import Marker, PlotError, Points, Spread, distribution_chart, row_styles, save, scatter_chart

    markers = {
        "3": Marker("o", 16, "strict loops of 3+ calls (largest)"),
        "5": Marker("s", 10.5, "strict loops of 5+ calls"),
        "10": Marker("^", 7.5, "strict loops of 10+ calls (smallest)"),
    }
    styles = row_styles(len(report["rows"]))
    rows, spreads = [], []
    for (color, shape), row in zip(styles, report["rows"]):
        fa = 100 * (row["false_alarm_rate"] or 0.0)
        points = [(fa, 100 * row["loops"][k]["rate"], k) for k in markers if row["loops"][k]["rate"] is not None]
        rows.append(Points(row["name"], points, color, shape))
        pct = row["loops"]["5"]["calls_into_loop"]["percentiles"]
        spreads.append(Spread(row["name"], pct["p25"], pct["p50"], pct["p75"], pct["p90"], color, shape))
    loops = {k: v["runs"] for k, v in report["strict_loops"].items()}
    try:
        fig = scatter_chart(
            rows,
            markers=markers,
            title=f"loopwatch evaluate: {report['runs']:,} runs, {report['labels']['successful']:,} successful; "
            f"runs with strict loops of 3+/5+/10+ calls: {loops['3']}/{loops['5']}/{loops['10']}",
            xlabel="false-alarm rate, % (runs labelled successful that the row blocked or aborted)",
            ylabel="catch rate, % (runs with a strict loop stopped in it)",
            empty="no strict loops in these runs",
        )
        save(fig, path)
        fig = distribution_chart(
            spreads,
            title=f"calls into the loop at each catch of a strict loop of 5+ calls ({loops['5']} runs have one)",
            xlabel="calls into the loop before the stop: bar 25th-75th percentile, line to the 90th, marker the median",
            empty="no strict loop of 5+ calls caught",
        )
        save(fig, distribution_path(path))
    except PlotError as exc:
        raise BacktestError(str(exc)) from None


def _run_name(key: bytes) -> str:
    """A run's name in the report: its state key without the ``run:`` prefix."""
    name = key.decode("utf-8", "replace")
    return name[4:] if name.startswith("run:") else name
