"""Edge hashing: call signatures and outcome hashes (spec §2.2, §2.3, §5).

Runners hash at the edge with these functions and publish only the hashes; raw
arguments and results never need to leave the runner.  Values are JSON-like Python
values as decoded from JSON.  A missing result (the tool returned ``undefined``) is
``None`` passed as ``result`` together with ``returned=False``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

from .canonical import UNDEFINED, digest, js_number, js_trim, stable_stringify

__all__ = [
    "Outcome",
    "ThrownError",
    "args_hash",
    "hash_outcome",
    "is_known_poll",
    "is_send_call",
    "strip_volatile_send_ids",
    "unknown_tool_name",
]


@dataclass(frozen=True, slots=True)
class ThrownError:
    """A thrown JavaScript ``Error`` object (as opposed to a thrown string or value)."""

    message: str = ""
    name: str = "Error"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What ``recordToolCallOutcome`` derives from a tool's result or error.

    ``result_hash`` is None when the outcome produces no hash: the tool returned nothing,
    or the result is the loop detector's own veto (``loop_veto``).
    """

    result_hash: str | None
    unknown_tool_name: str | None = None
    loop_veto: bool = False
    is_error: bool = False


def args_hash(tool_name: str, args: Any) -> str:
    """The call signature ``<tool>:<sha256 of canonical args>``; args are hashed as received."""
    return f"{tool_name}:{digest(args)}"


def is_known_poll(tool_name: str, args: Any) -> bool:
    """``command_status`` (any args) and ``process`` with action poll/log (spec §2.8)."""
    if tool_name == "command_status":
        return True
    return tool_name == "process" and isinstance(args, dict) and args.get("action") in ("poll", "log")


_SEND_LIKE_MESSAGE_ACTIONS = frozenset(
    {"send", "broadcast", "reply", "thread-reply", "sendWithEffect", "sendAttachment",
     "upload-file", "sticker", "poll"}
)
_VOLATILE_SEND_KEYS = frozenset(
    {"messageId", "message_id", "messageIds", "platformMessageId", "platformMessageIds",
     "fileId", "file_id", "fileKey", "pollId", "poll_id", "receipt", "runId",
     "idempotencyKey", "ts", "timestamp", "sentAt", "deliveredAt", "createdAt",
     # Assigning `__proto__` on a JS object sets its prototype instead of adding a key.
     "__proto__"}
)


def is_send_call(tool_name: str, args: Any, provider_send_tools: Iterable[str] = ()) -> bool:
    """Whether a call is an outbound send whose result carries volatile ids (spec §5.2).

    ``provider_send_tools`` names the provider-docked channel tools (telegram, discord, …)
    that count as sends: upstream asks the channel plugin (``extractToolSend``), which the
    runner knows and loopwatch does not, so the runner lists them (as upstream's tests mock).
    """
    if tool_name == "sessions_send":
        return True
    if tool_name == "message":
        action = args.get("action") if isinstance(args, dict) else None
        return isinstance(action, str) and action in _SEND_LIKE_MESSAGE_ACTIONS
    return tool_name in provider_send_tools


def _is_message_delivery_object(obj: dict) -> bool:
    return (
        isinstance(obj.get("id"), str)
        and isinstance(obj.get("text"), str)
        and (
            isinstance(obj.get("direction"), str)
            or isinstance(obj.get("senderId"), str)
            or isinstance(obj.get("accountId"), str)
            or isinstance(obj.get("conversation"), dict)
        )
    )


def strip_volatile_send_ids(value: Any) -> Any:
    """Drop per-send volatile ids and timestamps, at any depth (spec §5.2)."""
    if isinstance(value, list):
        return [strip_volatile_send_ids(item) for item in value]
    if not isinstance(value, dict):
        return value
    drop_id = _is_message_delivery_object(value)
    return {
        key: strip_volatile_send_ids(nested)
        for key, nested in value.items()
        if key not in _VOLATILE_SEND_KEYS and not (drop_id and key == "id")
    }


def _error_text(error: Any) -> str:
    if isinstance(error, ThrownError):
        return error.message or error.name
    if isinstance(error, str):
        return error
    if isinstance(error, bool):
        return "true" if error else "false"
    if isinstance(error, (int, float)):
        if isinstance(error, float) and (error != error or error in (float("inf"), float("-inf"))):
            return {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}[repr(error)]
        return js_number(error)
    return stable_stringify(error)


