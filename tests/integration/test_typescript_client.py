"""The TypeScript client and the OpenClaw plugin end to end: a real broker, a real worker, and
Node runners (clients/typescript/test/e2e/runner.ts) driven from here.

What is right comes from the engine alone (``reference_verdicts`` over the records the Node
runner really published, read back from ``tool-calls`` and decoded by the Python schema),
and from the Python client watching the same runs. ``make test`` installs the package's npm
dependencies from its lock file and builds it before pytest runs. The same runner on the
secured broker (TLS, SCRAM, signed events): test_secure_kafka.py.
"""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest
from aiokafka.partitioner import murmur2
from node_runner import NodeRunner, assert_blocked_calls_completed_at_once, node_calls, plain

from harness import collect, produce, reference_verdicts, write_config
from schemas import decode_event, decode_verdict
from schemas.events import RunEnded, ToolCallCompleted, ToolCallRequested
from schemas.keys import record_key
from schemas.verdicts import Decision, RunAborted
from streams.client import LoopwatchClient

pytestmark = pytest.mark.kafka

CONFIG = {"tools": {"loopDetection": {"enabled": True}}, "loopwatch": {"surfaceWarnings": True}}


@pytest.fixture(scope="module")
def worker(lw_module):
    config = lw_module.tmp / "loop-detection.json"
    write_config(config, CONFIG)
    w = lw_module.worker(config=config).start()
    w.wait_ready()
    return lw_module


def kafka_plan(lw) -> dict:
    return {"brokers": [lw.broker], "toolCallsTopic": lw.names.tool_calls, "verdictsTopic": lw.names.verdicts}


async def published_records(lw, keys: set[str]) -> list:
    """The records on tool-calls with these Kafka keys, partition by partition in offset order."""
    records = await collect(lw.broker, lw.names.tool_calls, until=lambda _: False, timeout=3.0)
    return [r for r in records if r.key is not None and r.key.decode() in keys]


# -- the client: the verdict stream equals the engine's and the Python client's ------------------


