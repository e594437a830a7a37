"""Golden traces of the peer profiles (``tests/data/conformance/openhands/TRACES.md``): sessions
of raw agent events and the peer's own answer at each, computed by its published code (the
oracles in ``tests/oracles/``).  The engine is driven over every session through the edge,
exactly as a runner would publish it, and each step compared with the oracle's answer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from schemas.config import GEMINI_CLI, OPENHANDS
from schemas.events import ModelText, ToolCallRequested
from schemas.names import GEMINI_CONTENT_LOOP, GEMINI_LLM_LOOP, GEMINI_TOOL_CALL_LOOP, OPENHANDS_ACTION_ERROR

from ..edge.content_windows import ContentEdge
from ..edge.events import agent_message_event, compaction_event, completed_event, model_text_event, requested_event
from ..engine import LoopEngine, RunDriver, engine_for, published
from .traces import SessionResult, TraceFileError, numbered_jsonl

__all__ = [
    "gemini_answers",
    "gemini_events",
    "openhands_answers",
    "openhands_events",
    "iter_peer_traces",
    "run_peer_traces",
]


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
    driver = RunDriver(engine or engine_for({"loopwatch": {"profile": OPENHANDS}}))
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


def gemini_events(session: dict) -> Iterator[Any]:
    """The events a runner publishes: a call (with Gemini's own key of it), the outcome of each
    call that ran (which the profile ignores), a user prompt, a chunk of the model's streamed
    text (through the run's ``ContentEdge``, which calls and prompts reset as Gemini does)."""
    sid = session["id"]
    ids = {"run_id": sid, "session_key": f"agent:main:{sid}"}
    edge = ContentEdge()
    for i, e in enumerate(session["events"]):
        k, eid, fields = e["k"], f"{sid}:{i}", {**ids, "ts_ms": i + 1}
        if k == "call":
            edge.tool_call()
            yield requested_event(eid, e["tool"], e["args"], tool_call_id=e["id"], gemini_key=True, **fields)
        elif k == "user":
            edge.user_prompt()
            yield agent_message_event(eid, e["text"], source="user", **fields)
        elif k == "text":
            yield model_text_event(eid, edge, e["text"], **fields)
        else:
            raise ValueError(f"unknown event kind {k!r} at event {i}")


def gemini_answers(session: dict, engine: LoopEngine | None = None) -> list[list | None]:
    """The engine's answer at each event in the oracle's form: for a call or a chunk of text,
    ["allow", None], or
    ["feedback", the loop type] (blocked, Gemini's feedback to the model), or ["abort", the loop
    type] (blocked, the run aborted); None for a prompt.  The outcome of a call that ran is
    published as the runner would, and must change nothing."""
    driver = RunDriver(engine or engine_for({"loopwatch": {"profile": GEMINI_CLI}}))
    out: list[list | None] = []
    for event in gemini_events(session):
        step = driver.handle(event)
        kind = type(event)
        if kind is ModelText:
            verdicts = published(step)
            if step.abort is not None:
                out.append(["abort", _GEMINI_LOOP_TYPES[step.abort.detector]])
            elif verdicts and verdicts[0].action == "warn":
                out.append(["feedback", _GEMINI_LOOP_TYPES[verdicts[0].detector]])
            else:
                out.append(["allow", None])
            continue
        if kind is not ToolCallRequested:
            out.append(None)
            continue
        verdicts = published(step)
        if step.abort is not None:
            out.append(["abort", _GEMINI_LOOP_TYPES[step.abort.detector]])
        elif verdicts and verdicts[0].action == "block":
            out.append(["feedback", _GEMINI_LOOP_TYPES[verdicts[0].detector]])
        else:
            out.append(["allow", None])
            assert not published(
                driver.handle(
                    completed_event(
                        f"{event.event_id}:out",
                        event.tool_name,
                        None,
                        result="ok",
                        tool_call_id=event.tool_call_id,
                        run_id=event.run_id,
                        session_key=event.session_key,
                        ts_ms=event.ts_ms,
                    )
                )
            )
    return out


_GEMINI_LOOP_TYPES = {
    GEMINI_TOOL_CALL_LOOP: "consecutive_identical_tool_calls",
    GEMINI_CONTENT_LOOP: "chanting_identical_sentences",
    GEMINI_LLM_LOOP: "llm_detected_loop",
}
"""Gemini's ``LoopType`` of each of its detectors (telemetry/types.ts)."""

_ANSWERS = {OPENHANDS: openhands_answers, GEMINI_CLI: gemini_answers}


def run_peer_traces(
    sessions_path: str | Path, expected_path: str | Path, profile: str, progress=None
) -> list[SessionResult]:
    """Every session of the file against the oracle's answers (``TraceFileError`` for a file that
    is not of its kind); a session that disagrees at some event is a failed result."""
    results = []
    for result in iter_peer_traces(sessions_path, expected_path, profile):
        results.append(result)
        if progress:
            progress(len(results))
    return results


def iter_peer_traces(sessions_path: str | Path, expected_path: str | Path, profile: str) -> Iterator[SessionResult]:
    """``run_peer_traces`` one session at a time, as it is compared: a caller that only asks
    whether some session disagrees stops at the first (``any``) instead of driving them all."""
    answers = _ANSWERS.get(profile)
    if answers is None:
        raise TraceFileError(f"no golden traces for profile {profile!r} yet")
    expected: dict[str, list] = {}
    for number, line in numbered_jsonl(expected_path):
        if not isinstance(line.get("id"), str) or not isinstance(line.get("steps"), list):
            raise TraceFileError(f'{expected_path}:{number}: not an expected line (no "id" and "steps")')
        expected[line["id"]] = line["steps"]
    engine = engine_for({"loopwatch": {"profile": profile}})
    compared = 0
    for number, session in numbered_jsonl(sessions_path):
        if not isinstance(session.get("id"), str) or not isinstance(session.get("events"), list):
            raise TraceFileError(f'{sessions_path}:{number}: not a session (no "id" and "events")')
        want = expected.pop(session["id"], None)
        compared += 1
        yield _compare(session, want, answers, engine)
    if not compared:
        raise TraceFileError(f"{sessions_path}: no sessions in the file")
    for sid in expected:
        yield SessionResult(sid, 0, "expected steps for a session that is not in the sessions file")


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
    blank = [None, None] if answers is openhands_answers else None
    for i, (g, w) in enumerate(zip(got, want)):
        if g != (w or blank):
            return SessionResult(sid, i, f"event {i} ({session['events'][i]['k']}): loopwatch {g}, oracle {w}")
    return SessionResult(sid, len(got))
