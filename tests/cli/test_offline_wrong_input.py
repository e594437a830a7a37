"""``loopwatch evaluate`` and ``backtest`` on the wrong input: one line on stderr, a non-zero
status, nothing on stdout and no plot written; a raw transcript (a format ``loopwatch import``
reads) is named by its format with the command that imports it.  And the backtest header's
time range is the span of the events' times, whatever order they come in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import REPO
from harness.cli import loopwatch, one_line_error
from harness.fleets import BASELINE
from schemas import encode_event
from streams.edge.events import requested_event, run_ended_event

TRANSCRIPTS = REPO / "tests" / "data" / "transcripts"
RAW = {
    "claude-code": TRANSCRIPTS / "claude-code" / "session_with_compaction.jsonl",
    "codex": TRANSCRIPTS / "codex" / "session_with_compaction.jsonl",
    "mini-swe-agent": TRANSCRIPTS / "mini-swe-agent" / "django__django-16255.traj.json",
}


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(BASELINE))
    return path


def offline(command: str, config: Path, *files: Path, plot: Path) -> list[object]:
    if command == "evaluate":
        return ["evaluate", *files, "--plot", plot]
    return ["backtest", *files, "--baseline", config, "--candidate", config, "--plot", plot]


@pytest.mark.parametrize("command", ["evaluate", "backtest"])
@pytest.mark.parametrize("fmt", sorted(RAW))
def test_a_raw_transcript_is_named_with_the_import_to_run(command, fmt, config, tmp_path):
    png = tmp_path / "plot.png"
    path = RAW[fmt]
    proc = loopwatch(*offline(command, config, path, plot=png))
    line = one_line_error(proc, 1, f"{path} is a {fmt} transcript", f"`loopwatch import {fmt} {path} -o events.jsonl`")
    assert line.startswith(f"loopwatch {command}: nothing to ")
    assert proc.stdout == ""
    assert not png.exists()


@pytest.mark.parametrize("command", ["evaluate", "backtest"])
def test_records_that_are_no_events_print_no_report_and_no_plot(command, config, tmp_path):
    junk = tmp_path / "junk.jsonl"
    junk.write_text('{"not": "an event"}\n[1, 2]\n')
    png = tmp_path / "plot.png"
    proc = loopwatch(*offline(command, config, junk, plot=png))
    one_line_error(proc, 1, "all 2 records were refused")
    assert proc.stdout == ""
    assert not png.exists()


def test_the_backtest_header_spans_the_event_times_not_the_first_and_last_read(config, tmp_path):
    # Hand-made times: the earliest event is read second, the latest third; the first and the
    # last read are neither.  2024-01-01T00:00:00Z is 1_704_067_200_000 ms.
    t0 = 1_704_067_200_000
    fields = dict(session_key="agent:main:a", agent_id="main")
    events = [
        requested_event("e1", "read", {"p": 1}, tool_call_id="c1", ts_ms=t0 + 60_000, run_id="a", **fields),
        requested_event("e2", "read", {"p": 2}, tool_call_id="c2", ts_ms=t0, run_id="a", **fields),
        requested_event("e3", "read", {"p": 3}, tool_call_id="c3", ts_ms=t0 + 3_600_000, run_id="a", **fields),
        run_ended_event("e4", "completed", ts_ms=t0 + 120_000, run_id="a", **fields),
    ]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
    proc = loopwatch("backtest", path, "--baseline", config, "--candidate", config)
    assert proc.returncode == 0, proc.stderr
    header = proc.stdout.splitlines()[0]
    assert header.endswith("event times 2024-01-01T00:00:00Z to 2024-01-01T01:00:00Z)"), header
