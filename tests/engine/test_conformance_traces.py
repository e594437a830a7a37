"""Golden random traces: step-for-step agreement with upstream (issue 5), through the
``loopwatch conformance --traces`` command a user runs (also `make test-traces`)."""

from harness.cli import loopwatch
from streams.conformance.traces import compare_session, open_jsonl


def test_every_golden_session_agrees_with_upstream(conformance_dir):
    traces = conformance_dir / "traces"
    proc = loopwatch(
        "conformance",
        "--traces",
        traces / "one-run-sessions.jsonl.gz",
        "--expected",
        traces / "expected.jsonl.gz",
        timeout=900,
    )
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0, "\n".join(lines[:20])
    assert lines[-2:] == ["69196 steps compared", "666 passed, 0 failed, 0 skipped"]
    assert "sessions" in proc.stderr  # progress is shown on long work


def test_a_wrong_answer_is_reported_with_field_expected_and_got(conformance_dir):
    traces = conformance_dir / "traces"
    session = next(open_jsonl(traces / "one-run-sessions.jsonl.gz"))
    expected = [line for line in open_jsonl(traces / "expected.jsonl.gz") if line["s"] == session["id"]]
    expected[3] = {**expected[3], "h": "0" * 32}
    result = compare_session(session, expected)
    assert result.failure.startswith("step 3 (") and "field 'h'" in result.failure and "0" * 32 in result.failure
