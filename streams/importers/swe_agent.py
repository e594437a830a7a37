"""SWE-agent trajectories (``<instance>.traj``): ``trajectory[]`` of steps, each with its
``action`` (the command the model issued) and ``observation`` (what the environment returned).

The tool is the action's first word when it is one of SWE-agent's own commands (``edit``,
``open``, ``str_replace_editor``, ...), else ``bash`` (a shell command); the arguments are the
whole action.  SWE-agent marks no errors in a step; an edit its linter refused (``Your proposed
edit has introduced new syntax error(s)``) and a command SWE-agent rejected are errors here.
``info.exit_status`` ends the run: ``submitted`` (also ``submitted (exit_cost)`` and the
like), ``exit_cost`` / ``exit_step_limit`` / ``exit_context``: ``max-iterations``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .model import MAX_ITERATIONS, Call, ImportFailed, Run, run_id_of_file

NAME = "swe-agent"
KIND = "document"
COMMANDS = frozenset(
    {
        "open",
        "goto",
        "scroll_up",
        "scroll_down",
        "create",
        "edit",
        "insert",
        "append",
        "search_dir",
        "search_file",
        "find_file",
        "submit",
        "str_replace_editor",
        "str_replace_based_edit_tool",
        "filemap",
        "view_image",
        "exit_forfeit",
        "skip",
        "review_on_submit",
        "review_on_submit_m",
        "diff_state",
    }
)
_ERRORS = ("Your proposed edit has introduced new syntax error", "Your edit was not applied", "Usage: ")
_LIMITS = ("exit_cost", "exit_step_limit", "exit_context", "exit_total_execution_time")


def detect(doc: Any) -> bool:
    return (
        isinstance(doc, dict)
        and isinstance(doc.get("trajectory"), list)
        and all(isinstance(s, dict) and "action" in s for s in doc["trajectory"][:5])
    )


def runs(doc: Any, name: str) -> Iterator[Run]:
    if not detect(doc):
        raise ImportFailed(f"{name} is not a {NAME} trajectory: expected an object with trajectory[] of steps")
    info = doc.get("info") if isinstance(doc.get("info"), dict) else {}
    status = str(info.get("exit_status") or "")
    end = "submitted" if status.startswith("submitted") else MAX_ITERATIONS if status in _LIMITS else status or "ended"
    run = Run(str(doc.get("instance_id") or info.get("instance_id") or run_id_of_file(name)), end=end)
    for step in doc["trajectory"]:
        action = step.get("action")
        if not isinstance(action, str) or not action.strip():
            continue
        action = action.strip()
        first = action.split(None, 1)[0]
        tool = first if first in COMMANDS else "bash"
        observation = step.get("observation")
        error = isinstance(observation, str) and observation.lstrip().startswith(_ERRORS)
        run.items.append(Call(tool, {"command": action}, observation, error))
    yield run
