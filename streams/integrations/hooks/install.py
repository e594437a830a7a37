"""``loopwatch hook install``: loopwatch's hooks in an agent CLI's settings file.

Idempotent: loopwatch's own entries (a command that runs ``hook claude-code``, ``hook codex``
or ``hook gemini``, the relay, or an HTTP hook to a ``/hooks/<cli>`` path) are replaced,
everything else in the file is kept; a file that changes is first copied to ``<file>.bak``.

The command it writes by default is the relay (``relay``) run by this interpreter with
``-I -S``, by absolute path: it starts in a fraction of ``loopwatch hook <cli>``'s time, and it
keeps working in a CLI whose ``PATH`` does not have loopwatch's virtualenv.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.errors import LoopwatchError

from .call import TOKEN_ENV

HOOK_TIMEOUT_S = 10
"""The CLI's own limit on one hook command (the per-call command gives up first)."""


@dataclass(frozen=True)
class CliSettings:
    """Where and how one agent CLI reads its hooks."""

    settings: str
    """The settings file: relative to the project's root, or in the user's home (``~/``)."""
    tool_events: tuple[str, ...]
    """Before and after a tool call: a group with ``matcher: "*"`` (every tool)."""
    session_events: tuple[str, ...]
    timeout: int
    """``HOOK_TIMEOUT_S`` in the unit of the CLI's ``timeout`` field."""
    name: str | None = None
    """The hook's ``name`` field, where the CLI shows one."""
    home_env: str | None = None
    """The variable that, when set, names the directory of ``settings`` instead."""

    def path(self) -> str:
        moved = os.environ.get(self.home_env) if self.home_env else None
        if moved:  # $CODEX_HOME/hooks.json in place of ~/.codex/hooks.json
            return os.path.join(moved, os.path.basename(self.settings))
        return os.path.expanduser(self.settings)


CLIS = {
    "claude-code": CliSettings(
        ".claude/settings.json", ("PreToolUse", "PostToolUse"), ("PostToolBatch", "SessionEnd"), HOOK_TIMEOUT_S
    ),
    "codex": CliSettings(
        "~/.codex/hooks.json", ("PreToolUse", "PostToolUse"), (), HOOK_TIMEOUT_S, home_env="CODEX_HOME"
    ),
    "gemini": CliSettings(
        ".gemini/settings.json", ("BeforeTool", "AfterTool"), ("SessionEnd",), HOOK_TIMEOUT_S * 1000, "loopwatch"
    ),
}


def default_command(cli: str) -> str:
    return f"loopwatch hook {cli}"


DEFAULT_COMMAND = default_command("claude-code")
RELAY = str(Path(__file__).resolve().with_name("relay.py"))


def relay_command(cli: str, *, python: str | None = None, relay: str = RELAY) -> str:
    """The fast per-call command: ``python -I -S relay.py <cli>`` (by default this interpreter)."""
    python = python or sys.executable
    if not python:  # an embedded interpreter that cannot name itself
        return default_command(cli)
    return f"{_quoted(python)} -I -S {_quoted(relay)} {cli}"


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


HTTP_CLIS = ("claude-code",)
"""The CLIs with HTTP hooks (``"type": "http"``); Codex CLI and Gemini CLI run commands only."""


def http_hook(cli: str, url: str) -> dict[str, Any]:
    """An HTTP hook to ``loopwatch hook --serve --http``: ``url`` is its ``/hooks/<cli>`` URL;
    the request carries the bearer token from ``$LOOPWATCH_HOOK_TOKEN`` in Claude Code's environment."""
    from urllib.parse import urlsplit

    if cli not in HTTP_CLIS:
        raise InstallError(f"{cli} has no HTTP hooks; install its command hook (leave out --http)")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InstallError(f"--http {url[:100]!r} is not an http:// URL")
    if not parts.path.rstrip("/").endswith(f"/hooks/{cli}"):
        raise InstallError(f"--http {url[:100]!r}: loopwatch answers {cli} at the path /hooks/{cli}")
    return {
        "type": "http",
        "url": url,
        "headers": {"Authorization": f"Bearer ${{{TOKEN_ENV}}}"},
        "allowedEnvVars": [TOKEN_ENV],
        "timeout": CLIS[cli].timeout,
    }


def cli_hooks(cli: str, command: str | dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The ``hooks`` block of the CLI's settings file: every tool, before and after, and the
    session's end; ``command`` is the per-call command, or an ``http_hook``."""
    spec = CLIS[cli]
    hook: dict[str, Any]
    if isinstance(command, dict):
        hook = dict(command)
    else:
        hook = {"type": "command", "command": command, "timeout": spec.timeout}
    if spec.name:
        hook = {"name": spec.name, **hook}
    out = {event: [{"matcher": "*", "hooks": [dict(hook)]}] for event in spec.tool_events}
    out.update({event: [{"hooks": [dict(hook)]}] for event in spec.session_events})
    return out


def _ours(group: Any) -> bool:
    hooks = group.get("hooks") if isinstance(group, dict) else None
    return isinstance(hooks, list) and any(
        isinstance(h, dict)
        and any(
            f"hook {cli}" in str(h.get("command", ""))
            or f"relay.py {cli}" in str(h.get("command", ""))
            or (h.get("type") == "http" and str(h.get("url", "")).rstrip("/").endswith(f"/hooks/{cli}"))
            for cli in CLIS
        )
        for h in hooks
    )


def merged(settings: dict[str, Any], command: str | dict[str, Any], cli: str = "claude-code") -> dict[str, Any]:
    """``settings`` with loopwatch's hooks in place of any earlier ones of loopwatch."""
    out = dict(settings)
    hooks = out.get("hooks", {})
    if not isinstance(hooks, dict):
        raise InstallError('its "hooks" is not a JSON object')
    hooks = dict(hooks)
    for event, groups in cli_hooks(cli, command).items():
        earlier = hooks.get(event, [])
        if not isinstance(earlier, list):
            raise InstallError(f"its hooks.{event} is not a JSON array")
        hooks[event] = [g for g in earlier if not _ours(g)] + groups
    out["hooks"] = hooks
    return out


def install(path: Path, command: str | dict[str, Any], cli: str = "claude-code") -> str:
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
        after = json.dumps(merged(settings, command, cli), indent=2) + "\n"
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
