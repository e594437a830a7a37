"""Profile gemini-cli (issue 29): Gemini CLI's tool-call loop rule and what its client does with a
detection, step for step, against the peer's own published code (``@google/gemini-cli-core``
0.61.0's LoopDetectionService driven in node by ``tests/oracles/gemini_oracle.mjs``;
``make oracle-gemini``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import msgspec
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from harness.cli import loopwatch
from schemas.events import ToolCallRequested, decode_event, encode_event
from schemas.names import GEMINI_TOOL_CALL_LOOP
from streams.conformance import peers
from streams.conformance.traces import open_jsonl
from streams.edge.events import agent_message_event, requested_event
from streams.edge.hashing import gemini_call_key
from streams.engine import RunDriver, decode_state, encode_state, engine_for, published
from streams.engine import gemini as gm

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "conformance" / "gemini-cli"
ORACLE = REPO / "tests" / "oracles" / "gemini_oracle.mjs"
GEMINI = {"loopwatch": {"profile": "gemini-cli"}}


def _core() -> Path:
    root = Path(os.environ.get("LOOPWATCH_ORACLES", Path.home() / ".cache" / "loopwatch" / "oracles"))
    core = root / "gemini" / "node_modules" / "@google" / "gemini-cli-core"
    if not (core / "package.json").exists() or shutil.which("node") is None:
        pytest.skip(f"the @google/gemini-cli-core oracle is not installed ({core}): make oracle-gemini")
    return core


def _steps(path: Path) -> dict[str, list]:
    return {line["id"]: line["steps"] for line in open_jsonl(path)}


GOLDEN = {
    "tool-calls": (DATA, 23622, 9),
    "content": (REPO / "tests" / "data" / "conformance" / "gemini-cli-content", 15501, 26),
}
"""The golden sets (sessions answered by the oracle, and Gemini's own unit-test cases
transcribed): the tool-call rule's, and the content detector's (tests/engine/test_gemini_content.py
has its other tests).  Each: (directory, steps compared, cases)."""


@pytest.mark.parametrize("data, steps, _cases", GOLDEN.values(), ids=GOLDEN)
def test_every_gemini_session_agrees_with_the_oracle(data, steps, _cases):
    proc = loopwatch(
        "conformance",
        "--profile",
        "gemini-cli",
        "--traces",
        data / "sessions.jsonl.gz",
        "--expected",
        data / "expected.jsonl.gz",
        timeout=600,
    )
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0, "\n".join(lines[:20])
    assert lines[-2:] == [f"{steps} steps compared", "600 passed, 0 failed, 0 skipped"]


@pytest.mark.parametrize("data, _steps_compared, cases", GOLDEN.values(), ids=GOLDEN)
def test_gemini_own_unit_test_cases_transcribed(data, _steps_compared, cases):
    proc = loopwatch(
        "conformance",
        "--profile",
        "gemini-cli",
        "--traces",
        data / "cases.jsonl",
        "--expected",
        data / "cases-expected.jsonl",
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == f"{cases} passed, 0 failed, 0 skipped"


@pytest.mark.parametrize("data", [d for d, _s, _c in GOLDEN.values()], ids=GOLDEN)
def test_the_golden_answers_are_the_installed_oracles(data):
    core = _core()
    assert json.loads((core / "package.json").read_text())["version"] == "0.61.0"
    for sessions, expected in (("sessions.jsonl.gz", "expected.jsonl.gz"), ("cases.jsonl", "cases-expected.jsonl")):
        proc = subprocess.run(["node", ORACLE, core, data / sessions], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        got = {row["id"]: row["steps"] for row in map(json.loads, proc.stdout.splitlines())}
        assert got == _steps(data / expected)


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=6) | st.integers(0, 2**33).map(str), inner, max_size=4)
    ),
    max_leaves=12,
)


# (No shrinking: every example starts node; a failure prints its whole batch.)
@settings(max_examples=6, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(st.lists(st.tuples(st.sampled_from(["read_file", "t", "é"]), _json), min_size=40, max_size=40))
def test_the_call_key_is_the_one_node_computes(calls):
    """``gemini_call_key`` against node's own ``JSON.stringify`` and ``createHash`` (Gemini's
    ``getToolCallKey``), on generated arguments in generated key orders."""
    script = (
        "const {createHash}=require('node:crypto');"
        "const calls=JSON.parse(require('node:fs').readFileSync(0,'utf8'));"
        "process.stdout.write(JSON.stringify(calls.map(([n,a])=>createHash('sha256').update(`${n}:${JSON.stringify(a)}`).digest('hex'))));"
    )
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    proc = subprocess.run(["node", "-e", script], input=json.dumps(calls), capture_output=True, text=True, timeout=60)
    assert json.loads(proc.stdout) == [gemini_call_key(name, json.loads(json.dumps(args))) for name, args in calls]


def test_the_traces_tell_another_rule_apart(monkeypatch):
    for name, value in (("REPEATS", 4), ("REPEATS", 6), ("CYCLES", 4), ("CYCLES", 6)):
        with monkeypatch.context() as m:
            m.setattr(gm, name, value)
            results = peers.iter_peer_traces(DATA / "sessions.jsonl.gz", DATA / "expected.jsonl.gz", "gemini-cli")
            assert any(r.failure for r in results), (name, value)


def test_the_traces_need_geminis_own_key():
    """Sessions repeat the same arguments in another key order: one call for loopwatch's
    ``args_hash``, two for Gemini.  Without ``call_key`` some answers differ."""
    expected = _steps(DATA / "expected.jsonl.gz")
    engine = engine_for(GEMINI)
    differ = 0
    for session in open_jsonl(DATA / "sessions.jsonl.gz"):
        driver, got = RunDriver(engine), []
        for event in peers.gemini_events(session):
            if type(event) is ToolCallRequested:
                step = driver.handle(msgspec.structs.replace(event, call_key=msgspec.UNSET))
                got.append("abort" if step.abort else "feedback" if step.vetoed else "allow")
            else:
                driver.handle(event)
                got.append(None)
        differ += got != [w and w[0] for w in expected[session["id"]]]
    assert differ > 0


def test_a_state_stored_and_restored_at_every_event_decides_the_same():
    engine = engine_for(GEMINI)
    expected = _steps(DATA / "expected.jsonl.gz")
    for session in list(open_jsonl(DATA / "sessions.jsonl.gz"))[:150]:
        state, got = None, []
        for event in peers.gemini_events(session):
            step = engine.handle(state, decode_event(encode_event(event)), validated=True)
            if type(event) is ToolCallRequested:
                kind = "abort" if step.abort else "feedback" if step.vetoed else "allow"
                got.append([kind, None if kind == "allow" else "consecutive_identical_tool_calls"])
            else:
                got.append(None)
            state = decode_state(encode_state(step.state))
        assert got == expected[session["id"]], session["id"]


def test_first_detection_blocks_with_feedback_the_second_aborts_and_later_calls_are_refused():
    ids = {"run_id": "r1", "session_key": "agent:main:s1"}
    driver = RunDriver(engine_for(GEMINI))
    verdicts = [
        published(
            driver.handle(requested_event(f"e{i}", "read_file", {"path": "a"}, gemini_key=True, gate=True, **ids))
        )
        for i in range(7)
    ]
    assert all(v[0].action == "allow" for v in verdicts[:4])
    first = verdicts[4]
    assert [v.action for v in first] == ["block"] and first[0].detector == GEMINI_TOOL_CALL_LOOP
    assert first[0].message.startswith("System: Potential loop detected.") and first[0].notify_model
    assert [getattr(v, "action", "abort") for v in verdicts[5]] == ["block", "abort"]
    assert verdicts[5][1].detector == GEMINI_TOOL_CALL_LOOP
    assert verdicts[6][0].action == "block"  # the run is over


def test_a_user_prompt_starts_over_and_agent_messages_do_not():
    ids = {"run_id": "r1", "session_key": "agent:main:s1"}
    calls = [requested_event(f"e{i}", "glob", {"p": 1}, gemini_key=True, **ids) for i in range(4)]
    more = [requested_event(f"f{i}", "glob", {"p": 1}, gemini_key=True, **ids) for i in range(1)]
    for between, loops in (
        (agent_message_event("u", "again", source="user", **ids), False),
        (agent_message_event("m", "thinking", **ids), True),
    ):
        driver = RunDriver(engine_for(GEMINI))
        steps = [driver.handle(e) for e in [*calls, between, *more]]
        assert (steps[-1].vetoed) is loops
