"""The framework adapters (``streams/integrations/frameworks``) in each framework's REAL agent loop,
driven by that framework's own fake model, on the real broker and a real worker.

What the model must receive is computed twice, independently of the adapters:

* by hand from the spec's defaults (§2: warningThreshold 10, criticalThreshold 20; §3: a
  warning when count // 10 reaches a new bucket): the same call with the same result over and
  over is warned at the 11th call (10 identical calls before it, count 10) and blocked from the
  21st on (count 20; a vetoed call is not recorded, so the count stays);
* by the engine alone (``harness.reference_verdicts``) on the records the adapter actually
  published on ``tool-calls``: every call's decision, and what the model sees for it (the
  tool's result, the result with the warning appended, or the block's message instead).

The worker runs with ``surfaceWarnings`` (warnings are only logged otherwise, as upstream), and
agent ``aborter`` with ``abortAfterCriticalBlocks: 1`` (its first critical block ends the run).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Annotated, TypedDict

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from framework_checks import (
    INTEGRATIONS_DOC,
    LOOP_CALLS,
    SAME_RESULT,
    assert_hand_worked_loop,
    assert_model_saw_the_hand_worked_loop,
    assert_model_saw_what_the_engine_decided,
    assert_only_hashes_left,
    assert_unknown_tool_published,
    engine_abort,
    engine_decisions,
    published,
    readme_run_of,
    run_of_call,
    run_of_session,
    run_snippet,
    worker,
)

from schemas.events import ToolCallCompleted, ToolCallRequested
from streams.client import LoopwatchClient, RunAbortedError

pytestmark = pytest.mark.kafka
__all__ = ["worker"]  # the shared fixture: pytest finds it in this module by its name


# -- LangChain / LangGraph -----------------------------------------------------------------------------

import langchain_core.messages as lc_messages  # noqa: E402
from langchain.agents import create_agent  # noqa: E402
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel  # noqa: E402
from langchain_core.tools import tool as lc_tool  # noqa: E402
from langgraph.graph import START, StateGraph  # noqa: E402
from langgraph.graph.message import add_messages  # noqa: E402
from langgraph.prebuilt import ToolNode, tools_condition  # noqa: E402

from streams.integrations.frameworks.langchain import LoopwatchMiddleware  # noqa: E402


class ScriptedChatModel(FakeMessagesListChatModel):
    """LangChain's own fake chat model; ``create_agent`` binds tools, which the fake lacks."""

    def bind_tools(self, tools, **kwargs):
        return self


def lc_script(calls: list[tuple[str, dict]]) -> ScriptedChatModel:
    turns = [
        lc_messages.AIMessage(
            content="", tool_calls=[{"name": name, "args": args, "id": f"call-{i}", "type": "tool_call"}]
        )
        for i, (name, args) in enumerate(calls)
    ]
    return ScriptedChatModel(responses=[*turns, lc_messages.AIMessage(content="done")])


@lc_tool
async def lookup(q: str) -> str:
    """Look a page up."""
    return SAME_RESULT if q == "same" else f"page about {q}"


class GraphState(TypedDict):
    messages: Annotated[list, add_messages]


def new_id() -> str:
    return str(uuid.uuid4())


def lc_config(run_id: str) -> dict:
    return {"run_id": run_id, "recursion_limit": 200}


def lc_seen(state) -> dict[str, str]:
    return {m.tool_call_id: m.content for m in state["messages"] if isinstance(m, lc_messages.ToolMessage)}


async def test_langchain_loop_is_warned_at_the_11th_call_and_blocked_from_the_21st(worker):
    async with worker.client() as client:
        guard = LoopwatchMiddleware(client, agent_id="main")
        agent = create_agent(lc_script([("lookup", {"q": "same"})] * LOOP_CALLS), [lookup], middleware=[guard])
        state = await agent.ainvoke({"messages": [lc_messages.HumanMessage("find it")]}, lc_config(run_id := new_id()))
    assert state["messages"][-1].content == "done", "a block is a refused call, not the end of the run"
    events = await published(worker, run_id)
    seen = lc_seen(state)
    assert_model_saw_the_hand_worked_loop(seen, events)
    assert [m.status for m in state["messages"] if isinstance(m, lc_messages.ToolMessage)][20:] == ["error"] * 3


