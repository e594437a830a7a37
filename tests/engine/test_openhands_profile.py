"""Profile openhands (issue 29): OpenHands' StuckDetector, step for step, against the peer's own
published code (``openhands-sdk``'s ``Conversation.run()``, driven by
``tests/oracles/openhands_oracle.py`` in its own venv, ``make oracle-openhands``).  The golden answers were computed by that oracle; one test computes
them again from the installed package."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from pathlib import Path

import pytest

from harness.cli import loopwatch
from schemas.events import decode_event, encode_event
from schemas.names import (
    OPENHANDS_ACTION_ERROR,
    OPENHANDS_ACTION_OBSERVATION,
    OPENHANDS_ALTERNATING,
    OPENHANDS_MONOLOGUE,
)
from streams.conformance import peers
from streams.conformance.traces import open_jsonl
from streams.edge.events import agent_message_event, completed_event, requested_event
from streams.engine import RunDriver, decode_state, encode_state, engine_for, published
from streams.engine import openhands as oh

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "conformance" / "openhands"
ORACLE = REPO / "tests" / "oracles" / "openhands_oracle.py"
OPENHANDS = {"loopwatch": {"profile": "openhands"}}


def _oracle_python() -> Path:
    root = Path(os.environ.get("LOOPWATCH_ORACLES", Path.home() / ".cache" / "loopwatch" / "oracles"))
    return root / "openhands" / "bin" / "python"


def _steps(path: Path) -> dict[str, list]:
    return {line["id"]: [s or [None, None] for s in line["steps"]] for line in open_jsonl(path)}


# -- the golden traces and the transcribed cases, through the command a user runs ----------------


def test_every_openhands_session_agrees_with_the_oracle():
    proc = loopwatch(
        "conformance",
        "--profile",
        "openhands",
        "--traces",
        DATA / "sessions.jsonl.gz",
        "--expected",
        DATA / "expected.jsonl.gz",
        timeout=600,
    )
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0, "\n".join(lines[:20])
    assert lines[-2:] == ["13737 steps compared", "600 passed, 0 failed, 0 skipped"]
    assert "sessions" in proc.stderr  # progress is shown


def test_openhands_own_unit_test_cases_transcribed():
    proc = loopwatch(
        "conformance",
        "--profile",
        "openhands",
        "--traces",
        DATA / "cases.jsonl",
        "--expected",
        DATA / "cases-expected.jsonl",
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "13 passed, 0 failed, 0 skipped"


def test_the_golden_answers_are_the_installed_oracles():
    """The expected steps (of the random sessions and of the hand-worked cases) are what
    openhands-sdk's own run loop answers today, recomputed from the installed package."""
    python = _oracle_python()
    if not python.exists():
        pytest.skip(f"the openhands-sdk oracle is not installed ({python}): make oracle-openhands")
    version = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('openhands-sdk'))"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert version.stdout.strip() == "1.58.2"
    for sessions, expected in (("sessions.jsonl.gz", "expected.jsonl.gz"), ("cases.jsonl", "cases-expected.jsonl")):
        proc = subprocess.run([python, ORACLE, "answer", DATA / sessions], capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-2000:]
        got = {
            line["id"]: [s or [None, None] for s in line["steps"]] for line in map(json.loads, proc.stdout.splitlines())
        }
        assert got == _steps(DATA / expected)


def test_the_traces_exercise_every_pattern_and_the_nudge():
    counts: dict[str, int] = {}
    for steps in _steps(DATA / "expected.jsonl.gz").values():
        for nudged, pattern in steps:
            if nudged:
                counts["nudge"] = counts.get("nudge", 0) + 1
            if pattern:
                counts[pattern] = counts.get(pattern, 0) + 1
    for name in (
        "nudge",
        OPENHANDS_ACTION_OBSERVATION,
        OPENHANDS_ACTION_ERROR,
        OPENHANDS_MONOLOGUE,
        OPENHANDS_ALTERNATING,
    ):
        assert counts.get(name, 0) >= 30, counts


def test_the_comparison_fails_on_a_changed_answer(tmp_path):
    lines = [json.loads(line) for line in gzip.open(DATA / "expected.jsonl.gz", "rt")]
    steps = lines[0]["steps"]
    last = next(i for i in range(len(steps) - 1, -1, -1) if steps[i])
    steps[last] = [None, None]  # the stop the oracle saw, taken away
    path = tmp_path / "expected.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    results = peers.run_peer_traces(DATA / "sessions.jsonl.gz", path, "openhands")
    assert [r.session_id for r in results if r.failure] == [lines[0]["id"]]


