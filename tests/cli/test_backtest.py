"""``loopwatch backtest`` over files (issue 16): a hand-worked small fleet, a generated fleet
against the engine driven directly, and bad input.

The hand-worked fleet is ``harness.fleets.hand_worked_fleet`` (its docstring works it out),
with one record of each kind the worker dead-letters (``BAD_RECORDS``); a generated fleet is
checked against ``harness.fleets.reference_report``, the engine driven directly.
"""

from __future__ import annotations

import gzip
import io
import json
import re
from pathlib import Path

import msgspec
import pytest

from harness.cli import loopwatch, one_line_error
from harness.fleets import BAD_RECORDS, BASELINE, CANDIDATE, assert_matches_reference, hand_worked_fleet
from schemas import encode_event
from streams.engine import RunDriver, engine_for
from streams.offline.scenarios import fleet_trace


def hand_fleet() -> list[bytes]:
    """The hand-worked fleet's lines: the retry after the first 30 events, two bad records
    after it and two at the end."""
    events, retry = hand_worked_fleet()
    lines = [encode_event(e) for e in events]
    bad = list(BAD_RECORDS.values())
    return lines[:30] + [encode_event(retry)] + bad[:2] + lines[30:] + bad[2:]


@pytest.fixture
def configs(tmp_path: Path) -> tuple[Path, Path]:
    base, cand = tmp_path / "baseline.json", tmp_path / "candidate.yaml"
    base.write_text(json.dumps(BASELINE))
    cand.write_text("tools:\n  loopDetection:\n    enabled: true\n    warningThreshold: 5\n    criticalThreshold: 8\n")
    return base, cand


def write_lines(path: Path, lines: list[bytes]) -> Path:
    data = b"".join(line + b"\n" for line in lines)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


@pytest.mark.parametrize("name", ["fleet.jsonl", "fleet.jsonl.gz"])
def test_the_hand_worked_fleet(tmp_path, configs, name):
    path = write_lines(tmp_path / name, hand_fleet())
    proc = loopwatch("backtest", path, "--baseline", configs[0], "--candidate", configs[1], "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["runs"], report["duplicates"]) == (4, 1)
    assert report["dead_letters"] == {"invalid_json": 1, "missing_key": 1, "oversized": 1, "unsupported_version": 1}
    assert report["events"] == 21 + 43 + 11 + 8  # a, b, c, d
    assert report["verdicts"] == {
        "baseline": {"warn": 1, "block": 1, "abort": 1},
        "candidate": {"warn": 0, "block": 2 + 13, "abort": 1},
    }
    assert report["outcomes"] == {
        "baseline": {"none": 2, "warn": 0, "block": 1, "abort": 1},
        "candidate": {"none": 1, "warn": 0, "block": 2, "abort": 1},
    }
    [changed] = report["changed_runs"]
    assert (changed["run"], changed["agent"], changed["baseline"], changed["candidate"], changed["ended"]) == (
        "run:a",
        "main",
        "none",
        "block",
        "completed",
    )
    first = changed["first_disagreement"]
    assert (first["event_id"], first["type"], first["tool"], first["baseline"], first["candidate"]) == (
        "a:9",
        "tool_call.requested",
        "read",
        "none",
        "block",
    )
    assert first["at"].startswith(str(path)) and first["at"].endswith(f":{line_of(hand_fleet(), b'a:9')}")
    assert report["runs_disagreeing"] == 2  # a, and b from call 9 (both end blocked)
    rows = {
        (r["agent"], r["detector"], r["tool"]): (r["baseline"], r["candidate"])
        for r in report["by_agent_detector_tool"]
    }
    assert rows == {
        ("main", "generic_repeat", "read"): (
            {"warned": 1, "blocked": 1, "aborted": 0},
            {"warned": 0, "blocked": 2, "aborted": 0},
        ),
        ("main", "compaction_loop_persisted", "gateway"): (
            {"warned": 0, "blocked": 0, "aborted": 1},
            {"warned": 0, "blocked": 0, "aborted": 1},
        ),
    }
    fp = report["likely_false_positives"]
    assert (fp["baseline"]["blocks"], fp["baseline"]["runs"]) == (0, [])
    assert (fp["candidate"]["blocks"], fp["candidate"]["runs"]) == (2, ["run:a"])
    assert fp["candidate"]["by"] == [{"agent": "main", "detector": "generic_repeat", "tool": "read", "blocks": 2}]


def line_of(lines: list[bytes], event_id: bytes) -> int:
    return next(n for n, line in enumerate(lines, 1) if b'"event_id":"' + event_id + b'"' in line)


def test_the_table_and_the_plot(tmp_path, configs):
    path = write_lines(tmp_path / "fleet.jsonl", hand_fleet())
    png = tmp_path / "would-fire.png"
    proc = loopwatch("backtest", path, "--baseline", configs[0], "--candidate", configs[1], "--plot", png)
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())  # (columns aligned with spaces)
    assert "83 events of 4 runs" in out
    assert "4 dead-letter-worthy records (invalid_json 1, missing_key 1, oversized 1, unsupported_version 1)" in out
    assert "block verdicts 1 15 +14" in out and "runs, outcome none 2 1 -1" in out
    assert "main generic_repeat read 1 -> 0 1 -> 2 0 -> 0" in out
    assert "runs whose outcome changes: 1 (verdicts differ somewhere in 2 runs)" in out
    assert "run:a agent main: none -> block; first disagreement at" in out
    assert "candidate: 2 blocks in 1 runs" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_only_the_agents_asked_for(tmp_path, configs):
    path = write_lines(tmp_path / "fleet.jsonl", hand_fleet())
    proc = loopwatch("backtest", path, "--baseline", configs[0], "--candidate", configs[1], "--json", "--agent", "cron")
    report = json.loads(proc.stdout)
    assert (report["runs"], report["events"], report["other_agents"], report["changed_runs"]) == (1, 11, 72 + 1, [])