async def test_langgraph_tool_node_is_served_by_the_same_middleware(worker):
    """Plain LangGraph: a model node and ``ToolNode(awrap_tool_call=...)``, no create_agent."""
    model = lc_script([("lookup", {"q": "same"})] * LOOP_CALLS)

    async def call_model(state: GraphState) -> dict:
        return {"messages": [await model.ainvoke(state["messages"])]}

    async with worker.client() as client:
        guard = LoopwatchMiddleware(client, agent_id="main")
        graph = StateGraph(GraphState)
        graph.add_node("model", call_model)
        graph.add_node("tools", ToolNode([lookup], awrap_tool_call=guard.awrap_tool_call))
        graph.add_edge(START, "model")
        graph.add_conditional_edges("model", tools_condition)
        graph.add_edge("tools", "model")
        state = await graph.compile().ainvoke(
            {"messages": [lc_messages.HumanMessage("find it")]}, lc_config(run_id := new_id())
        )
        await guard.end_run(run_id)
    assert state["messages"][-1].content == "done"
    events = await published(worker, run_id)
    seen = lc_seen(state)
    assert_model_saw_the_hand_worked_loop(seen, events)


async def test_langchain_without_a_decision_fails_open_or_closed_as_the_client(worker):
    """Topics nobody answers on: after the client's timeout the call runs (fail open, the
    default) or is refused with a message that says why (``fail_closed=True``)."""
    calls, verdicts = f"{worker.names.app_id}-idle-calls", f"{worker.names.app_id}-idle-verdicts"
    admin = AIOKafkaAdminClient(bootstrap_servers=worker.broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(calls, 1, 1), NewTopic(verdicts, 1, 1)])
    finally:
        await admin.close()
    seen = {}
    for fail_closed in (False, True):
        async with LoopwatchClient(
            worker.broker, timeout=0.5, fail_closed=fail_closed, tool_calls_topic=calls, verdicts_topic=verdicts
        ) as client:
            agent = create_agent(
                lc_script([("lookup", {"q": "same"})]),
                [lookup],
                middleware=[LoopwatchMiddleware(client, agent_id="main")],
            )
            seen[fail_closed] = lc_seen(await agent.ainvoke({"messages": [lc_messages.HumanMessage("go")]}))
    assert seen[False] == {"call-0": SAME_RESULT}
    assert seen[True]["call-0"].startswith(
        "Tool call blocked: loopwatch loop protection is unavailable (no loopwatch decision"
    )


async def test_langchain_healthy_run_is_never_blocked(worker):
    queries = [f"topic {i}" for i in range(25)]
    async with worker.client() as client:
        agent = create_agent(
            lc_script([("lookup", {"q": q}) for q in queries]),
            [lookup],
            middleware=[LoopwatchMiddleware(client, agent_id="main")],
        )
        state = await agent.ainvoke({"messages": [lc_messages.HumanMessage("read all")]}, lc_config(run_id := new_id()))
    events = await published(worker, run_id)
    seen = lc_seen(state)
    decisions = assert_model_saw_what_the_engine_decided(
        seen, {f"call-{i}": f"page about {q}" for i, q in enumerate(queries)}, events
    )
    assert {d.action for d in decisions} == {"allow"} and state["messages"][-1].content == "done"
    assert_only_hashes_left(events, "topic 7", "page about topic 7")


async def test_langchain_unknown_tool_is_published_as_unknown_and_answered_by_langchain(worker):
    async with worker.client() as client:
        agent = create_agent(
            lc_script([("nosuch", {"q": "x"})] * 2), [lookup], middleware=[LoopwatchMiddleware(client, agent_id="main")]
        )
        state = await agent.ainvoke({"messages": [lc_messages.HumanMessage("go")]}, lc_config(run_id := new_id()))
    events = await published(worker, run_id)
    assert_unknown_tool_published(events, "nosuch")
    assert all("not a valid tool" in text for text in lc_seen(state).values())  # LangChain's own answer


