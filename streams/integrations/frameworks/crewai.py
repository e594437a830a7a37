"""loopwatch for CrewAI (``crewai``), as CrewAI's own execution-scoped hooks.

    from streams.integrations.frameworks.crewai import Loopwatch

    guard = Loopwatch(client, agent_id="main")
    result = await guard.kickoff(crew, inputs={...})

Why hooks: ``before_tool_call`` / ``after_tool_call`` are CrewAI's one place that sees every
tool call of every agent (native function calling and the ReAct text path alike), and
``scoped_hooks`` keeps them to this kickoff, leaving other crews in the process alone.

CrewAI's hooks are synchronous; the client is asyncio.  ``kickoff`` runs the crew's synchronous
``kickoff`` in a thread (as CrewAI's own ``kickoff_async`` does) while each hook waits there for
loopwatch's answer on the client's event loop (the hooks are scoped to that thread's kickoff,
so a crew driven on the loop itself, ``akickoff``, never reaches them).

One kickoff is one run (session key ``agent:<agent id or main>:<run id>`` unless one is given):

* a block is the ``before_tool_call`` hook's ``False`` (CrewAI skips the tool), and its
  ``after_tool_call`` hook, which CrewAI runs for a blocked call too, puts loopwatch's message
  in the place of CrewAI's "Tool execution blocked by hook": the model reads it and goes on;
* an abort is that refusal, then a ``before_llm_call`` hook raises ``LoopwatchRunAborted``
  (a ``HookAborted``, CrewAI's own deny, and a ``RunAbortedError``) at the next model call,
  which ends the kickoff: ``kickoff`` raises it;
* a warning loopwatch asks to show (``loopwatch.surfaceWarnings``) is appended to the result
  the ``after_tool_call`` hook hands back;
* a call of a tool the agent lacks is published with upstream's unknown-tool outcome (CrewAI
  answers it itself); on the ReAct path (a model without function calling) CrewAI answers
  such a call before any hook, so loopwatch does not see it;
* a tool's exception is published as an error, on both paths (the ReAct path retries the tool
  first; the call is one call).

CrewAI's hooks carry no tool call id: the adapter names each call itself and pairs the two
hooks of a call by the argument dict CrewAI hands to both.
"""

from __future__ import annotations

import asyncio
import re
import threading
import uuid
from collections.abc import Coroutine
from typing import Any, TypeVar

from crewai.hooks.dispatch import HookAborted, InterceptionPoint, register_scoped, scoped_hooks

from streams.client import LoopwatchClient, RunAbortedError

from .guard import Admitted, RunGuard, open_run, plain, thrown

__all__ = ["Loopwatch", "LoopwatchRunAborted"]

T = TypeVar("T")

# How CrewAI hands an exception of the tool to the model (agent_executor, tool_utils): the
# result is this text and the raw result the same text.
_TOOL_ERROR_PREFIX = "Error executing tool: "
# The same on the ReAct path (a model without function calling; ToolUsage, its translations'
# "tool_usage_exception"), after its retries: the exception's message, then the tool's inputs.
_REACT_TOOL_ERROR = re.compile(
    r"\nI encountered an error while trying to use the tool\. This was the error: (.*?)\.\n Tool \S+ accepts these inputs: ",
    re.S,
)


class LoopwatchRunAborted(RunAbortedError, HookAborted):
    """loopwatch ended the run: ``detector``, ``count``, ``tool_name``, ``message``; raised as
    CrewAI's ``HookAborted`` deny from a ``before_llm_call`` hook."""

    def __init__(self, message: str, *, detector: str, count: int, tool_name: str) -> None:
        super().__init__(message, detector=detector, count=count, tool_name=tool_name)
        self.reason = message
        self.source = "loopwatch"


