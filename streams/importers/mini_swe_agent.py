"""mini-swe-agent trajectories (``<instance>.traj.json``, ``trajectory_format: mini-swe-agent-1``).

The agent has one tool, a shell: an assistant message whose content holds exactly one
```` ```bash ```` block is a call (the block is its command: mini-swe-agent's own
``action_regex``), and the next message (the user's) is its result, ``<returncode>N</returncode>``
then the output.  A non-zero return code is an error.  A message without exactly one block is
mini-swe-agent's format error, not a call.  ``info.exit_status`` ends the run (``Submitted``:
``submitted``; ``LimitsExceeded``: ``max-iterations``); labels (resolved) come from the
benchmark's results (``loopwatch import --labels results_summary.json``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from .model import MAX_ITERATIONS, Call, ImportFailed, Run, text_of

NAME = "mini-swe-agent"
KIND = "document"
TOOL = "bash"
_ACTION = re.compile(r"```bash\s*\n(.*?)\n```", re.S)
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
    run_id = str(doc.get("instance_id") or _stem(name))
    status = info.get("exit_status")
    run = Run(run_id, end=_EXIT.get(status, str(status).lower() if status else "ended"))
    messages = doc["messages"]
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


def _stem(name: str) -> str:
    base = name.rsplit("/", 1)[-1]
    for suffix in (".gz", ".json", ".traj"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return base
