"""OpenHands event streams: a run's ``history[]`` (an evaluation's ``output.jsonl``, one run a
line) or a bare JSON list of events (a saved trajectory).

An action with ``tool_call_metadata`` is a call: its tool the metadata's ``function_name``,
its arguments the action's ``args`` without ``thought`` (the model's reasoning, not the call).
Its result is the observation whose ``cause`` is the action's ``id`` (the observation's
``content``); an ``error`` observation, or a command's non-zero ``exit_code``, is an error.  A
``condensation`` action (the condenser dropped events) is a compaction.  The run ends
``max-iterations`` when its ``error`` says the agent reached its maximum iteration,
``error`` on any other error, ``finished`` after a ``finish`` action; a SWE-bench report in
``test_result`` (``resolved``) labels it ``resolved`` / ``unresolved``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .model import ENDED, MAX_ITERATIONS, Call, Compaction, ImportFailed, Run, iso_ms, label_reason, run_id_of_file

NAME = "openhands"
KIND = "either"
RUN_PER_LINE = True


def _is_event(value: Any) -> bool:
    return isinstance(value, dict) and "id" in value and ("action" in value or "observation" in value)


def detect(doc: Any) -> bool:
    if isinstance(doc, dict):
        history = doc.get("history")
        return isinstance(history, list) and (not history or _is_event(history[0]))
    return isinstance(doc, list) and bool(doc) and _is_event(doc[0])


def runs(doc: Any, name: str) -> Iterator[Run]:
    if not detect(doc):
        raise ImportFailed(f"{name} is not an {NAME} event stream: expected history[] or a list of events")
    if isinstance(doc, list):
        yield _run(doc, run_id_of_file(name), None)
    else:
        yield _run(doc["history"], str(doc.get("instance_id") or run_id_of_file(name)), doc)


def _run(history: list, run_id: str, record: dict | None) -> Run:
    results: dict[Any, dict] = {}
    for event in history:
        if isinstance(event, dict) and "observation" in event and event.get("cause") is not None:
            results[str(event["cause"])] = event
    run = Run(run_id)
    finished = False
    for event in history:
        if not isinstance(event, dict):
            continue
        action = event.get("action")
        if action == "condensation":
            run.items.append(Compaction(iso_ms(event.get("timestamp"))))
            continue
        meta = event.get("tool_call_metadata")
        if action is None or not isinstance(meta, dict):
            continue
        finished = action == "finish"
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        args = {k: v for k, v in args.items() if k != "thought"}
        observation = results.get(str(event.get("id")))
        result = error = None
        if observation is not None:
            result = observation.get("content")
            extras = observation.get("extras") if isinstance(observation.get("extras"), dict) else {}
            metadata = extras.get("metadata") if isinstance(extras.get("metadata"), dict) else {}
            code = metadata.get("exit_code")
            error = observation.get("observation") == "error" or (isinstance(code, int) and code not in (0, -1))
        run.items.append(
            Call(
                str(meta.get("function_name") or action),
                args,
                result,
                bool(error),
                iso_ms(event.get("timestamp")),
                meta.get("tool_call_id"),
            )
        )
    run.end = _end(record, finished)
    return run


def _end(record: dict | None, finished: bool) -> str:
    if record is not None:
        test = record.get("test_result")
        report = test.get("report") if isinstance(test, dict) else None
        if isinstance(report, dict) and isinstance(report.get("resolved"), bool):
            return label_reason(resolved=report["resolved"])
        error = record.get("error")
        if error:
            return MAX_ITERATIONS if "maximum iteration" in str(error) else "error"
    return "finished" if finished else ENDED
