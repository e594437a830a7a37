"""Profile latest end to end: a worker configured with ``loopwatch.profile: latest`` and the
runner client in gate mode on the real broker (issue 14).

The client completes every blocked call with upstream's blocked result at once, so the
worker records each veto and the count climbs to the global breaker; expected values are
the spec's worked example (openclaw-latest.md §5.3), not the engine's own answer."""

from __future__ import annotations

import pytest

from harness import write_config
from streams.client import LoopBlocked, LoopwatchClient

pytestmark = pytest.mark.kafka

LATEST = {"tools": {"loopDetection": {"enabled": True}}, "loopwatch": {"profile": "latest"}}
SAME = {"content": [{"type": "text", "text": "same"}], "details": {"ok": True}}
CHANGED = {"content": [{"type": "text", "text": "written"}], "details": {"changed": True}}


async def test_the_client_records_vetoes_so_the_global_breaker_is_reached(lw):
    path = lw.tmp / "loop-detection.json"
    write_config(path, LATEST)
    worker = lw.worker(config=path).start()
    worker.wait_ready()
    outcomes = []
    async with LoopwatchClient(
        lw.broker, mode="gate", timeout=20.0, tool_calls_topic=lw.names.tool_calls, verdicts_topic=lw.names.verdicts
    ) as client:
        run = client.run("latest-run", session_key="agent:main:latest-run", agent_id="main")
        for n in range(33):
            args = {"path": "/x"}
            try:
                decision = await run.before_tool_call("read", args, tool_call_id=f"c{n}")
            except LoopBlocked as blocked:
                outcomes.append((blocked.decision.action, blocked.decision.detector, blocked.decision.count))
                continue
            outcomes.append((decision.action, decision.detector, decision.count))
            await run.after_tool_call("read", args, tool_call_id=f"c{n}", result=SAME)
        # An agent rewriting one file with ever new content: argument churn from the 11th write.
        writer = client.run("rewrite-run", session_key="agent:main:rewrite-run", agent_id="main")
        churn = []
        for n in range(12):
            args = {"path": "notes.md", "content": f"draft {n}"}
            decision = await writer.before_tool_call("write", args, tool_call_id=f"w{n}")
            churn.append((decision.action, decision.detector, decision.count, decision.liveness_signal))
            await writer.after_tool_call("write", args, tool_call_id=f"w{n}", result=CHANGED)
    # "After 20 identical outcomes, calls 21-30 are vetoed as generic_repeat with counts
    # 20...29 and call 31 hits the global breaker with 30."
    assert outcomes[10] == ("warn", "generic_repeat", 10)
    assert outcomes[20:30] == [("block", "generic_repeat", n) for n in range(20, 30)]
    assert outcomes[30:] == [("block", "global_circuit_breaker", 30)] * 3
    assert (
        worker.metric("loopwatch_decisions_total", detector="global_circuit_breaker", level="critical", action="block")
        == 3
    )
    assert churn[10] == ("warn", "argument_churn", 10, "argument_churn")
    assert churn[11] == ("allow", "argument_churn", 11, "argument_churn")  # the warning bucket
    assert worker.metric("loopwatch_liveness_signals_total", signal="argument_churn", detector="argument_churn") == 2
    assert worker.metric("loopwatch_warnings_suppressed_total", detector="argument_churn") == 1
