"""Gemini CLI's hook payloads as loopwatch edge events, loopwatch's verdicts as its hook output.

* ``BeforeTool``: the call's request (gate mode waits for the decision).  A block is
  ``decision: "deny"`` with loopwatch's message as ``reason``, which Gemini CLI gives the model
  as the tool's error (``Tool execution blocked: <reason>``); an aborted run also gets
  ``continue: false`` with ``stopReason``, Gemini CLI's way of ending the agent loop.
  Gemini CLI reads no context from a ``BeforeTool`` hook, so a warning waits for the call's
  ``AfterTool``.
* ``AfterTool``: the call's completion, hashed from ``tool_response``; warnings loopwatch asks
  to show (``surfaceWarnings``) go to ``hookSpecificOutput.additionalContext``, which Gemini CLI
  appends to the tool's result; an abort is ``continue: false``.  Gemini CLI runs no
  ``AfterTool`` for a call a ``BeforeTool`` hook denied.
* ``SessionEnd``: the run's end.

Gemini CLI's hook input carries no call id: a call's id is made here at
``BeforeTool`` (``gemini-call-<n>``, unique within the session) and found again at ``AfterTool``
by the tool's name and arguments.

The run is Gemini CLI's session: run id ``session_id``, session key ``gemini:<session_id>``.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict, deque
from typing import Any

from schemas.verdicts import Decision
from streams.client import LoopBlocked, LoopwatchClient, NoDecisionError, RunAbortedError, RunHandle

from .sessions import MAX_ID, PayloadError, Session, Sessions, event_name, ident

__all__ = ["EVENTS", "GeminiHooks", "PayloadError", "outcome"]

EVENTS = ("BeforeTool", "AfterTool", "SessionEnd")
MAX_PENDING = 1024
"""Calls of one session allowed but not yet completed that are remembered (a call another
hook denied, or one cancelled, never completes)."""
SHELL_TOOL = "run_shell_command"
# Gemini CLI's shell tool ends its result with the process ids of the run (inside the
# untrusted_context wrapper it may add): they differ every time the same command runs, and
# are no part of what the command did.
_SHELL_PIDS = re.compile(r"(?:\nBackground PIDs: [0-9, ]*)?\nProcess Group PGID: [0-9]+(?=\n</untrusted_context>\Z|\Z)")


def outcome(tool: str, response: Any) -> Any:
    """What a call's ``tool_response`` says it did, for its hash: the response, less the shell
    tool's process ids."""
    if tool == SHELL_TOOL and isinstance(response, dict) and isinstance(response.get("llmContent"), str):
        return {**response, "llmContent": _SHELL_PIDS.sub("", response["llmContent"])}
    return response


class _GeminiSession(Session):
    def __init__(self, run: RunHandle) -> None:
        super().__init__(run)
        self.calls = 0
        self.pending: OrderedDict[str, deque[str]] = OrderedDict()  # call key -> ids, oldest first
        self.pending_count = 0

    def new_call(self) -> str:
        self.calls += 1
        return f"gemini-call-{self.calls}"

    def started(self, key: str, call_id: str) -> None:
        self.pending.setdefault(key, deque()).append(call_id)
        self.pending_count += 1
        while self.pending_count > MAX_PENDING:
            oldest = next(iter(self.pending))
            self._take(oldest)

    def finished(self, key: str) -> str:
        return self._take(key) or self.new_call()

    def _take(self, key: str) -> str | None:
        ids = self.pending.get(key)
        if not ids:
            return None
        call_id = ids.popleft()
        self.pending_count -= 1
        if not ids:
            del self.pending[key]
        return call_id


def _call_key(tool: str, args: Any) -> str:
    try:
        return tool + "\0" + json.dumps(args, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return tool + "\0" + repr(args)


class GeminiHooks:
    """One serve process's Gemini CLI sessions, each a run of ``client``."""

    def __init__(self, client: LoopwatchClient, *, agent_id: str = "gemini-cli") -> None:
        self.client = client
        self.sessions = Sessions(client, agent_id=agent_id, key_prefix="gemini")

    def _session(self, session_id: str) -> _GeminiSession:
        session = self.sessions.get(session_id, _GeminiSession)
        assert isinstance(session, _GeminiSession)
        return session

    async def handle(self, payload: dict) -> dict | None:
        event = event_name(payload, EVENTS)
        session_id = ident(payload, "session_id")
        if event == "SessionEnd":
            ended = self.sessions.pop(session_id)
            if ended is not None:
                reason = payload.get("reason")
                await ended.run.end(reason[:MAX_ID] if isinstance(reason, str) else None)
            return None
        tool = ident(payload, "tool_name")
        args = payload.get("tool_input")
        session = self._session(session_id)
        key = _call_key(tool, args)
        if event == "BeforeTool":
            return await self._before(session, tool, args, key)
        call_id = session.finished(key)
        response = payload.get("tool_response")
        await session.run.after_tool_call(tool, args, tool_call_id=call_id, result=outcome(tool, response))
        return self._after(session)

    async def _before(self, session: _GeminiSession, tool: str, args: Any, key: str) -> dict | None:
        call_id = session.new_call()
        try:
            decision = await session.run.before_tool_call(tool, args, tool_call_id=call_id)
        except RunAbortedError as aborted:
            return _deny(aborted.message, stop=aborted.message)
        except LoopBlocked as blocked:
            return _blocked(session, blocked.decision)
        except NoDecisionError as missing:  # fail closed
            return _deny(f"Tool call blocked: loopwatch loop protection is unavailable ({missing}).")
        if decision is not None and decision.action == "block":
            return _blocked(session, decision)
        session.started(key, call_id)
        if session.run.aborted is not None:
            return _stop(session.run.aborted.message)
        return None

    def _after(self, session: _GeminiSession) -> dict | None:
        out: dict[str, Any] = {}
        notices = session.notices()
        if notices:
            out["hookSpecificOutput"] = {"hookEventName": "AfterTool", "additionalContext": "\n\n".join(notices)}
        if session.run.aborted is not None:
            out.update(_stop(session.run.aborted.message))
        return out or None


def _blocked(session: Session, decision: Decision) -> dict:
    session.notices()  # the block's own message says it all; earlier warnings are moot
    return _deny(decision.message or "Tool call blocked by loopwatch.", stop=session.stop_message(decision))


def _stop(message: str | None) -> dict:
    return {"continue": False, "stopReason": message or "loopwatch ended the run."}


def _deny(reason: str, *, stop: str | None = None) -> dict:
    out: dict[str, Any] = {"decision": "deny", "reason": reason}
    if stop is not None:
        out.update(_stop(stop))
    return out
