"""What ``loopwatch evaluate`` counts as a catch, a stop before the loop, a stop inside a strict
loop of a run that succeeded and a pure false alarm, planted loops by shape, and the
calls-into-the-loop distribution.  The runs are written here call by call and each row stops
at a fixed place (a reference row whose rule returns it), so every figure is counted by hand
from the positions alone.

Calls are numbered from 0; a stop at s means calls 0..s-1 ran.  A loop at (start, length) is
caught by a stop s with start <= s <= start + length (the loop's first call refused, up to the
call right after its last), s - start calls into it."""

from __future__ import annotations

import json
from pathlib import Path

from harness.cli import loopwatch
from schemas.events import ToolCallCompleted
from streams.edge.events import completed_event, requested_event, run_ended_event
from streams.offline.evaluate import Evaluation, ReferenceRow, Stops, evaluate_run, loop_spans

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "transcripts"


def run(name: str, calls: list[tuple[str, str]], reason: str) -> list:
    """Events of a run: each call ``(command, output)``."""
    ids = {"run_id": name, "session_key": name}
    events = []
    for n, (command, output) in enumerate(calls):
        args = {"command": command}
        events.append(requested_event(f"{name}#{n}", "bash", args, ts_ms=n, **ids))
        events.append(completed_event(f"{name}#{n}r", "bash", args, result=output, ts_ms=n, **ids))
    events.append(run_ended_event(f"{name}#end", reason, ts_ms=999, **ids))
    return events


def fixed(stops: dict[int, int]) -> ReferenceRow:
    """A row that stops a run (told apart by its call count) after a fixed number of calls."""
    return ReferenceRow(f"stop {stops}", lambda calls: Stops(block=stops.get(len(calls))), "test")


# L: unsuccessful, 8 calls: a, b, c, then x 5 times (a strict loop of 5 at start 3).
LOOPED = run("L", [("a", "1"), ("b", "2"), ("c", "3")] + [("x", "same")] * 5, "unresolved")
# S: successful, 7 calls: p, q, then y 3 times (a strict loop of 3 at start 2), then r, s.
SUCCEEDED = run("S", [("p", "1"), ("q", "2")] + [("y", "same")] * 3 + [("r", "3"), ("s", "4")], "resolved")
# P: a planted cycle of 3 calls over 6 calls at start 1 (not a strict loop), 8 calls in all.
CYCLE = [("c1", "o1"), ("c2", "o2"), ("c3", "o3")]
PLANTED = run("P", [("m", "1")] + CYCLE * 2 + [("n", "2")], "planted:cycle-3:1:6")


def report(*stops: dict[int, int]) -> dict:
    rows = [fixed(s) for s in stops]
    evaluation = Evaluation(rows)
    for key, events in (("L", LOOPED), ("S", SUCCEEDED), ("P", PLANTED)):
        evaluation.add(evaluate_run(key, events, rows))
    return {row["name"]: row for row in evaluation.report()["rows"]}


def test_the_runs_are_what_the_docstring_says():
    def calls(events):
        return [(e.args_hash, e.result_hash, e.is_error) for e in events if type(e) is ToolCallCompleted]

    assert loop_spans(calls(LOOPED)) == [(3, 5)]
    assert loop_spans(calls(SUCCEEDED)) == [(2, 3)]
    assert loop_spans(calls(PLANTED)) == []


def test_a_stop_before_the_loop_is_not_a_catch():
    # L (8 calls): stop 2 is before the loop (start 3); 3 refuses its first call (0 in);
    # 8 = 3 + 5 stops the call right after it (5 in). P (8 calls as well) is stopped alike.
    rows = report({8: 2}, {8: 3}, {8: 8})
    before, first, after = rows.values()
    assert before["loops"]["5"] | {"calls_into_loop": None} == {
        "runs": 1, "caught": 0, "rate": 0.0, "stopped_before_loop": 1,
        "calls_into_loop_median": None, "calls_into_loop_p90": None, "calls_into_loop": None,
    }  # fmt: skip
    assert (first["loops"]["5"]["caught"], first["loops"]["5"]["calls_into_loop_median"]) == (1, 0)
    assert (after["loops"]["5"]["caught"], after["loops"]["5"]["calls_into_loop_median"]) == (1, 5)
    assert first["loops"]["5"]["stopped_before_loop"] == after["loops"]["5"]["stopped_before_loop"] == 0


