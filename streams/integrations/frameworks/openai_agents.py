"""loopwatch for the OpenAI Agents SDK (``openai-agents``).

    from agents import Agent, Runner
    from streams.integrations.frameworks.openai_agents import LoopwatchGuardrails

    guard = LoopwatchGuardrails(client, agent_id="main")
    agent = Agent(name="main", tools=guard.protect([search, fetch]), model=...)
    async with guard.run("run-42"):
        result = await Runner.run(agent, "…", run_config=guard.run_config())

The SDK's hooks only observe; a tool input guardrail can refuse a call.  Guardrails attach per
``FunctionTool`` (the SDK has no agent-wide tool hook), so ``protect`` adds loopwatch's pair
to each tool it is given (MCP servers take the same pair: ``tool_input_guardrails`` /
``tool_output_guardrails``):

* the input guardrail publishes the request and waits for the decision; a block is
  ``reject_content`` with loopwatch's message (the SDK's "tool refused": the model reads it
  and the run goes on); an abort is ``raise_exception``, the SDK's tripwire: ``Runner.run``
  raises ``ToolInputGuardrailTripwireTriggered`` (its ``output.output_info`` is the
  ``RunAbortedError``), as its own guardrails halt a run;
* the output guardrail publishes the outcome; a warning loopwatch asks to show
  (``loopwatch.surfaceWarnings``) is appended to the output (``reject_content`` with the
  output's text and the warning: the only way a guardrail changes an output);
* ``run_config()``: ``tool_not_found_behavior="return_error_to_model"`` and a
  ``tool_error_formatter`` through which a call of a tool the agent lacks is published with
  upstream's unknown-tool outcome (and a loopwatch block of it replaces the SDK's message), and
  a tool's exception is published as an error, not as the SDK's error text.

The SDK has no run id: ``run(run_id)`` names the loopwatch run for the code inside it (a
context variable, which the SDK's tool tasks inherit) and ends it with ``run.ended``.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
from collections.abc import AsyncIterator, Iterable
from typing import Any

from agents import FunctionTool, RunConfig, ToolGuardrailFunctionOutput, ToolInputGuardrail, ToolOutputGuardrail
from agents.run_config import ToolErrorFormatterArgs
from agents.tool_guardrails import ToolInputGuardrailData, ToolOutputGuardrailData

from streams.client import LoopwatchClient

from .guard import Admitted, RunGuard, json_args, open_run, plain, thrown

__all__ = ["LoopwatchGuardrails"]


class LoopwatchGuardrails:
    def __init__(self, client: LoopwatchClient, *, agent_id: str | None = None, session_key: str | None = None) -> None:
        self.client = client
        self.agent_id = agent_id
        self.session_key = session_key
        self._current: contextvars.ContextVar[_Run | None] = contextvars.ContextVar(
            f"loopwatch-{id(self):x}", default=None
        )
        self.input_guardrail = ToolInputGuardrail(guardrail_function=self._before, name="loopwatch")
        self.output_guardrail = ToolOutputGuardrail(guardrail_function=self._after, name="loopwatch")

    def protect(self, tools: Iterable[Any]) -> list[Any]:
        """``tools`` with loopwatch's guardrails on each ``FunctionTool``: copies, so a tool
        defined once (``@function_tool`` at module level) can serve agents guarded or not."""
        return [self._protected(tool) if isinstance(tool, FunctionTool) else tool for tool in tools]

    def _protected(self, tool: FunctionTool) -> FunctionTool:
        guarded = copy.copy(tool)
        guarded.tool_input_guardrails = [self.input_guardrail, *(tool.tool_input_guardrails or ())]
        guarded.tool_output_guardrails = [*(tool.tool_output_guardrails or ()), self.output_guardrail]
        return guarded

    def run_config(self, **options: Any) -> RunConfig:
        options.setdefault("tool_not_found_behavior", "return_error_to_model")
        return RunConfig(tool_error_formatter=self._tool_error, **options)

    @contextlib.asynccontextmanager
    async def run(self, run_id: str | None = None, *, session_key: str | None = None) -> AsyncIterator[RunGuard]:
        guard = open_run(self.client, run_id, session_key=session_key or self.session_key, agent_id=self.agent_id)
        token = self._current.set(_Run(guard))
        reason = "failed"
        try:
            yield guard
            reason = "completed"
        finally:
            self._current.reset(token)
            await guard.end("aborted" if guard.aborted is not None else reason)

    def _run(self) -> _Run:
        run = self._current.get()
        if run is None:
            raise RuntimeError("loopwatch: run the agent inside `async with guardrails.run(...)`")
        return run

    async def _before(self, data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        run, ctx = self._run(), data.context
        verdict = await run.guard.before(ctx.tool_name, json_args(ctx.tool_arguments), ctx.tool_call_id)
        if isinstance(verdict, Admitted):
            run.notices[ctx.tool_call_id] = verdict.notices
            return ToolGuardrailFunctionOutput.allow()
        if verdict.aborted is not None:
            return ToolGuardrailFunctionOutput.raise_exception(output_info=verdict.aborted)
        return ToolGuardrailFunctionOutput.reject_content(verdict.message, output_info=verdict.decision)

    async def _after(self, data: ToolOutputGuardrailData) -> ToolGuardrailFunctionOutput:
        run, ctx = self._run(), data.context
        args = json_args(ctx.tool_arguments)
        error = run.errors.pop(ctx.tool_call_id, None)
        if error is not None:
            await run.guard.after(ctx.tool_name, args, ctx.tool_call_id, error=thrown(error))
        else:
            await run.guard.after(ctx.tool_name, args, ctx.tool_call_id, result=plain(data.output))
        notices = run.notices.pop(ctx.tool_call_id, ()) + run.guard.notices()
        if not notices:
            return ToolGuardrailFunctionOutput.allow()
        return ToolGuardrailFunctionOutput.reject_content("\n\n".join([str(data.output), *notices]))

    async def _tool_error(self, args: ToolErrorFormatterArgs[Any]) -> str | None:
        run = self._current.get()
        if run is None:
            return None
        if args.kind == "tool_exception" and args.error is not None:
            run.errors[args.call_id] = args.error  # the output guardrail publishes it
        elif args.kind == "tool_not_found":
            # The SDK hands over no arguments for a call it cannot resolve.
            verdict = await run.guard.unknown_tool(args.tool_name, None, args.call_id)
            if not isinstance(verdict, Admitted):
                return verdict.message
        return None


class _Run:
    """One run's guard and what passes between its guardrails, by tool call id."""

    def __init__(self, guard: RunGuard) -> None:
        self.guard = guard
        self.notices: dict[str, tuple[str, ...]] = {}
        self.errors: dict[str, BaseException] = {}
