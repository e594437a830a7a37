"""The CrewAI adapter (``streams.integrations.frameworks.crewai``) in CrewAI's REAL agent loop
(a ``Crew`` with one agent), driven by a scripted ``BaseLLM``, on the real broker and a real
worker.  CrewAI runs in its own venv (``framework_venv``); what the model must see is worked
out by hand and by the engine alone on what was published (``framework_checks``).

CrewAI 1.15 ends a run itself at the 5th identical call with an identical result
(``check_repeated_tool_call``, ``MAX_REPEATED_TOOL_CALLS = 5``, a ``ToolExecutionFailedError``),
before upstream's default thresholds (10, 20) are reached.  Agent ``crew`` therefore has
thresholds below it (warningThreshold 2, criticalThreshold 4), as the docs advise for CrewAI.
Worked by hand from the spec: the n-th identical call has count n - 1; a warning is shown only
when count // 10 exceeds its key's last bucket (0 to start), so counts 2 and 3 warn nobody;
the 5th call (count 4) and every later one is blocked (a vetoed call is not recorded, so the
count stays).  CrewAI's own check counts (tool, arguments, result as handed to the model), and
blocked calls read loopwatch's message, so it never reaches 5 here.  Warnings need count 10:
the same arguments with a changing result (which CrewAI's check does not stop) are warned at
the 11th call, under the default thresholds (agent ``main``).
"""

from __future__ import annotations

import uuid

import pytest
from framework_checks import (
    INTEGRATIONS_DOC,
    SAME_RESULT,
    assert_model_saw_what_the_engine_decided,
    assert_only_hashes_left,
    assert_unknown_tool_published,
    engine_abort,
    run_of_call,
    run_of_session,
    snippet_for,
    worker,
)
from framework_venv import run_in_framework_venv

from schemas.events import ToolCallCompleted, ToolCallRequested

pytestmark = pytest.mark.kafka
__all__ = ["worker"]  # the shared fixture (on this module's CONFIG): pytest finds it here by its name

BELOW_CREWAI = {"loopDetection": {"warningThreshold": 2, "criticalThreshold": 4}}
CONFIG = {
    "tools": {"loopDetection": {"enabled": True}},
    "loopwatch": {"surfaceWarnings": True},
    "agents": {
        "list": [
            {"id": "main"},
            {"id": "crew", "tools": BELOW_CREWAI},
            {"id": "crew-aborter", "tools": BELOW_CREWAI, "loopwatch": {"abortAfterCriticalBlocks": 1}},
        ]
    },
}
LOOP_CALLS = 7  # two blocked calls after the first block


def crew_run(lw, calls: list[tuple[str, dict]], agent_id: str = "crew", react: bool = False) -> tuple[dict, str]:
    """Runs the scripted crew (its model calling tools natively, or in ReAct text); returns
    what it printed and the run's session key."""
    key = f"crewai-test:{uuid.uuid4()}"
    out = run_in_framework_venv(
        "crewai", "crewai_agent.py", lw, agent_id=agent_id, session_key=key, calls=[list(c) for c in calls], react=react
    )
    return out, key


def by_call(events, seen: dict[str, str]) -> dict[str, str]:
    """CrewAI's hooks carry no call id: the adapter names each call; the model's call ids
    (``call-<n>``) follow the published calls in order."""
    requested = [e.tool_call_id for e in events if isinstance(e, ToolCallRequested)]
    assert len(requested) == len(seen), (requested, seen)
    return {published_id: seen[f"call-{n}"] for n, published_id in enumerate(requested)}


async def test_crewai_loop_is_blocked_from_the_5th_call_before_crewai_stops_it(worker):
    out, key = crew_run(worker, [("lookup", {"q": "same"})] * LOOP_CALLS)
    assert out.get("output") == "done", out
    events = await run_of_session(worker, key)
    seen = by_call(events, out["seen"])
    decisions = assert_model_saw_what_the_engine_decided(seen, {c: SAME_RESULT for c in seen}, events, CONFIG)
    actions = [(d.action, d.count if d.action != "allow" else None) for d in decisions]
    assert actions == [("allow", None)] * 4 + [("block", 4)] * 3, actions
    assert decisions[4].message.startswith("CRITICAL")
    assert not any("blocked by hook" in text for text in seen.values()), "loopwatch's message, not CrewAI's"
    assert events[-1].reason == "completed"
    assert_only_hashes_left(events, SAME_RESULT)


