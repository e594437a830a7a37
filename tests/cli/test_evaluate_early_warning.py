"""``loopwatch evaluate``'s early-warning figures: planted loops warned before their first call
(with the lead), warned inside the loop instead, never warned, and warnings on successful runs.

Every run below makes the same calls, ``A B C D E X X X X F G X X X`` (calls numbered from 0,
each one completed), under ``earlyWarning {window: 4, ratio: 0.5, minCalls: 5}``: by the
hand-worked case of tests/engine/test_early_warning.py the warnings fall on calls 7 and 13 (the
8th and 14th).  Only the labels differ, so each figure follows from the positions alone:

* P1 ``planted:identical-command:11:3``: the last warning before call 11 is call 7, lead 4;
* P2 ``planted:identical-command:6:3``: none before call 6; call 7 is inside 6..9, 1 call in;
* P3 ``planted:poll:2:2``: none before call 2, none in 2..4: never warned;
* S1 ``resolved``: warned (2 warnings); S2 ``resolved``, 10 distinct calls: not warned;
  successful calls 14 + 10 = 24, so 2 warnings are 1000 * 2 / 24 = 83.33 per 1,000 calls."""

from __future__ import annotations

import json

import pytest

from harness.cli import loopwatch
from schemas.events import encode_event_lines
from streams.edge.events import completed_event, requested_event, run_ended_event
from streams.engine import engine_for
from streams.offline.evaluate import REFERENCE_ROWS, EngineRow, Evaluation, early_warned, evaluate_run

CALLS = "ABCDEXXXXFGXXX"
SMALL = {"window": 4, "ratio": 0.5, "minCalls": 5}
CONFIG = {"tools": {"loopDetection": {"enabled": True}}, "loopwatch": {"detectors": {"earlyWarning": SMALL}}}


def run(name: str, calls: str, reason: str) -> list:
    ids = {"run_id": name, "session_key": name}
    events = []
    for n, a in enumerate(calls):
        args = {"q": a}
        events.append(requested_event(f"{name}#{n}", "search", args, ts_ms=n, **ids))
        events.append(completed_event(f"{name}#{n}r", "search", args, result=f"r{a}", ts_ms=n, **ids))
    events.append(run_ended_event(f"{name}#end", reason, ts_ms=999, **ids))
    return events


RUNS = {
    "P1": run("P1", CALLS, "planted:identical-command:11:3"),
    "P2": run("P2", CALLS, "planted:identical-command:6:3"),
    "P3": run("P3", CALLS, "planted:poll:2:2"),
    "S1": run("S1", CALLS, "resolved"),
    "S2": run("S2", "abcdefghij", "resolved"),
}


def test_early_warned_by_hand():
    assert early_warned((7, 13), 11, 3) == ("before", 4)
    assert early_warned((7, 13), 6, 3) == ("inside", 1)
    assert early_warned((7, 13), 2, 2) is None
    assert early_warned((3, 7), 11, 3) == ("before", 4)  # the last warning before the loop
    assert early_warned((), 0, 5) is None


def test_the_row_reports_the_hand_counted_figures():
    rows = [EngineRow("early", engine_for(CONFIG)), *REFERENCE_ROWS]
    evaluation = Evaluation(rows)
    for key, events in RUNS.items():
        result = evaluate_run(key, events, rows)
        if key != "S2":
            assert result.stops[0].early == (7, 13)
        evaluation.add(result)
    report = evaluation.report()["rows"]
    early = report[0]["early_warning"]
    assert early | {"lead_calls": None, "successful_warnings_per_1000_calls": None} == {
        "runs_warned": 4,
        "warnings": 8,
        "planted_runs": 3,
        "warned_before_loop": 1,
        "warned_before_loop_rate": pytest.approx(1 / 3),
        "lead_calls_median": 4.0,
        "lead_calls_p90": 4.0,
        "lead_calls": None,
        "warned_in_loop": 1,
        "calls_into_loop_median": 1.0,
        "not_warned": 1,
        "by_shape": {
            "identical-command": {"runs": 2, "before": 1, "inside": 1},
            "poll": {"runs": 1, "before": 0, "inside": 0},
        },
        "successful_runs": 2,
        "successful_runs_warned": 1,
        "successful_runs_warned_rate": 0.5,
        "successful_warnings_per_1000_calls": None,
        "successful_runs_warned_examples": ["S1"],
    }
    assert early["successful_warnings_per_1000_calls"] == pytest.approx(83.333, abs=1e-3)
    assert early["lead_calls"]["histogram"] == {"4": 1}
    assert all("early_warning" not in row for row in report[1:])  # rows without it report none


def test_the_cli_row(tmp_path):
    events = tmp_path / "events.jsonl"
    events.write_bytes(encode_event_lines([e for run_events in RUNS.values() for e in run_events]))
    config = tmp_path / "early.json"
    config.write_text(json.dumps(CONFIG))
    proc = loopwatch("evaluate", events, "--early-warning", "--config", config, "--no-reference", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    assert [r["name"] for r in rows] == [
        "early",
        "early warning (upstream defaults, enabled, detectors.earlyWarning: true)",
    ]
    # The config row's figures are the hand-counted ones; the defaults (minCalls 20) warn on none
    # of these runs of at most 14 calls.
    assert (rows[0]["early_warning"]["warned_before_loop"], rows[0]["early_warning"]["warned_in_loop"]) == (1, 1)
    assert rows[1]["early_warning"]["runs_warned"] == 0
    text = loopwatch("evaluate", events, "--config", config, "--no-reference")
    assert (
        "early: before the loop 1/3 (4, 4); inside it 1; never 1; successful runs warned 1/2, 83.33 per 1,000 calls"
        in text.stdout
    )


def test_config_check_shows_the_early_warning_resolved(tmp_path):
    """Keys left out take the defaults (ratio 0.5, minCalls 20)."""
    config = tmp_path / "early.json"
    config.write_text(json.dumps({**CONFIG, "loopwatch": {"detectors": {"earlyWarning": {"window": 8}}}}))
    proc = loopwatch("config", "check", config, "--json")
    assert proc.returncode == 0, proc.stderr
    detectors = json.loads(proc.stdout)["(default)"]["loopwatch"]["detectors"]
    assert detectors == {
        "cycle": False,
        "nearIdentical": False,
        "earlyWarning": {"window": 8, "ratio": 0.5, "minCalls": 20},
    }
