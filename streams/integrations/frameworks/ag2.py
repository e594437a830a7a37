"""loopwatch for AG2 (PyPI ``ag2``, the ``ag2.Agent`` API), as agent middleware.

    from ag2 import Agent
    from streams.integrations.frameworks.ag2 import Loopwatch

    agent = Agent("main", config=..., tools=[...], middleware=[Loopwatch(client, agent_id="main")])
    reply = await agent.ask("…")

Why middleware: ``on_tool_execution`` wraps every tool of the agent (its own, a plugin's, an
``ask``'s), ``on_turn`` the turn, and ``on_llm_call`` the model calls; AG2 builds the
middleware afresh for each turn, so each turn has its own state.  A turn (one ``ask``, or one
``reply.ask``) is one loopwatch run; the conversation (the AG2 stream) is its session, key
``ag2:<stream id>`` unless one is given, so a loop that goes on over several turns of one
conversation is still one loop.

* a block is the call's result, loopwatch's message, as AG2's own ``approval_required``
  answers a denied call: the model reads it and the turn goes on;
* an abort is that refusal, then the turn's next model call is answered with loopwatch's
  message instead of calling the model, which ends the turn: AG2's own halt (a FATAL alert's
  ``HaltEvent`` short-circuits the model the same way); a ``HaltEvent`` goes on the stream
  too, so AG2's observers see it;
* a warning loopwatch asks to show (``loopwatch.surfaceWarnings``) is appended to the tool's
  result as a text part;
* a call of a tool the agent lacks is published with upstream's unknown-tool outcome (AG2
  answers it with its own ``ToolNotFoundEvent``; loopwatch does not gate it).
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from ag2.events import (
    BaseEvent,
    ClientToolCallEvent,
    DataInput,
    HaltEvent,
    ModelMessage,
    ModelResponse,
    TextInput,
    ToolCallEvent,
    ToolErrorEvent,
    ToolNotFoundEvent,
    ToolResultEvent,
)
from ag2.middleware import BaseMiddleware

from streams.client import LoopwatchClient, RunAbortedError

from .guard import Admitted, RunGuard, json_args, open_run, plain, thrown

__all__ = ["Loopwatch"]


class Loopwatch:
    """AG2 middleware (a middleware factory: ``Agent(middleware=[Loopwatch(...)])``)."""

    def __init__(self, client: LoopwatchClient, *, agent_id: str | None = None, session_key: str | None = None) -> None:
        self.client = client
        self.agent_id = agent_id
        self.session_key = session_key

    def __call__(self, event: BaseEvent, context: Any) -> LoopwatchTurn:
        return LoopwatchTurn(event, context, self)


class LoopwatchTurn(BaseMiddleware):
    """One turn's loopwatch run."""

    def __init__(self, event: BaseEvent, context: Any, factory: Loopwatch) -> None:
        super().__init__(event, context)
        self.factory = factory
        self.guard: RunGuard | None = None
        self.aborted: RunAbortedError | None = None
        self._arguments: dict[str, str] = {}  # the model's calls this turn, by id (for unknown tools)

    async def on_turn(self, call_next: Any, event: BaseEvent, context: Any) -> ModelResponse:
        f = self.factory
        key = f.session_key or f"ag2:{context.stream.id}"
        self.guard = guard = open_run(f.client, uuid.uuid4().hex, session_key=key, agent_id=f.agent_id)
        subscription = context.stream.where(ToolNotFoundEvent).subscribe(self._unknown_tool)
        reason = "failed"
        try:
            response: ModelResponse = await call_next(event, context)
            reason = "completed"
            return response
        finally:
            context.stream.unsubscribe(subscription)
            await guard.end("aborted" if self._aborted() is not None else reason)

    def _aborted(self) -> RunAbortedError | None:
        return self.aborted or (self.guard.aborted if self.guard is not None else None)

    async def on_llm_call(self, call_next: Any, events: Any, context: Any) -> ModelResponse:
        aborted = self._aborted()
        if aborted is not None:  # the run is over: answer for the model, which ends the turn
            return ModelResponse(message=ModelMessage(aborted.message or "loopwatch ended the run."))
        response: ModelResponse = await call_next(events, context)
        for call in response.tool_calls.calls:
            self._arguments[call.id] = call.arguments
        return response

    async def on_tool_execution(self, call_next: Any, event: ToolCallEvent, context: Any) -> Any:
        guard = self.guard
        if guard is None:  # not inside a turn
            return await call_next(event, context)
        tool, args = event.name, json_args(event.arguments)
        verdict = await guard.before(tool, args, event.id)
        if not isinstance(verdict, Admitted):
            if verdict.aborted is not None and self.aborted is None:
                self.aborted = verdict.aborted
                await context.send(HaltEvent(reason=verdict.aborted.message or verdict.message, source="loopwatch"))
            return ToolResultEvent.from_call(event, result=verdict.message)
        try:
            outcome = await call_next(event, context)
        except Exception as exc:
            await guard.after(tool, args, event.id, error=thrown(exc))
            raise
        if isinstance(outcome, ToolErrorEvent):
            await guard.after(tool, args, event.id, error=thrown(outcome.error))
        elif isinstance(outcome, ClientToolCallEvent):  # the application runs it, not AG2
            await guard.after(tool, args, event.id, returned=False)
        else:
            await guard.after(tool, args, event.id, result=_value(outcome.result))
        notices = verdict.notices + guard.notices()
        if notices and isinstance(outcome, ToolResultEvent):
            parts = [*outcome.result.parts, *(TextInput(n) for n in notices)]
            outcome = ToolResultEvent(
                parent_id=outcome.parent_id,
                name=outcome.name,
                result=dataclasses.replace(outcome.result, parts=parts),
            )
        return outcome

    async def _unknown_tool(self, event: ToolNotFoundEvent) -> None:
        if self.guard is not None and event.name is not None:
            args = json_args(self._arguments.get(event.parent_id, "{}"))
            await self.guard.unknown_tool(event.name, args, event.parent_id)


def _value(result: Any) -> Any:
    """A ``ToolResult`` as what the tool returned: its one part's text or data, else the list."""
    values = [
        p.content if isinstance(p, TextInput) else plain(p.data) if isinstance(p, DataInput) else plain(p)
        for p in result.parts
    ]
    return values[0] if len(values) == 1 else values