class Loopwatch:
    def __init__(self, client: LoopwatchClient, *, agent_id: str | None = None, session_key: str | None = None) -> None:
        self.client = client
        self.agent_id = agent_id
        self.session_key = session_key

    async def kickoff(self, runner: Any, /, *, run_id: str | None = None, **kwargs: Any) -> Any:
        """``runner.kickoff(**kwargs)`` (a ``Crew``) as one loopwatch run, with loopwatch's hooks
        scoped to it; raises ``LoopwatchRunAborted`` when loopwatch ends it."""
        guard = open_run(self.client, run_id, session_key=self.session_key, agent_id=self.agent_id)
        run = _Run(guard, asyncio.get_running_loop())

        def kickoff() -> Any:
            with scoped_hooks():
                register_scoped(InterceptionPoint.PRE_TOOL_CALL, run.before_tool_call)
                register_scoped(InterceptionPoint.POST_TOOL_CALL, run.after_tool_call)
                register_scoped(InterceptionPoint.PRE_MODEL_CALL, run.before_llm_call)
                return runner.kickoff(**kwargs)

        reason = "failed"
        try:
            result = await asyncio.to_thread(kickoff)
            reason = "completed"
            return result
        finally:
            await guard.end("aborted" if run.aborted is not None else reason)


class _Run:
    """One kickoff's hooks, called on CrewAI's thread."""

    def __init__(self, guard: RunGuard, loop: asyncio.AbstractEventLoop) -> None:
        self.guard = guard
        self.loop = loop
        self.aborted: RunAbortedError | None = None
        self._calls: dict[int, tuple[str, Any, str]] = {}  # id(tool_input) -> tool, args, call id
        self._refusals: dict[str, str] = {}  # call id -> loopwatch's message
        self._notices: dict[str, tuple[str, ...]] = {}
        self._lock = threading.Lock()

    def _wait(self, step: Coroutine[Any, Any, T]) -> T:
        """``step`` on the client's loop, from CrewAI's thread (the client bounds the wait)."""
        return asyncio.run_coroutine_threadsafe(step, self.loop).result()

    def before_tool_call(self, context: Any) -> bool | None:
        tool, args, call_id = context.tool_name, plain(context.tool_input), uuid.uuid4().hex
        with self._lock:
            self._calls[id(context.tool_input)] = (tool, args, call_id)
        if context.tool is None:  # CrewAI answers a tool it lacks itself
            self._wait(self.guard.unknown_tool(tool, args, call_id))
            return None
        verdict = self._wait(self.guard.before(tool, args, call_id))
        if isinstance(verdict, Admitted):
            self._notices[call_id] = verdict.notices
            return None
        if verdict.aborted is not None and self.aborted is None:
            self.aborted = verdict.aborted
        self._refusals[call_id] = verdict.message
        return False

    def after_tool_call(self, context: Any) -> str | None:
        with self._lock:
            call = self._calls.pop(id(context.tool_input), None)
        if call is None:
            return None
        tool, args, call_id = call
        refusal = self._refusals.pop(call_id, None)
        if refusal is not None:
            return refusal  # instead of CrewAI's "Tool execution blocked by hook"
        if context.tool is None:
            return None
        raw = context.raw_tool_result
        react_error = _REACT_TOOL_ERROR.match(raw) if isinstance(raw, str) else None
        if isinstance(raw, str) and raw.startswith(_TOOL_ERROR_PREFIX) and raw == context.tool_result:
            self._wait(self.guard.after(tool, args, call_id, error=thrown(raw.removeprefix(_TOOL_ERROR_PREFIX))))
        elif react_error is not None:
            self._wait(self.guard.after(tool, args, call_id, error=thrown(react_error.group(1))))
        else:
            self._wait(self.guard.after(tool, args, call_id, result=plain(raw)))
        notices = self._notices.pop(call_id, ()) + self.guard.notices()
        if not notices:
            return None
        return "\n\n".join([str(context.tool_result), *notices])

    def before_llm_call(self, context: Any) -> None:
        aborted = self.aborted or self.guard.aborted
        if aborted is not None:
            self.aborted = aborted
            raise LoopwatchRunAborted(
                aborted.message, detector=aborted.detector, count=aborted.count, tool_name=aborted.tool_name
            )