async def test_langchain_abort_jumps_to_the_end(worker):
    async with worker.client() as client:
        agent = create_agent(
            lc_script([("lookup", {"q": "same"})] * 30),
            [lookup],
            middleware=[LoopwatchMiddleware(client, agent_id="aborter")],
        )
        state = await agent.ainvoke({"messages": [lc_messages.HumanMessage("loop")]}, lc_config(run_id := new_id()))
    events = await published(worker, run_id)
    abort = engine_abort(events)
    assert (abort.detector, abort.count) == ("critical_block_limit", 1)
    last = state["messages"][-1]
    assert isinstance(last, lc_messages.AIMessage) and last.content == abort.message and not last.tool_calls
    calls = [e for e in events if isinstance(e, ToolCallRequested)]
    assert 21 <= len(calls) <= 22 < 30, "the run ended at the abort (one late call at most, refused)"
    assert events[-1].reason == "aborted"


async def test_langchain_abort_raises_with_on_abort_error(worker):
    async with worker.client() as client:
        agent = create_agent(
            lc_script([("lookup", {"q": "same"})] * 30),
            [lookup],
            middleware=[LoopwatchMiddleware(client, agent_id="aborter", on_abort="error")],
        )
        with pytest.raises(RunAbortedError) as info:
            await agent.ainvoke({"messages": [lc_messages.HumanMessage("loop")]}, lc_config(run_id := new_id()))
    assert info.value.detector == "critical_block_limit"
    events = await published(worker, run_id)  # ended all the same
    assert events[-1].reason == "aborted"


# -- OpenAI Agents SDK --------------------------------------------------------------------------------

from agents import Agent, Runner, ToolInputGuardrailTripwireTriggered, function_tool, set_tracing_disabled  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

from streams.integrations.frameworks.openai_agents import LoopwatchGuardrails  # noqa: E402

set_tracing_disabled(True)  # offline: no trace exporter


def oa_model(calls: list[tuple[str, dict]]) -> ScriptedModel:
    """The SDK's own scripted ``Model``: one tool call per turn, then a final answer."""
    steps = [[function_call(name, args, call_id=f"call-{i}")] for i, (name, args) in enumerate(calls)]
    return ScriptedModel([*steps, [assistant_message("done")]])


@function_tool
async def search(q: str) -> str:
    """Search for a page."""
    return SAME_RESULT if q == "same" else f"page about {q}"


@function_tool
async def flaky(q: str) -> str:
    """Fails every time, the same way."""
    raise RuntimeError(f"backend down for {q}")


