"""loopwatch plant and loopwatch tune: a hand-worked planting, determinism, the background kept,
and plant + tune end to end through the CLI against held-out figures recomputed here with
loopwatch evaluate."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.events import RunEnded, ToolCallCompleted, ToolCallRequested, decode_event
from streams.edge.events import completed_event, requested_event, run_ended_event
from streams.edge.hashing import args_hash, hash_outcome
from streams.offline.plant import _WORDS, plant_run
from streams.offline.tune import RunFacts, figures, held_out_front, sample_trials, tune_report

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "trajectories" / "mini-swe-agent-40.jsonl.gz"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streams.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


def small_run(calls: int = 2, reason: str = "resolved") -> list:
    ids = {"run_id": "r1", "session_key": "r1"}
    events = []
    for n in range(calls):
        args = {"command": f"ls {n}"}
        events.append(requested_event(f"r1#{n}", "bash", args, ts_ms=10 * n, **ids))
        events.append(completed_event(f"r1#{n}r", "bash", args, result=f"out {n}", ts_ms=10 * n, **ids))
    events.append(run_ended_event("r1#end", reason, ts_ms=100, **ids))
    return events


def test_a_hand_worked_planting_field_by_field():
    background = small_run()
    out, where = plant_run(background, random.Random(7), shape="identical-command", length=3)
    # The draws after shape and length, in plant_run's documented order: the position, then the words.
    rng = random.Random(7)
    start = rng.randint(0, 2)
    word = rng.choice(_WORDS)
    tag = f"{rng.randrange(16**6):06x}"
    assert (where.start, where.length, where.shape) == (start, 3, "identical-command")
    assert len(out) == 4 + 6 + 1
    at = 2 * start
    assert out[:at] == background[:at] and out[at + 6 : -1] == background[at:-1]
    command = {"command": f"python -m pytest tests/test_{word}.py -x -q"}
    result = f"<returncode>0</returncode>\n<output>\n1 failed, 3 passed ({tag})\n</output>"
    expected_result = hash_outcome("bash", command, result=result).result_hash
    planted = out[at : at + 6]
    for n in range(3):
        req, done = planted[2 * n], planted[2 * n + 1]
        assert type(req) is ToolCallRequested and type(done) is ToolCallCompleted
        assert req.tool_name == done.tool_name == "bash"
        assert req.args_hash == done.args_hash == args_hash("bash", command)
        assert done.result_hash == expected_result and done.is_error is False
        assert (req.run_id, req.session_key, req.session_id, req.agent_id) == ("r1", "r1", None, None)
        assert req.ts_ms == (background[at - 1].ts_ms if at else background[0].ts_ms)
        assert req.event_id.startswith("plant-") and done.event_id == req.event_id + "r"
    assert len({e.event_id for e in out}) == len(out)
    end = out[-1]
    assert type(end) is RunEnded and end.event_id == "r1#end" and end.ts_ms == 100
    assert end.reason == f"planted:identical-command:{start}:3"


def test_a_failing_edit_is_an_error_each_time():
    out, where = plant_run(small_run(), random.Random(1), shape="failing-edit", length=4)
    planted = [e for e in out if type(e) is ToolCallCompleted and e.event_id.startswith("plant-")]
    assert len(planted) == 4 and all(e.is_error for e in planted)
    assert len({(e.args_hash, e.result_hash) for e in planted}) == 1


def test_near_identical_arguments_differ_and_results_do_not():
    out, _ = plant_run(small_run(), random.Random(1), shape="near-identical", length=6)
    planted = [e for e in out if type(e) is ToolCallCompleted and e.event_id.startswith("plant-")]
    assert len({e.args_hash for e in planted}) == 6 and len({e.result_hash for e in planted}) == 1


@settings(max_examples=60, deadline=None)
@given(calls=st.integers(0, 8), seed=st.integers(0, 2**32), reason=st.sampled_from(["resolved", "unresolved"]))
def test_planting_never_drops_or_reorders_the_background(calls, seed, reason):
    background = small_run(calls, reason)
    out, where = plant_run(background, random.Random(seed))
    kept = [e for e in out if not e.event_id.startswith("plant-")]
    assert kept[:-1] == background[:-1]
    assert kept[-1].event_id == background[-1].event_id and kept[-1].reason == where.reason
    assert len(out) == len(background) + 2 * where.length
    assert 3 <= where.length <= 12 and 0 <= where.start <= calls
    firsts = [i for i, e in enumerate(out) if e.event_id.startswith("plant-")]
    assert sum(type(e) is ToolCallCompleted for e in out[: firsts[0]]) == where.start


def test_plant_is_deterministic_by_seed(tmp_path):
    outs = []
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        r = cli("plant", str(DATA), "-o", str(tmp_path / f"{name}.jsonl"), "--seed", str(seed), "--fraction", "0.5")
        assert r.returncode == 0, r.stderr
        outs.append((tmp_path / f"{name}.jsonl").read_bytes())
    assert outs[0] == outs[1] and outs[0] != outs[2]
    reasons = [json.loads(x)["reason"] for x in outs[0].splitlines() if b'"run.ended"' in x]
    assert len(reasons) == 40 and sum(r.startswith("planted:") for r in reasons) == 20


def test_bad_fraction_is_one_line():
    r = cli("plant", str(DATA), "-o", "/tmp/never.jsonl", "--fraction", "2")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--fraction" in r.stderr


def test_plant_then_tune_figures_are_the_held_out_figures_evaluate_gives(tmp_path):
    """Each fold's held-out line is the figures that loopwatch evaluate gives the trial chosen
    on the other folds, on the fold's runs alone, counted here from its stops."""
    planted = tmp_path / "planted.jsonl"
    r = cli("plant", str(DATA), "-o", str(planted), "--seed", "11", "--fraction", "0.5")
    assert r.returncode == 0, r.stderr
    chosen = tmp_path / "chosen.yaml"
    r = cli(
        "tune", str(planted), "-o", str(chosen), "--folds", "3", "--trials", "8", "--seed", "2",
        "--max-false-alarms", "0.1", "--jobs", "1", "--json", "--plot", str(tmp_path / "front.png"),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "front.png").read_bytes()[:4] == b"\x89PNG"
    assert "8/8 trials" in r.stderr  # the progress bar's last line
    report = json.loads(r.stdout)
    check = cli("config", "check", str(chosen))
    assert check.returncode == 0, check.stderr
    comments = chosen.read_text()
    assert f"# command: {report['command']}" in comments.splitlines()
    lines = planted.read_text().splitlines()
    by_run: dict[str, list[str]] = {}
    reasons = {}
    for line in lines:
        event = decode_event(line.encode())
        by_run.setdefault(event.run_id, []).append(line)
        if type(event) is RunEnded:
            reasons[event.run_id] = event.reason
    assert sorted(k for fold in report["folds"] for k in fold) == sorted(by_run)
    trials = sample_trials(8, 2)
    caught_anywhere = 0
    for f, fold in enumerate(report["folds"]):
        trial = report["chosen_per_fold"][f]["trial"]
        config = tmp_path / f"trial{f}.yaml"
        config.write_text(yaml.safe_dump(trials[trial]))
        part = tmp_path / f"fold{f}.jsonl"
        part.write_text("".join(line + "\n" for k in fold for line in by_run[k]))
        r = cli("evaluate", str(part), "--config", str(config), "--no-reference", "--json", "--jobs", "1")
        assert r.returncode == 0, r.stderr
        stopped = {s["run"]: s["stopped_after"] for s in json.loads(r.stdout)["rows"][0]["stopped_runs"]}
        loops = caught = before = alarms = successful = 0
        for k in fold:
            m = re.fullmatch(r"planted:[a-z0-9-]+:(\d+):(\d+)", reasons[k] or "")
            if m:
                start, length = int(m.group(1)), int(m.group(2))
                if length >= 5:
                    loops += 1
                    caught += k in stopped and start <= stopped[k] <= start + length
                    before += k in stopped and stopped[k] < start
            elif reasons[k] == "resolved":
                successful += 1
                alarms += k in stopped
        caught_anywhere += caught
        expected = (
            f"# held-out, fold {f} (trial {trial}): loops of 5+ stopped {caught}/{loops} ({before} stopped before "
            "the loop);"
        )
        assert any(line.startswith(expected) for line in comments.splitlines()), expected
        assert loops > 0
        assert report["chosen_per_fold"][f]["false_alarms"] == alarms
        assert report["chosen_per_fold"][f]["successful"] == successful
    assert report["chosen_figures"]["caught_5"] == caught_anywhere