async def test_crewai_repeated_arguments_are_warned_at_the_11th_call(worker):
    """``tick`` returns a new value each call: CrewAI's check lets it go on; loopwatch warns
    the model at the 11th call with the same arguments (count 10), appended to the result."""
    out, key = crew_run(worker, [("tick", {"q": "status"})] * 12, agent_id="main")
    assert out["output"] == "done", out
    events = await run_of_session(worker, key)
    seen = by_call(events, out["seen"])
    results = {c: f"tick {n}" for n, c in enumerate(seen, start=1)}
    decisions = assert_model_saw_what_the_engine_decided(seen, results, events, CONFIG)
    actions = [(d.action, d.count if d.action != "allow" else None) for d in decisions]
    assert actions == [("allow", None)] * 10 + [("warn", 10), ("allow", None)], actions
    assert decisions[10].message.startswith("WARNING") and decisions[10].message in list(seen.values())[10]


async def test_crewai_healthy_run_is_never_blocked(worker):
    queries = [f"topic {i}" for i in range(25)]
    out, key = crew_run(worker, [("lookup", {"q": q}) for q in queries])
    events = await run_of_session(worker, key)
    seen = by_call(events, out["seen"])
    results = dict(zip(seen, (f"page about {q}" for q in queries)))
    decisions = assert_model_saw_what_the_engine_decided(seen, results, events, CONFIG)
    assert {d.action for d in decisions} == {"allow"} and out["output"] == "done"
    assert_only_hashes_left(events, "topic 7", "page about topic 7")


async def test_crewai_unknown_tool_and_tool_errors_are_published_as_such(worker):
    out, key = crew_run(worker, [("nosuch", {"q": "x"}), ("nosuch", {"q": "x"}), ("flaky", {"q": "x"})])
    assert out["output"] == "done", out
    events = await run_of_session(worker, key)
    assert_unknown_tool_published(events, "nosuch")
    failed = [e for e in events if isinstance(e, ToolCallCompleted) and e.tool_name == "flaky"]
    assert len(failed) == 1 and failed[0].is_error and failed[0].result_hash.startswith("error:")
    assert "backend down" in out["seen"]["call-2"]


# -- the ReAct path: a model without native function calling ----------------------------------------

# CrewAI's answer to a ReAct call with the same input as the last call it ran (its translations,
# "task_repeated_usage"): the tool is not run again.
CREWAI_REPEATED_INPUT = (
    "I tried reusing the same input, I must stop using this action input. I'll try something else instead."
)


async def test_crewai_react_loop_is_blocked_from_the_6th_call(worker):
    """The model answers in "Action:" / "Action Input:" text.  Worked by hand: CrewAI runs the
    1st call and answers each later identical one itself (the same input as the last call it
    ran), so the outcomes are one page, then CrewAI's repeated-input text.  The n-th call's
    no-progress streak is the run of identical outcomes before it, n - 2 from the 3rd call
    on: calls 1 to 5 run (streaks 0 to 3, below criticalThreshold 4), the 6th (streak 4) and
    every later one is refused with loopwatch's message.  CrewAI's own check (5 identical
    results) never fires: the repeated-input text is read 4 times (one of them with its format
    reminder appended, which CrewAI counts as another result)."""
    out, key = crew_run(worker, [("lookup", {"q": "same"})] * 8, react=True)
    assert out.get("output") == "done", out
    events = await run_of_session(worker, key)
    seen = by_call(events, out["seen"])
    expected = [SAME_RESULT] + [CREWAI_REPEATED_INPUT] * 4
    assert list(seen.values())[:5] == expected, "what CrewAI's ReAct path gave the model"
    decisions = assert_model_saw_what_the_engine_decided(seen, dict(zip(seen, expected)), events, CONFIG)
    actions = [(d.action, d.count if d.action != "allow" else None) for d in decisions]
    assert actions == [("allow", None)] * 5 + [("block", 4)] * 3, actions
    assert decisions[5].message.startswith("CRITICAL") and decisions[5].detector == "generic_repeat"
    assert not any("blocked by hook" in text for text in seen.values()), "loopwatch's message, not CrewAI's"
    assert [e.tool_name for e in events if isinstance(e, ToolCallRequested)] == ["lookup"] * 8
    assert events[-1].reason == "completed"
    assert_only_hashes_left(events, SAME_RESULT)


