"""Golden random traces of profile latest (issue 14): step-for-step agreement with upstream
OpenClaw 2a627431, through the ``loopwatch conformance --profile latest`` command a user runs
(also ``make test-traces-latest``).  The traces are the repository's own copy."""

from pathlib import Path

import pytest

from harness.cli import loopwatch
from streams.conformance.traces import SessionDriver, compare_session, open_jsonl
from streams.engine import decode_state, encode_state

REPO = Path(__file__).resolve().parents[2]
LATEST = REPO / "tests" / "data" / "conformance" / "latest"


def test_every_latest_session_agrees_with_upstream():
    proc = loopwatch(
        "conformance",
        "--profile",
        "latest",
        "--traces",
        LATEST / "sessions.jsonl.gz",
        "--expected",
        LATEST / "expected.jsonl.gz",
        timeout=900,
    )
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0, "\n".join(lines[:20])
    assert lines[-2:] == ["74607 steps compared", "600 passed, 0 failed, 0 skipped"]
    assert "sessions" in proc.stderr  # progress is shown on long work


@pytest.fixture(scope="module")
def traces() -> tuple[dict, dict]:
    """The sessions by id and their expected lines, read once per module: a module-scoped
    fixture also keeps the module's tests in one xdist process (tests/conftest.py)."""
    sessions = {s["id"]: s for s in open_jsonl(LATEST / "sessions.jsonl.gz")}
    by_session: dict[str, list] = {}
    for line in open_jsonl(LATEST / "expected.jsonl.gz"):
        by_session.setdefault(line["s"], []).append(line)
    return sessions, by_session


def _session_with(traces, predicate):
    sessions, by_session = traces
    for sid, lines in by_session.items():
        for n, line in enumerate(lines):
            if predicate(line):
                return sessions[sid], lines, n
    raise AssertionError("no such step in the traces")


@pytest.mark.parametrize(
    "field, predicate, wrong",
    [
        ("vr", lambda line: line.get("vr"), lambda line: {**line, "vr": None}),
        ("ow", lambda line: "ow" in line, lambda line: {**line, "ow": [["argument_churn", 99, "x"]]}),
        ("d", lambda line: line["op"] != "end" and line["d"][7], lambda line: {**line, "d": line["d"][:7] + [None]}),
        (
            "rec",
            lambda line: (line.get("rec") or [None] * 9)[6],
            lambda line: {**line, "rec": line["rec"][:6] + [None] + line["rec"][7:]},
        ),
        ("gl", lambda line: any("window closed" in g for g in line.get("gl", [])), lambda line: {**line, "gl": []}),
    ],
)
def test_a_wrong_latest_field_is_reported(traces, field, predicate, wrong):
    """Each of latest's own fields is compared: changing it in the expected line fails the session."""
    session, lines, n = _session_with(traces, predicate)
    assert compare_session(session, lines, "latest").failure is None
    lines = [*lines[:n], wrong(lines[n]), *lines[n + 1 :]]
    failure = compare_session(session, lines, "latest").failure
    assert failure is not None and f"field {field!r}" in failure


def test_configurable_final_fails_the_latest_traces(traces):
    """The two profiles really differ: the default profile disagrees with latest's answers."""
    session, lines, _ = _session_with(traces, lambda line: line.get("b"))
    assert compare_session(session, lines, "latest").failure is None
    assert compare_session(session, lines).failure is not None


def test_every_latest_state_survives_the_state_codec():
    """The stored form of a latest run (flags, digests, the guard's observations in all their
    forms) decodes to the same records and instrumentation, after every step of the first
    150 sessions."""
    checked = 0
    for n, session in enumerate(open_jsonl(LATEST / "sessions.jsonl.gz")):
        if n == 150:
            break
        driver = SessionDriver(session, "latest")
        for _ in driver.run():
            for run in driver.runs:
                state = run.state
                if state is None:
                    continue
                back = decode_state(encode_state(state))
                assert back.records() == state.records()
                got, want = back.latest, state.latest
                assert got.recent_observations(back.sigs) == want.recent_observations(state.sigs)
                assert (got.observed, got.dropped) == (want.observed, want.dropped)
                assert (got.ring is None) == (want.ring is None)  # (only the last 16 are kept)
                assert got.rereads == want.rereads
                assert back.guard == state.guard and back.warning_buckets == state.warning_buckets
                checked += 1
    assert checked > 15_000


def test_every_arming_takes_the_last_16_observations(traces):
    """The engine keeps the guard's observations as flags in the history (with the dropped
    ones aside, or an explicit list once they come out of order); every arming of the traces
    must take as baseline exactly the last 16 outcomes the guard observed, which a plain list
    kept alongside knows."""
    sessions, _ = traces
    arms = 0
    for sid, session in sessions.items():
        driver = SessionDriver(session, "latest")
        steps = session["steps"]
        observed: list[str] = []
        for out in driver.run():
            run = driver.runs[0]
            guard_on = driver.engine.settings_for(run.agent_id).guard.enabled
            if out.get("succ"):
                observed = []  # a successor run: a fresh guard
            op = steps[out["i"]]["op"]
            if op in ("call", "end") and "g" in out and guard_on:
                observed.append(out["rec"][0])
                if out["g"][0]:
                    observed = []  # the abort ends the guard's run
            if op == "arm" and guard_on and observed:
                arms += 1
                assert run.state.latest.rereads.baseline == tuple(observed[-16:]), (sid, out["i"])
    assert arms > 200
