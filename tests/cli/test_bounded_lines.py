"""``streams.offline.files.read_lines``: every file reader's line splitting, with a bound on a line (issue 26).

The reference for the splitting is ``bytes.split(b"\\n")`` on the whole input (an independent
rule: a line is what lies between two line ends). The gzip bomb is one line of 64 MiB that
compresses to about 64 KiB: read through a bounded ``readline``, it is never held.
"""

from __future__ import annotations

import gzip
import io
import json
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.bounded_lines import gzip_bomb
from harness.cli import loopwatch
from schemas.events import encode_event
from streams.edge.events import requested_event
from streams.engine import engine_for
from streams.offline import files
from streams.offline.backtest import Backtest, FileSource
from streams.offline.files import MAX_LINE_BYTES, OverlongLine, decompressed, read_lines

ENABLED = {"tools": {"loopDetection": {"enabled": True}}}
BOMB_LINE_BYTES = 64 * 1024 * 1024


def reference(data: bytes, limit: int) -> list[bytes | OverlongLine]:
    pieces = data.split(b"\n")
    ends = [True] * (len(pieces) - 1) + [False]
    if pieces[-1] == b"":  # a final line end closes the last line; nothing follows it
        pieces, ends = pieces[:-1], ends[:-1]
    return [p + b"\n" * end if len(p) <= limit else OverlongLine(len(p), limit) for p, end in zip(pieces, ends)]


lines = st.lists(
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"x")) | st.sampled_from([b"", b"\r"]), max_size=12
)


@settings(max_examples=400, deadline=None)
@given(lines, st.booleans(), st.integers(1, 24), st.integers(1, 9), st.integers(1, 16))
def test_read_lines_splits_as_the_line_ends_do_and_reports_every_line_over_the_bound(
    pieces, final_end, limit, skip_chunk, buffer_size
):
    data = b"\n".join(pieces) + (b"\n" if final_end and pieces else b"")
    old, files.SKIP_CHUNK = files.SKIP_CHUNK, skip_chunk
    try:
        got = list(read_lines(io.BufferedReader(io.BytesIO(data), buffer_size=buffer_size), limit))
    finally:
        files.SKIP_CHUNK = old
    assert got == reference(data, limit)


@settings(max_examples=100, deadline=None)
@given(lines, st.integers(1, 24))
def test_read_lines_through_gzip_splits_the_same(pieces, limit):
    data = b"\n".join(pieces)
    assert list(read_lines(decompressed(io.BytesIO(gzip.compress(data))), limit)) == reference(data, limit)
    if not data.startswith(b"\x1f\x8b"):  # (data that starts with gzip's magic bytes is taken for gzip)
        assert decompressed(raw := io.BytesIO(data)) is raw  # not gzip: read as it is


def event_line(i: int, run: str = "r1") -> bytes:
    event = requested_event(
        f"{run}:{i}",
        "read",
        {"p": 1},
        tool_call_id=f"c{i}",
        run_id=run,
        session_key=f"agent:main:{run}",
        agent_id="main",
        ts_ms=1_000 + i,
    )
    return encode_event(event) + b"\n"


