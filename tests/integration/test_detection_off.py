"""A worker started without a config (upstream's defaults: detection off) allows every call;
it says so in its log, and so do its answers: the runner client warns once per agent."""

from __future__ import annotations

import logging

import pytest

pytestmark = pytest.mark.kafka

SAME = {"content": [{"type": "text", "text": "same page"}]}


async def test_a_worker_without_config_says_detection_is_off_and_the_client_warns_once(lw, caplog):
    worker = lw.worker().start()  # no --config, as in a first trial
    worker.wait_ready(90)
    assert "detection OFF for agent * (profile configurable-final)" in worker.log_tail(200)
    decisions = []
    with caplog.at_level(logging.WARNING, logger="loopwatch.client"):
        async with lw.client(mode="gate") as client:
            for r in range(2):  # two runs of one agent: one warning
                run = client.run(f"{lw.names.tag}-off-{r}", session_key=f"agent:main:off-{r}", agent_id="main")
                for n in range(25):  # past upstream's critical threshold (20): still allowed
                    decisions.append(await run.before_tool_call("read", {"path": "/same"}, tool_call_id=f"c{n}"))
                    await run.after_tool_call("read", {"path": "/same"}, tool_call_id=f"c{n}", result=SAME)
                assert run.detection_off is True, decisions[-1]
                await run.end()
    assert len(decisions) == 50 and all(d.action == "allow" and d.detection_off is True for d in decisions)
    lines = [r.getMessage() for r in caplog.records if "detection is OFF" in r.getMessage()]
    assert lines == [
        "loopwatch detection is OFF for agent main: its calls are allowed without a check "
        "(start the worker with --config examples/getting-started.yaml, or set tools.loopDetection.enabled: "
        "true in its config; loopwatch config check shows it)"
    ]
