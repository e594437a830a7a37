"""``loopwatch evaluate`` (issue 28): a hand-made transcript whose every figure was counted by
hand, a real resolved SWE-bench run that two peers would have stopped, the peers' rules
against their plain descriptions under hypothesis, and bad input.

``tests/data/transcripts/hand-made/loops.json`` (tau-bench's format), counted by hand (calls
numbered from 1; "executed" is the calls that ran before the stop):

* A, reward 0: ``read``, then ``run_tests`` -> the same failure 7 times (calls 2-8: a strict
  loop of 7, 1 call before it), ``edit``: 9 calls.  Roo Code refuses call 5 (3 identical calls
  counted after the first): 4 executed, 3 into the loop, 5 saved.  Gemini CLI stops call 6
  (the 5th identical): 5 executed, 4 into the loop, 4 saved.  OpenHands is stuck after call 5
  (4 identical pairs): 5 executed, 4 into the loop, 4 saved.  The recommended config
  (history 6, critical 4) blocks call 6, whose 4 earlier outcomes in the history are one
  failure: 5 executed, 4 into the loop, 4 saved.  Upstream's defaults block at 20: nothing.
* B, reward 1 (successful): ``ls``, ``cat f`` -> the same text 4 times (a loop of 4), ``finish``:
  6 calls.  Roo Code refuses the 4th ``cat`` (call 5): 4 executed, 3 into the loop, 2 saved; a
  false alarm.  OpenHands: stuck after call 5, 1 saved; a false alarm.  Gemini CLI needs 5; the
  recommended config needs 4 earlier equal outcomes: neither fires.
* C, reward 0: ``run make`` 3 times, each a different ``Error: ...``, then ``fix``: no strict
  loop (the results differ).  Only OpenHands fires: 3 identical erroring actions, stuck after
  call 3, 1 saved.
* D, reward 0: ``a b c`` 5 times (15 calls).  Gemini CLI fires: a cycle of 3 repeated 5
  times completes at call 15, stopped: 14 executed, 1 saved.  The recommended config's cycle
  detector blocks call 6, the first whose tail (calls 1-6) holds the cycle twice, 6 calls, at
  least its critical 4: 5 executed, 10 saved (no strict loop: not counted as a catch).
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.cli import loopwatch, one_line_error
from streams.offline.evaluate import gemini_cli, openhands, roo_code, strict_loops

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "transcripts"


def report_for(tmp_path: Path, transcripts: list[Path], *options: object) -> dict:
    events = tmp_path / "events.jsonl.gz"
    proc = loopwatch("import", *transcripts, "-o", events)
    assert proc.returncode == 0, proc.stderr
    proc = loopwatch("evaluate", events, "--json", *options)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def by_name(report: dict) -> dict:
    return {row["name"].split(" (")[0]: row for row in report["rows"]}


def summary(row: dict) -> dict:
    loops = {
        k: (v["caught"], v["runs"], v["calls_into_loop_median"], v["calls_into_loop_p90"])
        for k, v in row["loops"].items()
    }
    return {
        "warned": row["runs_warned"],
        "blocked": row["runs_blocked"],
        "aborted": row["runs_aborted"],
        "loops": loops,
        "false_alarms": row["false_alarms"],
        "saved": row["calls_saved"],
    }


def test_hand_counted_transcript(tmp_path):
    report = report_for(
        tmp_path,
        [DATA / "hand-made" / "loops.json"],
        "--profile",
        "configurable-final",
        "--config",
        REPO / "examples" / "recommended.yaml",
    )
    assert report["runs"] == 4 and report["tool_calls"] == 9 + 6 + 4 + 15
    assert report["labels"] == {"successful": 1, "unsuccessful": 3, "unlabelled": 0}
    assert {k: v["runs"] for k, v in report["strict_loops"].items()} == {"3": 2, "5": 1, "10": 0}
    rows = {name: summary(row) for name, row in by_name(report).items()}
    none = (0, 0, None, None)
    assert rows["profile configurable-final"] == {
        "warned": 0,
        "blocked": 0,
        "aborted": 0,
        "loops": {"3": (0, 2, None, None), "5": (0, 1, None, None), "10": none},
        "false_alarms": 0,
        "saved": 0,
    }
    assert rows["recommended"] == {
        "warned": 0,
        "blocked": 2,
        "aborted": 0,
        "loops": {"3": (1, 2, 4, 4), "5": (1, 1, 4, 4), "10": none},
        "false_alarms": 0,
        "saved": 4 + 10,
    }
    assert rows["Roo Code"] == {
        "warned": 0,
        "blocked": 2,
        "aborted": 0,
        "loops": {"3": (2, 2, 3, 3), "5": (1, 1, 3, 3), "10": none},
        "false_alarms": 1,
        "saved": 5 + 2,
    }
    assert rows["Gemini CLI"] == {
        "warned": 0,
        "blocked": 2,
        "aborted": 0,
        "loops": {"3": (1, 2, 4, 4), "5": (1, 1, 4, 4), "10": none},
        "false_alarms": 0,
        "saved": 4 + 1,
    }
    assert rows["OpenHands"] == {
        "warned": 0,
        "blocked": 0,
        "aborted": 3,
        "loops": {"3": (2, 2, 4, 4), "5": (1, 1, 4, 4), "10": none},
        "false_alarms": 1,
        "saved": 4 + 1 + 1,
    }
    assert by_name(report)["Roo Code"]["false_alarm_runs"] == ["task-B-loop-of-4-resolved-trial-0"]
    # B's loop of 4 is calls 2-5 (start 1, length 4): Roo Code stops at 4 executed, OpenHands at
    # 5 (the call right after it); both stops are inside it, so neither is a pure false alarm.
    for name in ("Roo Code", "OpenHands"):
        row = by_name(report)[name]
        assert (row["false_alarms_in_strict_loops"], row["pure_false_alarms"]) == (1, 0), name


def test_a_real_resolved_run_that_two_peers_would_stop(tmp_path):
    """sympy__sympy-15976 (resolved) runs one command with one output 4 times in a row (read
    from the file here): Roo Code and OpenHands stop it, Gemini CLI, upstream's defaults and
    the recommended config do not.  django__django-16255 (resolved) has no repeat."""
    import gzip

    doc = json.load(gzip.open(DATA / "mini-swe-agent" / "sympy__sympy-15976.traj.json.gz", "rt"))
    pairs = [
        (m["content"], doc["messages"][i + 1]["content"])
        for i, m in enumerate(doc["messages"])
        if m["role"] == "assistant" and m["content"].count("```bash") == 1
    ]
    commands = [(c.split("```bash", 1)[1].split("```", 1)[0], r) for c, r in pairs]
    longest = max(len(list(g)) for g in _groups(commands))
    assert longest == 4
    report = report_for(
        tmp_path,
        [
            DATA / "mini-swe-agent" / "sympy__sympy-15976.traj.json.gz",
            DATA / "mini-swe-agent" / "django__django-16255.traj.json",
        ],
        "--profile",
        "configurable-final",
        "--config",
        REPO / "examples" / "recommended.yaml",
    )
    # the labels are not given: the runs are unlabelled, so no false alarm is counted
    assert report["labels"]["unlabelled"] == 2
    rows = by_name(report)
    assert rows["Roo Code"]["runs_blocked"] == 1 and rows["OpenHands"]["runs_aborted"] == 1
    assert rows["Gemini CLI"]["runs_blocked"] == 0
    assert rows["recommended"]["runs_blocked"] == rows["profile configurable-final"]["runs_blocked"] == 0


def _groups(items):
    from itertools import groupby

    return [list(g) for _k, g in groupby(items)]


def test_plot_is_a_png_beside_the_table(tmp_path):
    # what is in the picture: tests/cli/test_plots.py test_the_evaluate_plot_shows_every_row
    events = tmp_path / "events.jsonl"
    assert loopwatch("import", DATA / "hand-made" / "loops.json", "-o", events).returncode == 0
    png = tmp_path / "plot.png"
    proc = loopwatch("evaluate", events, "--plot", png)
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "Roo Code" in proc.stdout and "loops 5+" in proc.stdout
    spread = tmp_path / "plot-calls-into-loop.png"
    assert spread.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and str(spread) in proc.stderr


def test_bad_input(tmp_path):
    junk = tmp_path / "junk.jsonl"
    junk.write_text('{"not": "an event"}\n')
    one_line_error(loopwatch("evaluate", junk), 1, "nothing to evaluate")
    one_line_error(loopwatch("evaluate", tmp_path / "missing.jsonl"), 2, "cannot read")
    bad = tmp_path / "bad.yaml"
    bad.write_text("tools: [")
    one_line_error(loopwatch("evaluate", junk, "--config", bad), 2, "--config")


# -- the rules against their plain descriptions ----------------------------------------------------

sigs = st.lists(st.sampled_from("abc"), max_size=40)


def as_calls(letters, results=None, errors=None):
    return [(s, (results or {}).get(i, "r"), bool(errors and errors[i])) for i, s in enumerate(letters)]


@settings(max_examples=300)
@given(sigs)
def test_roo_code_refuses_the_first_call_that_follows_three_identical_ones(letters):
    first = next((i for i in range(3, len(letters)) if len(set(letters[i - 3 : i + 1])) == 1), None)
    assert roo_code(as_calls(letters)).block == first


@settings(max_examples=300)
@given(sigs)
def test_gemini_cli_stops_the_call_that_completes_five_repetitions(letters):
    def repeated(end):
        return any(end >= 5 * p and letters[end - 5 * p : end] == letters[end - p : end] * 5 for p in range(1, 6))

    first = next((i for i in range(len(letters)) if repeated(i + 1)), None)
    assert gemini_cli(as_calls(letters)).block == first


@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from("xy"), st.booleans()), max_size=30))
def test_openhands_is_stuck_after_four_equal_pairs_or_three_equal_errors(calls):
    stuck = None
    for end in range(1, len(calls) + 1):
        if end >= 4 and calls[end - 4 : end] == [calls[end - 1]] * 4:
            stuck = end
            break
        if end >= 3 and len({c[0] for c in calls[end - 3 : end]}) == 1 and all(c[2] for c in calls[end - 3 : end]):
            stuck = end
            break
    assert openhands(calls).abort == stuck


@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from("xy")), max_size=30))
def test_strict_loops_are_the_first_runs_of_equal_call_and_result(pairs):
    calls = [(s, r, False) for s, r in pairs]
    found = strict_loops(calls)
    for k in (3, 5, 10):
        expected = None
        i = 0
        while i < len(pairs):
            j = i
            while j < len(pairs) and pairs[j] == pairs[i]:
                j += 1
            if j - i >= k:
                expected = (i, j - i)
                break
            i = j
        assert found.get(k) == expected


def test_runs_are_judged_alone_in_any_order(tmp_path):
    """evaluate_run is a function of one run's events: the report of the runs in reverse order
    is the report of the runs in order."""
    from schemas.events import decode_event
    from streams.offline.evaluate import REFERENCE_ROWS, Evaluation, evaluate_run

    events_path = tmp_path / "events.jsonl"
    assert loopwatch("import", DATA / "hand-made" / "loops.json", "-o", events_path).returncode == 0
    runs: dict[str, list] = {}
    for line in events_path.read_bytes().splitlines():
        event = decode_event(line)
        runs.setdefault(event.run_id, []).append(event)
    reports = []
    for direction in (1, -1):
        evaluation = Evaluation(REFERENCE_ROWS)
        for key in list(runs)[::direction]:
            evaluation.add(evaluate_run(key, runs[key], REFERENCE_ROWS))
        reports.append(evaluation.report())
    assert reports[0] == reports[1]


# -- in parallel (--jobs) ----------------------------------------------------------------------


def labelled_fleet() -> list[bytes]:
    """A generated fleet whose runs keep looping (no engine obeyed), ended as successful,
    unsuccessful or unlabelled by run number, with every kind of bad record early, retries of
    ten events, a second run of twenty run ids after their first ended, and four runs the
    input leaves open (their run.ended dropped)."""
    import msgspec

    from harness.fleets import BAD_RECORDS
    from schemas import encode_event
    from schemas.events import RunEnded
    from streams.offline.scenarios import fleet_trace

    reasons = ("completed", "failed", "compacted")

    def labelled(events):
        out = []
        for e in events:
            n = int(e.run_id.rsplit("-", 1)[1])
            if type(e) is RunEnded:
                if n % 37 == 30:
                    continue
                e = msgspec.structs.replace(e, reason=reasons[n % 3])
            out.append(e)
        return out

    first, _ = fleet_trace(150, 14, seed=11, end=True)
    again, _ = fleet_trace(20, 14, seed=12, end=True)
    lines = [encode_event(e) for e in labelled(first)]
    return (
        lines[:100]
        + list(BAD_RECORDS.values())
        + lines[50:60]
        + lines[100:]
        + [encode_event(e) for e in labelled(again)]
    )


def test_jobs_give_the_report_of_one_process_field_for_field(tmp_path):
    from streams.cli import UPSTREAM_DEFAULTS
    from streams.engine import engine_for
    from streams.engine.config import with_profile
    from streams.offline.backtest import FileSource
    from streams.offline.evaluate import REFERENCE_ROWS, EngineRow, Evaluation

    path = tmp_path / "fleet.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in labelled_fleet()))
    rows = [
        EngineRow("upstream", engine_for(UPSTREAM_DEFAULTS)),
        EngineRow("latest", engine_for(with_profile(UPSTREAM_DEFAULTS, "latest"))),
        *REFERENCE_ROWS,
    ]
    reports = {}
    for jobs in (1, 2, 3):
        evaluation = Evaluation(rows)
        evaluation.run(FileSource([path]).records(), jobs=jobs)
        reports[jobs] = evaluation.report()
    one = reports[1]
    # the input exercises what the merge must add up and put back in order
    assert one["dead_letters"] and one["duplicates"] == 10 and one["runs"] == 150 + 20
    assert all(one["labels"].values()) and one["strict_loops"]["5"]["runs"]
    names = [r["run"] for row in one["rows"] for r in row["stopped_runs"]]
    assert len(names) > len(set(names)), "some run id should be stopped in both its runs"
    assert all(row["false_alarms"] for row in one["rows"][2:])
    for jobs in (2, 3):
        assert reports[jobs] == one, jobs
        assert json.dumps(reports[jobs]) == json.dumps(one)  # the same order too, list by list


def test_the_cli_with_jobs_prints_what_one_process_prints(tmp_path):
    path = tmp_path / "fleet.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in labelled_fleet()))
    out = {}
    for jobs in ("1", "2"):
        for form in ((), ("--json",)):
            proc = loopwatch("evaluate", path, "--jobs", jobs, *form)
            assert proc.returncode == 0, proc.stderr
            out[jobs, form] = proc.stdout
    assert out["1", ()] == out["2", ()] and "Roo Code" in out["1", ()]
    assert out["1", ("--json",)] == out["2", ("--json",)] and json.loads(out["1", ("--json",)])["runs"] == 170
    one_line_error(loopwatch("evaluate", path, "--jobs", "0"), 2, "--jobs must be at least 1")
