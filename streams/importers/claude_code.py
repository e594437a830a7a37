"""Claude Code session transcripts (``~/.claude/projects/<project>/<session>.jsonl``): one JSON
object a line (``type``: ``user``, ``assistant``, ``system``, ``summary``, ...).

A ``tool_use`` block of an assistant message is a call (``name``, ``input``); its result is
the ``tool_result`` block with its ``tool_use_id`` in a later user message (``content``: text
or blocks; ``is_error: true`` an error).  A ``system`` line with subtype ``compact_boundary``
is a compaction.  A file is one run (its first ``sessionId``); the file's end is its end
(``ended``: a session carries no outcome label).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .model import Call, Compaction, ImportFailed, Run, iso_ms, run_id_of_file, text_of

NAME = "claude-code"
KIND = "lines"
_TYPES = {"user", "assistant", "system", "summary", "queue-operation", "file-history-snapshot", "last-prompt"}


def detect(first: Any) -> bool:
    return (
        isinstance(first, dict)
        and isinstance(first.get("type"), str)
        and first["type"] in _TYPES
        and any(k in first for k in ("sessionId", "uuid", "leafUuid", "messageId"))
    )


def runs(lines: Iterator[tuple[int, Any]], name: str) -> Iterator[Run]:
    run = Run(run_id_of_file(name))
    named = False
    pending: dict[str, Call] = {}
    for number, line in lines:
        if not isinstance(line, dict) or "type" not in line:
            raise ImportFailed(f"{name}: line {number} is not a {NAME} transcript line (no type)")
        if not named and isinstance(line.get("sessionId"), str):
            run.run_id, named = line["sessionId"], True
        kind = line["type"]
        if kind == "system" and line.get("subtype") == "compact_boundary":
            run.items.append(Compaction(iso_ms(line.get("timestamp"))))
            continue
        message = line.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use" and kind == "assistant":
                call = Call(
                    str(block.get("name") or "unknown"),
                    block.get("input"),
                    None,
                    False,
                    iso_ms(line.get("timestamp")),
                    block.get("id"),
                )
                run.items.append(call)
                if isinstance(block.get("id"), str):
                    pending[block["id"]] = call
            elif block.get("type") == "tool_result":
                call = pending.pop(block.get("tool_use_id"), None)
                if call is not None:
                    call.result = text_of(block.get("content"))
                    call.error = block.get("is_error") is True
    yield run
