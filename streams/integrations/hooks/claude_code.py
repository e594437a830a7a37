"""Claude Code's hook payloads as loopwatch edge events, loopwatch's verdicts as its hook output.

* ``PreToolUse``: the call's request (gate mode waits for the decision).  A block is a deny
  (``permissionDecision: "deny"``, loopwatch's message as ``permissionDecisionReason``: Claude
  Code hands it to the model as the tool's error result); warnings loopwatch asks to show
  (``surfaceWarnings``) go to ``additionalContext``; an aborted run also gets
  ``continue: false`` with ``stopReason``, Claude Code's way of ending the session.
* ``PostToolUse``: the call's completion, hashed from ``tool_response``; warnings that arrived
  since go to ``additionalContext``, an abort to ``continue: false``.
* ``PostToolBatch`` (after each batch of tool results, before the model is asked again): an
  aborted run, or a deny that ended it, gets ``continue: false`` with ``stopReason``.  This is what
  ends the session after a denied call: Claude Code (2.1.197) ignores ``continue: false`` in a
  ``PreToolUse`` output that denies, and without the deny it would run the call first.
* ``SessionEnd``: the run's end.

The run is Claude Code's session: run id ``session_id``, session key
``claude-code:<session_id>``.
"""

from __future__ import annotations

from typing import Any

from schemas.verdicts import Decision
from streams.client import LoopBlocked, LoopwatchClient, NoDecisionError, RunAbortedError

from .sessions import MAX_ID, PayloadError, Session, Sessions, event_name, ident, optional_ident

__all__ = ["EVENTS", "ClaudeCodeHooks", "PayloadError"]

EVENTS = ("PreToolUse", "PostToolUse", "PostToolBatch", "SessionEnd")


class ClaudeCodeHooks:
    """One serve process's Claude Code sessions, each a run of ``client``."""

    events: tuple[str, ...] = EVENTS
    key_prefix = "claude-code"
    ends_session = True
    """An aborted run's hooks answer ``continue: false``, which ends the CLI's session."""

    def __init__(self, client: LoopwatchClient, *, agent_id: str = "claude-code") -> None:
        self.client = client
        self.sessions = Sessions(client, agent_id=agent_id, key_prefix=self.key_prefix)

    async def handle(self, payload: dict) -> dict | None:
        event = event_name(payload, self.events)
        session_id = ident(payload, "session_id")
        if event == "SessionEnd":
            session = self.sessions.pop(session_id)
            if session is not None:
                reason = payload.get("reason")
                await session.run.end(reason[:MAX_ID] if isinstance(reason, str) else None)
            return None
        if event == "PostToolBatch":
            return self._after_batch(self.sessions.peek(session_id))
        tool = ident(payload, "tool_name")
        call_id = optional_ident(payload, "tool_use_id")
        args = payload.get("tool_input")
        session = self.sessions.get(session_id)
        if event == "PreToolUse":
            return await self._before(session, tool, args, call_id)
        await session.run.after_tool_call(tool, args, tool_call_id=call_id, result=payload.get("tool_response"))
        return self._context("PostToolUse", session)

    async def _before(self, session: Session, tool: str, args: Any, call_id: str | None) -> dict | None:
        try:
            decision = await session.run.before_tool_call(tool, args, tool_call_id=call_id)
        except RunAbortedError as aborted:
            session.stopped = aborted.message
            return self._deny(aborted.message, stop=aborted.message)
        except LoopBlocked as blocked:
            return self._blocked(session, blocked.decision)
        except NoDecisionError as missing:  # fail closed
            return self._deny(f"Tool call blocked: loopwatch loop protection is unavailable ({missing}).")
        if decision is not None and decision.action == "block":
            return self._blocked(session, decision)
        return self._context("PreToolUse", session)

    def _blocked(self, session: Session, decision: Decision) -> dict:
        session.notices()  # the block's own message says it all; earlier warnings are moot
        stop = session.stop_message(decision)
        if stop is not None:
            session.stopped = stop
        return self._deny(decision.message or "Tool call blocked by loopwatch.", stop=stop)

    def _after_batch(self, session: Session | None) -> dict | None:
        if session is None or not self.ends_session:
            return None
        aborted = session.run.aborted
        stop = (aborted.message or "loopwatch ended the run.") if aborted is not None else session.stopped
        return None if stop is None else {"continue": False, "stopReason": stop}

    def _context(self, event: str, session: Session) -> dict | None:
        out: dict[str, Any] = {}
        notices = session.notices()
        if notices:
            out["hookSpecificOutput"] = {"hookEventName": event, "additionalContext": "\n\n".join(notices)}
        if session.run.aborted is not None and self.ends_session:
            out["continue"] = False
            out["stopReason"] = session.run.aborted.message or "loopwatch ended the run."
        return out or None

    def _deny(self, reason: str, *, stop: str | None = None) -> dict:
        return _deny(reason, stop=stop if self.ends_session else None)


def _deny(reason: str, *, stop: str | None = None) -> dict:
    out: dict[str, Any] = {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": reason,
        }
    }
    if stop is not None:
        out["continue"] = False
        out["stopReason"] = stop
    return out