@pytest.mark.parametrize("window", [19, 21])
def test_the_traces_tell_a_window_one_event_off_apart(monkeypatch, window):
    """Some sessions stretch a pattern to the edge of OpenHands' 20-event window."""
    monkeypatch.setattr(oh, "SCAN", window)
    results = peers.iter_peer_traces(DATA / "sessions.jsonl.gz", DATA / "expected.jsonl.gz", "openhands")
    assert any(r.failure for r in results)


def test_a_state_stored_and_restored_at_every_event_decides_the_same():
    """The worker stores states between batches: encode/decode at every event changes nothing."""
    engine = engine_for(OPENHANDS)
    sessions = list(open_jsonl(DATA / "sessions.jsonl.gz"))[:120]
    expected = _steps(DATA / "expected.jsonl.gz")
    for session in sessions:
        state, got = None, []
        for event in peers.openhands_events(session):
            step = engine.handle(state, decode_event(encode_event(event)), validated=True)
            answer = [None, None]
            for verdict in published(step):
                if getattr(verdict, "action", None) == "warn":
                    answer[0] = verdict.tool_name
                elif getattr(verdict, "action", None) is None:
                    answer[1] = verdict.detector
            got.append(answer)
            state = decode_state(encode_state(step.state))
        assert got == expected[session["id"]], session["id"]


# -- hand-worked rules -----------------------------------------------------------------------------


def _run(engine, events):
    driver = RunDriver(engine)
    return [published(driver.handle(e)) for e in events]


def _loop(n, thought=lambda i: "same", error=None, gate=False, agent_id=None):
    events = []
    for i in range(n):
        ids = {"run_id": "r1", "session_key": "agent:main:s1", "agent_id": agent_id, "ts_ms": i + 1}
        events.append(
            requested_event(
                f"q{i}", "terminal", {"command": "ls"}, tool_call_id=f"c{i}", thought=thought(i), gate=gate, **ids
            )
        )
        outcome = {"error": error} if error else {"result": "file1.txt"}
        events.append(completed_event(f"o{i}", "terminal", {"command": "ls"}, tool_call_id=f"c{i}", **outcome, **ids))
    return events


def test_four_identical_pairs_stop_the_agent_and_later_calls_are_refused():
    verdicts = _run(engine_for(OPENHANDS), _loop(5, gate=True))
    assert [type(v).__name__ for v in verdicts[0]] == ["Decision"] and verdicts[0][0].action == "allow"
    abort = verdicts[7][0]
    assert (abort.type if hasattr(abort, "type") else type(abort).__name__) in ("RunAborted", "loop.run_aborted")
    assert abort.detector == OPENHANDS_ACTION_OBSERVATION and abort.tool_name == "terminal"
    assert verdicts[8][0].action == "block"  # the fifth call, after the stop


def test_a_different_thought_is_a_different_action():
    verdicts = _run(engine_for(OPENHANDS), _loop(6, thought=lambda i: f"attempt {i}"))
    assert not any(verdicts)


def test_three_failing_calls_nudge_the_model_once():
    verdicts = _run(engine_for(OPENHANDS), _loop(3, error="boom"))
    nudge = verdicts[5][0]
    assert (nudge.action, nudge.detector, nudge.count, nudge.notify_model) == ("warn", OPENHANDS_ACTION_ERROR, 3, True)
    assert "`terminal` with the same arguments 3 times in a row" in nudge.message
    assert "boom" not in nudge.message  # the raw error never left the runner
    assert not any(verdicts[:5])


def test_parallel_calls_are_judged_after_the_whole_step():
    ids = {"run_id": "r1", "session_key": "agent:main:s1"}
    events = []
    for i in range(4):  # each step: the same call twice in parallel, then both outcomes
        events += [
            requested_event(f"q{i}a", "grep", {"p": 1}, tool_call_id=f"a{i}", **ids),
            requested_event(f"q{i}b", "grep", {"p": 1}, tool_call_id=f"b{i}", **ids),
            completed_event(f"o{i}a", "grep", {"p": 1}, result="x", tool_call_id=f"a{i}", **ids),
            completed_event(f"o{i}b", "grep", {"p": 1}, result="x", tool_call_id=f"b{i}", **ids),
        ]
    verdicts = _run(engine_for(OPENHANDS), events)
    # 4 identical pairs are complete after the second step's first outcome, but OpenHands looks
    # only when the step's last outcome is in.
    flagged = [i for i, v in enumerate(verdicts) if v]
    assert flagged[0] == 7 and verdicts[7][0].detector == OPENHANDS_ACTION_OBSERVATION
    assert all(verdicts[i][0].action == "block" for i in flagged[1:])  # the later calls, refused