async def test_node_client_verdicts_equal_the_engine_and_the_python_client(worker, node):
    lw = worker
    tag = f"ts-{int(time.time() * 1000)}"
    gate_runs = {
        kind: {
            "runId": f"{tag}-{kind}",
            "sessionKey": f"agent:main:{tag}-{kind}",
            "sessionId": None,
            "mode": "gate",
            "calls": node_calls(kind, 7),
        }
        for kind in (
            "generic_repeat",
            "polling_loop",
            "ping_pong",
            "unknown_tool",
            "send_loop",
            "post_compaction",
            "healthy",
        )
    }
    # A run without a run id: its events and verdicts are keyed session:<key>| (schemas.keys), as the
    # worker keys its state.
    session_run = {
        "runId": None,
        "sessionKey": f"agent:main:{tag}-sess",
        "sessionId": f"{tag}-sid",
        "mode": "advisory",
        "calls": node_calls("generic_repeat", 8),
    }
    plan = {"kafka": kafka_plan(lw), "runs": [*gate_runs.values(), session_run]}

    # The Python client watches the same runs (advisory: it only listens, the Node runner publishes;
    # its runs publish nothing, so it reads every partition from its start).
    observer = LoopwatchClient(
        lw.broker,
        mode="advisory",
        tool_calls_topic=lw.names.tool_calls,
        verdicts_topic=lw.names.verdicts,
        verdict_partitions="all",
    )
    await observer.start()
    watched = {
        kind: observer.run(r["runId"], session_key=r["sessionKey"], agent_id="main") for kind, r in gate_runs.items()
    }
    runner = await NodeRunner.start(node, "client", plan)
    try:
        await runner.read("ready")
        # The advisory run has published all its calls: how many warnings and blocks is that?
        published = await runner.read("published")
        assert published["key"] == f"session:{session_run['sessionKey']}|"
        session_events = [decode_event(r.value) for r in await published_records(lw, {published["key"]})]
        await runner.send(f"expect {len(reference_verdicts(session_events, CONFIG))}")
        reports = (await runner.read("runs"))["runs"]

        # What the Node runner really published, decoded by the Python schema, in partition order.
        keys = {r["runId"] for r in gate_runs.values()} | {published["key"]}
        records = await published_records(lw, keys)
        events = [decode_event(r.value) for r in records]
        for record, event in zip(records, events):
            # keyed by run id (its state key without one), on the partition aiokafka gives that key
            assert record.key.decode() == record_key(event)
            assert record.partition == (murmur2(record.key) & 0x7FFFFFFF) % 4
        # every event numbered (seq), strictly increasing within its run, in the order published
        seqs: dict[bytes, list[int]] = {}
        for record, event in zip(records, events):
            assert type(event.seq) is int, event
            seqs.setdefault(record.key, []).append(event.seq)
        assert all(run == sorted(set(run)) for run in seqs.values()), seqs
        expected = reference_verdicts(events, CONFIG)
        by_id = {v.verdict_id: plain(v) for v in expected}

        node_seen: dict[str, list] = {}
        for report, run in zip(reports, plan["runs"]):
            name = run["runId"] or run["sessionKey"]
            seen = [plain(d) for d in report["decisions"]] + [plain(d) for d in report["warnings"] + report["blocked"]]
            if report["aborted"]:
                seen.append(plain(report["aborted"]))
            for verdict in seen:
                assert by_id.get(verdict["verdict_id"]) == verdict, (
                    f"{name}: {verdict['verdict_id']} differs from the engine"
                )
            node_seen[name] = seen
            mine = [v for v in expected if (v.run_id or v.session_key) == name]
            if run["mode"] == "gate":
                # every decision of every gate call, and the abort, reached the Node client
                want = {v.verdict_id for v in mine}
                got = {v["verdict_id"] for v in seen}
                assert got == want, f"{name}: missing {want - got}, extra {got - want}"
            else:
                # advisory: warnings and blocks arrive on their own, keyed by the session state key
                assert {v["verdict_id"] for v in report["warnings"] + report["blocked"]} == {
                    v.verdict_id for v in mine if isinstance(v, Decision) and v.action in ("warn", "block")
                }
                assert report["blocked"], name

        # The Python client saw the same warnings, blocks and abort, run by run.
        await asyncio.sleep(1.0)
        for kind, run in gate_runs.items():
            name, report, handle = run["runId"], reports[list(gate_runs).index(kind)], watched[kind]
            node_warn_block = [v for v in report["decisions"] if v["action"] in ("warn", "block")]
            python = [plain(d) for d in handle.warnings + handle.blocked]
            assert sorted(python, key=lambda v: v["verdict_id"]) == sorted(
                node_warn_block, key=lambda v: v["verdict_id"]
            ), name
            assert (plain(handle.aborted) if handle.aborted else None) == report["aborted"], name

        # Each kind of loop did what it should, through Node.
        by_kind = {kind: reports[i] for i, kind in enumerate(gate_runs)}
        for kind, detector in [
            ("generic_repeat", "generic_repeat"),
            ("polling_loop", "known_poll_no_progress"),
            ("ping_pong", "ping_pong"),
            ("unknown_tool", "unknown_tool_repeat"),
            ("send_loop", "generic_repeat"),
        ]:
            blocks = [d for d in by_kind[kind]["decisions"] if d["action"] == "block"]
            assert blocks and blocks[0]["detector"] == detector, (kind, blocks[:1])
            assert by_kind[kind]["blockedCalls"], kind
        assert by_kind["post_compaction"]["aborted"]["detector"] == "compaction_loop_persisted"
        assert by_kind["post_compaction"]["abortError"]["name"] == "PostCompactionLoopPersistedError"
        assert not any(d["action"] != "allow" for d in by_kind["healthy"]["decisions"])
        # Blocked calls were completed at once with the blocked result, never hashed, once.
        gate_blocks = {d["cause_event_id"] for r in reports for d in r["decisions"] if d["action"] == "block"}
        assert assert_blocked_calls_completed_at_once(events, gate_blocks) == len(gate_blocks) > 0

        # Redelivered verdicts are dropped by id: re-publish some, the client must drop each.
        verdict_records = await collect(lw.broker, lw.names.verdicts, until=lambda _: False, timeout=3.0)
        ours = [r for r in verdict_records if decode_verdict(r.value).verdict_id in by_id]
        again = ours[:: max(1, len(ours) // 8)][:8]
        await produce(lw.broker, lw.names.verdicts, [(r.key, r.value) for r in again])
        await runner.send(f"dups {len(again)}")
        assert (await runner.read("dups"))["dropped"] == {"gate": len(again), "advisory": len(again)}
        await runner.finish()
    finally:
        runner.kill()
        await observer.stop()


# -- the plugin: OpenClaw's hooks on the real broker and worker ---------------------------------


async def test_openclaw_plugin_blocks_a_loop_and_relays_an_abort(worker, node):
    lw = worker
    tag = f"oc-{int(time.time() * 1000)}"
    plan = {
        "kafka": kafka_plan(lw),
        "loopRun": f"{tag}-loop",
        "abortRun": f"{tag}-abort",
        "sessionKey": f"agent:main:{tag}",
    }
    runner = await NodeRunner.start(node, "plugin", plan)
    try:
        await runner.read("ready")
        report = await runner.read("plugin")
        await runner.finish()
    finally:
        runner.kill()

    records = await published_records(lw, {plan["loopRun"], plan["abortRun"]})
    events = [decode_event(r.value) for r in records]
    expected = reference_verdicts(events, CONFIG)
    decisions = {v.cause_event_id: v for v in expected if isinstance(v, Decision)}
    requests = {(e.run_id, e.tool_call_id): e for e in events if isinstance(e, ToolCallRequested)}

    # The loop: the warning reaches the model with its call's result, then the 21st call is blocked
    # with loopwatch's message and stays blocked (a blocked call is recorded as the loop's veto).
    loop = report["loop"]
    for call in loop:
        decision = decisions[requests[(plan["loopRun"], f"call_{call['n']}")].event_id]
        assert call["blocked"] == (decision.action == "block"), call
        if decision.action == "block":
            assert call["blockReason"] == decision.message and call["modelText"] == [decision.message]
        elif decision.action == "warn":
            assert decision.notify_model
            assert call["modelText"] == ["no new lines", decision.message], call
        else:
            assert call["modelText"] == ["no new lines"], call
    assert [c["n"] for c in loop if c["blocked"]] == list(range(20, 24))
    # The plugin's client completed each blocked call when it blocked it; OpenClaw's
    # after_tool_call for it (with the host's own blocked result) published nothing.
    blocked = {requests[(plan["loopRun"], f"call_{c['n']}")].event_id for c in loop if c["blocked"]}
    assert assert_blocked_calls_completed_at_once(events, blocked) == 4
    assert [c["n"] for c in loop if len(c["modelText"]) == 2] == [10]
    assert decisions[requests[(plan["loopRun"], "call_20")].event_id].detector == "generic_repeat"

    # The abort after compaction reaches the runner: the next call is refused with its message.
    aborts = [v for v in expected if isinstance(v, RunAborted)]
    assert [a.detector for a in aborts] == ["compaction_loop_persisted"]
    assert plain(report["aborted"]) == plain(aborts[0])
    assert report["refused"]["blocked"] and report["refused"]["blockReason"] == aborts[0].message
    # Refused by the client itself (the run is over): neither its request nor its outcome is published.
    refused_id = f"call_{report['refused']['n']}"
    assert not [
        e
        for e in events
        if e.run_id == plan["abortRun"]
        and getattr(e, "tool_call_id", None) == refused_id
        and not isinstance(e, RunEnded)
    ]
    assert not any(c["blocked"] for c in report["abort"])
    # agent_end published run.ended: the worker freed the run, the same run id starts afresh.
    assert any(isinstance(e, RunEnded) and e.run_id == plan["abortRun"] for e in events)
    assert not report["afterEnd"]["blocked"]
    assert decisions[requests[(plan["abortRun"], f"call_{report['afterEnd']['n']}")].event_id].action == "allow"


# -- profile latest: the Node client's latest fields and veto completions, end to end ------------

LATEST = {"tools": {"loopDetection": {"enabled": True}}, "loopwatch": {"profile": "latest", "surfaceWarnings": True}}


def untrusted(text: str, rng: random.Random) -> str:
    """A web page as web_fetch wraps it: a fresh random envelope id on every call."""
    envelope_id = f"{rng.getrandbits(64):016x}"
    return f'<<<EXTERNAL_UNTRUSTED_CONTENT id="{envelope_id}">>>{text}<<<END_EXTERNAL_UNTRUSTED_CONTENT id="{envelope_id}">>>'


def failing_tests(n: int, rng: random.Random) -> dict:
    """One failure whose output drifts: timestamp, attempt, pid and duration change every time."""
    out = (
        f"FAILED tests/test_db.py::test_connect - ConnectionRefusedError at 2026-08-{10 + n % 9:02d}T0{n % 10}:1{n % 6}:0{n % 10}"
        f".{rng.randint(100, 999)}Z (attempt {n + 1}, pid {4000 + n}, took {rng.randint(5, 900)}ms)"
    )
    return {
        "content": [{"type": "text", "text": out}],
        "details": {"status": "failed", "exitCode": 1, "aggregated": out, "durationMs": rng.randint(5, 900)},
    }


async def test_node_client_under_profile_latest_blocks_drifting_loops_and_reaches_the_breaker(lw, node):
    """Loops only profile latest catches, run by a Node runner: a web fetch whose page comes in
    a fresh random envelope every time, and a test command failing with drifting output. The
    client's latest fields make the outcomes identical, and its veto completions make the count
    climb to the global breaker. Expected values: the worked example of openclaw-latest.md
    §5.3 (as in test_latest_profile.py), and the engine on the events really published."""
    config = lw.tmp / "latest.json"
    write_config(config, LATEST)
    lw.worker(config=config).start().wait_ready()
    rng = random.Random(14)
    tag = f"tsl-{int(time.time() * 1000)}"
    calls_of = {
        "fetch": [
            {
                "tool": "web_fetch",
                "args": {"url": "https://status.example.com"},
                "result": {
                    "content": [{"type": "text", "text": untrusted("status: degraded", rng)}],
                    "details": {"status": 200},
                },
            }
            for _ in range(34)
        ],
        "exec": [
            {"tool": "exec", "args": {"command": "pytest -x"}, "result": failing_tests(n, rng)} for n in range(34)
        ],
        "write": [
            {
                "tool": "write",
                "args": {"path": "notes.md", "content": f"draft {n}"},
                "result": {"content": [{"type": "text", "text": "written"}], "details": {"changed": True}},
            }
            for n in range(12)
        ],
    }
    runs = [
        {
            "runId": f"{tag}-{kind}",
            "sessionKey": f"agent:main:{tag}-{kind}",
            "sessionId": None,
            "mode": "gate",
            "calls": calls,
        }
        for kind, calls in calls_of.items()
    ]
    runner = await NodeRunner.start(node, "client", {"kafka": kafka_plan(lw), "runs": runs})
    try:
        await runner.read("ready")
        reports = dict(zip(calls_of, (await runner.read("runs"))["runs"]))
        await runner.send("dups 0")
        await runner.read("dups")
        await runner.finish()
    finally:
        runner.kill()

    # "After 20 identical outcomes, calls 21-30 are vetoed as generic_repeat with counts 20...29
    # and call 31 hits the global breaker with 30."
    for kind in ("fetch", "exec"):
        got = [(d["action"], d["detector"], d["count"]) for d in reports[kind]["decisions"]]
        assert got[10] == ("warn", "generic_repeat", 10), kind
        assert got[20:30] == [("block", "generic_repeat", n) for n in range(20, 30)], kind
        assert got[30:] == [("block", "global_circuit_breaker", 30)] * 4, kind
    churn = [(d["action"], d["detector"], d["count"], d["liveness_signal"]) for d in reports["write"]["decisions"]]
    assert churn[10] == ("warn", "argument_churn", 10, "argument_churn")
    assert churn[11] == ("allow", "argument_churn", 11, "argument_churn")

    records = await published_records(lw, {r["runId"] for r in runs})
    events = [decode_event(r.value) for r in records]
    # Every decision the Node client got is the engine's on the events it published...
    expected = {v.verdict_id: plain(v) for v in reference_verdicts(events, LATEST)}
    for report in reports.values():
        for decision in report["decisions"]:
            assert expected[decision["verdict_id"]] == plain(decision)
    # ...the blocked calls were completed at once with the blocked result (what lets the breaker fire)...
    blocked = {d["cause_event_id"] for r in reports.values() for d in r["decisions"] if d["action"] == "block"}
    assert assert_blocked_calls_completed_at_once(events, blocked) == 28
    # ...and it is the latest fields that make these loops: configurable-final, reading only the
    # plain hashes of the same events, blocks none of them.
    final = {**LATEST, "loopwatch": {"surfaceWarnings": True}}
    assert not [v for v in reference_verdicts(events, final) if isinstance(v, Decision) and v.action == "block"]
    outcomes = [e for e in events if isinstance(e, ToolCallCompleted) and not e.loop_veto]
    assert {e.tool_name for e in outcomes if e.normalized_result_hash} == {"web_fetch"}
    assert {(e.tool_name, e.outcome_kind) for e in outcomes} == {
        ("web_fetch", None),
        ("exec", "terminal-exec-failure"),
        ("write", "write-mutation"),
    }
    assert len({e.failure_identity_hash for e in outcomes if e.tool_name == "exec"}) == 1
    assert (
        len({e.result_hash for e in outcomes if e.tool_name == "exec"}) == 20
    )  # 20 ran; each looked new to configurable-final


# -- the Vercel AI SDK: its own agent loop and mock model, through withLoopwatch -----------------


async def test_ai_sdk_tools_warn_the_model_refuse_a_repeated_call_and_end_an_aborted_run(worker, node):
    """The SDK's generateText loop with its MockLanguageModelV3, through withLoopwatch, the
    looping run by the README's snippet as it is (clients/typescript/README.md).
    Hand-worked from the spec's defaults (warning threshold 10, critical 20, as the plugin test
    above): of 25 identical calls the 11th is warned, and the model reads the warning after the
    tool's output; from the 21st on the tool does not run and the model reads loopwatch's message
    as the tool's error. A loop that survives a compaction (as in the plugin test) is aborted, and
    loopwatchAborted ends the SDK's loop there."""
    lw = worker
    tag = f"ai-{int(time.time() * 1000)}"
    plan = {
        "kafka": kafka_plan(lw),
        "runId": f"{tag}-loop",
        "abortRun": f"{tag}-abort",
        "unknownRun": f"{tag}-unknown",
        "sessionKey": f"agent:main:{tag}",
        "calls": 25,
    }
    runner = await NodeRunner.start(node, "ai-sdk", plan)
    try:
        await runner.read("ready")
        report = await runner.read("ai-sdk")
        await runner.finish()
    finally:
        runner.kill()

    records = await published_records(lw, {plan["runId"], plan["abortRun"], plan["unknownRun"]})
    events = [decode_event(r.value) for r in records]
    expected = reference_verdicts(events, CONFIG)
    decisions = {v.cause_event_id: v for v in expected if isinstance(v, Decision)}
    requests = {(e.run_id, e.tool_call_id): e for e in events if isinstance(e, ToolCallRequested)}

    def decision(run: str, n: int) -> Decision:
        return decisions[requests[(plan[run], f"call_{n}")].event_id]

    loop = report["loop"]
    assert [r["toolCallId"] for r in loop["read"]] == [f"call_{n}" for n in range(25)]
    assert loop["executed"] == 20  # the refused calls never ran
    assert loop["steps"] == 26 and loop["text"] == "giving up"  # 25 tool steps, then the answer
    warn, block = decision("runId", 10), decision("runId", 20)
    assert (warn.action, warn.detector, warn.count, warn.notify_model) == ("warn", "generic_repeat", 10, True)
    assert (block.action, block.detector) == ("block", "generic_repeat")
    for n, r in enumerate(loop["read"]):
        if n == 10:
            assert r["output"] == {
                "type": "content",
                "value": [{"type": "text", "text": "no new lines"}, {"type": "text", "text": warn.message}],
            }
        elif n < 20:
            assert r["output"] == {"type": "text", "value": "no new lines"}, n
        else:
            assert decision("runId", n).action == "block", n
            assert r["output"] == {"type": "error-text", "value": decision("runId", n).message}, n
    # The warning the model read is not part of the outcome loopwatch hashed: every call that ran
    # has the same outcome, which is what kept the streak going to the block.
    ran = [e for e in events if isinstance(e, ToolCallCompleted) and e.run_id == plan["runId"] and not e.loop_veto]
    assert len(ran) == 20 and len({e.result_hash for e in ran}) == 1
    blocked = {requests[(plan["runId"], f"call_{n}")].event_id for n in range(20, 25)}
    assert assert_blocked_calls_completed_at_once(events, blocked) == 5

    # The abort: the engine's, reached the run; the SDK's loop stopped at the step that learnt it
    # (the model had 12 lookups scripted, and never got to answer).
    abort = report["abort"]
    aborts = [v for v in expected if isinstance(v, RunAborted)]
    assert [a.detector for a in aborts] == ["compaction_loop_persisted"]
    assert plain(abort["aborted"]) == plain(aborts[0])
    assert abort["checked"] == {"name": "PostCompactionLoopPersistedError", "message": aborts[0].message}
    assert abort["executed"]["gateway"] == 3 and abort["executed"]["read"] == 3
    # The abort comes with the third lookup's outcome; the step after it is the last: a 7th call,
    # if the model got to make one before the abort arrived, was refused and ran nothing.
    assert abort["steps"] == abort["made"] in (6, 7) and len(abort["read"]) == abort["made"] - 1
    ran = [e for e in events if isinstance(e, ToolCallCompleted) and e.run_id == plan["abortRun"] and not e.loop_veto]
    assert [e.tool_call_id for e in ran] == [f"call_{n}" for n in range(6)]
    for ended in (plan["runId"], plan["abortRun"], plan["unknownRun"]):
        assert any(isinstance(e, RunEnded) and e.run_id == ended for e in events)

    # A call of a tool that is not in `tools`: the model read the SDK's own error, and
    # loopwatchAborted published the call, completed with the unknown tool's name, as the Python
    # adapters publish it (upstream's unknown-tool detector reads that field).
    unknown = report["unknown"]
    assert (unknown["steps"], unknown["text"]) == (2, "giving up")
    assert [r["toolCallId"] for r in unknown["read"]] == ["call_0"]
    assert (
        unknown["read"][0]["output"]["type"] == "error-text"
        and "lookup_weather" in unknown["read"][0]["output"]["value"]
    )
    calls = [
        e for e in events if e.run_id == plan["unknownRun"] and isinstance(e, (ToolCallRequested, ToolCallCompleted))
    ]
    assert [(type(e).__name__, e.tool_name, e.tool_call_id) for e in calls] == [
        ("ToolCallRequested", "lookup_weather", "call_0"),
        ("ToolCallCompleted", "lookup_weather", "call_0"),
    ]
    assert calls[1].unknown_tool_name == "lookup_weather" and calls[1].is_error


# -- the OpenAI Agents SDK for TypeScript: its Runner and a model on its own Model interface ------


async def test_openai_agents_ts_guardrails_warn_the_model_refuse_a_repeated_call_and_trip_on_an_abort(worker, node):
    """@openai/agents' Runner with a scripted model on the SDK's own ``Model`` interface, through
    withLoopwatch's tool guardrails, the looping run by the README's snippet as it is. The same
    hand-worked case as the AI SDK test above: the 11th of 25 identical calls is warned (the
    model reads the warning after the tool's output), the 21st on are refused with loopwatch's message; a loop that survives a compaction trips the
    input guardrail: the run rejects with the SDK's ToolCallError around its
    ToolInputGuardrailTripwireTriggered, which carries loopwatch's RunAbortedError."""
    lw = worker
    tag = f"oa-{int(time.time() * 1000)}"
    plan = {
        "kafka": kafka_plan(lw),
        "runId": f"{tag}-loop",
        "abortRun": f"{tag}-abort",
        "unknownRun": f"{tag}-unknown",
        "sessionKey": f"agent:main:{tag}",
        "calls": 25,
    }
    runner = await NodeRunner.start(node, "openai-agents", plan)
    try:
        await runner.read("ready")
        report = await runner.read("openai-agents")
        await runner.finish()
    finally:
        runner.kill()

    records = await published_records(lw, {plan["runId"], plan["abortRun"], plan["unknownRun"]})
    events = [decode_event(r.value) for r in records]
    expected = reference_verdicts(events, CONFIG)
    decisions = {v.cause_event_id: v for v in expected if isinstance(v, Decision)}
    requests = {(e.run_id, e.tool_call_id): e for e in events if isinstance(e, ToolCallRequested)}

    def decision(run: str, n: int) -> Decision:
        return decisions[requests[(plan[run], f"call_{n}")].event_id]

    loop = report["loop"]
    assert [r["toolCallId"] for r in loop["read"]] == [f"call_{n}" for n in range(25)]
    assert loop["executed"] == 20 and loop["made"] == 25 and loop["text"] == "giving up"
    warn, block = decision("runId", 10), decision("runId", 20)
    assert (warn.action, warn.detector, warn.count, warn.notify_model) == ("warn", "generic_repeat", 10, True)
    assert (block.action, block.detector) == ("block", "generic_repeat")
    for n, r in enumerate(loop["read"]):
        if n == 10:
            assert r["output"] == {"type": "text", "text": f"no new lines\n\n{warn.message}"}
        elif n < 20:
            assert r["output"] == {"type": "text", "text": "no new lines"}, n
        else:
            assert decision("runId", n).action == "block", n
            assert r["output"] == {"type": "text", "text": decision("runId", n).message}, n
    ran = [e for e in events if isinstance(e, ToolCallCompleted) and e.run_id == plan["runId"] and not e.loop_veto]
    assert len(ran) == 20 and len({e.result_hash for e in ran}) == 1  # the warning is not the outcome
    blocked = {requests[(plan["runId"], f"call_{n}")].event_id for n in range(20, 25)}
    assert assert_blocked_calls_completed_at_once(events, blocked) == 5

    abort = report["abort"]
    aborts = [v for v in expected if isinstance(v, RunAborted)]
    assert [a.detector for a in aborts] == ["compaction_loop_persisted"]
    assert plain(abort["aborted"]) == plain(aborts[0])
    assert abort["finished"] is None
    assert abort["tripwire"] == {
        "name": "ToolCallError",
        "cause": "ToolInputGuardrailTripwireTriggered",
        "guardrail": "loopwatch",
        "info": {"name": "PostCompactionLoopPersistedError", "message": aborts[0].message},
    }
    # The abort comes with the third lookup's outcome: the next call trips the guardrail, and
    # nothing more runs.
    assert abort["made"] == 7 and (abort["executed"]["read"], abort["executed"]["gateway"]) == (3, 3)
    ran = [e for e in events if isinstance(e, ToolCallCompleted) and e.run_id == plan["abortRun"] and not e.loop_veto]
    assert [e.tool_call_id for e in ran] == [f"call_{n}" for n in range(6)]
    for ended in (plan["runId"], plan["abortRun"], plan["unknownRun"]):
        assert any(isinstance(e, RunEnded) and e.run_id == ended for e in events)

    # A call of a tool the agent lacks (loopwatchRunOptions): the model read the SDK's own error,
    # and the call was published as requested, then completed with the unknown tool's name, as the
    # Python adapter publishes it (upstream's unknown-tool detector reads that field).
    unknown = report["unknown"]
    assert unknown["text"] == "giving up" and [r["toolCallId"] for r in unknown["read"]] == ["call_0"]
    assert "lookup_weather" in json.dumps(unknown["read"][0]["output"]), unknown["read"]
    calls = [
        e for e in events if e.run_id == plan["unknownRun"] and isinstance(e, (ToolCallRequested, ToolCallCompleted))
    ]
    assert [(type(e).__name__, e.tool_name, e.tool_call_id) for e in calls] == [
        ("ToolCallRequested", "lookup_weather", "call_0"),
        ("ToolCallCompleted", "lookup_weather", "call_0"),
    ]
    assert calls[1].unknown_tool_name == "lookup_weather" and calls[1].is_error