# -- a generated fleet against the engine driven directly --------------------------------------


def test_a_generated_fleet_matches_the_engine_driven_directly(tmp_path, configs):
    # Runs of 15 calls: a loop warns at call 11 under the baseline and is blocked at call 9
    # under the candidate.
    events, _kinds = fleet_trace(300, 15, seed=11, engine=engine_for(BASELINE), end=True)
    path = write_lines(tmp_path / "fleet.jsonl.gz", [encode_event(e) for e in events])
    proc = loopwatch("backtest", path, "--baseline", configs[0], "--candidate", configs[1], "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    changed = assert_matches_reference(report, events, BASELINE, CANDIDATE)
    assert changed, "the candidate should change some outcomes of this fleet"
    assert report["runs"] == 300 and report["events"] == len(events) and report["dead_letters"] == {}


# -- in parallel (--jobs) ----------------------------------------------------------------------


def mixed_fleet() -> list[bytes]:
    """A generated fleet of three agents (runs of 15 calls: the candidate changes outcomes),
    with every kind of bad record early, retries of ten events, and run ids used again after
    their run ended (a second run of the key)."""
    events, _kinds = fleet_trace(300, 15, seed=11, engine=engine_for(BASELINE), end=True)
    events = [msgspec.structs.replace(e, agent_id=f"agent-{int(e.run_id.rsplit('-', 1)[1]) % 3}") for e in events]
    again, _ = fleet_trace(20, 15, seed=12, engine=engine_for(BASELINE), end=True)
    lines = [encode_event(e) for e in events]
    return lines[:100] + list(BAD_RECORDS.values()) + lines[50:60] + lines[100:] + [encode_event(e) for e in again]


@pytest.mark.parametrize("candidate", ["all agents", "one agent"])
def test_jobs_give_the_report_of_one_process_field_for_field(tmp_path, candidate):
    from streams.offline.backtest import Backtest, FileSource

    cand = (
        CANDIDATE
        if candidate == "all agents"
        else {**BASELINE, "agents": {"list": [{"id": "agent-1", "tools": CANDIDATE["tools"]}]}}
    )
    path = write_lines(tmp_path / "fleet.jsonl", mixed_fleet())
    reports = {}
    for jobs in (1, 2, 3):
        backtest = Backtest(engine_for(BASELINE), engine_for(cand))
        backtest.run(FileSource([path]).records(), keyed=False, jobs=jobs)
        reports[jobs] = backtest.report()
    one = reports[1].data
    # the fleet exercises what the merge must put back in order and add up
    assert len(one["changed_runs"]) > 20 and one["dead_letters"] and one["duplicates"] == 10
    assert any(r["ended"] for r in one["changed_runs"]) and one["runs"] == 300 + 20
    for jobs in (2, 3):
        assert reports[jobs].data == one, jobs
        assert json.dumps(reports[jobs].data) == json.dumps(one)  # the same order too, list by list
        assert reports[jobs].per_minute == reports[1].per_minute


def test_the_cli_with_jobs_prints_what_one_process_prints(tmp_path, configs):
    path = write_lines(tmp_path / "fleet.jsonl.gz", mixed_fleet())
    out = {}
    for jobs in ("1", "2"):
        proc = loopwatch(
            "backtest", path, "--baseline", configs[0], "--candidate", configs[1], "--json", "--jobs", jobs
        )
        assert proc.returncode == 0, proc.stderr
        out[jobs] = proc.stdout
    assert out["1"] == out["2"] and json.loads(out["1"])["changed_runs"]


# -- bad input ---------------------------------------------------------------------------------


def test_an_unreadable_file(tmp_path, configs):
    one_line_error(
        loopwatch("backtest", tmp_path / "missing.jsonl", "--baseline", configs[0], "--candidate", configs[1]),
        2,
        "loopwatch backtest: cannot read",
        "missing.jsonl",
    )


def test_a_file_that_is_not_gzip_inside(tmp_path, configs):
    path = tmp_path / "broken.jsonl.gz"
    path.write_bytes(b"\x1f\x8b" + b"not really gzip" * 10)
    one_line_error(
        loopwatch("backtest", path, "--baseline", configs[0], "--candidate", configs[1]),
        2,
        "cannot read",
        "broken.jsonl.gz",
    )


def test_an_unknown_agent(tmp_path, configs):
    path = write_lines(tmp_path / "fleet.jsonl", hand_fleet())
    one_line_error(
        loopwatch("backtest", path, "--baseline", configs[0], "--candidate", configs[1], "--agent", "nobody"),
        1,
        "unknown agent 'nobody'",
        "agents seen: cron, main",
    )


def test_a_file_without_events(tmp_path, configs):
    path = write_lines(tmp_path / "garbage.jsonl", [b"{not json", b"[]"])
    one_line_error(
        loopwatch("backtest", path, "--baseline", configs[0], "--candidate", configs[1]),
        1,
        "nothing to compare: all 2 records were refused",
    )
    empty = write_lines(tmp_path / "empty.jsonl", [])
    one_line_error(
        loopwatch("backtest", empty, "--baseline", configs[0], "--candidate", configs[1]),
        1,
        "nothing to compare: it holds no events",
    )


def test_jobs_below_one(tmp_path, configs):
    path = write_lines(tmp_path / "fleet.jsonl", hand_fleet())
    one_line_error(
        loopwatch("backtest", path, "--baseline", configs[0], "--candidate", configs[1], "--jobs", "0"),
        2,
        "--jobs must be at least 1",
    )


def test_a_bad_config(tmp_path, configs):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tools": {"loopDetection": {"warningThreshold": 0}}}))
    path = write_lines(tmp_path / "fleet.jsonl", hand_fleet())
    one_line_error(
        loopwatch("backtest", path, "--baseline", configs[0], "--candidate", bad), 2, "--candidate:", "warningThreshold"
    )


def test_an_unreachable_broker(configs):
    one_line_error(
        loopwatch(
            "backtest",
            "--bootstrap",
            "127.0.0.1:9",
            "--topic",
            "tool-calls",
            "--timeout",
            "2",
            "--baseline",
            configs[0],
            "--candidate",
            configs[1],
        ),
        2,
        "cannot reach the broker at 127.0.0.1:9",
    )


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--topic", "t"], "give files or --topic (and --bootstrap), not both"),
        (["--since", "1h"], "they need --topic"),
        (["--bootstrap", "127.0.0.1:9"], "give JSONL files of tool-calls events, or --topic"),
        (["--bootstrap", "127.0.0.1:9", "--topic", "t", "--since", "yesterday"], "cannot read the time 'yesterday'"),
    ],
)
def test_options_that_do_not_fit(tmp_path, configs, args, needle):
    files = [write_lines(tmp_path / "f.jsonl", hand_fleet())] if args[0] in ("--topic", "--since") else []
    one_line_error(loopwatch("backtest", *files, "--baseline", configs[0], "--candidate", configs[1], *args), 2, needle)


