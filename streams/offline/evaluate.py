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
arguments) and the same result (``result_hash``).  A rule catches a run's first such loop when
its first stop comes no later than right after the loop's last call; "calls into the loop" is
how many of the loop's calls ran before it (0: stopped before the loop began).

A run's outcome label is its ``run.ended`` reason (``loopwatch import`` writes them):
successful is ``completed`` (the clients' normal end), ``resolved`` (SWE-bench) or
``reward:<r>`` with r >= 1 (tau-bench); ``unresolved``, ``failed``, ``max-iterations``,
``error``, ``reward:<r>`` below 1 and ``planted:...`` (``loopwatch plant``) are unsuccessful; anything else is unlabelled.  A block or
abort in a successful run is a **false alarm**.

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

from ..engine import LoopEngine, RunDriver, outcome
from ..engine.drive import BLOCK, WARN
from .backtest import BacktestError, checked, records_sharded

__all__ = [
    "LOOP_LENGTHS",
    "EngineRow",
    "Evaluation",
    "ReferenceRow",
    "RunResult",
    "REFERENCE_ROWS",
    "evaluate_run",
    "is_successful",
    "plot",
    "render_table",
    "strict_loops",
]

LOOP_LENGTHS = (3, 5, 10)
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

    def judge(self, events: Sequence[Any], calls: Sequence[tuple[str, str | None, bool]]) -> Stops:
        driver = RunDriver(self.engine)
        handle = driver.handle
        executed = blocks = 0
        warn = block = abort = None
        for event in events:
            step = handle(event, "run", validated=True)
            rank = outcome(step)
            if rank:
                if rank == WARN:
                    if warn is None:
                        warn = executed
                elif rank == BLOCK:
                    blocks += 1
                    if block is None:
                        block = executed
                elif abort is None:  # ABORT
                    abort = executed
            if type(event) is ToolCallCompleted:
                executed += 1
        return Stops(warn, block, abort, blocks)


class ReferenceRow:
    """A peer's simple rule over a run's calls (``(args_hash, result_hash, is_error)``)."""

    kind = "reference"

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


def evaluate_run(
    key: str, events: Sequence[Any], rows: Sequence[Any], successful: frozenset[str] = SUCCESSFUL
) -> RunResult:
    """One run, every row: a function of the run's events only."""
    calls = [(e.args_hash, e.result_hash, e.is_error) for e in events if type(e) is ToolCallCompleted]
    last = events[-1] if events else None
    success = is_successful(last.reason, successful) if type(last) is RunEnded else None
    return RunResult(key, len(calls), success, strict_loops(calls), [row.judge(events, calls) for row in rows])


def _percentile(values: list[int], share: float) -> float | None:
    """The nearest-rank percentile (None: no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[max(0, math.ceil(share * len(ordered)) - 1)])


def _median(values: list[int]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return float(ordered[mid]) if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


@dataclass
class _Tally:
    warned: int = 0
    blocked: int = 0
    aborted: int = 0
    blocks: int = 0
    false_alarms: int = 0
    false_alarm_runs: list = field(default_factory=list)
    stopped_runs: list = field(default_factory=list)
    saved: int = 0
    saved_unsuccessful: int = 0
    caught: dict = field(default_factory=lambda: {k: [] for k in LOOP_LENGTHS})


class Evaluation:
    """Feed records (``run``), then read the ``report``."""

    def __init__(self, rows: Sequence[Any], successful: Iterable[str] = SUCCESSFUL) -> None:
        self.rows = list(rows)
        self.successful = frozenset(successful)
        self.records = self.events = self.duplicates = 0
        self.dead: Counter = Counter()
        self.runs = self.calls = 0
        self.labels: Counter = Counter()
        self.loops = {k: 0 for k in LOOP_LENGTHS}
        self.loop_runs: dict[int, list[str]] = {k: [] for k in LOOP_LENGTHS}
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
        for k, _loop in result.loops.items():
            self.loops[k] += 1
            self.loop_runs[k].append(result.key)
        for tally, stops in zip(self.tallies, result.stops):
            tally.warned += stops.warn is not None
            tally.blocked += stops.block is not None
            tally.aborted += stops.abort is not None
            tally.blocks += stops.blocks
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
            elif result.success is False:
                tally.saved_unsuccessful += saved
            for k, (start, length) in result.loops.items():
                if stop <= start + length:
                    tally.caught[k].append(max(0, stop - start))

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
                    "calls_into_loop_median": _median(into),
                    "calls_into_loop_p90": _percentile(into, 0.9),
                }
            rows.append(
                {
                    "name": row.name,
                    "kind": row.kind,
                    "runs_warned": tally.warned,
                    "runs_blocked": tally.blocked,
                    "runs_aborted": tally.aborted,
                    "blocks": tally.blocks,
                    "loops": loops,
                    "false_alarms": tally.false_alarms,
                    "false_alarm_rate": tally.false_alarms / successful if successful else None,
                    "false_alarm_runs": sorted(tally.false_alarm_runs),
                    "stopped_runs": sorted(tally.stopped_runs, key=lambda r: r["run"]),
                    "calls_saved": tally.saved,
                    "calls_saved_in_unsuccessful_runs": tally.saved_unsuccessful,
                    **({"source": row.source} if row.kind == "reference" else {}),
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
            "rows": rows,
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
    w("loops: caught/runs with one (median, p90 calls into the loop before the stop)\n\n")
    rows = report["rows"]
    nw = max(4, *(len(r["name"]) for r in rows))
    heads = (
        ("warned", "blocked", "aborted") + tuple(f"loops {k}+" for k in LOOP_LENGTHS) + ("false alarms", "calls saved")
    )
    widths = (7, 7, 7, 16, 16, 16, 12, 11)
    w(f"{'row':<{nw}}  " + "  ".join(f"{h:>{wd}}" for h, wd in zip(heads, widths)) + "\n")
    for r in rows:
        cells = (
            r["runs_warned"],
            r["runs_blocked"],
            r["runs_aborted"],
            *(_cell(r["loops"][str(k)]) for k in LOOP_LENGTHS),
            r["false_alarms"],
            r["calls_saved"],
        )
        w(
            f"{r['name']:<{nw}}  "
            + "  ".join(f"{c:>{wd}}" if isinstance(c, str) else f"{c:>{wd},}" for c, wd in zip(cells, widths))
            + "\n"
        )
    alarms = [(r["name"], r["false_alarm_runs"]) for r in rows if r["false_alarm_runs"]]
    if alarms:
        w("\nfalse alarms (blocked or aborted runs labelled successful):\n")
        for name, runs in alarms:
            w(f"  {name}: {', '.join(runs[:10])}" + (f" ... {len(runs) - 10} more" if len(runs) > 10 else "") + "\n")


def plot(report: dict, path: Path) -> None:
    """Catch rate against false-alarm rate, a colour per row and a marker per loop length
    (3+, 5+, 10+; ``streams.offline.plots.scatter_chart``)."""
    from .plots import ROW_COLORS, Marker, PlotError, Points, save, scatter_chart

    markers = {
        "3": Marker("o", 16, "strict loops of 3+ calls"),
        "5": Marker("s", 10.5, "strict loops of 5+ calls"),
        "10": Marker("^", 7.5, "strict loops of 10+ calls"),
    }
    rows = []
    for i, row in enumerate(report["rows"]):
        fa = 100 * (row["false_alarm_rate"] or 0.0)
        points = [(fa, 100 * row["loops"][k]["rate"], k) for k in markers if row["loops"][k]["rate"] is not None]
        rows.append(Points(row["name"], points, ROW_COLORS[i % len(ROW_COLORS)]))
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
    except PlotError as exc:
        raise BacktestError(str(exc)) from None


def _run_name(key: bytes) -> str:
    """A run's name in the report: its state key without the ``run:`` prefix."""
    name = key.decode("utf-8", "replace")
    return name[4:] if name.startswith("run:") else name
