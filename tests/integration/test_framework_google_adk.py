"""The Google ADK adapter (``streams.integrations.frameworks.google_adk``) in ADK's REAL agent
loop (an ``LlmAgent`` on ``InMemoryRunner``), driven by a scripted ``BaseLlm``, on the real
broker and a real worker.  ADK runs in its own venv (``framework_venv``: it pins OpenTelemetry
<= 1.44, the shared venv has 1.45); what the model must see is worked out by hand and by the
engine alone on what was published (``framework_checks``)."""

from __future__ import annotations

import uuid

import pytest
from framework_checks import (
    INTEGRATIONS_DOC,
    LOOP_CALLS,
    assert_model_saw_the_hand_worked_loop,
    assert_model_saw_what_the_engine_decided,
    assert_only_hashes_left,
    assert_unknown_tool_published,
    engine_abort,
    engine_decisions,
    published,
    run_of_session,
    snippet_for,
    worker,
)
from framework_venv import run_in_framework_venv

from schemas.events import ToolCallCompleted, ToolCallRequested

pytestmark = pytest.mark.kafka
__all__ = ["worker"]  # the shared fixture: pytest finds it in this module by its name


def adk_run(lw, calls: list[tuple[str, dict]], agent_id: str = "main", **spec) -> dict:
    return run_in_framework_venv(
        "google-adk", "adk_agent.py", lw, agent_id=agent_id, calls=[list(c) for c in calls], **spec
    )


def texts(seen: dict[str, dict]) -> dict[str, str]:
    """What the model read per call: a refusal's error, else the result and loopwatch's note."""
    return {
        call_id: response["error"] if "error" in response else "\n\n".join(
            str(response[k]) for k in ("result", "loopwatch") if k in response
        )
        for call_id, response in seen.items()
    }  # fmt: skip


async def test_google_adk_loop_is_warned_at_the_11th_call_and_blocked_from_the_21st(worker):
    out = adk_run(worker, [("lookup", {"q": "same"})] * LOOP_CALLS)
    assert out["final"] == "done" and "aborted" not in out, (
        "a block is a refused call, not the end of the run",
        {k: v for k, v in out.items() if k != "seen"},
    )
    events = await published(worker, out["invocation_id"])
    seen = texts(out["seen"])
    assert_model_saw_the_hand_worked_loop(seen, events)
    assert list(out["seen"]["call-20"]) == ["error"], "ADK's tool response, as a before_tool_callback answers"
    assert events[0].session_key.startswith("adk:") and events[-1].reason == "completed"


async def test_google_adk_healthy_run_is_never_blocked(worker):
    queries = [f"topic {i}" for i in range(25)]
    out = adk_run(worker, [("lookup", {"q": q}) for q in queries])
    events = await published(worker, out["invocation_id"])
    decisions = assert_model_saw_what_the_engine_decided(
        texts(out["seen"]), {f"call-{i}": f"page about {q}" for i, q in enumerate(queries)}, events
    )
    assert {d.action for d in decisions} == {"allow"} and out["final"] == "done"
    assert_only_hashes_left(events, "topic 7", "page about topic 7")


async def test_google_adk_unknown_tool_and_tool_errors_are_published_as_such(worker):
    out = adk_run(worker, [("nosuch", {"q": "x"}), ("nosuch", {"q": "x"})])
    assert out["final"] == "done", out
    events = await published(worker, out["invocation_id"])
    assert_unknown_tool_published(events, "nosuch")
    assert all("no tool with that name" in r["error"] for r in out["seen"].values()), out["seen"]  # ADK's own answer

    key = f"adk-test:{uuid.uuid4()}"
    out = adk_run(worker, [("flaky", {"q": "x"})], session_key=key, with_flaky=True)
    assert "backend down" in out.get("error", ""), out  # ADK lets a tool's exception end the run
    events = await run_of_session(worker, key)
    failed = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert [(e.tool_name, e.is_error) for e in failed] == [("flaky", True)]
    assert failed[0].result_hash.startswith("error:")
    assert events[-1].reason == "failed", "the run ends with ADK's run error (on_run_error_callback)"


async def test_google_adk_abort_ends_the_invocation(worker):
    """Agent ``aborter`` is aborted at its first critical block: the 21st call is refused and
    the run ends as ADK's ``exit_loop`` ends one: the model is not called again."""
    out = adk_run(worker, [("lookup", {"q": "same"})] * 30, agent_id="aborter")
    assert out["invocation_id"], {k: v for k, v in out.items() if k != "seen"}
    events = await published(worker, out["invocation_id"])
    abort = engine_abort(events)
    assert out["aborted"] == {"message": abort.message, "detector": "critical_block_limit", "count": 1}
    assert out["model_calls"] == 21, "no model call after the refused 21st call"
    refusal = engine_decisions(events)["call-20"].message
    assert texts(out["last_event"]) == {"call-20": refusal}, "the run ended on the refusal"
    assert [e.tool_call_id for e in events if isinstance(e, ToolCallRequested)] == [f"call-{i}" for i in range(21)]
    assert events[-1].reason == "aborted"


async def test_docs_google_adk_snippet_runs(worker):
    out = adk_run(worker, [("lookup", {"q": "notes"})], snippet=snippet_for(worker, "google-adk", INTEGRATIONS_DOC))
    assert out["final"] == "done" and out["seen"] == {"call-0": {"result": "page about notes"}}, out
    events = await published(worker, out["invocation_id"])
    assert [type(e).__name__ for e in events] == ["ToolCallRequested", "ToolCallCompleted", "RunEnded"]
    assert events[-1].reason == "completed"
