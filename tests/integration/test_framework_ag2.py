"""The AG2 adapter (``streams.integrations.frameworks.ag2``) in AG2's REAL agent loop
(``ag2.Agent``), driven by AG2's own scripted model (``ag2.testing.TestConfig``), on the real
broker and a real worker.  What the model must see is worked out by hand and by the engine
alone on what was published (``framework_checks``)."""

from __future__ import annotations

import json
import uuid

import pytest
from ag2 import Agent, tool
from ag2.config import LLMClient
from ag2.events import HaltEvent, ToolCallEvent, ToolErrorEvent, ToolNotFoundEvent, ToolResultEvent
from ag2.testing import TestConfig
from framework_checks import (
    INTEGRATIONS_DOC,
    LOOP_CALLS,
    SAME_RESULT,
    assert_model_saw_the_hand_worked_loop,
    assert_model_saw_what_the_engine_decided,
    assert_only_hashes_left,
    assert_unknown_tool_published,
    engine_abort,
    readme_run_of,
    run_of_session,
    run_snippet,
    worker,
)

from schemas.events import ToolCallCompleted, ToolCallRequested
from streams.integrations.frameworks.ag2 import Loopwatch

pytestmark = pytest.mark.kafka
__all__ = ["worker"]  # the shared fixture: pytest finds it in this module by its name


class Script(TestConfig):
    """AG2's own scripted model: one tool call per turn, then "done"; it keeps what the model
    was given at its last call (the conversation's events)."""

    def __init__(self, calls: list[tuple[str, dict]]) -> None:
        turns = [ToolCallEvent(name=n, arguments=json.dumps(a), id=f"call-{i}") for i, (n, a) in enumerate(calls)]
        super().__init__(*turns, "done", raise_tool_errors=False)  # a failed call is an answer, as a real model's
        self.messages: list = []
        self.model_calls = 0

    def create(self) -> LLMClient:
        scripted, script = super().create(), self

        class Recording(LLMClient):
            async def __call__(self, messages, context, **kwargs):
                script.messages, script.model_calls = list(messages), script.model_calls + 1
                return await scripted(messages, context, **kwargs)

        return Recording()

    def seen(self) -> dict[str, str]:
        """Per call: the text of the result the model was given."""
        return {
            e.parent_id: "\n\n".join(p.content for p in e.result.parts)
            for e in self.messages
            if isinstance(e, ToolResultEvent)
        }


@tool
async def lookup(q: str) -> str:
    """Look a page up."""
    return SAME_RESULT if q == "same" else f"page about {q}"


@tool
async def flaky(q: str) -> str:
    """Fails every time, the same way."""
    raise RuntimeError(f"backend down for {q}")


def agent(script: Script, client, agent_id: str = "main", session_key: str | None = None) -> Agent:
    guard = Loopwatch(client, agent_id=agent_id, session_key=session_key)
    return Agent("main", config=script, tools=[lookup, flaky], middleware=[guard])


def run_of(label: str) -> str:
    """A fresh session key: the turn's run is found by it (AG2 names no run)."""
    return f"ag2-test:{label}:{uuid.uuid4()}"


async def test_ag2_loop_is_warned_at_the_11th_call_and_blocked_from_the_21st(worker):
    script = Script([("lookup", {"q": "same"})] * LOOP_CALLS)
    key = run_of("loop")
    async with worker.client() as client:
        reply = await agent(script, client, session_key=key).ask("find it")
    assert reply.body == "done", "a block is a refused call, not the end of the turn"
    events = await run_of_session(worker, key)
    seen = script.seen()
    assert_model_saw_the_hand_worked_loop(seen, events)
    refused = [e for e in script.messages if isinstance(e, ToolResultEvent) and e.parent_id == "call-20"]
    assert not isinstance(refused[0], ToolErrorEvent), "refused as approval_required refuses: a plain result"
    assert events[-1].reason == "completed"