def oa_seen(model: ScriptedModel) -> dict[str, str]:
    """What the model was given back for each call, from its last request's input."""
    items = model.calls[-1].input
    return {i["call_id"]: i["output"] for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"}


def oa_agent(guard: LoopwatchGuardrails, model: ScriptedModel) -> Agent:
    return Agent(name="main", model=model, tools=guard.protect([search, flaky]))


async def test_openai_agents_loop_is_warned_at_the_11th_call_and_blocked_from_the_21st(worker):
    model = oa_model([("search", {"q": "same"})] * LOOP_CALLS)
    async with worker.client() as client:
        guard = LoopwatchGuardrails(client, agent_id="main")
        async with guard.run(run_id := new_id()):
            result = await Runner.run(oa_agent(guard, model), "find it", max_turns=100, run_config=guard.run_config())
    assert result.final_output == "done", "a block is a refused call, not the end of the run"
    events = await published(worker, run_id)
    seen = oa_seen(model)
    assert_model_saw_the_hand_worked_loop(seen, events)


async def test_openai_agents_healthy_run_is_never_blocked(worker):
    queries = [f"topic {i}" for i in range(25)]
    model = oa_model([("search", {"q": q}) for q in queries])
    async with worker.client() as client:
        guard = LoopwatchGuardrails(client, agent_id="main")
        async with guard.run(run_id := new_id()):
            result = await Runner.run(oa_agent(guard, model), "read all", max_turns=100, run_config=guard.run_config())
    events = await published(worker, run_id)
    decisions = assert_model_saw_what_the_engine_decided(
        oa_seen(model), {f"call-{i}": f"page about {q}" for i, q in enumerate(queries)}, events
    )
    assert {d.action for d in decisions} == {"allow"} and result.final_output == "done"
    assert_only_hashes_left(events, "topic 7", "page about topic 7")


async def test_openai_agents_unknown_tool_and_tool_errors_are_published_as_such(worker):
    model = oa_model([("nosuch", {"q": "x"}), ("nosuch", {"q": "x"}), ("flaky", {"q": "x"})])
    async with worker.client() as client:
        guard = LoopwatchGuardrails(client, agent_id="main")
        async with guard.run(run_id := new_id()):
            await Runner.run(oa_agent(guard, model), "go", max_turns=100, run_config=guard.run_config())
    events = await published(worker, run_id)
    assert_unknown_tool_published(events, "nosuch")
    failed = [e for e in events if isinstance(e, ToolCallCompleted) and e.tool_name == "flaky"]
    assert len(failed) == 1 and failed[0].is_error and failed[0].result_hash.startswith("error:")
    seen = oa_seen(model)
    assert "nosuch" in seen["call-0"] and "not found" in seen["call-0"]  # the SDK's own answer


async def test_openai_agents_abort_trips_the_guardrail_tripwire(worker):
    model = oa_model([("search", {"q": "same"})] * 30)
    async with worker.client() as client:
        guard = LoopwatchGuardrails(client, agent_id="aborter")
        with pytest.raises(ToolInputGuardrailTripwireTriggered) as info:
            async with guard.run(run_id := new_id()):
                await Runner.run(oa_agent(guard, model), "loop", max_turns=100, run_config=guard.run_config())
    aborted = info.value.output.output_info
    assert isinstance(aborted, RunAbortedError) and aborted.detector == "critical_block_limit"
    events = await published(worker, run_id)
    abort = engine_abort(events)
    assert aborted.message == abort.message and events[-1].reason == "aborted"
    assert 21 <= len([e for e in events if isinstance(e, ToolCallRequested)]) <= 22 < 30


# -- Pydantic AI -----------------------------------------------------------------------------------------

from pydantic_ai import Agent as PydanticAgent  # noqa: E402
from pydantic_ai import models as pai_models  # noqa: E402
from pydantic_ai.exceptions import AgentRunError  # noqa: E402
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart, UserPromptPart  # noqa: E402
from pydantic_ai.models.function import FunctionModel  # noqa: E402

from streams.integrations.frameworks.pydantic_ai import Loopwatch, LoopwatchRunAborted  # noqa: E402

pai_models.ALLOW_MODEL_REQUESTS = False  # offline: only the FunctionModel answers


class PaiScript:
    """Pydantic AI's own ``FunctionModel``: one tool call per turn, then a final answer; it
    keeps the last messages it was given (what the model saw)."""

    def __init__(self, calls: list[tuple[str, dict]]) -> None:
        self.calls = calls
        self.messages: list = []
        self.model = FunctionModel(self.respond)

    def respond(self, messages, info) -> ModelResponse:
        self.messages = list(messages)
        turn = sum(1 for m in messages if isinstance(m, ModelResponse))
        if turn < len(self.calls):
            name, args = self.calls[turn]
            return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"call-{turn}")])
        return ModelResponse(parts=[TextPart("done")])

    def seen(self) -> dict[str, str]:
        """Per call: the tool's (or the refusal's) content, and what travelled with it."""
        out: dict[str, str] = {}
        last = None
        for message in self.messages:
            for part in message.parts:
                if isinstance(part, ToolReturnPart):
                    out[last := part.tool_call_id] = str(part.content)
                elif isinstance(part, UserPromptPart) and last is not None:
                    out[last] += "\n\n" + str(part.content)
        return out


def pai_agent(script: PaiScript, client, agent_id: str, session_key: str | None = None) -> PydanticAgent:
    agent = PydanticAgent(script.model, capabilities=[Loopwatch(client, agent_id=agent_id, session_key=session_key)])

    @agent.tool_plain
    async def lookup(q: str) -> str:
        """Look a page up."""
        return SAME_RESULT if q == "same" else f"page about {q}"

    @agent.tool_plain
    async def flaky(q: str) -> str:
        """Fails every time, the same way."""
        raise RuntimeError(f"backend down for {q}")

    return agent


