"""The Python and TypeScript clients' ``model_text``/``modelText`` and ``agent_message``/
``agentMessage`` (issue 29) on the real broker and a worker on profile gemini-cli: sessions of the golden set (tests/data/conformance/gemini-cli-content,
answered by Gemini CLI's own ``LoopDetectionService``) streamed through ``RunHandle`` reach the
runner as Gemini's answers: its feedback as a warning on the chunk the oracle answered
``feedback``, the end of the turn as the run's abort on the chunk it answered ``abort``."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from pathlib import Path

import pytest
from node_runner import NodeRunner

from streams.engine.peers import GEMINI_CONTENT_LOOP

pytestmark = pytest.mark.kafka

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "conformance" / "gemini-cli-content"
CONFIG = {"loopwatch": {"profile": "gemini-cli"}}


def text_only_sessions(n: int) -> list[tuple[dict, list]]:
    """The first ``n`` golden sessions of prompts and text alone that end in an abort."""
    sessions = [json.loads(line) for line in gzip.open(GOLDEN / "sessions.jsonl.gz", "rt")]
    expected = {d["id"]: d["steps"] for d in map(json.loads, gzip.open(GOLDEN / "expected.jsonl.gz", "rt"))}
    out = []
    for session in sessions:
        steps = expected[session["id"]]
        if {e["k"] for e in session["events"]} <= {"text", "user"} and any(s and s[0] == "abort" for s in steps):
            out.append((session, steps))
            if len(out) == n:
                break
    return out


@pytest.fixture(scope="module")
def worker(lw_module):
    lw_module.configured_worker(CONFIG)
    return lw_module


async def test_streamed_text_gets_geminis_feedback_and_abort_on_the_oracles_chunks(worker):
    cases = text_only_sessions(3)
    assert len(cases) == 3
    async with worker.client(mode="advisory") as client:
        for session, steps in cases:
            run = client.run(f"{worker.names.tag}-{session['id']}", session_key=f"agent:main:{session['id']}")
            ids = []
            for event in session["events"]:
                if event["k"] == "user":
                    ids.append(await run.agent_message(event["text"], source="user"))
                else:
                    ids.append(await run.model_text(event["text"]))
            want_feedback = [ids[i] for i, s in enumerate(steps) if s and s[0] == "feedback"]
            [want_abort] = [ids[i] for i, s in enumerate(steps) if s and s[0] == "abort"]
            deadline = time.monotonic() + 60
            while run.aborted is None:
                assert time.monotonic() < deadline, f"{session['id']}: no abort in 60 s"
                await asyncio.sleep(0.05)
            assert [d.cause_event_id for d in run.warnings] == want_feedback, session["id"]
            assert {d.detector for d in run.warnings} == {GEMINI_CONTENT_LOOP}
            assert all(d.notify_model and d.message for d in run.warnings)
            assert run.aborted.cause_event_id == want_abort and run.aborted.detector == GEMINI_CONTENT_LOOP


async def test_the_typescript_client_streams_text_to_the_same_answers(worker, node):
    cases = text_only_sessions(6)[3:]
    plan = {
        "kafka": {
            "brokers": [worker.broker],
            "toolCallsTopic": worker.names.tool_calls,
            "verdictsTopic": worker.names.verdicts,
        },
        "runs": [
            {
                "runId": f"{worker.names.tag}-ts-{s['id']}",
                "sessionKey": f"agent:main:ts-{s['id']}",
                "events": [{"k": e["k"], "text": e["text"]} for e in s["events"]],
            }
            for s, _steps in cases
        ],
    }
    runner = await NodeRunner.start(node, "text", plan)
    try:
        reports = (await runner.read("runs"))["runs"]
    finally:
        await runner.finish()
    assert len(reports) == len(cases)
    for report, (session, steps) in zip(reports, cases):
        ids = report["eventIds"]
        assert len(ids) == len(session["events"])
        want_feedback = [ids[i] for i, s in enumerate(steps) if s and s[0] == "feedback"]
        [want_abort] = [ids[i] for i, s in enumerate(steps) if s and s[0] == "abort"]
        assert [d["cause_event_id"] for d in report["warnings"]] == want_feedback, session["id"]
        assert {d["detector"] for d in report["warnings"]} == {GEMINI_CONTENT_LOOP}
        assert (
            report["aborted"]["cause_event_id"] == want_abort and report["aborted"]["detector"] == GEMINI_CONTENT_LOOP
        )
        # Gemini's feedback and the abort's message, for the model, each once
        assert len(report["notices"]) == len(want_feedback) + 1