def facts_of(kinds: str) -> list[RunFacts]:
    """P: a planted loop of 5 calls at the run's start; S: a successful run with no loop."""
    return [
        RunFacts(f"{kind}{i}", False, 0, 5) if kind == "P" else RunFacts(f"{kind}{i}", True, None, None)
        for i, kind in enumerate(kinds)
    ]


def test_the_figures_are_of_the_choice_on_held_out_folds_not_of_the_runs_it_was_chosen_on():
    """Six runs in two folds: fold 0 = P0 P1 S2, fold 1 = P3 P4 S5 (P: a planted loop of 5 at
    call 0; S: successful).  Three trials' stops (calls before the stop; None: never):

    * T0: 2 2 - 2 - -  -> on all runs 3/4 loops caught, no false alarm;
    * T1: - - - 2 2 -  -> 2/4;
    * T2: 1 1 - 1 1 1  -> 4/4, but it stops S5: a pure false alarm (1/2).

    Budget 0.  On all runs T0 is chosen (T2 is over the budget): 3/4, 0 false alarms.  Nested:
    fold 0 held out, chosen on fold 1 (P3 P4 S5): T0 1/2, T1 2/2, T2 over budget (S5) -> T1,
    which on fold 0 catches 0/2.  Fold 1 held out, chosen on fold 0 (P0 P1 S2): T0 2/2 at 2
    calls in, T2 2/2 at 1 and S2 not stopped -> T2, which on fold 1 catches 2/2 at 1 call in and
    stops S5.  Held out, pooled: 2/4 caught, median 1 call in, 1/2 pure false alarms; not the
    3/4 and 0 that T0 shows on the runs it was chosen on."""
    runs = facts_of("PPSPPS")
    stops = [[2, 2, None, 2, None, None], [None, None, None, 2, 2, None], [1, 1, None, 1, 1, 1]]
    report = tune_report([{"t": 0}, {"t": 1}, {"t": 2}], stops, runs, [[0, 1, 2], [3, 4, 5]], 0.0)
    assert report["chosen"] == 0
    held = report["chosen_figures"]
    assert (held["caught_5"], held["loops_5"], held["into_median"]) == (2, 4, 1.0)
    assert (held["pure_false_alarms"], held["successful"]) == (1, 2)
    per_fold = [(p["trial"], p["caught_5"], p["pure_false_alarms"]) for p in report["chosen_per_fold"]]
    assert per_fold == [(1, 0, 0), (2, 2, 1)]
    inside = report["in_sample"]
    assert (inside["caught_5"], inside["pure_false_alarms"]) == (3, 0)  # what the old report showed