async def test_pydantic_ai_loop_is_warned_at_the_11th_call_and_blocked_from_the_21st(worker):
    script = PaiScript([("lookup", {"q": "same"})] * LOOP_CALLS)
    async with worker.client() as client:
        result = await pai_agent(script, client, "main").run("find it")
    assert result.output == "done", "a block is a refused call, not the end of the run"
    events = await published(worker, result.run_id)
    seen = script.seen()
    assert_model_saw_the_hand_worked_loop(seen, events)
    outcomes = [p.outcome for m in script.messages for p in m.parts if isinstance(p, ToolReturnPart)]
    assert outcomes[20:] == ["failed"] * 3, "Pydantic AI's terminal tool failure, no retry prompt"


async def test_pydantic_ai_healthy_run_is_never_blocked(worker):
    queries = [f"topic {i}" for i in range(25)]
    script = PaiScript([("lookup", {"q": q}) for q in queries])
    async with worker.client() as client:
        result = await pai_agent(script, client, "main").run("read all")
    events = await published(worker, result.run_id)
    decisions = assert_model_saw_what_the_engine_decided(
        script.seen(), {f"call-{i}": f"page about {q}" for i, q in enumerate(queries)}, events
    )
    assert {d.action for d in decisions} == {"allow"} and result.output == "done"
    assert_only_hashes_left(events, "topic 7", "page about topic 7")


async def test_pydantic_ai_unknown_tool_and_tool_errors_are_published_as_such(worker):
    script = PaiScript([("nosuch", {"q": "x"})])  # one: a second exceeds Pydantic AI's retries (1) and ends the run
    async with worker.client() as client:
        result = await pai_agent(script, client, "main").run("go")
    events = await published(worker, result.run_id)
    assert_unknown_tool_published(events, "nosuch")
    assert all(text.startswith("Unknown tool name: 'nosuch'") for text in script.seen().values())  # its own answer

    marker = new_id()
    script = PaiScript([("flaky", {"q": marker})])
    async with worker.client() as client:
        with pytest.raises(RuntimeError, match="backend down"):  # Pydantic AI lets a tool's exception end the run
            await pai_agent(script, client, "main").run("go")
    # The run id is not on the exception: the run is found by its one call's arguments' hash.
    events = await run_of_call(worker, "flaky", {"q": marker}, ToolCallCompleted)
    failed = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert len(failed) == 1 and failed[0].is_error and failed[0].result_hash.startswith("error:")


async def test_pydantic_ai_abort_ends_the_run_with_an_agent_run_error(worker):
    script = PaiScript([("lookup", {"q": "same"})] * 30)
    session = f"agent:aborter:{new_id()}"  # the exception has no run id: the run is found by its session
    async with worker.client() as client:
        with pytest.raises(LoopwatchRunAborted) as info:
            await pai_agent(script, client, "aborter", session).run("loop")
    aborted = info.value
    assert isinstance(aborted, AgentRunError) and isinstance(aborted, RunAbortedError)
    assert aborted.detector == "critical_block_limit"

    events = await run_of_session(worker, session)
    assert events[-1].reason == "aborted"
    abort = engine_abort(events)
    assert aborted.message == abort.message
    assert 21 <= len([e for e in events if isinstance(e, ToolCallRequested)]) <= 22 < 30


# -- the README's snippets, run as they are ---------------------------------------------------------------


async def test_readme_langchain_snippet_runs(worker):
    call_id = f"readme-lc-{new_id()}"
    model = ScriptedChatModel(
        responses=[
            lc_messages.AIMessage(
                content="", tool_calls=[{"name": "lookup", "args": {"q": "notes"}, "id": call_id, "type": "tool_call"}]
            ),
            lc_messages.AIMessage(content="done"),
        ]
    )
    state = await run_snippet(worker, "langchain")(model, [lookup])
    assert state["messages"][-1].content == "done" and lc_seen(state) == {call_id: "page about notes"}
    await readme_run_of(worker, call_id)


async def test_readme_openai_agents_snippet_runs(worker):
    call_id = f"readme-oa-{new_id()}"
    model = ScriptedModel([[function_call("search", {"q": "notes"}, call_id=call_id)], [assistant_message("done")]])
    result = await run_snippet(worker, "openai-agents")(model, [search])
    assert result.final_output == "done" and oa_seen(model) == {call_id: "page about notes"}
    events = await readme_run_of(worker, call_id)
    assert events[0].run_id == "run-42"