# JS `\s` and ASCII-only case folding (JS /i without the u flag).
_WS = "[" + re.escape("\t\n\x0b\x0c\r \xa0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff") + "\u2000-\u200a]"
_UNKNOWN_TOOL_PATTERNS = (
    re.compile(r"unknown tool(?::|" + _WS + r")+[\"']?([a-z0-9_.-]+)[\"']?", re.IGNORECASE | re.ASCII),
    re.compile(r"tool" + _WS + r"+[\"']?([a-z0-9_.-]+)[\"']?" + _WS + r"+(?:not found|is not available)",
               re.IGNORECASE | re.ASCII),
)


def unknown_tool_name(error: Any) -> str | None:
    """The missing tool's name from an "unknown tool"-style error, lowercased (spec §2.9)."""
    raw = js_trim(_error_text(error))
    if not raw:
        return None
    for pattern in _UNKNOWN_TOOL_PATTERNS:
        match = pattern.search(raw)
        if match:
            return match.group(1).lower()
    return None


def _text_content(result: dict) -> str:
    content = result.get("content")
    if not isinstance(content, list):
        return ""
    texts = [
        entry["text"]
        for entry in content
        if isinstance(entry, dict) and isinstance(entry.get("type"), str) and isinstance(entry.get("text"), str)
    ]
    return js_trim("\n".join(texts))


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _exec_outcome(details: dict, text: str) -> str | None:
    status = details.get("status")
    if not isinstance(status, str) or not status:
        return None
    if status == "running":
        return digest({"status": status, "tail": _str_or_none(details.get("tail")) or ""})
    if status in ("completed", "failed"):
        exit_code = details.get("exitCode")
        aggregated = details.get("aggregated")
        output = js_trim(aggregated) if isinstance(aggregated, str) else ""
        return digest({
            "status": status,
            "exitCode": exit_code if isinstance(exit_code, (int, float)) and not isinstance(exit_code, bool) else None,
            "timedOut": details.get("timedOut") is True,
            "output": output or text,
        })
    if status in ("approval-pending", "approval-unavailable"):
        command = _str_or_none(details.get("command"))
        warning = _str_or_none(details.get("warningText"))
        return digest({
            "status": status,
            "reason": _str_or_none(details.get("reason")),
            "host": _str_or_none(details.get("host")),
            "command": command if command is not None else "",
            "warningText": warning if warning is not None else "",
        })
    return None


def _or_null(details: dict, key: str) -> Any:
    value = details.get(key)
    return None if value is UNDEFINED else value


def hash_outcome(
    tool_name: str,
    args: Any,
    *,
    result: Any = None,
    error: Any = UNDEFINED,
    returned: bool = True,
    provider_send_tools: Iterable[str] = (),
) -> Outcome:
    """Upstream's ``hashToolOutcome``: the rules of spec §2.3 in order, first match wins.

    Pass ``error=`` for a thrown error (a ``ThrownError`` for an Error object, or any
    JSON value that was thrown), otherwise ``result=``; ``returned=False`` means the tool
    returned ``undefined``.
    """
    if error is not UNDEFINED:
        return Outcome(f"error:{digest(_error_text(error))}", unknown_tool_name(error), is_error=True)
    if not isinstance(result, dict):
        return Outcome(digest(result) if returned else None)
    details = result.get("details")
    if not isinstance(details, dict):
        details = {}
    text = _text_content(result)
    if details.get("status") == "blocked" and details.get("deniedReason") == "tool-loop":
        return Outcome(None, loop_veto=True)
    if tool_name == "exec":
        exec_hash = _exec_outcome(details, text)
        if exec_hash is not None:
            return Outcome(exec_hash)
    if tool_name == "process" and isinstance(args, dict):
        action = args.get("action")
        status = details["status"] if "status" in details else UNDEFINED
        if action == "poll":
            return Outcome(digest({
                "action": action, "status": status,
                "exitCode": _or_null(details, "exitCode"), "exitSignal": _or_null(details, "exitSignal"),
                "aggregated": _or_null(details, "aggregated"), "text": text,
            }))
        if action == "log":
            return Outcome(digest({
                "action": action, "status": status,
                "totalLines": _or_null(details, "totalLines"), "totalChars": _or_null(details, "totalChars"),
                "truncated": _or_null(details, "truncated"), "exitCode": _or_null(details, "exitCode"),
                "exitSignal": _or_null(details, "exitSignal"), "text": text,
            }))
    if is_send_call(tool_name, args, provider_send_tools):
        return Outcome(digest(strip_volatile_send_ids(details)))
    return Outcome(digest({"details": details, "text": text}))
