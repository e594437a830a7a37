"""mini-swe-agent trajectories (``<instance>.traj.json``, ``trajectory_format: mini-swe-agent-1``
and ``-1.1``).

The agent has one tool, a shell, and two ways to call it:

* Text (v1, and v2's text-based models): an assistant message whose content holds exactly one
  ```` ```bash ```` block (v2: ```` ```mswea_bash_command ````) is a call (the block is its
  command: mini-swe-agent's own ``action_regex``), and the next message (the user's) is its
  result, ``<returncode>N</returncode>`` then the output.  A message without exactly one
  block is mini-swe-agent's format error, not a call.
* Tool calling (v2's default models): every entry of an assistant message's ``tool_calls``
  is a call (``function.name``, ``function.arguments`` JSON-decoded: ``{"command": ...}``),
  its result the ``role: tool`` message with its ``tool_call_id``; the message's
  ``extra.returncode`` is the return code when it has one, else its content's
  ``<returncode>`` (a call v2 did not execute has return code -1: an error).  A call with no
  result message is imported with no result.  A trajectory with any ``tool_calls`` is read
  this way only.

A non-zero return code is an error.  ``info.exit_status`` ends the run (``Submitted``:
``submitted``; ``LimitsExceeded``: ``max-iterations``); labels (resolved) come from the
benchmark's results (``loopwatch import --labels results_summary.json``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from .chat import chat_tool_calls
from .model import MAX_ITERATIONS, Call, ImportFailed, Run, run_id_of_file, text_of

NAME = "mini-swe-agent"
KIND = "document"
TOOL = "bash"
_ACTION = re.compile(r"```(?:bash|mswea_bash_command)\s*\n(.*?)\n```", re.S)
_RETURNCODE = re.compile(r"\s*<returncode>(-?\d+)</returncode>")
_EXIT = {"Submitted": "submitted", "LimitsExceeded": MAX_ITERATIONS}


def detect(doc: Any) -> bool:
    return (
        isinstance(doc, dict)
        and isinstance(doc.get("messages"), list)
        and (
            str(doc.get("trajectory_format", "")).startswith("mini-swe-agent")
            or ("info" in doc and "trajectory" not in doc and not _has_tool_calls(doc["messages"]))
        )
    )


def _has_tool_calls(messages: list) -> bool:
    return any(isinstance(m, dict) and m.get("tool_calls") for m in messages[:50])


def runs(doc: Any, name: str) -> Iterator[Run]:
    if not detect(doc):
        raise ImportFailed(f"{name} is not a {NAME} trajectory: expected an object with messages[]")
    info = doc.get("info") if isinstance(doc.get("info"), dict) else {}
    run_id = str(doc.get("instance_id") or run_id_of_file(name))
    status = info.get("exit_status")
    run = Run(run_id, end=_EXIT.get(status, str(status).lower() if status else "ended"))
    messages = doc["messages"]
    if any(isinstance(m, dict) and m.get("tool_calls") for m in messages):
        _tool_calls(messages, run, name)
        yield run
        return
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        content = text_of(message.get("content"))
        if not isinstance(content, str):
            continue
        actions = _ACTION.findall(content)
        if len(actions) != 1:
            continue
        result = None
        error = False
        following = messages[i + 1] if i + 1 < len(messages) else None
        if isinstance(following, dict) and following.get("role") == "user":
            result = text_of(following.get("content"))
            if isinstance(result, str):
                code = _RETURNCODE.match(result)
                error = code is not None and code.group(1) != "0"
        run.items.append(Call(TOOL, {"command": actions[0].strip()}, result, error))
    yield run


def _tool_calls(messages: list, run: Run, name: str) -> None:
    """v2's tool-calling trajectory into ``run`` (module docstring)."""
    for call, tool, args, reply, result in chat_tool_calls(messages, name):
        error = False
        if reply is not None:
            extra = reply.get("extra")
            code = extra.get("returncode") if isinstance(extra, dict) else None
            if isinstance(code, int) and not isinstance(code, bool):
                error = code != 0
            elif isinstance(result, str):
                match = _RETURNCODE.match(result)
                error = match is not None and match.group(1) != "0"
        run.items.append(Call(tool or TOOL, args, result, error, 0, call.get("id")))