async def test_crewai_react_alternation_is_warned_at_the_10th_call(worker):
    """``tick`` with two inputs in turn (CrewAI runs each: the input differs from the last call
    it ran), a new value every call, under the default thresholds.  Worked by hand: the n-th
    call continues an alternation of n - 1 calls, ping-pong count n, warned when the count
    reaches warningThreshold 10 (bucket 1): the 10th call, the warning appended to the
    observation; with no repeated outcome there is no evidence to block on."""
    calls = [("tick", {"q": "a" if n % 2 == 0 else "b"}) for n in range(12)]
    out, key = crew_run(worker, calls, agent_id="main", react=True)
    assert out["output"] == "done", out
    events = await run_of_session(worker, key)
    seen = by_call(events, out["seen"])
    results = {c: seen[c].split("\n\n", 1)[0] for c in seen}
    assert [int(r.removeprefix("tick ")) for r in results.values()] == sorted(
        int(r.removeprefix("tick ")) for r in results.values()
    ), "a new value every call"
    decisions = assert_model_saw_what_the_engine_decided(seen, results, events, CONFIG)
    actions = [(d.action, d.count if d.action != "allow" else None) for d in decisions]
    assert actions == [("allow", None)] * 9 + [("warn", 10), ("allow", None), ("allow", None)], actions
    assert decisions[9].message.startswith("WARNING") and list(seen.values())[9].endswith(decisions[9].message)


async def test_crewai_react_tool_errors_are_published_as_on_the_native_path(worker):
    """On the ReAct path CrewAI retries a failing tool (three retries) and hands the model its
    own error text; the call is one call, published as an error, the same error (hash) as the
    same exception on the native path."""
    out, key = crew_run(worker, [("flaky", {"q": "x"}), ("flaky", {"q": "y"})], react=True)
    assert out["output"] == "done", out
    failed = [e for e in await run_of_session(worker, key) if isinstance(e, ToolCallCompleted)]
    assert [(e.tool_name, e.is_error) for e in failed] == [("flaky", True)] * 2, failed
    assert "backend down for x" in out["seen"]["call-0"] and "backend down for y" in out["seen"]["call-1"]
    native, native_key = crew_run(worker, [("flaky", {"q": "x"})])
    assert native["output"] == "done", native
    (same,) = [e for e in await run_of_session(worker, native_key) if isinstance(e, ToolCallCompleted)]
    assert same.is_error and same.result_hash.startswith("error:")
    assert failed[0].result_hash == same.result_hash != failed[1].result_hash


@pytest.mark.parametrize(("react", "refused"), [(False, 5), (True, 6)], ids=["native", "react"])
async def test_crewai_abort_ends_the_kickoff_with_crewais_deny(worker, react, refused):
    """Agent ``crew-aborter`` is aborted at its first critical block: the ``refused``-th call
    (the 5th natively, the 6th on the ReAct path, worked out above) is refused and the next
    model call is denied, which ends the kickoff with ``LoopwatchRunAborted``."""
    out, key = crew_run(worker, [("lookup", {"q": "same"})] * 10, agent_id="crew-aborter", react=react)
    events = await run_of_session(worker, key)
    abort = engine_abort(events, CONFIG)
    assert out["aborted"] == {
        "message": abort.message,
        "detector": "critical_block_limit",
        "count": 1,
        "loopwatch_error": True,
    }
    assert out["model_calls"] == refused, "no model call after the refused call"
    assert len([e for e in events if isinstance(e, ToolCallRequested)]) == refused
    assert events[-1].reason == "aborted"


async def test_docs_crewai_snippet_runs(worker):
    """The docs' snippet, as written, on one scripted call: run, published, then the answer.
    CrewAI names no call: the run is found by its one call's arguments' hash."""
    snippet = snippet_for(worker, "crewai", INTEGRATIONS_DOC)
    marker = f"notes {uuid.uuid4()}"
    out = run_in_framework_venv("crewai", "crewai_agent.py", worker, calls=[["lookup", {"q": marker}]], snippet=snippet)
    assert out["output"] == "done" and list(out["seen"].values()) == [f"page about {marker}"], out
    events = await run_of_call(worker, "lookup", {"q": marker})
    assert [type(e).__name__ for e in events] == ["ToolCallRequested", "ToolCallCompleted", "RunEnded"]
    assert events[0].agent_id == "main" and events[-1].reason == "completed"