def test_a_gzip_bomb_line_is_skipped_with_bounded_memory_and_the_next_lines_are_read(tmp_path):
    path = gzip_bomb(tmp_path / "bomb.jsonl.gz", [event_line(0)], [event_line(1), event_line(2)], BOMB_LINE_BYTES)
    assert path.stat().st_size < BOMB_LINE_BYTES // 500  # small compressed, large inflated
    tracemalloc.start()
    try:
        with open(path, "rb") as raw:
            got = list(read_lines(decompressed(raw)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got[0] == event_line(0) and got[2:] == [event_line(1), event_line(2)]
    assert isinstance(got[1], OverlongLine) and got[1].size > BOMB_LINE_BYTES - 1024 * 1024
    # Python allocations while reading a 64 MiB line: a few times the bound, not the line
    # (the zlib window and gzip's buffers included); iterating the file held all of it.
    assert peak < 8 * MAX_LINE_BYTES, peak


def test_backtest_counts_a_bomb_line_as_oversized_with_bounded_memory_and_goes_on(tmp_path):
    events = [event_line(i) for i in range(12)]
    path = gzip_bomb(tmp_path / "bomb.jsonl.gz", events[:6], events[6:], BOMB_LINE_BYTES)
    source = FileSource([path])
    strict = {"tools": {"loopDetection": {"enabled": True, "warningThreshold": 5, "criticalThreshold": 8}}}
    backtest = Backtest(engine_for(ENABLED), engine_for(strict))
    tracemalloc.start()
    try:
        backtest.run(source.records(), keyed=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * MAX_LINE_BYTES, peak  # the 64 MiB line was never held
    assert source.overlong == 1
    assert dict(backtest.dead) == {"oversized": 1}
    assert backtest.events == 12  # the lines before the bomb and after it


def test_replay_rejects_a_bomb_line_as_oversized_and_replays_the_rest(tmp_path):
    config = tmp_path / "loop.json"
    config.write_text(json.dumps(ENABLED))
    path = gzip_bomb(
        tmp_path / "bomb.jsonl.gz",
        [event_line(i) for i in range(3)],
        [event_line(i) for i in range(3, 5)],
        BOMB_LINE_BYTES,
    )
    proc = loopwatch("replay", path, "--config", config, "--json")
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert out[0] == {
        "line": 4,
        "rejected": "oversized",
        "detail": f"line is {out[0]['detail'].split()[2]} bytes, over the {MAX_LINE_BYTES}-byte bound "
        "of a line: skipped unread",
    }
    assert int(out[0]["detail"].split()[2]) > BOMB_LINE_BYTES - 1024 * 1024
    assert out[-1]["summary"]["events"] == 5 and out[-1]["summary"]["rejected"] == 1


def test_a_line_just_over_the_record_limit_is_still_checked_and_named_by_its_size(tmp_path):
    # Within the margin: the event check says how large it is, as the worker's dead letter would.
    from schemas.events import MAX_EVENT_BYTES

    line = b'{"pad": "' + b"a" * (MAX_EVENT_BYTES + 10) + b'"}\n'
    assert len(line) - 1 <= MAX_LINE_BYTES
    path = tmp_path / "t.jsonl"
    path.write_bytes(event_line(0) + line + event_line(1))
    config = tmp_path / "loop.json"
    config.write_text(json.dumps(ENABLED))
    proc = loopwatch("replay", path, "--config", config, "--json")
    first = json.loads(proc.stdout.splitlines()[0])
    assert first == {
        "line": 2,
        "rejected": "oversized",
        "detail": f"record is {len(line) - 1} bytes, the limit is {MAX_EVENT_BYTES}",
    }


def test_backtest_jobs_count_a_bomb_line_once_as_one_process_does(tmp_path):
    """With ``--jobs`` every shard reads the file through ``read_lines`` itself; the over-long
    line is counted once (it falls to one shard), as by one process."""
    events = [event_line(i, run=f"r{i % 4}") for i in range(12)]
    path = gzip_bomb(tmp_path / "bomb.jsonl.gz", events[:6], events[6:], BOMB_LINE_BYTES)
    reports = _reports_counting_one_overlong_line(path, (1, 2))
    assert reports[2] == reports[1]


def test_backtest_jobs_over_a_plain_file_count_an_overlong_line_once(tmp_path):
    """A plain file: with ``--jobs`` each shard reads it itself (gzip goes through the parent),
    every shard through ``read_lines`` with its bound; the over-long line is counted once."""
    events = [event_line(i, run=f"r{i % 4}") for i in range(12)]
    path = tmp_path / "long.jsonl"
    path.write_bytes(b"".join(events[:6]) + b"x" * (4 * MAX_LINE_BYTES) + b"\n" + b"".join(events[6:]))
    assert not FileSource([path]).any_gzip()
    reports = _reports_counting_one_overlong_line(path, (1, 2, 3))
    assert reports[2] == reports[1] == reports[3]


def _reports_counting_one_overlong_line(path, jobs_tried) -> dict:
    """The backtest report of 12 events and one over-long line in ``path`` per number of jobs,
    each run checked to count the line once, as one dead-letter-worthy record."""
    strict = {"tools": {"loopDetection": {"enabled": True, "warningThreshold": 5, "criticalThreshold": 8}}}
    reports = {}
    for jobs in jobs_tried:
        source = FileSource([path])
        backtest = Backtest(engine_for(ENABLED), engine_for(strict))
        backtest.run(source.records(), keyed=False, jobs=jobs)
        assert source.overlong == 1, jobs
        assert dict(backtest.dead) == {"oversized": 1}, jobs
        assert backtest.events == 12 and backtest.records == 13, jobs
        reports[jobs] = backtest.report().data
    return reports
