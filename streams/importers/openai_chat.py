"""OpenAI-style chat messages with ``tool_calls`` (tau-bench's trajectories, chat logs).

A document is a list of runs ``{task_id, trial, reward, traj: [messages]}`` (tau-bench), one
such run, an object with ``messages[]``, or a bare list of messages.  Every entry of an
assistant message's ``tool_calls`` is a call: ``function.name``, ``function.arguments``
(JSON-decoded; kept as the string when it is not JSON).  Its result is the ``role: tool``
message with its ``tool_call_id``; tau-bench's tools return ``Error: ...`` for a failed call,
an error here.  ``reward`` labels the run (``reward:1``, ``reward:0``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .chat import chat_tool_calls
from .model import ENDED, Call, ImportFailed, Run, label_reason, run_id_of_file

NAME = "openai-chat"
KIND = "document"


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and "role" in m for m in value[:5])


def _is_run(value: Any) -> bool:
    return isinstance(value, dict) and (_is_messages(value.get("traj")) or _is_messages(value.get("messages")))


def detect(doc: Any) -> bool:
    if isinstance(doc, list) and doc:
        return _is_run(doc[0]) or _is_messages(doc)
    return _is_run(doc)


def runs(doc: Any, name: str) -> Iterator[Run]:
    if not detect(doc):
        raise ImportFailed(f"{name} is not an {NAME} file: expected runs with traj[]/messages[], or messages")
    stem = run_id_of_file(name)
    if isinstance(doc, dict):
        yield _run(doc, stem, name)
    elif _is_messages(doc) and not _is_run(doc[0]):
        yield _run({"messages": doc}, stem, name)
    else:
        for i, entry in enumerate(doc):
            if _is_run(entry):
                yield _run(entry, f"{stem}#{i}", name)


def _run(entry: dict, fallback: str, name: str) -> Run:
    messages = entry.get("traj") if _is_messages(entry.get("traj")) else entry.get("messages")
    if "task_id" in entry:
        run_id = f"task-{entry['task_id']}" + (f"-trial-{entry['trial']}" if "trial" in entry else "")
    else:
        run_id = str(entry.get("id") or fallback)
    reward = entry.get("reward")
    end = label_reason(reward=reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else ENDED
    run = Run(run_id, end=end)
    for call, tool, args, _reply, result in chat_tool_calls(messages, f"{name}: run {run_id}"):
        error = isinstance(result, str) and result.startswith("Error")
        run.items.append(Call(tool or "unknown", args, result, error, 0, call.get("id")))
    return run