async def test_readme_openai_agents_snippet_lets_loopwatch_block_a_loop(worker):
    """The SDK's default of 10 turns would end this run at its 10th call; the snippet's run
    reaches upstream's critical threshold (20 identical calls) and its 21st is blocked."""
    model = oa_model([("search", {"q": "same"})] * 25)
    result = await run_snippet(worker, "openai-agents")(model, [search])
    assert result.final_output == "done"
    seen = oa_seen(model)
    blocked = sorted(int(call_id.split("-")[1]) for call_id, output in seen.items() if "CRITICAL" in output)
    assert len(seen) == 25 and blocked == list(range(20, 25))  # call-20 is the 21st call


async def test_readme_pydantic_ai_snippet_runs(worker):
    call_id = f"readme-pai-{new_id()}"

    def respond(messages, info):
        if any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("find", {"q": "notes"}, tool_call_id=call_id)])

    async def find(q: str) -> str:
        """Look a page up."""
        return f"page about {q}"

    result = await run_snippet(worker, "pydantic-ai")(FunctionModel(respond), [find])
    assert result.output == "done"
    events = await readme_run_of(worker, call_id)
    assert events[0].run_id == result.run_id


# -- Claude Agent SDK: the real SDK drives the real Claude Code CLI (make agent-clis) -------------------------

from agent_cli_setup import AGENT_CLIS  # noqa: E402
from claude_agent_sdk import (  # noqa: E402
    AssistantMessage,
    ClaudeAgentOptions,
    ClaudeSDKError,
    ResultMessage,
    ToolResultBlock,
    UserMessage,
)
from scripted_model import ScriptedModel as ScriptedMessagesApi  # noqa: E402
from scripted_model import seen_per_call, text_of  # noqa: E402

from streams.integrations.frameworks.claude_agent_sdk import Loopwatch as ClaudeSdkLoopwatch  # noqa: E402
from streams.integrations.frameworks.claude_agent_sdk import LoopwatchRunAborted as ClaudeSdkRunAborted  # noqa: E402

CLAUDE_CLI = AGENT_CLIS / "node_modules" / ".bin" / "claude"


def claude_options(model: ScriptedMessagesApi, tmp_path: Path) -> ClaudeAgentOptions:
    """The SDK on the pinned CLI, offline: the scripted Messages API, a dummy key, a home of its
    own, and a work directory whose one file the real ``ls`` lists."""
    if not CLAUDE_CLI.exists():
        pytest.fail(f"{CLAUDE_CLI} is missing: make agent-clis installs Claude Code")
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "marker-file.txt").write_text("x\n")
    env = {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": model.url,
        "ANTHROPIC_API_KEY": "sk-ant-test-dummy",
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "IS_SANDBOX": "1",
    }
    return ClaudeAgentOptions(cli_path=CLAUDE_CLI, cwd=work, env=env, allowed_tools=["Bash"], max_turns=100)


async def claude_run(guard: ClaudeSdkLoopwatch, options: ClaudeAgentOptions) -> list:
    return [m async for m in guard.query(prompt="List the files here.", options=options)]


CRITICAL_BASH = (
    "CRITICAL: Called Bash with identical arguments and identical outcomes 20 times. "
    "Session execution blocked to prevent runaway loops."
)
WARNING_BASH = "WARNING: You have called Bash 10 times with identical arguments."


async def test_claude_agent_sdk_loop_is_warned_at_the_11th_call_and_denied_from_the_21st(worker, tmp_path):
    async with worker.client() as client:
        with ScriptedMessagesApi(LOOP_CALLS) as model:
            messages = await claude_run(ClaudeSdkLoopwatch(client, agent_id="main"), claude_options(model, tmp_path))
            requests = list(model.requests)
    result = messages[-1]
    assert isinstance(result, ResultMessage) and not result.is_error, result
    assert len(requests) == LOOP_CALLS + 1, "a deny is a refused call, not the end of the session"
    seen = seen_per_call(requests)
    for n, (tool_result, _) in enumerate(seen, start=1):
        content = text_of(tool_result.get("content"))
        if n <= 20:
            assert not tool_result.get("is_error") and "marker-file.txt" in content, (n, tool_result)  # the real ls ran
        else:
            assert tool_result.get("is_error") is True and content == CRITICAL_BASH, (n, tool_result)
    assert [n for n, (_, text) in enumerate(seen, start=1) if WARNING_BASH in text] == [11]
    events = await published(worker, result.session_id)
    decisions = engine_decisions(events)
    assert_hand_worked_loop([decisions[f"toolu_{n:04d}"] for n in range(1, LOOP_CALLS + 1)])
    assert events[-1].reason == "completed"
    assert_only_hashes_left(events, "marker-file.txt")


