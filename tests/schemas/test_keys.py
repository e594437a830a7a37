"""The contract's keys (schemas.keys): the worker keys state and verdicts by ``state_key``,
runners publish under ``record_key``.  Expected forms are hand-written from the spec (§2.1:
upstream keys a session's state by sessionKey, or by sessionId when there is no key; §8:
loopwatch keys by run id, and events without one form the session's "no run" scope)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.keys import normalize_run_id, record_key, state_key
from streams.edge import completed_event, requested_event
from streams.engine import LoopEngine


def keyed(run_id=None, session_key=None, session_id=None):
    return SimpleNamespace(run_id=run_id, session_key=session_key, session_id=session_id)


@pytest.mark.parametrize(
    "fields, state, record",
    [
        (dict(run_id="r1", session_key="s", session_id="i"), "run:r1", "r1"),
        (dict(run_id="  r1\ufeff", session_key="s"), "run:r1", "r1"),            # trimmed as JavaScript trims
        (dict(run_id=" \u00a0 ", session_key="s"), "session:s|", "session:s|"),  # blank: no run
        (dict(session_key="s", session_id="i"), "session:s|", "session:s|"),      # the key wins over the id
        (dict(session_key="s"), "session:s|", "session:s|"),
        (dict(session_id="i"), "session:|i", "session:|i"),
        (dict(session_key="x", session_id=None), "session:x|", "session:x|"),
    ],
)
def test_key_forms(fields, state, record):
    assert state_key(keyed(**fields)) == state
    assert record_key(keyed(**fields)) == record


def test_a_session_key_and_an_equal_session_id_name_different_scopes():
    assert state_key(keyed(session_key="abc")) != state_key(keyed(session_id="abc"))


def test_verdicts_name_their_run_as_events_do():
    # A verdict carries run_id and session_key but no session_id: for every run with a run id or
    # a session key, its state key is the one its events name.
    from schemas.verdicts import RunAborted

    for fields in (dict(run_id="r", session_key="s"), dict(session_key="s")):
        event = keyed(session_id="sess-9", **fields)
        verdict = RunAborted(verdict_id="e/abort", cause_event_id="e", detector="d", count=1, tool_name="t", message="m",
                             **fields)
        assert state_key(verdict) == state_key(event)


def test_calls_of_one_session_without_run_id_share_history_whatever_their_session_id():
    """Upstream keeps one buffer per session key: the session id does not split it."""
    engine = LoopEngine({"tools": {"loopDetection": {"enabled": True}}})
    states: dict[str, object] = {}
    counts = []
    for n in range(12):
        ids = dict(session_key="agent:main:x", session_id=f"sess-{n % 3}")
        req = requested_event(f"e{n}", "read", {"p": 1}, tool_call_id=f"c{n}", **ids)
        step = engine.handle(states.get(state_key(req)), req)
        counts.append(step.decision.count)
        done = completed_event(f"d{n}", "read", {"p": 1}, result="same", tool_call_id=f"c{n}", **ids)
        states[state_key(done)] = engine.handle(step.state, done).state
    assert len(states) == 1
    assert counts[10] == 10  # the 11th identical call sees the 10 before it: warning (spec §2, threshold 10)


@given(st.one_of(st.none(), st.text(max_size=20)), st.one_of(st.none(), st.text(max_size=20)),
       st.one_of(st.none(), st.text(max_size=20)))
def test_record_key_is_the_run_id_or_the_state_key(run_id, session_key, session_id):
    event = keyed(run_id, session_key, session_id)
    run = normalize_run_id(run_id)
    if run is not None:
        assert (record_key(event), state_key(event)) == (run, f"run:{run}")
    else:
        assert record_key(event) == state_key(event)
        assert state_key(event).startswith("session:")


def test_the_runner_client_depends_only_on_schemas_and_the_edge():
    """The client is what runners embed: it must not reach into the engine or the worker."""
    import ast
    from pathlib import Path

    client = Path(__file__).resolve().parents[2] / "streams" / "client"
    imported = set()
    for path in client.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                imported.add(("." * node.level) + (node.module or ""))
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
    ours = {name for name in imported if name.startswith((".", "streams", "schemas"))}
    # ..broker_access explains a refused connection (aiokafka only, no engine or worker code);
    # .gemini_content is the runner side of Gemini's content detector (schemas only).
    allowed = ("schemas", "..edge", "..broker_access", ".errors", ".runner", ".gemini_content")
    assert {name for name in ours if not name.startswith(allowed)} == set()
    assert "..edge" in ours and any(name.startswith("schemas") for name in ours)
