"""``loopwatch hook install``: loopwatch's hooks in an agent CLI's settings file.

Idempotent: loopwatch's own entries (a command that runs ``hook claude-code``) are replaced,
everything else in the file is kept; a file that changes is first copied to ``<file>.bak``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from schemas.errors import LoopwatchError

DEFAULT_COMMAND = "loopwatch hook claude-code"
MARKER = "hook claude-code"
HOOK_TIMEOUT_S = 10
"""Claude Code's own limit on one hook command, in seconds (the per-call command gives up first)."""
EVENTS = ("PreToolUse", "PostToolUse", "SessionEnd")
TOOL_EVENTS = ("PreToolUse", "PostToolUse")


class InstallError(LoopwatchError):
    """A settings file that cannot be updated: one line."""


def hook_command(command: str = DEFAULT_COMMAND, *, socket: str | None = None, fail_closed: bool = False) -> str:
    parts = [command]
    if socket:
        parts += ["--socket", _quoted(socket)]
    if fail_closed:
        parts.append("--fail-closed")
    return " ".join(parts)


def _quoted(value: str) -> str:
    import shlex

    return shlex.quote(value)


def claude_code_hooks(command: str) -> dict[str, list[dict[str, Any]]]:
    """The ``hooks`` block of Claude Code's settings.json: every tool, before and after, and
    the session's end."""
    hook = {"type": "command", "command": command, "timeout": HOOK_TIMEOUT_S}
    return {
        event: [{"matcher": "*", "hooks": [dict(hook)]}] if event in TOOL_EVENTS else [{"hooks": [dict(hook)]}]
        for event in EVENTS
    }


def _ours(group: Any) -> bool:
    hooks = group.get("hooks") if isinstance(group, dict) else None
    return isinstance(hooks, list) and any(isinstance(h, dict) and MARKER in str(h.get("command", "")) for h in hooks)


def merged(settings: dict[str, Any], command: str) -> dict[str, Any]:
    """``settings`` with loopwatch's hooks in place of any earlier ones of loopwatch."""
    out = dict(settings)
    hooks = out.get("hooks", {})
    if not isinstance(hooks, dict):
        raise InstallError('its "hooks" is not a JSON object')
    hooks = dict(hooks)
    for event, groups in claude_code_hooks(command).items():
        earlier = hooks.get(event, [])
        if not isinstance(earlier, list):
            raise InstallError(f"its hooks.{event} is not a JSON array")
        hooks[event] = [g for g in earlier if not _ours(g)] + groups
    out["hooks"] = hooks
    return out


def install(path: Path, command: str) -> str:
    """Write the hooks into ``path``; returns what was done, in one line."""
    before = None
    if path.exists():
        try:
            before = path.read_text(encoding="utf-8")
            settings = json.loads(before) if before.strip() else {}
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise InstallError(f"cannot read {path} as JSON: {str(exc)[:200]}") from None
        if not isinstance(settings, dict):
            raise InstallError(f"{path} is not a JSON object")
    else:
        settings = {}
    try:
        after = json.dumps(merged(settings, command), indent=2) + "\n"
    except InstallError as exc:
        raise InstallError(f"cannot update {path}: {exc}") from None
    if before is not None and json.loads(before or "{}") == json.loads(after):
        return f"loopwatch hooks already in {path}; nothing changed"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        backup = ""
        if before is not None:
            shutil.copy2(path, f"{path}.bak")
            backup = f" (the previous file is {path}.bak)"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(after, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise InstallError(f"cannot write {path}: {exc.strerror or exc}") from None
    return f"loopwatch hooks written to {path}{backup}"
