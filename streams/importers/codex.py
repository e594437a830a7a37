"""Codex CLI session rollouts (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``): one JSON
object a line, ``{timestamp, type, payload}`` (``session_meta``, ``response_item``,
``compacted``, ``turn_context``, ``event_msg``); the older rollouts' bare response items
(a first line ``{id, timestamp, instructions}``) are read too.

A ``function_call`` response item is a call (``name``, ``arguments``: JSON-decoded), as are
``custom_tool_call`` (``name``, ``input``) and ``local_shell_call`` (tool ``local_shell``,
its ``action``); the ``function_call_output`` / ``custom_tool_call_output`` with its
``call_id`` is its result.  An output that is JSON with ``metadata.exit_code`` non-zero, or
``success: false``, is an error.  A ``compacted`` line is a compaction.  A file is one run
(``session_meta``'s ``id``), ended ``ended``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .model import Call, Compaction, ImportFailed, Run, iso_ms, run_id_of_file, text_of
from .reader import decode_embedded

NAME = "codex"
KIND = "lines"
_LINE_TYPES = {"session_meta", "response_item", "compacted", "turn_context", "event_msg"}
_CALLS = {"function_call", "custom_tool_call", "local_shell_call"}
_OUTPUTS = {"function_call_output", "custom_tool_call_output"}


def detect(first: Any) -> bool:
    if not isinstance(first, dict):
        return False
    if isinstance(first.get("type"), str) and first["type"] in _LINE_TYPES and isinstance(first.get("payload"), dict):
        return True
    return "instructions" in first and "id" in first and "timestamp" in first and "type" not in first


def _decoded(value: Any, where: str) -> Any:
    if isinstance(value, str) and value[:1] in "{[":
        return decode_embedded(value, where)
    return value


def _error(output: Any) -> bool:
    if isinstance(output, dict):
        if output.get("success") is False:
            return True
        metadata = output.get("metadata")
        code = metadata.get("exit_code") if isinstance(metadata, dict) else None
        return isinstance(code, int) and code != 0
    return False


def runs(lines: Iterator[tuple[int, Any]], name: str) -> Iterator[Run]:
    run = Run(run_id_of_file(name))
    pending: dict[str, Call] = {}
    for number, line in lines:
        if not isinstance(line, dict):
            raise ImportFailed(f"{name}: line {number} is not a {NAME} rollout line (not an object)")
        ts = iso_ms(line.get("timestamp"))
        if isinstance(line.get("payload"), dict) and "type" in line:
            kind, item = line["type"], line["payload"]
        elif "instructions" in line and "id" in line:
            kind, item = "session_meta", line
        else:
            kind, item = "response_item", line
        if kind == "session_meta":
            if item.get("id"):
                run.run_id = str(item["id"])
            continue
        if kind == "compacted":
            run.items.append(Compaction(ts))
            continue
        if kind != "response_item":
            continue
        what = item.get("type") if isinstance(item.get("type"), str) else None
        if what in _CALLS:
            if what == "local_shell_call":
                tool, args = "local_shell", item.get("action")
            else:
                tool = str(item.get("name") or "unknown")
                args = _decoded(
                    item.get("arguments") if what == "function_call" else item.get("input"),
                    f"{name}: line {number}: the call's arguments",
                )
            call_id = item.get("call_id") or item.get("id")
            call = Call(tool, args, None, False, ts, call_id)
            run.items.append(call)
            if isinstance(call_id, str):
                pending[call_id] = call
        elif what in _OUTPUTS:
            call = pending.pop(item.get("call_id"), None)
            if call is not None:
                output = _decoded(item.get("output"), f"{name}: line {number}: the call's output")
                call.error = _error(output)
                call.result = (
                    text_of(output.get("content")) if isinstance(output, dict) and "content" in output else output
                )
    yield run
