"""Golden traces of the peer profiles (``tests/data/conformance/openhands/TRACES.md``): sessions
of raw agent events and the peer's own answer at each, computed by its published code (the
oracles in ``tests/oracles/``).  The engine is driven over every session through the edge,
exactly as a runner would publish it, and each step compared with the oracle's answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from schemas.config import OPENHANDS
from schemas.names import OPENHANDS_ACTION_ERROR

from ..edge import agent_message_event, compaction_event, completed_event, requested_event
from ..engine import LoopEngine, RunDriver, published
from .traces import SessionResult, TraceFileError, _numbered_jsonl

__all__ = ["openhands_events", "openhands_answers", "run_peer_traces"]


def openhands_events(session: dict) -> Iterator[Any]:
    """The events a runner publishes for a session's raw events (one each)."""
    sid = session["id"]
    ids = {"run_id": sid, "session_key": f"agent:main:{sid}"}
    calls: dict[str, tuple[str, Any]] = {}
    for i, e in enumerate(session["events"]):
        k, eid, fields = e["k"], f"{sid}:{i}", {**ids, "ts_ms": i + 1}
        if k == "call":
            calls[e["id"]] = (e["tool"], e["args"])
            yield requested_event(eid, e["tool"], e["args"], tool_call_id=e["id"], thought=e.get("thought"), **fields)
        elif k in ("result", "error"):
            tool, args = calls[e["id"]]
            outcome = {"error": e["text"]} if k == "error" else {"result": e["text"]}
            yield completed_event(eid, tool, args, tool_call_id=e["id"], **outcome, **fields)
        elif k == "reply":
            yield agent_message_event(eid, e["text"], **fields)
        elif k == "user":
            yield agent_message_event(eid, e["text"], source="user", **fields)
        elif k == "condense":
            yield compaction_event(eid, **fields)
        else:
            raise ValueError(f"unknown event kind {k!r} at event {i}")


def openhands_answers(session: dict, engine: LoopEngine | None = None) -> list[list]:
    """The engine's answer at each event, in the oracle's form: [the tool OpenHands nudged
    about, or None; the stuck pattern that stopped the agent, or None]."""
    driver = RunDriver(engine or LoopEngine({"loopwatch": {"profile": OPENHANDS}}))
    out = []
    for event in openhands_events(session):
        nudged = pattern = None
        for verdict in published(driver.handle(event)):
            if getattr(verdict, "action", None) == "warn" and verdict.detector == OPENHANDS_ACTION_ERROR:
                nudged = verdict.tool_name
            elif getattr(verdict, "action", None) is None:
                pattern = verdict.detector
        out.append([nudged, pattern])
    return out


_ANSWERS = {OPENHANDS: openhands_answers}


def run_peer_traces(sessions_path: str | Path, expected_path: str | Path, profile: str, progress=None) -> list[SessionResult]:
    """Every session of the file against the oracle's answers (``TraceFileError`` for a file that
    is not of its kind); a session that disagrees at some event is a failed result."""
    answers = _ANSWERS.get(profile)
    if answers is None:
        raise TraceFileError(f"no golden traces for profile {profile!r} yet")
    expected: dict[str, list] = {}
    for number, line in _numbered_jsonl(expected_path):
        if not isinstance(line.get("id"), str) or not isinstance(line.get("steps"), list):
            raise TraceFileError(f"{expected_path}:{number}: not an expected line (no \"id\" and \"steps\")")
        expected[line["id"]] = line["steps"]
    engine = LoopEngine({"loopwatch": {"profile": profile}})
    results = []
    for number, session in _numbered_jsonl(sessions_path):
        if not isinstance(session.get("id"), str) or not isinstance(session.get("events"), list):
            raise TraceFileError(f"{sessions_path}:{number}: not a session (no \"id\" and \"events\")")
        want = expected.pop(session["id"], None)
        results.append(_compare(session, want, answers, engine))
        if progress:
            progress(len(results))
    if not results:
        raise TraceFileError(f"{sessions_path}: no sessions in the file")
    results.extend(SessionResult(sid, 0, "expected steps for a session that is not in the sessions file") for sid in expected)
    return results


def _compare(session: dict, want: list | None, answers, engine: LoopEngine) -> SessionResult:
    sid = session["id"]
    if want is None:
        return SessionResult(sid, 0, "no expected steps for this session")
    try:
        got = answers(session, engine)
    except Exception as exc:  # a malformed session: report it, never crash the whole run
        return SessionResult(sid, 0, f"cannot drive this session: {type(exc).__name__}: {exc}")
    if len(got) != len(want):
        return SessionResult(sid, len(got), f"{len(got)} events, {len(want)} expected steps")
    for i, (g, w) in enumerate(zip(got, want)):
        if g != (w or [None, None]):
            return SessionResult(sid, i, f"event {i} ({session['events'][i]['k']}): loopwatch {g}, oracle {w}")
    return SessionResult(sid, len(got))
