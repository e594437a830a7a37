"""Edge hashing: call signatures and outcome hashes (spec §2.2, §2.3, §5).

Runners hash at the edge with these functions and publish only the hashes; raw
arguments and results never need to leave the runner.  Values are JSON-like Python
values as decoded from JSON.  A missing result (the tool returned ``undefined``) is
``None`` passed as ``result`` together with ``returned=False``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shlex
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import msgspec

from schemas.events import OutcomeKind
from schemas.keys import JS_WHITESPACE

from .canonical import (
    JSON_DEPTH_LIMIT,
    UNDEFINED,
    TooDeep,
    digest,
    js_number,
    js_trim,
    sha256_hex,
    stable_bytes,
    stable_stringify,
)

__all__ = [
    "Outcome",
    "TERMINAL_EXEC_FAILURE",
    "TOOL_LOOP_VETO",
    "ThrownError",
    "WRITE_MUTATION",
    "args_hash",
    "canonicalize_untrusted_envelopes",
    "failure_shape",
    "gemini_call_key",
    "hash_outcome",
    "is_known_poll",
    "is_send_call",
    "near_args_hash",
    "near_command",
    "strip_volatile_send_ids",
    "text_hash",
    "unknown_tool_name",
    "write_target_hash",
]

# Profile latest's outcome kinds (openclaw-latest.md §3), interned: histories compare them
# by identity first.
TERMINAL_EXEC_FAILURE = cast("OutcomeKind", sys.intern("terminal-exec-failure"))
WRITE_MUTATION = cast("OutcomeKind", sys.intern("write-mutation"))
TOOL_LOOP_VETO = sys.intern("tool-loop-veto")
"""A call the detector vetoed (recorded by the engine, never by a runner's outcome)."""


@dataclass(frozen=True, slots=True)
class ThrownError:
    """A thrown JavaScript ``Error`` object (as opposed to a thrown string or value)."""

    message: str = ""
    name: str = "Error"


class Outcome(msgspec.Struct, frozen=True, gc=False):
    """What ``recordToolCallOutcome`` derives from a tool's result or error, for both
    profiles at once, so that a runner need not know which profile judges it.

    ``result_hash`` is None when the outcome produces no hash: the tool returned nothing,
    or the result is the loop detector's own veto (``loop_veto``).  It is
    configurable-final's hash; the other fields are profile latest's
    (openclaw-latest.md §4): ``normalized_result_hash`` is latest's hash when it differs
    (untrusted-content ids canonicalised, a write that changed nothing), ``outcome_kind``
    tags terminal exec failures and write mutations, ``failure_identity_hash`` is a
    terminal failure's drift-free identity and ``no_progress`` flags errors and no-op writes.
    (A Struct, not a frozen dataclass: one is made per call, and a frozen dataclass sets
    each field through ``object.__setattr__``.)
    """

    result_hash: str | None
    unknown_tool_name: str | None = None
    loop_veto: bool = False
    is_error: bool = False
    normalized_result_hash: str | None = None
    outcome_kind: OutcomeKind | None = None
    failure_identity_hash: str | None = None
    no_progress: bool = False

    @property
    def plain(self) -> bool:
        """Only ``result_hash``, ``is_error`` and ``no_progress`` may differ from their defaults."""
        return (
            self.unknown_tool_name is None
            and not self.loop_veto
            and self.normalized_result_hash is None
            and self.outcome_kind is None
            and self.failure_identity_hash is None
        )

    @property
    def latest_result_hash(self) -> str | None:
        """The result hash under profile latest."""
        return self.normalized_result_hash or self.result_hash


def args_hash(tool_name: str, args: Any) -> str:
    """The call signature ``<tool>:<sha256 of canonical args>``; args are hashed as received."""
    return f"{tool_name}:{digest(args)}"


# A switch: a short flag or a cluster of them (``-l``, ``-la``), or a long option without a value
# (``--verbose``).  ``-5``, ``-n5`` and ``--format=json`` carry a value and are kept.
_SWITCH = re.compile(r"-[A-Za-z]+|--[A-Za-z][A-Za-z-]*")
# A string ``near_command`` returns as it is: one word that shlex.join would not quote, not a
# switch, without a trailing /.
_PLAIN = re.compile(r"(?![-])[\w@%+=:,./-]*(?<!/)", re.ASCII)
_NEEDS_LEXER = re.compile(r"['\"\\#();<>|&]")
_BLANKS = re.compile(r"[ \t]+")


def near_command(text: str) -> str:
    """A one-line command string as ``near_args_hash`` reads it: tokenised as a POSIX shell
    does (``shlex``, quotes honoured, so whitespace inside quotes counts; ``&&``, ``|``, ``;``
    split off however they are spaced), switches dropped (``-l``, ``-la``, ``--verbose``; a
    token after ``--`` is an operand), a trailing ``/`` of an operand dropped, rejoined with
    single spaces (``shlex.join``).  A string with a newline (a script, a heredoc, a file's
    content, where whitespace can matter) or quotes that do not close is returned unchanged."""
    if _PLAIN.fullmatch(text):  # one word, nothing to read (ids, names, numbers): most strings
        return text
    if "\n" in text or "\r" in text:
        return text
    if _NEEDS_LEXER.search(text) is None:
        # No quote, escape, comment or operator: shlex would split at blanks only (what it
        # returns then, but several times faster).
        tokens = [token for token in _BLANKS.split(text) if token]
    else:
        lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        try:
            tokens = list(lexer)
        except ValueError:  # quotes that do not close: not a command we can read
            return text
    kept: list[str] = []
    operands_only = False
    for token in tokens:
        if not operands_only:
            if token == "--":
                operands_only = True
                continue
            if _SWITCH.fullmatch(token):
                continue
        if len(token) > 1 and token.endswith("/"):
            token = token.rstrip("/") or "/"
        kept.append(token)
    return shlex.join(kept)


def _near(value: Any, ancestors: list[int], changed: list[bool]) -> Any:
    """``value`` with its strings read as commands (``changed[0]`` set when one reads
    otherwise); cycles and depth as ``stable_stringify`` meets them (a cycle is the string
    ``[Circular]``; ``TooDeep`` past ``JSON_DEPTH_LIMIT``)."""
    if isinstance(value, str):
        read = near_command(value)
        if read != value:
            changed[0] = True
        return read
    if not isinstance(value, (dict, list, tuple)):
        return value
    if id(value) in ancestors:
        return "[Circular]"
    if len(ancestors) >= JSON_DEPTH_LIMIT:
        raise TooDeep
    ancestors.append(id(value))
    if isinstance(value, dict):
        out: Any = {key: _near(item, ancestors, changed) for key, item in value.items()}
    else:
        out = [_near(item, ancestors, changed) for item in value]
    ancestors.pop()
    return out


def _reads_otherwise(value: Any, ancestors: list[int]) -> bool:
    """Whether ``_near`` would change any string of ``value``: the same walk, building nothing,
    so that the common call (ids, paths, names: nothing to read) costs one pass and no copy."""
    if type(value) is str:
        return _PLAIN.fullmatch(value) is None and near_command(value) != value
    if isinstance(value, str):
        return near_command(value) != value
    if not isinstance(value, (dict, list, tuple)):
        return False
    if id(value) in ancestors:
        return False
    if len(ancestors) >= JSON_DEPTH_LIMIT:
        raise TooDeep
    ancestors.append(id(value))
    items = value.values() if isinstance(value, dict) else value
    found = any(_reads_otherwise(item, ancestors) for item in items)
    ancestors.pop()
    return found


def near_args_hash(args: Any, plain: str | None = None) -> str:
    """SHA-256 (64 hex) of the call's arguments with every one-line string read as a command
    (``near_command``): calls that differ only in whitespace, in switches (their order, a
    cluster split or joined, one added or left out) or in a trailing ``/`` hash alike.  Keys,
    numbers and multi-line strings count as they are.  Read by ``loopwatch.detectors.nearIdentical``
    in place of ``args_hash``; ``TooDeep`` as ``args_hash``.  ``plain``: the digest of ``args``
    when the caller has it (``args_hash``'s hex), used when the reading changes nothing."""
    if not _reads_otherwise(args, []):
        return digest(args) if plain is None else plain
    changed = [False]
    return digest(_near(args, [], changed))


def js_json_stringify(value: Any, _depth: int = 0) -> str:
    """JavaScript's ``JSON.stringify`` of a JSON value: keys in their order (not sorted, unlike
    ``stable_stringify``), JavaScript's number forms, non-finite numbers as null.  ``TooDeep``
    when it nests deeper than ``JSON_DEPTH_LIMIT``."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (int, float)):
        return js_number(value) if math.isfinite(value) else "null"
    if isinstance(value, (dict, list, tuple)):
        if _depth >= JSON_DEPTH_LIMIT:
            raise TooDeep
        _depth += 1
    if isinstance(value, dict):
        # A JavaScript object lists its integer-like keys first, in ascending order, then the
        # others in insertion order.
        keys = [str(k) for k in value]
        indices = sorted((k for k in keys if _is_array_index(k)), key=int)
        ordered = indices + [k for k in keys if not _is_array_index(k)] if indices else keys
        items = {str(k): v for k, v in value.items()}
        return (
            "{"
            + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{js_json_stringify(items[k], _depth)}" for k in ordered)
            + "}"
        )
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(js_json_stringify(v, _depth) for v in value) + "]"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def _is_array_index(key: str) -> bool:
    """``key`` is a canonical array index (0 to 2^32 - 2, no sign or leading zero)."""
    return key.isdigit() and key.isascii() and (key == "0" or key[0] != "0") and int(key) < 2**32 - 1


def gemini_call_key(tool_name: str, args: Any) -> str:
    """Gemini CLI's key of a tool call (``LoopDetectionService.getToolCallKey``): SHA-256 of
    ``<name>:<JSON.stringify(args)>``.  Unlike ``args_hash``, the arguments' key order counts."""
    return hashlib.sha256(f"{tool_name}:{js_json_stringify(args)}".encode("utf-8", "surrogatepass")).hexdigest()


def text_hash(text: str) -> str:
    """SHA-256 (hex) of a text's UTF-8 bytes: a thought or a message, as the peer profiles read
    them (``thought_hash``, ``text_hash``).  Raw text never leaves the runner."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def is_known_poll(tool_name: str, args: Any) -> bool:
    """``command_status`` (any args) and ``process`` with action poll/log (spec §2.8)."""
    if tool_name == "command_status":
        return True
    return tool_name == "process" and isinstance(args, dict) and args.get("action") in ("poll", "log")


_SEND_LIKE_MESSAGE_ACTIONS = frozenset(
    {"send", "broadcast", "reply", "thread-reply", "sendWithEffect", "sendAttachment", "upload-file", "sticker", "poll"}
)
_VOLATILE_SEND_KEYS = frozenset(
    {
        "messageId",
        "message_id",
        "messageIds",
        "platformMessageId",
        "platformMessageIds",
        "fileId",
        "file_id",
        "fileKey",
        "pollId",
        "poll_id",
        "receipt",
        "runId",
        "idempotencyKey",
        "ts",
        "timestamp",
        "sentAt",
        "deliveredAt",
        "createdAt",
        # Assigning `__proto__` on a JS object sets its prototype instead of adding a key.
        "__proto__",
    }
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


def strip_volatile_send_ids(value: Any, _depth: int = 0) -> Any:
    """Drop per-send volatile ids and timestamps, at any depth (spec §5.2); ``TooDeep`` deeper
    than ``JSON_DEPTH_LIMIT``."""
    if not isinstance(value, (list, dict)):
        return value
    if _depth >= JSON_DEPTH_LIMIT:
        raise TooDeep
    if isinstance(value, list):
        return [strip_volatile_send_ids(item, _depth + 1) for item in value]
    drop_id = _is_message_delivery_object(value)
    return {
        key: strip_volatile_send_ids(nested, _depth + 1)
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


# JavaScript's `\s` (schemas.keys.JS_WHITESPACE): inside a character class, and as one.
_JS_SPACE = re.escape(JS_WHITESPACE)
_WS = f"[{_JS_SPACE}]"
# The unknown-tool patterns: JS `\s` and ASCII-only case folding (JS /i without the u flag).
_UNKNOWN_TOOL_PATTERNS = (
    re.compile(r"unknown tool(?::|" + _WS + r")+[\"']?([a-z0-9_.-]+)[\"']?", re.IGNORECASE | re.ASCII),
    re.compile(
        r"tool" + _WS + r"+[\"']?([a-z0-9_.-]+)[\"']?" + _WS + r"+(?:not found|is not available)",
        re.IGNORECASE | re.ASCII,
    ),
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


def _exec_hashed(details: dict, text: str) -> Any:
    """The value the exec rule hashes (spec §5.1), or UNDEFINED when it does not apply."""
    status = details.get("status")
    if not isinstance(status, str) or not status:
        return UNDEFINED
    if status == "running":
        return {"status": status, "tail": _str_or_none(details.get("tail")) or ""}
    if status in ("completed", "failed"):
        exit_code = details.get("exitCode")
        aggregated = details.get("aggregated")
        output = js_trim(aggregated) if isinstance(aggregated, str) else ""
        return {
            "status": status,
            "exitCode": exit_code if isinstance(exit_code, (int, float)) and not isinstance(exit_code, bool) else None,
            "timedOut": details.get("timedOut") is True,
            "output": output or text,
        }
    if status in ("approval-pending", "approval-unavailable"):
        command = _str_or_none(details.get("command"))
        warning = _str_or_none(details.get("warningText"))
        return {
            "status": status,
            "reason": _str_or_none(details.get("reason")),
            "host": _str_or_none(details.get("host")),
            "command": command if command is not None else "",
            "warningText": warning if warning is not None else "",
        }
    return UNDEFINED


# -- profile latest (openclaw-latest.md §4) -----------------------------------------------------

_ENVELOPE_MARKER = "<<<EXTERNAL_UNTRUSTED_CONTENT id="
_ENVELOPE_MARKER_BYTES = _ENVELOPE_MARKER.encode()
# Upstream's regular expression, verbatim (JS and Python agree on every construct in it).
_ENVELOPE = re.compile(
    r'(<<<EXTERNAL_UNTRUSTED_CONTENT id=(\\*)")([a-f0-9]{16})'
    r'(\2">>>(?:(?!<<<(?:END_)?EXTERNAL_UNTRUSTED_CONTENT)[\s\S])*<<<END_EXTERNAL_UNTRUSTED_CONTENT id=\2")\3(\2">>>)'
)
_QUOTE_ESCAPES = re.compile(r'(?<!\\)\\*"')
_ZERO_ID = "0" * 16


def _canonical_envelope(match: re.Match[str]) -> str:
    k = len(match.group(2))
    inner = match.group(4)
    # Only a consistently escaped envelope (k = 2^n - 1 backslashes before every quote, at
    # any depth of JSON string encoding) is rewritten; anything else keeps its ids.
    if k & (k + 1):
        return match.group(0)
    step = k + 1
    for quote in _QUOTE_ESCAPES.finditer(inner):
        if len(quote.group(0)) % step:
            return match.group(0)
    return match.group(1) + _ZERO_ID + inner + _ZERO_ID + match.group(5)


def canonicalize_untrusted_envelopes(text: str) -> str:
    """Replace the random ids of well-formed ``EXTERNAL_UNTRUSTED_CONTENT`` envelopes by
    sixteen zeros (openclaw-latest.md §4.1), so wrapped results that differ only in their
    ids hash alike."""
    if _ENVELOPE_MARKER not in text:
        return text
    return _ENVELOPE.sub(_canonical_envelope, text)


def _digests(value: Any) -> tuple[str, str | None]:
    """(configurable-final's digest, latest's digest when it differs)."""
    data = stable_bytes(value)
    plain = hashlib.sha256(data).hexdigest()
    # Every string and key appears in the serialisation, and the marker needs no escaping:
    # without it, the normaliser changes nothing.
    if _ENVELOPE_MARKER_BYTES not in data:
        return plain, None
    normalized = stable_stringify(value, canonicalize_untrusted_envelopes)
    return plain, (None if normalized == data.decode("utf-8") else sha256_hex(normalized))


# The failure identity's masks, upstream's JS sources verbatim (§4.2), applied in this order.
_FAILURE_MASK_SOURCES = (
    (r"\d{4}-\d{2}-\d{2}[t ]\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?(?:z|[+-]\d{2}:\d{2})?", "giu"),  # ISO timestamps
    (r"\d{1,2}:\d{2}:\d{2}(?:\.\d{1,6})?", "gu"),  # clock times
    (r"\b(?:attempt|retry)\b[\s#:=]*\d+", "giu"),  # attempt/retry counters
    (r"\b\d+(?:\.\d+)?\s?(?:ns|us|ms|seconds?|minutes?|hours?|s)\b", "giu"),  # durations
    (r"\b(?:pid|ppid)\b[\s#:=]*\d+", "giu"),  # process ids
)

# With /iu a letter matches what Unicode *simple* case folding maps to it: `s` also matches
# U+017F and `k` the Kelvin sign, and `\b` counts both as word characters.  (Python's re.I
# is not the same: it would also match U+0130 for `i`.)
_FOLDS = {"s": "sS\u017f", "k": "kK\u212a"}
_JS_WORD_IU = "A-Za-z0-9_\u017f\u212a"


def _js_regex(source: str, flags: str) -> re.Pattern[str]:
    """Translate the small JS regex subset of the masks (escapes \\d \\s \\b \\., classes,
    groups, quantifiers, literal letters) to Python with JS semantics: `\\d` is ASCII,
    `\\s` is JS whitespace, letters fold as /iu folds them."""
    ignore_case = "i" in flags
    word = _JS_WORD_IU if ignore_case else "A-Za-z0-9_"
    boundary = f"(?:(?<=[{word}])(?![{word}])|(?<![{word}])(?=[{word}]))"

    def letter(ch: str) -> str:
        return _FOLDS.get(ch.lower(), ch.lower() + ch.upper()) if ignore_case and ch.isalpha() else ch

    out, in_class, i = [], False, 0
    while i < len(source):
        ch = source[i]
        if ch == "\\":
            nxt = source[i + 1]
            i += 2
            if nxt == "d":
                out.append("0-9" if in_class else "[0-9]")
            elif nxt == "s":
                out.append(_JS_SPACE if in_class else _WS)
            elif nxt == "b" and not in_class:
                out.append(boundary)
            else:
                out.append("\\" + nxt)
            continue
        if ch == "[":
            in_class = True
            out.append(ch)
        elif ch == "]":
            in_class = False
            out.append(ch)
        elif ch.isalpha():
            folded = letter(ch)
            out.append(folded if in_class or len(folded) == 1 else f"[{folded}]")
        else:
            out.append(ch)
        i += 1
    return re.compile("".join(out))


_FAILURE_MASKS = tuple(_js_regex(source, flags) for source, flags in _FAILURE_MASK_SOURCES)


def failure_shape(output: str) -> str:
    """A failing command's output with timestamps, clock times, attempt/retry counters,
    durations and pids masked as ``#`` (openclaw-latest.md §4.2), in upstream's order."""
    for mask in _FAILURE_MASKS:
        output = mask.sub("#", output)
    return output


def _terminal_failure_identity(details: dict, text: str) -> str | None:
    """The failure identity of a terminal exec failure, else None (§4.2)."""
    status = details.get("status")
    if status not in ("completed", "failed"):
        return None
    exit_code = details.get("exitCode")
    if isinstance(exit_code, bool) or not isinstance(exit_code, (int, float)) or exit_code == 0:
        return None
    if isinstance(exit_code, float) and (exit_code != exit_code or exit_code in (float("inf"), float("-inf"))):
        return None
    if details.get("timedOut") is True:
        return None
    aggregated = details.get("aggregated")
    output = (js_trim(aggregated) if isinstance(aggregated, str) else "") or text
    if not output or output == f"(Command exited with code {js_number(exit_code)})":
        return None
    identity = {"status": status, "exitCode": exit_code, "timedOut": False, "output": failure_shape(output)}
    return digest(identity, canonicalize_untrusted_envelopes)


def write_target_hash(tool_name: str, args: Any) -> str | None:
    """Profile latest's write target (§4.3): SHA-256 of ``{"path": <path>}`` for tool
    ``write`` with a non-empty string ``path``, used verbatim; else None."""
    if tool_name != "write" or not isinstance(args, dict):
        return None
    path = args.get("path")
    if not isinstance(path, str) or not path:
        return None
    return sha256_hex(stable_stringify({"path": path}))


_WRITE_UNCHANGED = digest({"status": "unchanged"})


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
    """Upstream's ``hashToolOutcome``: the rules of spec §2.3 in order, first match wins,
    with profile latest's additions (openclaw-latest.md §4) computed alongside.

    Pass ``error=`` for a thrown error (a ``ThrownError`` for an Error object, or any
    JSON value that was thrown), otherwise ``result=``; ``returned=False`` means the tool
    returned ``undefined``.
    """
    if error is not UNDEFINED:
        plain, normalized = _digests(_error_text(error))
        return Outcome(
            f"error:{plain}",
            unknown_tool_name(error),
            is_error=True,
            normalized_result_hash=None if normalized is None else f"error:{normalized}",
            no_progress=True,
        )
    if not isinstance(result, dict):
        if not returned:
            return Outcome(None)
        return _hashed(result)
    details = result.get("details")
    if not isinstance(details, dict):
        details = {}
    text = _text_content(result)
    if details.get("status") == "blocked" and details.get("deniedReason") == "tool-loop":
        return Outcome(None, loop_veto=True)
    if tool_name == "exec":
        hashed = _exec_hashed(details, text)
        if hashed is not UNDEFINED:
            plain, normalized = _digests(hashed)
            identity = _terminal_failure_identity(details, text)
            return Outcome(
                plain,
                normalized_result_hash=normalized,
                outcome_kind=None if identity is None else TERMINAL_EXEC_FAILURE,
                failure_identity_hash=identity,
            )
    if tool_name == "write":
        changed = details.get("changed")
        if changed is False:
            # Latest: every no-op write hashes alike, whatever its text says.
            return Outcome(
                digest({"details": details, "text": text}), normalized_result_hash=_WRITE_UNCHANGED, no_progress=True
            )
        if changed is True:
            plain, normalized = _digests({"details": details, "text": text})
            return Outcome(plain, normalized_result_hash=normalized, outcome_kind=WRITE_MUTATION)
    if tool_name == "process" and isinstance(args, dict):
        action = args.get("action")
        status = details["status"] if "status" in details else UNDEFINED
        if action == "poll":
            return _hashed(
                {
                    "action": action,
                    "status": status,
                    "exitCode": _or_null(details, "exitCode"),
                    "exitSignal": _or_null(details, "exitSignal"),
                    "aggregated": _or_null(details, "aggregated"),
                    "text": text,
                }
            )
        if action == "log":
            return _hashed(
                {
                    "action": action,
                    "status": status,
                    "totalLines": _or_null(details, "totalLines"),
                    "totalChars": _or_null(details, "totalChars"),
                    "truncated": _or_null(details, "truncated"),
                    "exitCode": _or_null(details, "exitCode"),
                    "exitSignal": _or_null(details, "exitSignal"),
                    "text": text,
                }
            )
    if is_send_call(tool_name, args, provider_send_tools):
        return _hashed(strip_volatile_send_ids(details))
    return _hashed({"details": details, "text": text})


def _hashed(value: Any) -> Outcome:
    plain, normalized = _digests(value)
    return Outcome(plain) if normalized is None else Outcome(plain, normalized_result_hash=normalized)
