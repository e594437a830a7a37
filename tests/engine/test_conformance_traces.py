"""Golden random traces: step-for-step agreement with upstream (issue 5).  The full run is
`make test-traces` (the CLI); here every session runs through the same driver."""

import pytest

from streams.conformance.traces import compare_session, open_jsonl, run_traces


@pytest.mark.slow
def test_every_golden_session_agrees_with_upstream(shared_dir):
    traces = shared_dir / "conformance" / "traces"
    results = run_traces(traces / "one-run-sessions.jsonl.gz", traces / "expected.jsonl.gz")
    failures = [f"{r.session_id}: {r.failure}" for r in results if r.failure]
    assert len(results) == 666
    assert sum(r.steps for r in results) == 69196
    assert not failures, "\n".join(failures[:10])


def test_a_wrong_answer_is_reported_with_field_expected_and_got(shared_dir):
    traces = shared_dir / "conformance" / "traces"
    session = next(open_jsonl(traces / "one-run-sessions.jsonl.gz"))
    expected = [line for line in open_jsonl(traces / "expected.jsonl.gz") if line["s"] == session["id"]]
    expected[3] = {**expected[3], "h": "0" * 32}
    result = compare_session(session, expected)
    assert result.failure.startswith("step 3 (") and "field 'h'" in result.failure and "0" * 32 in result.failure
