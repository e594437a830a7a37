"""loopwatch for Google ADK (``google-adk``), as a runner plugin.

    from google.adk.runners import Runner
    from streams.integrations.frameworks.google_adk import LoopwatchPlugin

    runner = Runner(agent=agent, app_name="app", session_service=..., plugins=[LoopwatchPlugin(client)])

Why a plugin and not an agent's ``before_tool_callback``: a plugin's ``before_tool_callback``
and ``after_tool_callback`` have the same powers (a dict returned before the call skips the tool
and is its response) but run for every agent of the runner, sub-agents included, ahead of the
agents' own callbacks; ``before_run_callback``, ``after_run_callback`` and
``on_run_error_callback`` bound the run.

An ADK invocation (one ``run_async``) is one loopwatch run, its id the ``invocation_id``; the
ADK session is its session, key ``adk:<session id>`` unless one is given, so a loop that goes
on over several messages of one session is one loop.  The agent id is the ADK agent's name
unless one is given.

* a block is ``before_tool_callback``'s answer ``{"error": <loopwatch's message>}``: ADK skips
  the tool and gives the model that dict as the tool's response; the run goes on;
* an abort is that refusal, and the run is ended as ADK's own ``exit_loop`` tool ends one: the
  call's actions say ``skip_summarization`` (the model is not called on the response, which is
  the run's final response) and ``escalate`` (an enclosing ``LoopAgent`` stops too);
  ``aborted`` holds the ``RunAbortedError``;
* a warning loopwatch asks to show (``loopwatch.surfaceWarnings``) goes with the tool's
  response dict, under ``"loopwatch"`` (a result that is not a dict goes under ``"result"``, as
  ADK puts it);
* a call of a tool the agent lacks is published with upstream's unknown-tool outcome (ADK
  answers it itself); a tool's exception is published as an error (``on_tool_error_callback``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from google.adk.plugins.base_plugin import BasePlugin
from google.adk.tools.base_tool import BaseTool

from streams.client import LoopwatchClient, RunAbortedError

from .guard import Admitted, RunGuard, open_run, plain, thrown

__all__ = ["LoopwatchPlugin"]


@dataclass
class _Run:
    guard: RunGuard
    aborted: RunAbortedError | None = None
    refused: set[str] = field(default_factory=set)  # call ids loopwatch answered
    notices: dict[str, tuple[str, ...]] = field(default_factory=dict)


class LoopwatchPlugin(BasePlugin):
    def __init__(
        self,
        client: LoopwatchClient,
        *,
        agent_id: str | None = None,
        session_key: str | None = None,
        name: str = "loopwatch",
    ) -> None:
        super().__init__(name=name)
        self.client = client
        self.agent_id = agent_id
        self.session_key = session_key
        self.aborted: RunAbortedError | None = None  # the last run loopwatch ended
        self._runs: dict[str, _Run] = {}  # by invocation id

    async def before_run_callback(self, *, invocation_context: Any) -> None:
        ctx = invocation_context
        key = self.session_key or f"adk:{ctx.session.id}"
        agent_id = self.agent_id or ctx.agent.name
        self._runs[ctx.invocation_id] = _Run(
            open_run(self.client, ctx.invocation_id, session_key=key, agent_id=agent_id)
        )
        return None

    async def after_run_callback(self, *, invocation_context: Any) -> None:
        await self._end(invocation_context.invocation_id, "completed")

    async def on_run_error_callback(self, *, invocation_context: Any, error: Exception) -> None:
        await self._end(invocation_context.invocation_id, "failed")

    async def _end(self, invocation_id: str, reason: str) -> None:
        run = self._runs.pop(invocation_id, None)
        if run is not None:
            await run.guard.end("aborted" if (run.aborted or run.guard.aborted) is not None else reason)

    async def before_tool_callback(self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: Any) -> Any:
        run = self._runs.get(tool_context.invocation_id)
        if run is None:
            return None
        call_id, args = tool_context.function_call_id, plain(tool_args)
        if type(tool) is BaseTool:  # ADK stands a bare BaseTool in for a name it cannot resolve, then answers
            await run.guard.unknown_tool(tool.name, args, call_id)
            return None
        verdict = await run.guard.before(tool.name, args, call_id)
        if isinstance(verdict, Admitted):
            run.notices[call_id] = verdict.notices
            return None
        run.refused.add(call_id)
        if verdict.aborted is not None:
            run.aborted = self.aborted = verdict.aborted
            # As ADK's own exit_loop tool ends a run: no model call on this response, and an
            # enclosing LoopAgent stops too.
            tool_context.actions.skip_summarization = True
            tool_context.actions.escalate = True
        return {"error": verdict.message}

    async def after_tool_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: Any, result: Any
    ) -> Any:
        run = self._runs.get(tool_context.invocation_id)
        call_id = tool_context.function_call_id
        if run is None or call_id in run.refused:
            return None
        await run.guard.after(tool.name, plain(tool_args), call_id, result=plain(result))
        notices = run.notices.pop(call_id, ()) + run.guard.notices()
        if not notices:
            return None
        note = "\n\n".join(notices)
        # A dict result keeps its keys; anything else is what ADK would wrap as {"result": ...}.
        return {**result, "loopwatch": note} if isinstance(result, dict) else {"result": result, "loopwatch": note}

    async def on_tool_error_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: Any, error: Exception
    ) -> Any:
        run = self._runs.get(tool_context.invocation_id)
        if run is not None and type(tool) is not BaseTool:
            await run.guard.after(tool.name, plain(tool_args), tool_context.function_call_id, error=thrown(error))
        return None
