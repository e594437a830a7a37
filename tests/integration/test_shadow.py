"""Shadow mode and the candidate config on the real broker, with real runner clients (issue 16).

Expected decisions are hand-worked from the spec's defaults (§2: warningThreshold 10,
criticalThreshold 20; §3: a warning is shown when count // 10 reaches a new bucket): the same
call with the same result warns at the 11th call and is blocked at the 21st; with
``abortAfterCriticalBlocks: 1`` that block also ends the run.  Whole fleets are checked
against the engine driven directly with each config (``reference_verdicts``).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from harness import (
    collect,
    collect_verdicts,
    dedupe,
    encode_all,
    group_lag,
    header,
    produce,
    reference_verdicts,
    write_config,
)
from schemas.verdicts import decode_verdict
from streams.client import LoopBlocked
from streams.edge.events import completed_event, requested_event, run_ended_event

pytestmark = pytest.mark.kafka

ENABLED = {"tools": {"loopDetection": {"enabled": True}}}
SAME = {"content": [{"type": "text", "text": "same page"}]}
SHADOWED = {
    **ENABLED,
    "loopwatch": {"abortAfterCriticalBlocks": 1},
    "agents": {"list": [{"id": "trial", "loopwatch": {"mode": "shadow"}}]},
}
STRICT = {"tools": {"loopDetection": {"enabled": True, "warningThreshold": 5, "criticalThreshold": 8}}}
"""A candidate: the 9th identical call is blocked (its warnings, counts 5-9, are all hidden by
the bucket rule: count // 10 is 0)."""


def config_file(lw, root, name="loop-detection.json"):
    path = lw.tmp / name
    write_config(path, root)
    return path


async def same_calls(run, n: int) -> list:
    """``n`` identical reads through the client; a blocked call completes as the loop's veto."""
    out = []
    for i in range(n):
        try:
            decision = await run.before_tool_call("read", {"path": "/same"}, tool_call_id=f"c{i}")
        except LoopBlocked as blocked:
            out.append(blocked.decision)
            continue
        await run.after_tool_call("read", {"path": "/same"}, tool_call_id=f"c{i}", result=SAME)
        out.append(decision)
    return out


def by_config(records, config: str) -> list:
    return [r for r in records if header(r, "loopwatch.config") == config]


async def all_committed(lw, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while any((lag := await group_lag(lw.broker, lw.names.app_id, lw.names.tool_calls)).values()):
        assert time.monotonic() < deadline, f"offsets not committed up to the end: {lag}"
        await asyncio.sleep(0.3)


async def test_shadow_verdicts_never_reach_a_runner_client(lw):
    worker = lw.worker(config=config_file(lw, SHADOWED)).start()
    worker.wait_ready(90)
    tag = lw.names.tag
    # fail_closed: a call that got no decision in time would raise, so every call below was
    # answered by a decision on loop-verdicts.
    async with lw.client(mode="gate", fail_closed=True) as gate, lw.client(mode="advisory") as advisory:
        shadowed = gate.run(f"{tag}-trial", session_key=f"agent:trial:{tag}", agent_id="trial")
        enforced = gate.run(f"{tag}-main", session_key=f"agent:main:{tag}", agent_id="main")
        trial = await same_calls(shadowed, 25)
        main = await same_calls(enforced, 21)
        quiet = advisory.run(f"{tag}-quiet", session_key=f"agent:trial:{tag}-quiet", agent_id="trial")
        await same_calls(quiet, 25)
        await shadowed.end("completed")
    # The shadow runner: an allow for every call, never a warning, block or abort.
    assert [(d.action, d.detector) for d in trial] == [("allow", None)] * 25
    assert (shadowed.warnings, shadowed.blocked, shadowed.aborted) == ([], [], None)
    assert (quiet.warnings, quiet.blocked, quiet.aborted) == ([], [], None)
    quiet.check()  # would raise RunAbortedError for an aborted run
    # The same loop under enforce mode, on the same worker: warned at 11, blocked (and ended) at 21.
    assert [d.action for d in main] == ["allow"] * 10 + ["warn"] + ["allow"] * 9 + ["block"]
    assert enforced.aborted is not None and enforced.aborted.detector == "critical_block_limit"
    # What detection decided for the shadow runs is on the shadow topic, tagged live.
    ids = [f"{d.cause_event_id}/abort" for d in trial[20:21]]
    shadow = await collect_verdicts(lw.broker, lw.names.shadow_verdicts, ids, settle=1.0)
    assert {header(r, "loopwatch.config") for r in shadow} == {"live"}
    assert all(len(header(r, "loopwatch.config_sha256")) == 16 for r in shadow)
    got = [decode_verdict(r.value) for r in shadow if r.key == f"run:{tag}-trial".encode()]
    # (a gated call's decision is published even when it allows: 10 + 9 of them)
    assert [getattr(v, "action", "abort") for v in got] == (
        ["allow"] * 10 + ["warn"] + ["allow"] * 9 + ["block", "abort", "block", "block", "block", "block"]
    )
    assert [v.verdict_id for v in got][:25] == [f"{d.cause_event_id}/decision" for d in trial][:20] + [
        f"{trial[20].cause_event_id}/decision",
        f"{trial[20].cause_event_id}/abort",
    ] + [f"{d.cause_event_id}/decision" for d in trial[21:24]]
    quiet_shadow = [
        getattr(decode_verdict(r.value), "action", "abort") for r in shadow if r.key == f"run:{tag}-quiet".encode()
    ]
    assert quiet_shadow == ["warn", "block", "abort", "block", "block", "block", "block"]
    # Nothing of it went to loop-verdicts.
    live = await collect(lw.broker, lw.names.verdicts, until=lambda rs: False, timeout=3)
    keys = {f"run:{tag}-trial".encode(), f"run:{tag}-quiet".encode()}
    assert {decode_verdict(r.value).action for r in live if r.key in keys} == {"allow"}
    assert worker.metric("loopwatch_decisions_total", config="live", mode="shadow", action="block") >= 10
    assert worker.metric("loopwatch_run_aborts_total", config="live", mode="shadow") == 2
    assert worker.metric("loopwatch_run_aborts_total", config="live", mode="enforce") == 1


def repeat(run_id: str, calls: range, now_ms: int) -> list:
    fields = dict(run_id=run_id, session_key=f"agent:main:{run_id}", agent_id="main")
    events = []
    for i in calls:
        events.append(
            requested_event(
                f"{run_id}:{i}", "read", {"p": 1}, tool_call_id=f"c{i}", gate=True, ts_ms=now_ms + i, **fields
            )
        )
        events.append(
            completed_event(
                f"{run_id}:{i}:done", "read", {"p": 1}, result=SAME, tool_call_id=f"c{i}", ts_ms=now_ms + i, **fields
            )
        )
    return events


async def test_a_candidate_config_survives_a_kill_9_like_the_live_state(lw):
    # Ten runs, six identical calls each before the crash and six after.  The candidate blocks
    # the 9th call (count 8): only with the six calls before the crash in its history.  A
    # candidate state lost in the crash would start afresh and allow calls 7-12.
    live_config, candidate_config = config_file(lw, ENABLED), config_file(lw, STRICT, "candidate.json")
    env = {"LOOPWATCH_CANDIDATE_CONFIG": str(candidate_config)}
    worker = lw.worker(config=live_config, env=env).start()
    worker.wait_ready(90)
    now = int(time.time() * 1000)
    runs = [f"{lw.names.tag}-r{n}" for n in range(10)]
    before = [e for run in runs for e in repeat(run, range(6), now)]
    after = [e for run in runs for e in repeat(run, range(6, 12), now)]
    ended = [
        run_ended_event(
            f"{run}:end",
            reason="completed",
            run_id=run,
            session_key=f"agent:main:{run}",
            agent_id="main",
            ts_ms=now + 20,
        )
        for run in runs
    ]
    await produce(lw.broker, lw.names.tool_calls, encode_all(before))
    await collect_verdicts(lw.broker, lw.names.verdicts, [f"{run}:5/decision" for run in runs])
    await all_committed(lw)  # a checkpoint stored both states of every run
    worker.kill()
    worker.start()
    worker.wait_ready(90)
    await produce(lw.broker, lw.names.tool_calls, encode_all(after + ended))
    events = before + after + ended
    expected = reference_verdicts(events, STRICT)
    assert [v.action for v in expected if v.run_id == runs[0]] == ["allow"] * 8 + ["block"] * 4
    records = await collect_verdicts(lw.broker, lw.names.shadow_verdicts, [v.verdict_id for v in expected], settle=1.0)
    candidate = by_config(records, "candidate")
    assert len(candidate) == len(records)  # nothing on the shadow topic but the candidate's
    by_id, _duplicates, differing = dedupe(candidate)
    assert differing == 0
    assert sorted(by_id.values(), key=lambda v: v.verdict_id) == sorted(expected, key=lambda v: v.verdict_id)
    # The live verdicts are the live config's alone.
    live = await collect_verdicts(lw.broker, lw.names.verdicts, [f"{run}:11/decision" for run in runs], settle=0.5)
    by_id, _duplicates, differing = dedupe(live)
    assert differing == 0 and by_id == {v.verdict_id: v for v in reference_verdicts(events, ENABLED)}
    # Every run ended with a different outcome: warned at call 11 under the live config (count
    # 10), blocked under the candidate.
    deadline = time.monotonic() + 30
    while worker.metric("loopwatch_candidate_outcome_changes_total", live="warn", candidate="block") < len(runs):
        assert time.monotonic() < deadline, worker.metrics()
        await asyncio.sleep(0.3)
    assert worker.metric("loopwatch_candidate_outcome_changes_total") == len(runs)


async def test_a_worker_restarted_with_a_broken_candidate_starts_and_enforces_its_live_config(lw):
    # Issue 26: before, a candidate file that does not validate kept the worker from starting
    # after any restart, so a shadow-only file turned enforcement off.  Now: the worker starts,
    # is ready, serves verdicts from the live config, and says it refused the candidate (one
    # log line, the gauge behind LoopwatchConfigRefused); a fixed file is applied without a restart.
    live_config = config_file(lw, ENABLED)
    candidate_config = config_file(
        lw,
        {"tools": {"loopDetection": {"enabled": True, "warningThreshold": 30, "criticalThreshold": 20}}},
        "candidate.json",
    )
    worker = lw.worker(config=live_config, env={"LOOPWATCH_CANDIDATE_CONFIG": str(candidate_config)}).start()
    worker.wait_ready(90)
    deadline = time.monotonic() + 30
    while not worker.metrics():  # the metrics server starts beside the web server, not before it
        assert time.monotonic() < deadline, worker.log_tail()
        await asyncio.sleep(0.3)
    assert worker.metric("loopwatch_config_file_refused", config="candidate") == 1
    assert worker.metric("loopwatch_config_file_refused", config="live") == 0
    assert worker.metric("loopwatch_config_reloads_total", config="candidate", result="refused") == 1
    refusals = [line for line in worker.log_text().splitlines() if "refused new config" in line]
    assert len(refusals) == 1 and str(candidate_config) in refusals[0], refusals
    assert "running without a candidate config until the file is fixed" in refusals[0]
    # The live config's verdicts (hand-worked: warned at the 11th identical call, blocked at the 21st).
    tag = lw.names.tag
    async with lw.client(mode="gate", fail_closed=True) as gate:
        run = gate.run(f"{tag}-main", session_key=f"agent:main:{tag}", agent_id="main")
        decisions = await same_calls(run, 21)
    assert [d.action for d in decisions] == ["allow"] * 10 + ["warn"] + ["allow"] * 9 + ["block"]
    assert worker.running
    # The candidate fixed: applied by the running worker, its verdicts on the shadow topic.
    write_config(candidate_config, STRICT)
    deadline = time.monotonic() + 60
    while worker.metric("loopwatch_config_reloads_total", config="candidate", result="applied") < 1:
        assert time.monotonic() < deadline and worker.running, worker.log_tail()
        await asyncio.sleep(0.5)
    assert worker.metric("loopwatch_config_file_refused", config="candidate") == 0
    now = int(time.time() * 1000)
    events = repeat(f"{tag}-fixed", range(9), now)
    await produce(lw.broker, lw.names.tool_calls, encode_all(events))
    expected = reference_verdicts(events, STRICT)
    assert [v.action for v in expected] == ["allow"] * 8 + ["block"]
    records = await collect_verdicts(lw.broker, lw.names.shadow_verdicts, [v.verdict_id for v in expected], settle=0.5)
    by_id, _duplicates, differing = dedupe(by_config(records, "candidate"))
    assert differing == 0 and by_id == {v.verdict_id: v for v in expected}