def test_a_plot_without_a_writable_place(tmp_path, configs):
    path = write_lines(tmp_path / "fleet.jsonl", hand_fleet())
    one_line_error(
        loopwatch(
            "backtest",
            path,
            "--baseline",
            configs[0],
            "--candidate",
            configs[1],
            "--plot",
            tmp_path / "no" / "such" / "dir.png",
        ),
        2,
        "cannot write",
    )


def test_agents_the_candidate_leaves_alone_are_judged_once_and_the_same(tmp_path):
    # The candidate changes agent main only: cron's runs reuse the baseline's steps, and a run
    # whose events move from cron to main takes its own candidate state at main's first event.
    from streams.offline.backtest import Backtest, FileSource

    main, _ = fleet_trace(60, 15, seed=3, engine=engine_for(BASELINE), end=True, run_prefix="m")
    cron, _ = fleet_trace(60, 15, seed=4, engine=engine_for(BASELINE), end=True, run_prefix="c")
    cron = [msgspec.structs.replace(e, agent_id="cron") for e in cron]
    mixed = [
        e
        for e in fleet_trace(1, 30, seed=5, mix={"generic_repeat": 1.0}, run_prefix="x", engine=engine_for(BASELINE))[0]
    ]
    mixed = [msgspec.structs.replace(e, agent_id="cron" if i < 12 else "main") for i, e in enumerate(mixed)]
    events = [e for trio in zip(main, cron) for e in trio] + mixed
    candidate = {
        **BASELINE,
        "agents": {
            "list": [{"id": "main", "tools": {"loopDetection": {"warningThreshold": 5, "criticalThreshold": 8}}}]
        },
    }
    path = write_lines(tmp_path / "two-agents.jsonl", [encode_event(e) for e in events])
    backtest = Backtest(engine_for(BASELINE), engine_for(candidate))
    backtest.run(FileSource([path]).records(), keyed=False)
    report = backtest.report().data
    assert assert_matches_reference(report, events, BASELINE, candidate)
    assert all(r["agent"] == "main" for r in report["changed_runs"])
    # Only the run that moved from cron to main (still open) has a candidate state of its own,
    # and it is the state the candidate reaches when it judges the run from its start.
    assert set(backtest.sides[1].driver.states) == {b"run:x-00000"}
    directly = RunDriver(engine_for(candidate))
    for event in events:
        directly.handle(event)
    assert backtest.sides[1].driver.states[b"run:x-00000"] == directly.states["run:x-00000"]


