"""The per-call command an agent CLI runs for each hook (``loopwatch hook claude-code``,
``loopwatch hook codex``, ``loopwatch hook gemini``).

It must start fast, so it imports only the standard library and nothing of loopwatch: it reads
the hook's JSON on stdin, sends it to ``loopwatch hook --serve`` over a Unix socket (one JSON
line each way), and writes the CLI's hook output the serve process answered.  When the serve
process is not there (or does not answer within ``--timeout``) it fails open (no output: the
call runs) or, with ``--fail-closed``, denies the tool call.  It can also be run by path
(``python -S .../call.py claude-code``), which skips the interpreter's site setup.

The protocol: request ``{"cli": "claude-code", "payload": {...}}``; answer
``{"output": {...} | null}`` or ``{"error": "one line"}``.
"""

from __future__ import annotations

import json
import os
import socket
import sys

CLIS = ("claude-code", "codex", "gemini")
MAX_LINE = 4 * 1024 * 1024
"""Longest request or answer line: a hook payload carries the tool's whole output."""
SOCKET_ENV = "LOOPWATCH_HOOK_SOCKET"
DEFAULT_TIMEOUT_S = 5.0
TOKEN_ENV = "LOOPWATCH_HOOK_TOKEN"
"""The HTTP endpoint's bearer token, for the serve process (else it is kept in a file) and for
Claude Code, which fills it into the HTTP hook's ``Authorization`` header."""
USAGE = "usage: loopwatch hook claude-code|codex|gemini [--socket PATH] [--timeout S] [--fail-closed]"


def default_socket() -> str:
    """``$LOOPWATCH_HOOK_SOCKET``, else one socket per user in the runtime (or temp) directory."""
    explicit = os.environ.get(SOCKET_ENV)
    if explicit:
        return explicit
    return _runtime_path("sock")


def default_token_file() -> str:
    """Where ``hook --serve --http`` keeps its bearer token when ``$LOOPWATCH_HOOK_TOKEN`` is unset."""
    return _runtime_path("token")


def _runtime_path(suffix: str) -> str:
    base = os.environ.get("XDG_RUNTIME_DIR") or os.environ.get("TMPDIR") or "/tmp"  # tempfile costs ms
    return os.path.join(base, f"loopwatch-hook-{os.getuid()}.{suffix}")


def parse(argv: list[str]) -> tuple[str, str, float, bool] | str:
    """``(cli, socket path, timeout, fail closed)``, or what is wrong with ``argv`` in one line.

    argparse is left out to start faster; a problem is returned rather than raised so that this
    module defines no exception class (those derive from ``LoopwatchError``, whose import would
    pull in msgspec and cost the hook ~100 ms on every call)."""
    if not argv or argv[0] not in CLIS:
        return f"the CLI is one of: {', '.join(CLIS)}"
    path, timeout, closed = default_socket(), DEFAULT_TIMEOUT_S, False
    rest = argv[1:]
    while rest:
        flag = rest.pop(0)
        if flag == "--fail-closed":
            closed = True
        elif flag in ("--socket", "--timeout") and rest:
            value = rest.pop(0)
            if flag == "--socket":
                path = value
            else:
                try:
                    timeout = float(value)
                except ValueError:
                    return f"--timeout takes seconds, not {value!r}"
                if not 0 < timeout <= 600:
                    return "--timeout is between 0 and 600 seconds"
        else:
            return f"unknown or incomplete option {flag!r}"
    return argv[0], path, timeout, closed


def ask(path: str, request: bytes, timeout: float) -> dict:
    """One request line to the serve process, its answer line decoded."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(request)
        chunks, size = [], 0
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if chunk.endswith(b"\n"):
                break
            if size > MAX_LINE:
                raise ValueError("answer too long")
    answer = json.loads(b"".join(chunks))
    if not isinstance(answer, dict):
        raise ValueError("answer is not a JSON object")
    return answer


def unavailable_output(cli: str, payload: dict, reason: str) -> dict | None:
    """Fail closed: deny a tool call about to run; other events have nothing to refuse."""
    message = f"Tool call blocked: loopwatch loop protection is unavailable ({reason})."
    event = payload.get("hook_event_name")
    if cli in ("claude-code", "codex") and event == "PreToolUse":  # Codex CLI speaks Claude Code's protocol
        return {
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "deny",
                "permissionDecisionReason": message,
            }
        }
    if cli == "gemini" and event == "BeforeTool":
        return {"decision": "deny", "reason": message}
    return None


def read_payload(raw: bytes) -> dict | str:
    """The hook input on stdin, or what is wrong with it in one line."""
    try:
        if len(raw) > MAX_LINE:
            raise ValueError(f"longer than {MAX_LINE} bytes")
        payload = json.loads(raw)
        if not isinstance(payload, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        return f"the hook input on stdin is not a JSON object: {str(exc)[:200]}"
    except RecursionError:  # json recurses once per level of nesting
        return "the hook input on stdin is nested too deep to read"
    return payload


def unanswered(cli: str, payload: dict | bytes, path: str, exc: Exception, closed: bool) -> int:
    """What the per-call command does when the serve process gives no decision (``exc``): one
    line on stderr, then nothing (fail open: the call runs) or a deny (``closed``).  The relay
    (``relay``) comes here too, with the raw stdin it did not read itself."""
    if isinstance(payload, bytes):
        read = read_payload(payload)
        if isinstance(read, str):
            print(f"loopwatch hook: {read}", file=sys.stderr)
            return 1
        payload = read
    reason = f"no answer from loopwatch hook --serve at {path}: {exc or type(exc).__name__}"
    print(f"loopwatch hook: {reason}; failing {'closed' if closed else 'open'}", file=sys.stderr)
    output = unavailable_output(cli, payload, reason) if closed else None
    if output is not None:
        sys.stdout.write(json.dumps(output))
        sys.stdout.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parsed = parse(list(argv))
    if isinstance(parsed, str):
        print(f"loopwatch hook: {parsed} ({USAGE})", file=sys.stderr)
        return 2
    cli, path, timeout, closed = parsed
    payload = read_payload(sys.stdin.buffer.read(MAX_LINE + 1))
    if isinstance(payload, str):
        print(f"loopwatch hook: {payload}", file=sys.stderr)
        return 1
    request = json.dumps({"cli": cli, "payload": payload}, separators=(",", ":")).encode() + b"\n"
    try:
        answer = ask(path, request, timeout)
        if "error" in answer:
            raise ValueError(str(answer["error"])[:300])
        output = answer.get("output")
    except (OSError, ValueError) as exc:
        return unanswered(cli, payload, path, exc, closed)
    if output is not None:
        sys.stdout.write(json.dumps(output))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
