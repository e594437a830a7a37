"""Codex CLI's hooks: Claude Code's protocol (``claude_code``), which Codex CLI speaks for its
``PreToolUse`` and ``PostToolUse`` hooks: the same input fields (``session_id``, ``tool_name``,
``tool_input``, ``tool_use_id``, ``tool_response``) and the same output (a deny is
``permissionDecision: "deny"`` with ``permissionDecisionReason``, context is
``additionalContext``).  Codex CLI has no session-end hook (``Stop`` ends a turn, not the
session), so a run is not ended from here.

An aborted run gets no ``continue: false``: Codex CLI does not end its session on it, and at
``PreToolUse`` it runs the command all the same (the output the model gets is replaced by
``stopReason``), which would let the very call loopwatch refuses run.  Instead every later call
of an aborted run is denied with the abort's message.

The run is Codex CLI's session: run id ``session_id``, session key ``codex:<session_id>``.
"""

from __future__ import annotations

from .claude_code import ClaudeCodeHooks

EVENTS = ("PreToolUse", "PostToolUse")


class CodexHooks(ClaudeCodeHooks):
    """One serve process's Codex CLI sessions, each a run of ``client``."""

    events = EVENTS
    key_prefix = "codex"
    ends_session = False
