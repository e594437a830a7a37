"""``loopwatch backtest`` over files (issue 16): a hand-worked small fleet, a generated fleet
against the engine driven directly, and bad input.

The hand-worked fleet (``hand_fleet``), under the baseline (upstream's defaults: warning 10,
critical 20) and the candidate (warning 5, critical 8), by spec §2.7/§2.10 (an identical call
counts the identical calls with identical results before it; a warning is shown only when
count // 10 reaches a new high; a blocked call is not recorded, and neither is the loop's own
veto that completes it) and §4 (after a compaction, three identical outcomes end the run):

* run ``a`` (agent main): 10 identical reads, then ``run.ended completed``.  Baseline: counts
  0-9, nothing.  Candidate: the 9th call sees 8 and is blocked; the runner (which followed the
  baseline) completed it with its result, so the 10th sees 9: blocked.  Outcome none -> block,
  first disagreement at call 9's request; 2 candidate blocks in a run that ended normally.
* run ``b`` (agent main): 21 identical reads, the 21st completed as a veto, then ``run.ended
  failed``.  Baseline: warning at call 11 (count 10), block at call 21 (count 20).  Candidate:
  calls 9-21 blocked (13; counts 8 and up; its warnings, counts 5-7, are hidden: count // 10
  is 0).  Outcome block under both; they disagree first at call 9.
* run ``c`` (agent cron): 5 different reads, ``run.ended completed``: nothing under either.
* run ``d`` (agent main): a compaction, then 3 identical gateway calls with identical results:
  aborted at the third outcome under both (window 3), then ``run.ended aborted``.
* four records the worker would dead-letter (not JSON, schema version 2, no run id, session
  key or session id, over 64 KiB), and one retried event (run a's call 3, again).
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from schemas import encode_event
from streams.edge import blocked_result, compaction_event, completed_event, requested_event, run_ended_event
from streams.engine import LoopEngine, RunDriver, published
from streams.scenarios import fleet_trace

REPO = Path(__file__).resolve().parents[2]
BASELINE = {"tools": {"loopDetection": {"enabled": True}}}
CANDIDATE = {"tools": {"loopDetection": {"enabled": True, "warningThreshold": 5, "criticalThreshold": 8}}}
SAME = {"content": [{"type": "text", "text": "same"}]}


def loopwatch(*args: object, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streams.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr and err.count("\n") == 0, proc.stderr
    for needle in needles:
        assert needle in err, err
    return err


def reads(run_id: str, n: int, *, agent: str = "main", veto_from: int | None = None, distinct: bool = False):
    fields = dict(run_id=run_id, session_key=f"agent:{agent}:{run_id}", agent_id=agent)
    out = []
    for i in range(1, n + 1):
        args = {"path": f"/f{i}" if distinct else "/same"}
        out.append(requested_event(f"{run_id}:{i}", "read", args, tool_call_id=f"c{i}", ts_ms=1_700_000_000_000 + i * 1000,
                                   **fields))
        if veto_from is not None and i >= veto_from:
            out.append(completed_event(f"{run_id}:{i}:done", "read", args, tool_call_id=f"c{i}", result=blocked_result("no"),
                                       ts_ms=1_700_000_000_000 + i * 1000 + 1, **fields))
        else:
            out.append(completed_event(f"{run_id}:{i}:done", "read", args, tool_call_id=f"c{i}", result=SAME,
                                       ts_ms=1_700_000_000_000 + i * 1000 + 1, **fields))
    return out


def ended(run_id: str, reason: str, agent: str = "main"):
    return run_ended_event(f"{run_id}:end", reason=reason, run_id=run_id, session_key=f"agent:{agent}:{run_id}",
                           agent_id=agent, ts_ms=1_700_000_100_000)


def hand_fleet() -> list[bytes]:
    """The lines of the hand-worked fleet (module docstring), runs interleaved."""
    a = reads("a", 10) + [ended("a", "completed")]
    b = reads("b", 21, veto_from=21) + [ended("b", "failed")]
    c = reads("c", 5, agent="cron", distinct=True) + [ended("c", "completed", agent="cron")]
    fields = dict(run_id="d", session_key="agent:main:d", agent_id="main")
    d = [compaction_event("d:compaction", ts_ms=1_700_000_000_500, **fields)]
    for i in range(1, 4):
        d.append(requested_event(f"d:{i}", "gateway", {"op": "x"}, tool_call_id=f"g{i}", ts_ms=1_700_000_000_600 + i, **fields))
        d.append(completed_event(f"d:{i}:done", "gateway", {"op": "x"}, tool_call_id=f"g{i}", result=SAME,
                                 ts_ms=1_700_000_000_600 + i, **fields))
    d.append(ended("d", "aborted"))
    lines = []
    streams = [a, b, c, d]
    while any(streams):  # round robin: every run's events in order, runs interleaved
        for s in streams:
            if s:
                lines.append(encode_event(s.pop(0)))
    retry = encode_event(reads("a", 3)[5])  # a's 3rd completion, published again
    bad = [
        b"{not json",
        json.dumps({"type": "run.ended", "v": 2, "event_id": "v2", "run_id": "x"}).encode(),
        json.dumps({"type": "run.ended", "event_id": "nokey"}).encode(),
        b'{"type": "run.ended", "event_id": "big", "run_id": "big", "reason": "' + b"x" * 70_000 + b'"}',
    ]
    return lines[:30] + [retry] + bad[:2] + lines[30:] + bad[2:]


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
    assert report["verdicts"] == {"baseline": {"warn": 1, "block": 1, "abort": 1},
                                  "candidate": {"warn": 0, "block": 2 + 13, "abort": 1}}
    assert report["outcomes"] == {"baseline": {"none": 2, "warn": 0, "block": 1, "abort": 1},
                                  "candidate": {"none": 1, "warn": 0, "block": 2, "abort": 1}}
    [changed] = report["changed_runs"]
    assert (changed["run"], changed["agent"], changed["baseline"], changed["candidate"], changed["ended"]) == (
        "run:a", "main", "none", "block", "completed")
    first = changed["first_disagreement"]
    assert (first["event_id"], first["type"], first["tool"], first["baseline"], first["candidate"]) == (
        "a:9", "tool_call.requested", "read", "none", "block")
    assert first["at"].startswith(str(path)) and first["at"].endswith(f":{line_of(hand_fleet(), b'a:9')}")
    assert report["runs_disagreeing"] == 2  # a, and b from call 9 (both end blocked)
    rows = {(r["agent"], r["detector"], r["tool"]): (r["baseline"], r["candidate"]) for r in report["by_agent_detector_tool"]}
    assert rows == {
        ("main", "generic_repeat", "read"): ({"warned": 1, "blocked": 1, "aborted": 0}, {"warned": 0, "blocked": 2, "aborted": 0}),
        ("main", "compaction_loop_persisted", "gateway"): ({"warned": 0, "blocked": 0, "aborted": 1},
                                                           {"warned": 0, "blocked": 0, "aborted": 1}),
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


def reference_report(events, baseline, candidate) -> dict:
    """Runs warned/blocked/aborted per (agent, detector, tool) and each run's strongest verdict,
    per config, from the engine driven directly and counted here."""
    out = {}
    for name, config in (("baseline", baseline), ("candidate", candidate)):
        rows: dict = defaultdict(lambda: {"warned": set(), "blocked": set(), "aborted": set()})
        strongest: dict = {}
        rank = {"warn": 1, "block": 2, "abort": 3}
        driver = RunDriver(LoopEngine(config))
        for event in events:
            for verdict in published(driver.handle(event)):
                action = getattr(verdict, "action", "abort")
                if action == "allow":
                    continue
                run = verdict.run_id
                rows[(verdict.agent_id, verdict.detector, verdict.tool_name)][
                    {"warn": "warned", "block": "blocked", "abort": "aborted"}[action]].add(run)
                strongest[run] = max(strongest.get(run, 0), rank[action])
        out[name] = ({k: {kind: len(v) for kind, v in row.items()} for k, row in rows.items()}, strongest)
    return out


def test_a_generated_fleet_matches_the_engine_driven_directly(tmp_path, configs):
    # Runs of 15 calls: a loop warns at call 11 under the baseline and is blocked at call 9
    # under the candidate.
    events, _kinds = fleet_trace(300, 15, seed=11, engine=LoopEngine(BASELINE), end=True)
    path = write_lines(tmp_path / "fleet.jsonl.gz", [encode_event(e) for e in events])
    proc = loopwatch("backtest", path, "--baseline", configs[0], "--candidate", configs[1], "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    expected = reference_report(events, BASELINE, CANDIDATE)
    for name in ("baseline", "candidate"):
        got = {(r["agent"], r["detector"], r["tool"]): r[name] for r in report["by_agent_detector_tool"]
               if any(r[name].values())}
        assert got == expected[name][0], name
    names = ("none", "warn", "block", "abort")
    base, cand = expected["baseline"][1], expected["candidate"][1]
    changed = {f"run:{run}": (names[base.get(run, 0)], names[cand.get(run, 0)]) for run in set(base) | set(cand)
               if base.get(run, 0) != cand.get(run, 0)}
    assert {r["run"]: (r["baseline"], r["candidate"]) for r in report["changed_runs"]} == changed
    assert changed, "the candidate should change some outcomes of this fleet"
    assert report["runs"] == 300 and report["events"] == len(events) and report["dead_letters"] == {}


# -- bad input ---------------------------------------------------------------------------------


def test_an_unreadable_file(tmp_path, configs):
    one_line_error(loopwatch("backtest", tmp_path / "missing.jsonl", "--baseline", configs[0], "--candidate", configs[1]),
                   2, "loopwatch backtest: cannot read", "missing.jsonl")


def test_a_file_that_is_not_gzip_inside(tmp_path, configs):
    path = tmp_path / "broken.jsonl.gz"
    path.write_bytes(b"\x1f\x8b" + b"not really gzip" * 10)
    one_line_error(loopwatch("backtest", path, "--baseline", configs[0], "--candidate", configs[1]),
                   2, "cannot read", "broken.jsonl.gz")


def test_an_unknown_agent(tmp_path, configs):
    path = write_lines(tmp_path / "fleet.jsonl", hand_fleet())
    one_line_error(loopwatch("backtest", path, "--baseline", configs[0], "--candidate", configs[1], "--agent", "nobody"),
                   1, "unknown agent 'nobody'", "agents seen: cron, main")


def test_a_file_without_events(tmp_path, configs):
    path = write_lines(tmp_path / "garbage.jsonl", [b"{not json", b"[]"])
    one_line_error(loopwatch("backtest", path, "--baseline", configs[0], "--candidate", configs[1]),
                   1, "nothing to compare: all 2 records were refused")
    empty = write_lines(tmp_path / "empty.jsonl", [])
    one_line_error(loopwatch("backtest", empty, "--baseline", configs[0], "--candidate", configs[1]),
                   1, "nothing to compare: it holds no events")


def test_a_bad_config(tmp_path, configs):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tools": {"loopDetection": {"warningThreshold": 0}}}))
    path = write_lines(tmp_path / "fleet.jsonl", hand_fleet())
    one_line_error(loopwatch("backtest", path, "--baseline", configs[0], "--candidate", bad),
                   2, "--candidate:", "warningThreshold")


def test_an_unreachable_broker(configs):
    one_line_error(loopwatch("backtest", "--broker", "127.0.0.1:9", "--topic", "tool-calls", "--timeout", "2",
                             "--baseline", configs[0], "--candidate", configs[1]),
                   2, "cannot reach the broker at 127.0.0.1:9")


@pytest.mark.parametrize("args, needle", [
    (["--topic", "t"], "need --broker"),
    (["--broker", "127.0.0.1:9"], "--broker needs --topic"),
    (["--broker", "127.0.0.1:9", "--topic", "t", "--since", "yesterday"], "cannot read the time 'yesterday'"),
])
def test_options_that_do_not_fit(tmp_path, configs, args, needle):
    files = [write_lines(tmp_path / "f.jsonl", hand_fleet())] if args[0] == "--topic" else []
    one_line_error(loopwatch("backtest", *files, "--baseline", configs[0], "--candidate", configs[1], *args), 2, needle)


def test_a_plot_without_a_writable_place(tmp_path, configs):
    path = write_lines(tmp_path / "fleet.jsonl", hand_fleet())
    one_line_error(loopwatch("backtest", path, "--baseline", configs[0], "--candidate", configs[1],
                             "--plot", tmp_path / "no" / "such" / "dir.png"), 2, "cannot write")
