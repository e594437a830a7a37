"""Claude Code's hook payloads as loopwatch edge events, loopwatch's verdicts as its hook output.

* ``PreToolUse``: the call's request (gate mode waits for the decision).  A block is a deny
  (``permissionDecision: "deny"``, loopwatch's message as ``permissionDecisionReason``: Claude
  Code hands it to the model as the tool's error result); warnings loopwatch asks to show
  (``surfaceWarnings``) go to ``additionalContext``; an aborted run also gets
  ``continue: false`` with ``stopReason``, Claude Code's way of ending the session.
* ``PostToolUse``: the call's completion, hashed from ``tool_response``; warnings that arrived
  since go to ``additionalContext``, an abort to ``continue: false``.
* ``SessionEnd``: the run's end.

The run is Claude Code's session: run id ``session_id``, session key
``claude-code:<session_id>``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from schemas.errors import LoopwatchError
from schemas.verdicts import Decision
from streams.client import LoopBlocked, LoopwatchClient, NoDecisionError, RunAbortedError, RunHandle

EVENTS = ("PreToolUse", "PostToolUse", "SessionEnd")
MAX_ID = 256
MAX_SESSIONS = 10_000
# The detectors whose block refuses a late call of a run loopwatch has aborted
# (streams.engine.engine.refused_after_abort names the abort's detector).
_ABORT_DETECTORS = frozenset({"compaction_loop_persisted", "critical_block_limit"})


class PayloadError(LoopwatchError, ValueError):
    """A hook payload loopwatch cannot read: one line for the per-call command's stderr."""


def _ident(payload: dict, name: str, *, required: bool = True) -> str | None:
    value = payload.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_ID:
        raise PayloadError(f"{name} must be a non-empty string of at most {MAX_ID} characters")
    return value


class _Session:
    def __init__(self, run: RunHandle) -> None:
        self.run = run
        self.noticed = 0  # how many of run.warnings were given to the model (or skipped)

    def notices(self) -> list[str]:
        fresh = self.run.warnings[self.noticed :]
        self.noticed = len(self.run.warnings)
        return [d.message for d in fresh if d.notify_model and d.message]


class ClaudeCodeHooks:
    """One serve process's Claude Code sessions, each a run of ``client``."""

    def __init__(self, client: LoopwatchClient, *, agent_id: str = "claude-code") -> None:
        self.client = client
        self.agent_id = agent_id
        self._sessions: OrderedDict[str, _Session] = OrderedDict()

    def _session(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:
            run = self.client.run(session_id, session_key=f"claude-code:{session_id}", agent_id=self.agent_id)
            session = self._sessions[session_id] = _Session(run)
            while len(self._sessions) > MAX_SESSIONS:  # bounded: the oldest session is forgotten
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(session_id)
        return session

    async def handle(self, payload: dict) -> dict | None:
        event = payload.get("hook_event_name")
        if event not in EVENTS:
            raise PayloadError(f"hook_event_name must be one of {', '.join(EVENTS)}, not {str(event)[:40]!r}")
        session_id = _ident(payload, "session_id")
        if event == "SessionEnd":
            session = self._sessions.pop(session_id, None)
            if session is not None:
                reason = payload.get("reason")
                await session.run.end(reason[:MAX_ID] if isinstance(reason, str) else None)
            return None
        tool = _ident(payload, "tool_name")
        call_id = _ident(payload, "tool_use_id", required=False)
        args = payload.get("tool_input")
        session = self._session(session_id)
        if event == "PreToolUse":
            return await self._before(session, tool, args, call_id)
        await session.run.after_tool_call(tool, args, tool_call_id=call_id, result=payload.get("tool_response"))
        return self._context("PostToolUse", session)

    async def _before(self, session: _Session, tool: str, args: Any, call_id: str | None) -> dict | None:
        try:
            decision = await session.run.before_tool_call(tool, args, tool_call_id=call_id)
        except RunAbortedError as aborted:
            return _deny(aborted.message, stop=aborted.message)
        except LoopBlocked as blocked:
            return self._blocked(session, blocked.decision)
        except NoDecisionError as missing:  # fail closed
            return _deny(f"Tool call blocked: loopwatch loop protection is unavailable ({missing}).")
        if decision is not None and decision.action == "block":
            return self._blocked(session, decision)
        return self._context("PreToolUse", session)

    def _blocked(self, session: _Session, decision: Decision) -> dict:
        session.notices()  # the block's own message says it all; earlier warnings are moot
        message = decision.message or "Tool call blocked by loopwatch."
        aborted = session.run.aborted
        stop = None
        if aborted is not None:
            stop = aborted.message or message
        elif decision.detector in _ABORT_DETECTORS:
            stop = message
        return _deny(message, stop=stop)

    def _context(self, event: str, session: _Session) -> dict | None:
        out: dict[str, Any] = {}
        notices = session.notices()
        if notices:
            out["hookSpecificOutput"] = {"hookEventName": event, "additionalContext": "\n\n".join(notices)}
        if session.run.aborted is not None:
            out["continue"] = False
            out["stopReason"] = session.run.aborted.message or "loopwatch ended the run."
        return out or None


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