async def test_claude_agent_sdk_abort_ends_the_session(worker, tmp_path):
    """Agent ``aborter`` is aborted at its first critical block: the 21st call is denied and
    ``query`` stops the session, raising the abort; no call runs after the 20th."""
    messages = []
    async with worker.client() as client:
        with ScriptedMessagesApi(LOOP_CALLS) as model:
            guard = ClaudeSdkLoopwatch(client, agent_id="aborter")
            with pytest.raises(ClaudeSdkRunAborted) as info:
                async for message in guard.query(
                    prompt="List the files here.", options=claude_options(model, tmp_path)
                ):
                    messages.append(message)
            requests = list(model.requests)
    aborted = info.value
    assert isinstance(aborted, ClaudeSDKError) and aborted.detector == "critical_block_limit"
    assert aborted.count == 1 and aborted.tool_name == "Bash"
    # The CLI may have asked the model once more before it was stopped; nothing after ran.
    assert len(requests) in (21, 22), len(requests)
    assert not any(isinstance(m, ResultMessage) for m in messages), "the session was stopped, not finished"
    ran = [b.tool_use_id for m in messages if isinstance(m, UserMessage) and isinstance(m.content, list)
           for b in m.content if isinstance(b, ToolResultBlock) and not b.is_error]  # fmt: skip
    assert ran == [f"toolu_{n:04d}" for n in range(1, 21)]
    session_id = next(m.session_id for m in messages if isinstance(m, AssistantMessage))
    events = await published(worker, session_id)
    assert events[-1].reason == "aborted"
    requested = [e.tool_call_id for e in events if isinstance(e, ToolCallRequested)]
    assert requested[:21] == [f"toolu_{n:04d}" for n in range(1, 22)] and len(requested) <= 22
    abort = engine_abort(events)
    assert (abort.detector, abort.count, abort.message) == (aborted.detector, aborted.count, aborted.message)


async def test_docs_claude_agent_sdk_snippet_runs(worker, tmp_path):
    """The docs' snippet, on the pinned CLI: one ``ls``, run and published, then the answer."""
    with ScriptedMessagesApi(1) as model:
        messages = await run_snippet(worker, "claude-agent-sdk", INTEGRATIONS_DOC)(claude_options(model, tmp_path))
    result = messages[-1]
    assert isinstance(result, ResultMessage) and result.result == "Done.", result
    events = await published(worker, result.session_id)
    assert [type(e).__name__ for e in events] == ["ToolCallRequested", "ToolCallCompleted", "RunEnded"]
    assert events[0].tool_call_id == "toolu_0001" and events[0].session_key == f"claude-agent-sdk:{result.session_id}"
    assert events[-1].reason == "completed"


async def test_claude_agent_sdk_failed_call_is_published_as_an_error(worker, tmp_path, monkeypatch):
    """A Bash command that fails reaches ``PostToolUseFailure``: published as a thrown error,
    its text hashed like any result."""
    import scripted_model

    monkeypatch.setattr(scripted_model, "COMMAND", "ls no-such-file-here")
    async with worker.client() as client:
        with ScriptedMessagesApi(1) as model:
            messages = await claude_run(ClaudeSdkLoopwatch(client, agent_id="main"), claude_options(model, tmp_path))
    result = messages[-1]
    assert isinstance(result, ResultMessage), result
    events = await published(worker, result.session_id)
    completed = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert [(e.tool_call_id, e.is_error) for e in completed] == [("toolu_0001", True)]
    assert_only_hashes_left(events, "no-such-file-here")