def test_three_empty_replies_are_a_monologue_and_a_user_message_resets():
    ids = {"run_id": "r1", "session_key": "agent:main:s1"}
    empty = [agent_message_event(f"m{i}", "", **ids) for i in range(2)]
    user = agent_message_event("u", "try again", source="user", **ids)
    verdicts = _run(
        engine_for(OPENHANDS), [*empty, user, *[agent_message_event(f"n{i}", " ", **ids) for i in range(3)]]
    )
    assert [bool(v) for v in verdicts] == [False, False, False, False, False, True]
    assert verdicts[-1][0].detector == OPENHANDS_MONOLOGUE


def _replies(*texts):
    ids = {"run_id": "r1", "session_key": "agent:main:s1"}
    return [agent_message_event(f"m{i}", text, **ids) for i, text in enumerate(texts)]


def test_a_reply_with_content_finishes_the_agent_and_is_not_judged():
    # OpenHands: the two empty replies each get the corrective feedback and a check (2 agent
    # messages: no monologue); "Done." sets FINISHED and the run loop exits before checking.
    verdicts = _run(engine_for(OPENHANDS), _replies("", "", "Done."))
    assert verdicts == [[], [], []]


def test_a_third_empty_reply_is_still_a_monologue():
    # The third empty reply does not finish the agent: OpenHands checks and sees 3 agent messages.
    verdicts = _run(engine_for(OPENHANDS), _replies("", "", "   "))
    assert [bool(v) for v in verdicts] == [False, False, True]
    assert verdicts[-1][0].detector == OPENHANDS_MONOLOGUE


def test_an_agent_that_goes_on_after_finishing_is_judged_at_its_next_reply():
    # A Stop hook that refuses the finish: the agent replies again without a user message.  The
    # finishing reply stays in the window, so the next empty reply makes 4 agent messages.
    verdicts = _run(engine_for(OPENHANDS), _replies("", "", "Done.", ""))
    assert [bool(v) for v in verdicts] == [False, False, False, True]
    assert verdicts[-1][0].detector == OPENHANDS_MONOLOGUE


def test_the_profile_is_chosen_per_agent_and_openclaw_agents_decide_as_before():
    detection = {"tools": {"loopDetection": {"enabled": True}}}
    config = {**detection, "agents": {"list": [{"id": "oh", "loopwatch": {"profile": "openhands"}}]}}
    mixed, plain = engine_for(config), engine_for(detection)
    openclaw = _loop(25, agent_id="claw")
    assert _run(mixed, openclaw) == _run(plain, openclaw)
    assert any(_run(mixed, openclaw))  # (OpenClaw warns and blocks this loop)
    stuck = _run(mixed, _loop(4, agent_id="oh"))
    assert stuck[7][0].detector == OPENHANDS_ACTION_OBSERVATION


def test_openclaw_profiles_take_agent_messages_and_ignore_them():
    event = decode_event(encode_event(agent_message_event("m1", "hello", run_id="r1", session_key="s")))
    for config in (None, {"loopwatch": {"profile": "latest"}}):
        step = engine_for(config).handle(None, event, validated=True)
        assert published(step) == []


def test_the_worker_publishes_the_peer_verdicts_across_batches_and_checkpoints():
    """The worker's batch processor (record checks, the run table's state envelope, a
    checkpoint after every batch) publishes what the engine alone does, for both peer profiles."""
    from schemas.keys import record_key
    from schemas.verdicts import decode_verdict
    from streams.app.processor import BatchProcessor, Record
    from streams.conformance.traces import open_jsonl as sessions_of

    gemini = REPO / "tests" / "data" / "conformance" / "gemini-cli"
    for profile, folder, events_of in (
        ("openhands", DATA, peers.openhands_events),
        ("gemini-cli", gemini, peers.gemini_events),
    ):
        config = {"loopwatch": {"profile": profile}}
        events = [e for s in list(sessions_of(folder / "sessions.jsonl.gz"))[:40] for e in events_of(s)]
        want = [v for v in RunDriver(engine_for(config)).verdicts(events)]
        store: dict = {}
        processor = BatchProcessor(engine_for(config))
        got = []
        recs = [Record("tool-calls", 0, i, record_key(e).encode(), encode_event(e), 1.0) for i, e in enumerate(events)]
        for i in range(0, len(recs), 97):
            result = processor.process(
                recs[i : i + 97], lambda partition, key, store=store: store.get((partition, key))
            )
            got += [decode_verdict(v.value) for v in result.verdicts]
            checkpoint = processor.runs.checkpoint()
            for pk, value in checkpoint.writes.items():
                store.pop(pk, None) if value is None else store.__setitem__(pk, value)
            processor = BatchProcessor(engine_for(config))  # a restarted worker: states from the table only
        assert got == want and any(getattr(v, "detector", None) for v in got), profile
