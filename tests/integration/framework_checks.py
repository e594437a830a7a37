"""What the framework adapters' integration tests share: the worker's config and its fixture,
the hand-worked loop (warned at the 11th identical call, blocked from the 21st), finding a run's
published events, and the checks of what was published and what the model saw
(tests/integration/test_framework_*.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness import collect, reference_verdicts
from schemas.events import RunEnded, ToolCallCompleted, ToolCallRequested, decode_event
from schemas.verdicts import Decision, RunAborted
from streams.edge.hashing import args_hash

CONFIG = {
    "tools": {"loopDetection": {"enabled": True}},
    "loopwatch": {"surfaceWarnings": True},
    "agents": {"list": [{"id": "aborter", "loopwatch": {"abortAfterCriticalBlocks": 1}}]},
}
LOOP_CALLS = 23  # two blocked calls after the first block
SAME_RESULT = "same page, nothing new"
WAIT_S = 60.0


@pytest.fixture(scope="module")
def worker(request, lw_module):
    """A worker on the test module's ``CONFIG``: the one above unless the module has its own
    (a test module imports this fixture by name)."""
    lw_module.configured_worker(getattr(request.module, "CONFIG", CONFIG))
    return lw_module


async def published(lw, run_id: str) -> list:
    """The events of ``run_id`` on ``tool-calls``, in order, once its ``run.ended`` is there."""

    def of_run(records):
        return [e for e in (decode_event(r.value) for r in records) if e.run_id == run_id]

    records = await collect(
        lw.broker,
        lw.names.tool_calls,
        timeout=WAIT_S,
        until=lambda rs: any(isinstance(e, RunEnded) for e in of_run(rs)),
    )
    events = of_run(records)
    assert events and isinstance(events[-1], RunEnded), f"run {run_id} did not end on tool-calls"
    return events


async def run_where(lw, match: Callable[[Any], bool]) -> list:
    """The events of the run that published an event ``match`` takes, once the run ended
    (for a framework that names no run, or a run found by what it did)."""

    def matching(records):
        return [e for e in (decode_event(r.value) for r in records) if match(e)]

    records = await collect(lw.broker, lw.names.tool_calls, timeout=WAIT_S, until=matching)
    return await published(lw, matching(records)[0].run_id)


async def run_of_session(lw, session_key: str) -> list:
    """The events of the run that ended with ``session_key`` (a key fresh to the test)."""
    return await run_where(lw, lambda e: isinstance(e, RunEnded) and e.session_key == session_key)


async def run_of_call(lw, tool: str, args: dict, kind: type = ToolCallRequested) -> list:
    """The events of the run that published a ``kind`` event of ``tool`` with ``args``
    (arguments fresh to the test)."""
    mine = args_hash(tool, args)
    return await run_where(lw, lambda e: isinstance(e, kind) and e.args_hash == mine)


def engine_decisions(events, config: Any = CONFIG) -> dict[str, Decision]:
    """The engine's decision for each requested call, by tool call id."""
    return {v.tool_call_id: v for v in reference_verdicts(events, config) if isinstance(v, Decision)}


def engine_abort(events, config: Any = CONFIG) -> RunAborted:
    """The engine's abort of the run whose events these are (it must have one)."""
    aborts = [v for v in reference_verdicts(events, config) if isinstance(v, RunAborted)]
    assert aborts, "the engine alone does not abort this run"
    return aborts[0]


def assert_model_saw_what_the_engine_decided(
    seen: dict[str, str], results: dict[str, str], events, config: Any = CONFIG
) -> list[Decision]:
    """``seen``: what the model received per tool call id; ``results``: what the tool would
    have returned.  Returns the engine's decisions in call order."""
    decisions = engine_decisions(events, config)
    requested = [e.tool_call_id for e in events if isinstance(e, ToolCallRequested)]
    assert list(seen) == requested, "the model saw one answer per published call, in order"
    for call_id in requested:
        d = decisions[call_id]
        if d.action == "block":
            assert seen[call_id] == d.message, call_id
        elif d.action == "warn" and d.notify_model:
            assert seen[call_id].startswith(results[call_id]) and seen[call_id].endswith(d.message), call_id
        else:
            assert seen[call_id] == results[call_id], call_id
    return [decisions[c] for c in requested]


def assert_hand_worked_loop(decisions: list[Decision]) -> None:
    actions = [(d.action, d.count if d.action != "allow" else None) for d in decisions]
    assert actions == [("allow", None)] * 10 + [("warn", 10)] + [("allow", None)] * 9 + [("block", 20)] * 3
    assert decisions[10].message.startswith("WARNING") and decisions[20].message.startswith("CRITICAL")


def assert_model_saw_the_hand_worked_loop(seen: dict[str, str], events) -> list[Decision]:
    """A loop of identical calls that return ``SAME_RESULT``: the model saw what the engine
    decided for each call, the decisions are the hand-worked loop, and nothing raw was
    published.  Returns the decisions in call order."""
    decisions = assert_model_saw_what_the_engine_decided(seen, dict.fromkeys(seen, SAME_RESULT), events)
    assert_hand_worked_loop(decisions)
    assert_only_hashes_left(events, SAME_RESULT)
    return decisions


def assert_only_hashes_left(events, *raw: str) -> None:
    """Raw arguments and results never leave the process: no published field holds them."""
    for event in events:
        text = repr(event)
        for needle in raw:
            assert needle not in text, f"{needle!r} published in {type(event).__name__}"


def assert_unknown_tool_published(events, name: str) -> None:
    completed = [e for e in events if isinstance(e, ToolCallCompleted) and e.tool_name == name]
    assert completed and all(e.unknown_tool_name == name and e.is_error for e in completed)


# -- the docs' snippets, run as they are ---------------------------------------------------------------

README = Path(__file__).resolve().parents[2] / "README.md"
INTEGRATIONS_DOC = README.parent / "docs" / "integrations.md"


def readme_snippet(marker: str, page: Path = README) -> str:
    """The python block after ``<!-- snippet: <marker> -->`` in the README (or a docs page),
    with only the broker address replaced by this test's broker and topics
    (tests/docs/test_snippets.py checks that every README marker exists)."""
    text = page.read_text(encoding="utf-8")
    head = f"<!-- snippet: {marker} -->\n```python\n"
    assert text.count(head) == 1, f"{page.name} has no `{head.strip()}`"
    code = text.split(head, 1)[1].split("```", 1)[0]
    assert code.count('"kafka:9092"') == 1, marker
    return code


def snippet_for(lw, marker: str, page: Path = README) -> str:
    """The snippet's code with its broker address made ``lw``'s broker and topics."""
    target = f'"{lw.broker}", tool_calls_topic="{lw.names.tool_calls}", verdicts_topic="{lw.names.verdicts}"'
    return readme_snippet(marker, page).replace('"kafka:9092"', target)


def run_snippet(lw, marker: str, page: Path = README):
    namespace: dict[str, Any] = {}
    exec(compile(snippet_for(lw, marker, page), f"{page.name} ({marker})", "exec"), namespace)
    return namespace["main"]


async def readme_run_of(lw, call_id: str) -> list:
    """The published run whose one call has ``call_id``."""
    events = await run_where(lw, lambda e: getattr(e, "tool_call_id", None) == call_id)
    assert [type(e).__name__ for e in events] == ["ToolCallRequested", "ToolCallCompleted", "RunEnded"]
    return events
