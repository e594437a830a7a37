"""loopwatch for the Claude Agent SDK (``claude-agent-sdk``), as the SDK's own in-process hooks.

    from claude_agent_sdk import ClaudeAgentOptions
    from streams.integrations.frameworks.claude_agent_sdk import Loopwatch

    guard = Loopwatch(client, agent_id="main")
    async for message in guard.query(prompt="…", options=ClaudeAgentOptions(allowed_tools=["Bash"])):
        ...

Why hooks and not ``can_use_tool``: ``can_use_tool`` is asked only for calls that the
permission rules leave open, so a tool the options allow (``allowed_tools``, a permission mode)
would run unseen; a ``PreToolUse`` hook sees every call, and ``PostToolUse`` and
``PostToolUseFailure`` see how each call came out, which the detectors need.

The run is the Claude Code session the SDK drives (run id ``session_id``, session key
``claude-agent-sdk:<session_id>`` unless one is given):

* a block is a ``PreToolUse`` deny with loopwatch's message as ``permissionDecisionReason``,
  which Claude Code gives the model as the tool's error result; the session goes on;
* an abort is that deny too, and ends the session: ``Loopwatch.query`` stops the SDK's
  ``query()`` (which stops the CLI) at the next message and raises ``LoopwatchRunAborted``.
  The hook also answers ``continue: false`` with ``stopReason``, Claude Code's own way, but
  Claude Code does not act on it beside a deny, and without the deny the refused call would
  run;
* a warning loopwatch asks to show (``loopwatch.surfaceWarnings``) is ``additionalContext``,
  which Claude Code adds to what the model reads next.

Hook events carry no "session ended": ``Loopwatch.query`` ends the runs when its ``query()``
ends; with ``hooks()`` on options of your own (``ClaudeSDKClient``), call ``end()``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from typing import Any, cast

from claude_agent_sdk import ClaudeAgentOptions, ClaudeSDKError, HookMatcher
from claude_agent_sdk import query as sdk_query
from claude_agent_sdk.types import HookCallback

from streams.client import LoopwatchClient, RunAbortedError

from .guard import Admitted, RunGuard, open_run, plain, thrown

__all__ = ["Loopwatch", "LoopwatchRunAborted"]


class LoopwatchRunAborted(RunAbortedError, ClaudeSDKError):
    """loopwatch ended the session's run: ``detector``, ``count``, ``tool_name``, ``message``."""


class Loopwatch:
    """loopwatch's ``PreToolUse``, ``PostToolUse`` and ``PostToolUseFailure`` hooks, one run
    per Claude Code session."""

    def __init__(self, client: LoopwatchClient, *, agent_id: str | None = None, session_key: str | None = None) -> None:
        self.client = client
        self.agent_id = agent_id
        self.session_key = session_key
        self._runs: dict[str, RunGuard] = {}
        self._aborted: dict[str, RunAbortedError] = {}  # aborts a deny carried before their verdict arrived

    async def query(
        self, *, prompt: str | AsyncIterable[dict[str, Any]], options: ClaudeAgentOptions | None = None
    ) -> AsyncIterator[Any]:
        """The SDK's ``query()`` with loopwatch's hooks added to ``options``' own: its messages,
        until loopwatch aborts the run (then ``LoopwatchRunAborted``); the runs end with it."""
        options = options or ClaudeAgentOptions()
        hooks: dict[Any, list[HookMatcher]] = {k: list(v) for k, v in (options.hooks or {}).items()}
        for event, matchers in self.hooks().items():
            hooks.setdefault(event, []).extend(matchers)
        messages = cast(
            AsyncGenerator[Any, None], sdk_query(prompt=prompt, options=dataclasses.replace(options, hooks=hooks))
        )
        reason = "failed"
        try:
            async for message in messages:
                aborted = self.aborted
                if aborted is not None:
                    raise LoopwatchRunAborted(
                        aborted.message, detector=aborted.detector, count=aborted.count, tool_name=aborted.tool_name
                    )
                yield message
            reason = "completed"
        finally:
            await messages.aclose()  # stops the CLI
            await self.end(reason)

    @property
    def aborted(self) -> RunAbortedError | None:
        """The abort of a session's run, once loopwatch has aborted one."""
        for session_id, guard in self._runs.items():
            aborted = guard.aborted or self._aborted.get(session_id)
            if aborted is not None:
                return aborted
        return None

    def hooks(self) -> dict[Any, list[HookMatcher]]:
        """loopwatch's hooks, for ``ClaudeAgentOptions(hooks=...)`` (``query`` adds them itself)."""
        return {
            "PreToolUse": [HookMatcher(hooks=[cast(HookCallback, self.pre_tool_use)])],
            "PostToolUse": [HookMatcher(hooks=[cast(HookCallback, self.post_tool_use)])],
            "PostToolUseFailure": [HookMatcher(hooks=[cast(HookCallback, self.post_tool_use_failure)])],
        }

    def _run(self, session_id: str) -> RunGuard:
        guard = self._runs.get(session_id)
        if guard is None:
            key = self.session_key or f"claude-agent-sdk:{session_id}"
            guard = open_run(self.client, session_id, session_key=key, agent_id=self.agent_id)
            self._runs[session_id] = guard
        return guard

    async def pre_tool_use(self, data: Any, tool_use_id: str | None, context: Any) -> dict[str, Any]:
        guard = self._run(data["session_id"])
        call_id = data.get("tool_use_id") or tool_use_id
        verdict = await guard.before(data["tool_name"], plain(data.get("tool_input")), call_id)
        if isinstance(verdict, Admitted):
            return _context("PreToolUse", verdict.notices, guard)
        out: dict[str, Any] = {
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "deny",
                "permissionDecisionReason": verdict.message,
            }
        }
        if verdict.aborted is not None:
            self._aborted.setdefault(data["session_id"], verdict.aborted)
            out["continue_"] = False
            out["stopReason"] = verdict.aborted.message or verdict.message
        return out

    async def post_tool_use(self, data: Any, tool_use_id: str | None, context: Any) -> dict[str, Any]:
        guard = self._run(data["session_id"])
        call_id = data.get("tool_use_id") or tool_use_id
        tool, args = data["tool_name"], plain(data.get("tool_input"))
        await guard.after(tool, args, call_id, result=plain(data.get("tool_response")))
        return _context("PostToolUse", guard.notices(), guard)

    async def post_tool_use_failure(self, data: Any, tool_use_id: str | None, context: Any) -> dict[str, Any]:
        guard = self._run(data["session_id"])
        call_id = data.get("tool_use_id") or tool_use_id
        tool, args = data["tool_name"], plain(data.get("tool_input"))
        await guard.after(tool, args, call_id, error=thrown(str(data.get("error") or "")))
        return _context("PostToolUseFailure", guard.notices(), guard)

    async def end(self, reason: str | None = None) -> None:
        """End the run of every session seen: ``aborted`` where loopwatch ended it, else
        ``reason`` (``completed`` by default)."""
        runs, aborts, self._runs, self._aborted = self._runs, self._aborted, {}, {}  # the next query afresh
        for session_id, guard in runs.items():
            aborted = guard.aborted is not None or session_id in aborts
            await guard.end("aborted" if aborted else reason or "completed")


def _context(event: str, notices: tuple[str, ...], guard: RunGuard) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if notices:
        out["hookSpecificOutput"] = {"hookEventName": event, "additionalContext": "\n\n".join(notices)}
    aborted = guard.aborted
    if aborted is not None:
        out["continue_"] = False
        out["stopReason"] = aborted.message or "loopwatch ended the run."
    return out