def test_the_held_out_front_is_the_nested_choice_per_budget():
    """The runs and trials above: at budget 1 every fold may pick T2 (2/2 at 1 call in on
    either training fold; T1 and T0 need 2) -> 4/4, median 1, 1/2 pure; at budgets 0 and 0.5
    the fold-0 choice (made on fold 1, where T2's rate is 1/1) is T1 -> 2/4, median 1, 1/2.  So
    budget 1 dominates them: it alone is on the front."""
    runs = facts_of("PPSPPS")
    stops = [[2, 2, None, 2, None, None], [None, None, None, 2, 2, None], [1, 1, None, 1, 1, 1]]
    front = held_out_front(stops, runs, [[0, 1, 2], [3, 4, 5]], (0.0, 0.5, 1.0))
    got = [(p["budget"], p["pooled"]["caught_5"], p["pooled"]["into_median"], p["on_front"]) for p in front]
    assert got == [(0.0, 2, 1.0, False), (0.5, 2, 1.0, False), (1.0, 4, 1.0, True)]


def test_a_stop_before_the_planted_loop_is_not_caught_and_a_stop_in_a_strict_loop_is_not_pure():
    # P: loop of 5 at call 3; stops 2 (before), 3 (its first call refused), 8 (right after it), 9 (past it).
    # S: successful with a strict loop of 3 at call 4: stop 4 and 7 are in it, 3 and 8 are pure.
    runs = [RunFacts("P", False, 3, 5, "poll"), RunFacts("S", True, None, None, None, ((4, 3),))]
    cases = {(2, 3): (0, 1, 1), (3, 4): (1, 0, 0), (8, 7): (1, 0, 0), (9, 8): (0, 0, 1)}
    for (p_stop, s_stop), (caught, before, pure) in cases.items():
        fig = figures([p_stop, s_stop], runs, [0, 1])
        assert (fig["caught_5"], fig["stopped_before_loop"], fig["pure_false_alarms"], fig["false_alarms"]) == (
            caught,
            before,
            pure,
            1,
        ), (p_stop, s_stop)
        assert fig["by_shape"] == {"poll": {"caught_5": caught, "loops_5": 1}}