def _backtest_with_progress(tmp_path, monkeypatch, **run_options):
    """A fleet's backtest with progress on a clock that moves 10 s per reading: every progress
    call past the first couple of seconds prints a line (a file, not a terminal: one line each,
    not rewritten in place).  Returns the events, the backtest and the lines printed."""
    import streams.offline.backtest as backtest_module
    from streams.offline.backtest import Backtest, FileSource, Progress

    events, _ = fleet_trace(400, 50, seed=11, engine=engine_for(BASELINE), end=True)
    path = write_lines(tmp_path / "fleet.jsonl", [encode_event(e) for e in events])
    ticks = iter(range(0, 10**6, 10))
    monkeypatch.setattr(backtest_module.time, "monotonic", lambda: float(next(ticks)))
    out, source = io.StringIO(), FileSource([path])
    progress = Progress(out, source.progress)
    backtest = Backtest(engine_for(BASELINE), engine_for(CANDIDATE))
    backtest.run(source.records(), keyed=False, progress=progress, **run_options)
    progress.done(backtest.records)
    return events, backtest, out.getvalue().splitlines()


def test_the_progress_line_reports_records_rate_and_eta(tmp_path, monkeypatch):
    events, _backtest, lines = _backtest_with_progress(tmp_path, monkeypatch)
    calls = len(events) // 0x4000 + 1  # every 16,384 records, and once at the end
    assert len(lines) == calls + 1, lines
    shown = [
        re.fullmatch(r"backtest: ([\d,]+) records read, ([\d,]+)/s, (\d+)%, ETA (\d+) s", line) for line in lines[:-1]
    ]
    assert all(shown), lines
    read = [int(m[1].replace(",", "")) for m in shown]
    assert read == [0x4000 * i for i in range(1, calls)] + [len(events)]
    # the n-th line is read at 10 n s of the clock: the rate is records over elapsed seconds
    assert [int(m[2].replace(",", "")) for m in shown] == [round(n / (10 * i)) for i, n in enumerate(read, 1)]
    shares = [int(m[3]) for m in shown]
    assert shares == sorted(shares) and shares[-1] == 100 and int(shown[-1][4]) == 0
    assert (
        lines[-1] == f"backtest: {len(events):,} records read in {10 * (calls + 1):.1f} s, "
        f"{len(events) / (10 * (calls + 1)):,.0f}/s"
    )


