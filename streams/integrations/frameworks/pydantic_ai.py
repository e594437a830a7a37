"""loopwatch for Pydantic AI (``pydantic-ai-slim``), as a capability.

    from pydantic_ai import Agent
    from streams.integrations.frameworks.pydantic_ai import Loopwatch

    agent = Agent(model, tools=[...], capabilities=[Loopwatch(client, agent_id="main")])
    result = await agent.run("…")

Why a capability and not a wrapper toolset: a wrapper toolset (``WrapperToolset.call_tool``)
sees only the tools of the toolset it wraps and nothing of the run, while a capability is
Pydantic AI's one place for cross-cutting behaviour: ``wrap_tool_execute`` covers every tool of
the agent (functions, MCP servers, other toolsets), ``wrap_run`` the run (its id is
``ctx.run_id``; it ends with ``run.ended``), ``after_model_request`` the calls of tools the agent
does not have, and ``for_run`` gives each run its own state.

* a block is ``ToolFailed`` with loopwatch's message: Pydantic AI's "terminal tool failure",
  which the model reads as the tool's failed result, without its retry prompt and without
  spending the tool's retry budget; the run goes on;
* an abort raises ``LoopwatchRunAborted`` out of ``agent.run()``, an ``AgentRunError`` as
  Pydantic AI's own limit (``UsageLimitExceeded``) is, and the client's ``RunAbortedError``;
* a warning loopwatch asks to show (``loopwatch.surfaceWarnings``) travels with the result as
  ``ToolReturn.content``, which Pydantic AI sends to the model beside the result;
* a call of a tool the agent lacks is published with upstream's unknown-tool outcome (Pydantic
  AI answers it with its own retry prompt; loopwatch does not gate it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import AgentRunError, ModelRetry, ToolFailed
from pydantic_ai.messages import ModelResponse, ToolCallPart, ToolReturn

from streams.client import LoopwatchClient, RunAbortedError

from .guard import Admitted, RunGuard, open_run, plain, thrown

__all__ = ["Loopwatch", "LoopwatchRunAborted"]


class LoopwatchRunAborted(RunAbortedError, AgentRunError):
    """loopwatch ended the run: ``detector``, ``count``, ``tool_name``, ``message``."""


@dataclass
class Loopwatch(AbstractCapability[Any]):
    client: LoopwatchClient
    agent_id: str | None = None
    session_key: str | None = None
    _guard: RunGuard | None = field(default=None, init=False, repr=False)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a live client: not built from agent specs

    async def for_run(self, ctx: Any) -> Loopwatch:
        return dataclasses.replace(self)  # this run's own guard

    async def wrap_run(self, ctx: Any, *, handler: Any) -> Any:
        self._guard = open_run(self.client, ctx.run_id, session_key=self.session_key, agent_id=self.agent_id)
        reason = "failed"
        try:
            result = await handler()
            reason = "completed"
            return result
        finally:
            await self._guard.end("aborted" if self._guard.aborted is not None else reason)

    async def after_model_request(self, ctx: Any, *, request_context: Any, response: ModelResponse) -> ModelResponse:
        # The tools this request offered the model (function and output tools).
        known = {*ctx.tools, *request_context.model_request_parameters.tool_defs}
        for part in response.parts:
            if isinstance(part, ToolCallPart) and part.tool_name not in known and self._guard is not None:
                await self._guard.unknown_tool(part.tool_name, plain(part.args_as_dict()), part.tool_call_id)
        return response

    async def wrap_tool_execute(self, ctx: Any, *, call: ToolCallPart, tool_def: Any, args: Any, handler: Any) -> Any:
        guard = self._guard
        if guard is None:  # not inside a run (a tool called directly)
            return await handler(args)
        tool, raw_args, call_id = call.tool_name, plain(call.args_as_dict()), call.tool_call_id
        verdict = await guard.before(tool, raw_args, call_id)
        if not isinstance(verdict, Admitted):
            if verdict.aborted is not None:
                a = verdict.aborted
                raise LoopwatchRunAborted(a.message, detector=a.detector, count=a.count, tool_name=a.tool_name)
            raise ToolFailed(verdict.message)
        try:
            result = await handler(args)
        except (ModelRetry, ToolFailed) as refused:  # the tool's own answer to the model
            await guard.after(tool, raw_args, call_id, error=thrown(refused.message))
            raise
        except Exception as exc:
            await guard.after(tool, raw_args, call_id, error=thrown(exc))
            raise
        value = result.return_value if isinstance(result, ToolReturn) else result
        await guard.after(tool, raw_args, call_id, result=plain(value))
        notices = verdict.notices + guard.notices()
        if not notices:
            return result
        if isinstance(result, ToolReturn):
            extra = [result.content] if isinstance(result.content, str) else list(result.content or ())
            return dataclasses.replace(result, content=[*extra, *notices])
        return ToolReturn(return_value=result, content="\n\n".join(notices))
