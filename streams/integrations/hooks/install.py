"""``loopwatch hook install``: loopwatch's hooks in an agent CLI's settings file.

Idempotent: loopwatch's own entries (a command that runs ``hook claude-code``, ``hook codex``
or ``hook gemini``, the relay, or an HTTP hook to a ``/hooks/<cli>`` path) are replaced,
everything else in the file is kept; a file that changes is first copied to ``<file>.bak``.

The command it writes by default is the native relay (``relay.c``), compiled by the machine's C
compiler into a per-user cache directory with this interpreter built in for its fallback: it
starts in about a millisecond.  Without a compiler (or with ``--relay python``) it is the Python
relay (``relay``) run by this interpreter with ``-I -S``, by absolute path, which starts in a
fraction of ``loopwatch hook <cli>``'s time.  Both keep working in a CLI whose ``PATH`` does not
have loopwatch's virtualenv.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
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
    """A settings file that cannot be updated, or a relay that cannot be built: one line."""


RELAY_SOURCE = Path(__file__).resolve().with_name("relay.c")
NATIVE_NAME = "loopwatch-relay"
COMPILERS = ("cc", "gcc", "clang")
COMPILE_TIMEOUT_S = 120


def relay_cache() -> Path:
    """Where native relays are kept, one directory per build: ``$XDG_CACHE_HOME/loopwatch/relay``
    (by default ``~/.cache/loopwatch/relay``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "loopwatch" / "relay"


def find_compiler() -> list[str] | None:
    """``$CC`` (split as a shell would), else the first of cc, gcc and clang on ``PATH``."""
    explicit = os.environ.get("CC", "").strip()
    if explicit:
        return shlex.split(explicit)
    for name in COMPILERS:
        found = shutil.which(name)
        if found:
            return [found]
    return None


def _c_string(value: str) -> str:
    """``value`` as a C string literal that no shell, quote or trigraph can change."""
    safe = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+")
    return '"' + "".join(chr(b) if b in safe else f"\\{b:03o}" for b in os.fsencode(value)) + '"'


def build_native_relay(compiler: list[str], *, python: str | None = None, cache: Path | None = None) -> Path:
    """The native relay for ``python`` (default: this interpreter), compiled once per source,
    interpreter and compiler into ``cache`` (default ``relay_cache()``), atomically; a build that
    is there already is reused."""
    python = python or sys.executable
    if not python:
        raise InstallError("this Python cannot name its own interpreter, which the native relay falls back to")
    hooks = str(RELAY_SOURCE.parent)
    source = RELAY_SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, os.fsencode(python), os.fsencode(hooks), " ".join(compiler).encode()]))
    where = (cache or relay_cache()) / key.hexdigest()[:16]
    binary = where / NATIVE_NAME
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InstallError(f"cannot make {where}: {exc.strerror or exc}") from None
    tmp = where / f"{NATIVE_NAME}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    command = [*compiler, "-O2", "-o", str(tmp), f"-DLW_PYTHON={_c_string(python)}", f"-DLW_HOOKS={_c_string(hooks)}"]
    try:
        done = subprocess.run(
            [*command, str(RELAY_SOURCE)], capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False
        )
        if done.returncode != 0:
            said = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[:200])
            raise InstallError(
                f"{compiler[0]} could not build the native relay: {said[:200] or f'exit status {done.returncode}'}"
            )
        os.replace(tmp, binary)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError(f"{compiler[0]} could not build the native relay: {exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
        if not binary.exists():
            try:
                where.rmdir()  # only when empty: another install may be building beside this one
            except OSError:
                pass
    return binary


def native_command(cli: str, binary: str | Path) -> str:
    """The native relay's per-call command: ``<binary> <cli>``."""
    return f"{_quoted(str(binary))} {cli}"


def chosen_relay(cli: str, relay: str | None = None, *, cache: Path | None = None) -> tuple[str, str]:
    """The per-call command ``hook install`` writes and one line saying which relay it is.
    ``relay``: ``"native"`` (an error without a compiler), ``"python"``, or None: native when a C
    compiler is found and builds it, else Python."""
    if relay == "python":
        return relay_command(cli), "relay: python -I -S relay.py (--relay python)"
    compiler = find_compiler()
    if compiler is None:
        if relay == "native":
            raise InstallError(
                f"--relay native needs a C compiler: none of {', '.join(COMPILERS)} is on PATH (or set CC)"
            )
        return relay_command(
            cli
        ), f"relay: python -I -S relay.py (no C compiler: none of {', '.join(COMPILERS)} on PATH)"
    try:
        binary = build_native_relay(compiler, cache=cache)
    except InstallError as exc:
        if relay == "native":
            raise
        return relay_command(cli), f"relay: python -I -S relay.py ({exc})"
    return native_command(cli, binary), f"relay: native, {binary} (built by {compiler[0]})"


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
            or f"{NATIVE_NAME} {cli}" in str(h.get("command", ""))
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