async def test_ag2_healthy_run_is_never_blocked(worker):
    queries = [f"topic {i}" for i in range(25)]
    script = Script([("lookup", {"q": q}) for q in queries])
    key = run_of("healthy")
    async with worker.client() as client:
        reply = await agent(script, client, session_key=key).ask("read all")
    events = await run_of_session(worker, key)
    decisions = assert_model_saw_what_the_engine_decided(
        script.seen(), {f"call-{i}": f"page about {q}" for i, q in enumerate(queries)}, events
    )
    assert {d.action for d in decisions} == {"allow"} and reply.body == "done"
    assert_only_hashes_left(events, "topic 7", "page about topic 7")


async def test_ag2_unknown_tool_and_tool_errors_are_published_as_such(worker):
    script = Script([("nosuch", {"q": "x"}), ("nosuch", {"q": "x"}), ("flaky", {"q": "x"})])
    key = run_of("unknown")
    async with worker.client() as client:
        reply = await agent(script, client, session_key=key).ask("go")
    assert reply.body == "done"
    events = await run_of_session(worker, key)
    assert_unknown_tool_published(events, "nosuch")
    failed = [e for e in events if isinstance(e, ToolCallCompleted) and e.tool_name == "flaky"]
    assert len(failed) == 1 and failed[0].is_error and failed[0].result_hash.startswith("error:")
    answers = {e.parent_id: e for e in script.messages if isinstance(e, ToolResultEvent)}
    assert isinstance(answers["call-0"], ToolNotFoundEvent), "AG2 answers an unknown tool itself"
    assert "backend down" in script.seen()["call-2"]


async def test_ag2_abort_halts_the_turn(worker):
    """Agent ``aborter`` is aborted at its first critical block: the 21st call is refused, and
    the turn ends with the abort's message instead of another model call."""
    script = Script([("lookup", {"q": "same"})] * 30)
    key = run_of("abort")
    halts: list[HaltEvent] = []
    async with worker.client() as client:
        runner = agent(script, client, "aborter", session_key=key)
        reply = await runner.ask("loop")
        halts = [e for e in await reply.history.get_events() if isinstance(e, HaltEvent)]
    events = await run_of_session(worker, key)
    abort = engine_abort(events)
    assert (abort.detector, abort.count) == ("critical_block_limit", 1)
    assert reply.body == abort.message, "the turn ended with the abort's message"
    assert [(h.source, h.reason) for h in halts] == [("loopwatch", abort.message)]
    assert script.model_calls == 21, "no model call after the refused 21st call"
    assert [e.tool_call_id for e in events if isinstance(e, ToolCallRequested)] == [f"call-{i}" for i in range(21)]
    assert events[-1].reason == "aborted"


async def test_docs_ag2_snippet_runs(worker):
    call_id = f"docs-ag2-{uuid.uuid4()}"
    script = TestConfig(ToolCallEvent(name="lookup", arguments='{"q": "notes"}', id=call_id), "done")
    reply = await run_snippet(worker, "ag2", INTEGRATIONS_DOC)(script, [lookup])
    assert reply.body == "done"
    events = await readme_run_of(worker, call_id)
    assert events[0].session_key.startswith("ag2:")


async def test_ag2_turns_of_one_conversation_are_runs_of_one_session(worker):
    """Each turn (``ask``, then ``reply.ask``) is a run; the conversation (AG2's stream) is the
    session of both, so a loop carried over turns is one loop."""
    ids = [f"turn-{uuid.uuid4()}" for _ in range(2)]
    script = TestConfig(
        ToolCallEvent(name="lookup", arguments='{"q": "a"}', id=ids[0]),
        "first",
        ToolCallEvent(name="lookup", arguments='{"q": "b"}', id=ids[1]),
        "second",
    )
    async with worker.client() as client:
        first = await agent(script, client).ask("one")
        second = await first.ask("two")
    assert (first.body, second.body) == ("first", "second")
    runs = [await readme_run_of(worker, call_id) for call_id in ids]
    assert runs[0][0].run_id != runs[1][0].run_id
    assert runs[0][0].session_key == runs[1][0].session_key
    assert runs[0][0].session_key.startswith("ag2:") and len(runs[0][0].session_key) > len("ag2:")