def test_no_progress_line_on_short_work(tmp_path, configs):
    path = write_lines(tmp_path / "fleet.jsonl", hand_fleet())
    proc = loopwatch("backtest", path, "--baseline", configs[0], "--candidate", configs[1])
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_session_scope_is_refused_and_the_fleet_options_are_named(tmp_path, configs):
    """Issue 17's options in a backtest: session scope is refused (the backtest counts runs,
    each from fresh state); fleet incidents and agent rings, which need the fleet topology,
    are said to be left out."""
    path = write_lines(tmp_path / "fleet.jsonl", hand_fleet())
    session = tmp_path / "session.json"
    session.write_text(json.dumps({**BASELINE, "loopwatch": {"scope": "session"}}))
    one_line_error(
        loopwatch("backtest", path, "--baseline", configs[0], "--candidate", session),
        2,
        "--candidate: loopwatch.scope: session is not backtested",
    )
    fleet = tmp_path / "fleet-options.json"
    fleet.write_text(json.dumps({**BASELINE, "loopwatch": {"fleetIncidents": {"enabled": True}}}))
    done = loopwatch("backtest", path, "--baseline", configs[0], "--candidate", fleet)
    assert done.returncode == 0 and "--candidate: fleetIncidents and agentRings need the fleet topology" in done.stderr


@pytest.mark.parametrize("first", ["gzip", "plain"])
def test_jobs_over_several_files_give_the_report_of_one_process(tmp_path, first):
    """Two files numbered as one stream, the same report: both plain, each shard reads them
    itself (``streams.offline.backtest._files_sharded``); a gzip one first, this process reads them."""
    from streams.offline.backtest import Backtest, FileSource

    lines = mixed_fleet()
    half = len(lines) // 2
    packed = tmp_path / "first.jsonl.gz"
    data = b"".join(line + b"\n" for line in lines[:half])
    packed.write_bytes(gzip.compress(data) if first == "gzip" else data)
    assert FileSource([packed]).any_gzip() == (first == "gzip")
    plain = write_lines(tmp_path / "second.jsonl", lines[half:])
    reports = {}
    for jobs in (1, 2, 3):
        backtest = Backtest(engine_for(BASELINE), engine_for(CANDIDATE))
        backtest.run(FileSource([packed, plain]).records(), keyed=False, jobs=jobs)
        reports[jobs] = backtest.report()
    one = reports[1].data
    assert one["dead_letters"] and len(one["changed_runs"]) > 20
    for jobs in (2, 3):
        assert json.dumps(reports[jobs].data) == json.dumps(one), jobs
        assert reports[jobs].per_minute == reports[1].per_minute


def test_jobs_over_a_cut_gzip_fail_as_one_process_does(tmp_path):
    from streams.offline.backtest import Backtest, BacktestError, FileSource

    data = gzip.compress(b"".join(line + b"\n" for line in mixed_fleet()))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) // 2])
    errors = {}
    for jobs in (1, 2):
        with pytest.raises(BacktestError) as caught:
            Backtest(engine_for(BASELINE), engine_for(CANDIDATE)).run(
                FileSource([cut]).records(), keyed=False, jobs=jobs
            )
        errors[jobs] = (str(caught.value), caught.value.code)
    assert errors[1][0].startswith(f"cannot read {cut}: ") and errors[1][1] == 2
    assert errors[2] == errors[1]


def test_jobs_show_progress_and_count_the_records_read(tmp_path, monkeypatch):
    events, backtest, lines = _backtest_with_progress(tmp_path, monkeypatch, jobs=2)
    shown = [
        re.fullmatch(r"backtest: ([\d,]+) records read, ([\d,]+)/s, (\d+)%, ETA (\d+) s", line) for line in lines[:-1]
    ]
    assert shown and all(shown), lines
    read = [int(m[1].replace(",", "")) for m in shown]
    assert read == sorted(read) and read[-1] == len(events) == backtest.records
    assert int(shown[-1][3]) == 100
    assert lines[-1].startswith(f"backtest: {len(events):,} records read in ")