def test_a_stop_past_the_call_after_the_loop_is_neither_caught_nor_before():
    # S has 7 calls and its loop of 3 starts at 2: stop 6 comes after the call right after the
    # loop (stop 5), so no catch; and S is successful: a pure false alarm.
    rows = report({7: 6})
    (row,) = rows.values()
    assert row["loops"]["3"]["caught"] == 0 and row["loops"]["3"]["stopped_before_loop"] == 0
    assert (row["false_alarms"], row["false_alarms_in_strict_loops"], row["pure_false_alarms"]) == (1, 0, 1)
    assert row["pure_false_alarm_runs"] == ["S"] and row["pure_false_alarm_rate"] == 1.0


def test_a_stop_inside_a_strict_loop_of_a_successful_run_is_not_pure():
    # S: stops 2 (first call of y refused), 4 (2 of y ran) and 5 (the call right after it) are
    # inside the loop of 3; stop 1 is before it: pure.
    for stop, pure in ((1, 1), (2, 0), (4, 0), (5, 0)):
        (row,) = report({7: stop}).values()
        assert (row["false_alarms"], row["false_alarms_in_strict_loops"], row["pure_false_alarms"]) == (
            1,
            1 - pure,
            pure,
        ), stop


def test_planted_loops_by_shape_inside_their_span():
    # P: planted cycle-3 at start 1, 6 calls. The run has 8 calls, as L does, so one row stops both.
    before, inside, last = report({8: 0}, {8: 4}, {8: 7}).values()
    assert before["planted"] == {
        "cycle-3": {
            "runs": 1, "caught": 0, "rate": 0.0, "stopped_before_loop": 1, "calls_into_loop_median": None,
            "calls_into_loop": {"percentiles": {"p25": None, "p50": None, "p75": None, "p90": None}, "histogram": {}},
        }
    }  # fmt: skip
    assert inside["planted"]["cycle-3"]["caught"] == 1 and inside["planted"]["cycle-3"]["calls_into_loop_median"] == 3
    assert last["planted"]["cycle-3"]["calls_into_loop_median"] == 6  # 1 + 6 = 7: the call right after it


def test_the_calls_into_the_loop_distribution_is_counted_by_hand():
    # Five looped runs of 8 calls (loop of 5 at 3), stopped at 3, 4, 4, 6 and 8: 0, 1, 1, 3, 5 in.
    row = fixed({8: 0})
    evaluation = Evaluation([row])
    for n, stop in enumerate((3, 4, 4, 6, 8)):
        row.rule = lambda calls, stop=stop: Stops(block=stop)
        evaluation.add(evaluate_run(f"L{n}", LOOPED, [row]))
    loop = evaluation.report()["rows"][0]["loops"]["5"]
    # nearest rank over 0 1 1 3 5: p25 -> rank ceil(1.25) = 2 -> 1; p50 -> 3 -> 1; p75 -> 4 -> 3; p90 -> 5 -> 5
    assert loop["calls_into_loop"] == {
        "percentiles": {"p25": 1.0, "p50": 1.0, "p75": 3.0, "p90": 5.0},
        "histogram": {"0": 1, "1": 2, "3": 1, "5": 1},
    }


def test_every_profile_is_a_row(tmp_path):
    data = DATA / "hand-made" / "loops.json"
    events = tmp_path / "events.jsonl"
    assert loopwatch("import", data, "-o", events).returncode == 0
    args = [a for p in ("configurable-final", "latest", "gemini-cli", "openhands") for a in ("--profile", p)]
    proc = loopwatch("evaluate", events, *args, "--no-reference", "--json")
    assert proc.returncode == 0, proc.stderr
    names = [row["name"] for row in json.loads(proc.stdout)["rows"]]
    assert names == [
        "profile configurable-final (upstream defaults, enabled)",
        "profile latest (upstream defaults, enabled)",
        "profile gemini-cli (its system's defaults)",
        "profile openhands (its system's defaults)",
    ]
