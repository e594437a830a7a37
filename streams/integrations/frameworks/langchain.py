"""loopwatch for LangChain 1.x agents (``create_agent``) and LangGraph's ``ToolNode``.

    from langchain.agents import create_agent
    from streams.integrations.frameworks.langchain import LoopwatchMiddleware

    agent = create_agent(model, tools, middleware=[LoopwatchMiddleware(client, agent_id="main")])
    await agent.ainvoke({"messages": [...]})

LangChain's callbacks only observe; a middleware's ``awrap_tool_call`` decides whether the
tool runs.  A block is answered as LangChain answers a call it will not run
(``ToolCallLimitMiddleware``): a ``ToolMessage`` with ``status="error"`` and loopwatch's
message, which the model reads.  A run loopwatch aborted ends as ``ToolCallLimitMiddleware``
with ``exit_behavior="end"`` ends one: the next model step jumps to the end with an
``AIMessage`` saying why (``on_abort="error"`` raises ``RunAbortedError`` instead, as its
``exit_behavior="error"`` raises).  A call of a tool the agent does not have
(``request.tool is None``) is published with upstream's unknown-tool outcome.  Warnings that
loopwatch asks to show (``loopwatch.surfaceWarnings``) are appended to the tool's message; the
hash is of the tool's own result.

Each ``ainvoke`` is one loopwatch run: its id is the invocation's ``config["run_id"]`` when the
caller names one, a fresh one otherwise; it ends with ``run.ended``.  A LangGraph thread
(``configurable.thread_id``) is the runs' session unless ``session_key`` says otherwise.  For
LangGraph's ``ToolNode`` without ``create_agent``, pass
``ToolNode(tools, awrap_tool_call=middleware.awrap_tool_call)``: the run is then the
invocation's run id, else its thread; that graph has no end hook: ``await
middleware.end_run(run_id)`` publishes ``run.ended``.  Only the async
API is served (``ainvoke``/``astream``): the client is asyncio's.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, NotRequired

from langchain.agents.middleware.types import AgentMiddleware, AgentState, PrivateStateAttr, hook_config
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from streams.client import LoopwatchClient

from .guard import Admitted, RunGuard, open_run, plain, thrown

__all__ = ["LoopwatchMiddleware", "LoopwatchState"]

_RUN_KEY = "loopwatch_run_id"


class LoopwatchState(AgentState):
    loopwatch_run_id: NotRequired[Annotated[str, PrivateStateAttr]]


class LoopwatchMiddleware(AgentMiddleware):
    """``client``: a started ``LoopwatchClient`` (gate mode to refuse calls).  ``session_key``:
    the session the runs belong to (default ``agent:<agent_id or main>:<run id>``)."""

    state_schema = LoopwatchState

    def __init__(
        self,
        client: LoopwatchClient,
        *,
        agent_id: str | None = None,
        session_key: str | None = None,
        on_abort: Literal["end", "error"] = "end",
    ) -> None:
        super().__init__()
        if on_abort not in ("end", "error"):
            raise ValueError("on_abort is 'end' or 'error'")
        self.client = client
        self.agent_id = agent_id
        self.session_key = session_key
        self.on_abort = on_abort
        self._runs: dict[str, RunGuard] = {}

    def _guard(self, run_id: str, thread_id: Any = None) -> RunGuard:
        guard = self._runs.get(run_id)
        if guard is None:
            session_key = self.session_key
            if session_key is None and thread_id is not None:  # a thread is a conversation: a session
                session_key = f"agent:{self.agent_id or 'main'}:{thread_id}"
            guard = self._runs[run_id] = open_run(self.client, run_id, session_key=session_key, agent_id=self.agent_id)
        return guard

    def _run_of(self, state: Any, runtime: Any) -> RunGuard:
        info = getattr(runtime, "execution_info", None)
        thread_id = getattr(info, "thread_id", None)
        run_id = state.get(_RUN_KEY) if isinstance(state, dict) else getattr(state, _RUN_KEY, None)
        if not run_id:  # a ToolNode outside create_agent: the invocation's run, else its thread's
            run_id = getattr(info, "run_id", None) or thread_id or f"toolnode-{id(self):x}"
        return self._guard(str(run_id), thread_id)

    async def abefore_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        # The invocation's run id (config["run_id"]) when the caller named it, else a new one.
        info = getattr(runtime, "execution_info", None)
        run_id = str(getattr(info, "run_id", None) or uuid.uuid4())
        self._guard(run_id, getattr(info, "thread_id", None))
        return {_RUN_KEY: run_id}

    async def aafter_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        await self.end_run(state.get(_RUN_KEY, ""))
        return None

    async def end_run(self, run_id: str, reason: str = "completed") -> None:
        """Publish ``run.ended`` for ``run_id`` and forget it (``create_agent`` does this at the
        agent's end; a plain ``ToolNode`` graph has no such hook: call it when the run is done)."""
        guard = self._runs.pop(run_id, None)
        if guard is not None:
            await guard.end("aborted" if guard.aborted is not None else reason)

    @hook_config(can_jump_to=["end"])
    async def abefore_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        guard = self._runs.get(state.get(_RUN_KEY, ""))
        aborted = guard.aborted if guard is not None else None
        if aborted is None:
            return None
        if self.on_abort == "error":
            await self.end_run(state.get(_RUN_KEY, ""))  # the raise skips the agent's end hook
            raise aborted
        return {"jump_to": "end", "messages": [AIMessage(content=aborted.message)]}

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command]]
    ) -> ToolMessage | Command:
        call = request.tool_call
        tool, args, call_id = call["name"], plain(call.get("args") or {}), call.get("id")
        guard = self._run_of(request.state, request.runtime)
        verdict = await (
            guard.before(tool, args, call_id) if request.tool is not None else guard.unknown_tool(tool, args, call_id)
        )
        if not isinstance(verdict, Admitted):
            if verdict.aborted is not None and self.on_abort == "error":
                await self.end_run(guard.run.fields["run_id"])  # the raise skips the agent's end hook
                raise verdict.aborted
            return ToolMessage(content=verdict.message, tool_call_id=call_id, name=tool, status="error")
        if request.tool is None:  # published as unknown; LangChain answers it its own way
            return await handler(request)
        try:
            answer = await handler(request)
        except Exception as exc:
            await guard.after(tool, args, call_id, error=thrown(exc))
            raise
        if isinstance(answer, ToolMessage):
            if answer.status == "error":
                await guard.after(tool, args, call_id, error=thrown(_text(answer.content)))
            else:
                await guard.after(tool, args, call_id, result=plain(answer.content))
            notices = verdict.notices + guard.notices()
            return _with_notices(answer, notices) if notices else answer
        await guard.after(tool, args, call_id, returned=False)  # a Command: the tool updated state
        return answer


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = [b.get("text", "") if isinstance(b, dict) else str(b) for b in content or ()]
    return "\n".join(p for p in parts if p)


def _with_notices(message: ToolMessage, notices: tuple[str, ...]) -> ToolMessage:
    content = message.content
    if isinstance(content, str):
        content = "\n\n".join([content, *notices]) if content else "\n\n".join(notices)
    else:
        content = [*content, *({"type": "text", "text": n} for n in notices)]
    return message.model_copy(update={"content": content})
