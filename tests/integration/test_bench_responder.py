"""The raw responder of ``make bench`` (c') on the real broker: it answers exactly the gated
requested calls with an ``allow`` decision, on the partition they came from, so (c') measures
the same round trip as (c) without loopwatch's logic."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.partitioner import murmur2

from bench.kafka import PARTITIONS, ResponderProcess, create_topics
from harness import collect, encode_all, produce
from schemas import decode_verdict
from streams.edge.events import completed_event, requested_event

pytestmark = pytest.mark.kafka


async def test_responder_answers_gated_requests_only(lw):
    names = lw.names
    await create_topics(lw.broker, [names.tool_calls, names.verdicts])
    responder = ResponderProcess(lw.broker, names, log_dir=lw.tmp)
    responder.start()
    try:
        await asyncio.get_running_loop().run_in_executor(None, responder.wait_ready, 60)
        common = dict(session_key="agent:main:r", agent_id="main", ts_ms=1_000)
        events = []
        for i in range(6):
            run = f"run-{i % 3}"
            args = {"path": f"/tmp/{i}"}
            events.append(
                requested_event(
                    f"{run}:{i}:req", "read", args, tool_call_id=f"c{i}", gate=i % 2 == 0, run_id=run, **common
                )
            )
            events.append(
                completed_event(f"{run}:{i}:done", "read", args, tool_call_id=f"c{i}", result="x", run_id=run, **common)
            )
        records = encode_all(events)
        await produce(lw.broker, names.tool_calls, records + [(b"run-0", b"{not json")])
        gated = {e.event_id: e for e in events if getattr(e, "gate", False)}
        got = await collect(lw.broker, names.verdicts, timeout=60, settle=1.0, until=lambda rs: len(rs) >= len(gated))
    finally:
        responder.stop()
    verdicts = [decode_verdict(r.value) for r in got]
    assert sorted(v.cause_event_id for v in verdicts) == sorted(gated)
    for record, verdict in zip(got, verdicts):
        event = gated[verdict.cause_event_id]
        assert verdict.action == "allow"
        assert (verdict.run_id, verdict.tool_call_id, verdict.args_hash) == (
            event.run_id,
            event.tool_call_id,
            event.args_hash,
        )
        assert record.key == event.run_id.encode()
        assert record.partition == (murmur2(record.key) & 0x7FFFFFFF) % PARTITIONS  # the request's partition
    assert responder.proc.returncode is not None  # stopped, not left running
