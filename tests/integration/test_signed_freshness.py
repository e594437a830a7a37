"""Freshness of signed events on the real broker and a real worker: a signed event replayed
after more than 64 newer events of its run (out of the worker's id window) is dead-lettered
``stale_event``, whether the replayer stamps its record with the time of the replay or with
the original's, and still after the worker is killed and restarted (the run's newest time
is read back from its stored state).  Within the max age, a replay of an event that carries a
``seq`` (the Python client sets one on every event) is dead-lettered ``replayed_event``, also
after a restart (the run's highest ``seq`` is read back from its stored state)."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import msgspec
import pytest
from aiokafka import AIOKafkaProducer

from harness import collect, collect_verdicts, committed_offsets, end_offsets, header
from schemas import decode_verdict, encode_event
from schemas.events import decode_event
from schemas.signing import SigningKey
from streams.client import LoopwatchClient
from streams.edge.events import requested_event

pytestmark = pytest.mark.kafka

ENABLED = {"tools": {"loopDetection": {"enabled": True}}}
MAIN = SigningKey("main-1", "main", b"freshness-test-signing-key-0123456789")
MAX_AGE_S = 60
NEWER = 70
"""Events of the run after the one replayed: more than the 64 ids the worker remembers."""


def call(run_id: str, i: int, ts_ms: int):
    """A gated call (distinct arguments: no loop); its verdict id is ``<event id>/decision``."""
    return requested_event(
        f"{run_id}-{i}", "read", {"path": f"/f/{i}"}, run_id=run_id, session_key=f"s-{run_id}", agent_id="main",
        gate=True, ts_ms=ts_ms,
    )  # fmt: skip


async def publish(broker: str, topic: str, records: list[tuple[bytes, bytes, list, int | None]]) -> None:
    """Publish ``(key, value, headers, Kafka timestamp ms or None: now)`` in order."""
    producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all")
    await producer.start()
    try:
        for key, value, headers, at in records:
            await producer.send_and_wait(topic, value, key=key, headers=headers, timestamp_ms=at)
    finally:
        await producer.stop()


def signed(event, at: int | None) -> tuple[bytes, bytes, list, int | None]:
    value = encode_event(event)
    return event.run_id.encode(), value, MAIN.headers(value), at


def signed_worker(lw, max_age_s: int = MAX_AGE_S):
    keys = lw.tmp / "keys.json"
    keys.write_text(
        json.dumps({"key_id": MAIN.key_id, "agent_id": MAIN.agent_id, "secret": base64.b64encode(MAIN.secret).decode()})
    )
    config = lw.tmp / "loop-detection.json"
    config.write_text(json.dumps(ENABLED))
    env = {"LOOPWATCH_SIGNING_KEYS": str(keys), "LOOPWATCH_SIGNED_MAX_AGE_S": str(max_age_s)}
    worker = lw.worker(config=config, env=env).start()
    worker.wait_ready(90)
    return worker


async def wait_committed(lw) -> None:
    """Until the worker has committed everything published so far (nothing is redelivered)."""
    published = sum((await end_offsets(lw.broker, lw.names.tool_calls)).values())
    deadline = time.monotonic() + 60
    while sum((await committed_offsets(lw.broker, lw.names.app_id, lw.names.tool_calls)).values()) < published:
        assert time.monotonic() < deadline, "the worker did not commit its offsets within 60 s"
        await asyncio.sleep(0.5)


async def test_a_signed_event_replayed_after_64_newer_ones_is_dead_lettered_stale_even_after_a_restart(lw):
    worker = signed_worker(lw)

    now = int(time.time() * 1000)
    old_ms = now - 10 * 60_000
    first = call("r", 0, old_ms)  # published ten minutes ago, when it was made
    newer = [call("r", i, now + i) for i in range(1, NEWER + 1)]
    await publish(lw.broker, lw.names.tool_calls, [signed(first, old_ms)] + [signed(e, None) for e in newer])
    answered = [f"{e.event_id}/decision" for e in [first, *newer]]
    await collect_verdicts(lw.broker, lw.names.verdicts, answered, timeout=90)

    # The replays: the first event's exact bytes and signature, stamped now, then stamped with
    # the original's time (a producer sets its records' timestamps); a fresh call after them
    # says when the worker is past them.
    await publish(
        lw.broker,
        lw.names.tool_calls,
        [signed(first, None), signed(first, old_ms), signed(call("r", NEWER + 1, int(time.time() * 1000)), None)],
    )
    await collect_verdicts(lw.broker, lw.names.verdicts, [*answered, f"r-{NEWER + 1}/decision"], timeout=60)

    # Killed once everything so far is committed (so nothing is redelivered): the restarted
    # worker knows the run only from its stored state.
    await wait_committed(lw)
    worker.kill()
    worker.start()
    worker.wait_ready(90)
    sentinel = call("r", NEWER + 2, int(time.time() * 1000))
    await publish(lw.broker, lw.names.tool_calls, [signed(first, old_ms), signed(sentinel, None)])
    records = await collect_verdicts(
        lw.broker, lw.names.verdicts, [*answered, f"r-{NEWER + 1}/decision", f"r-{NEWER + 2}/decision"], timeout=90
    )

    dead = await collect(lw.broker, lw.names.dead_letters, until=lambda rs: len(rs) >= 3, timeout=30, settle=1.0)
    assert [(header(r, "loopwatch.reason"), bytes(r.value)) for r in dead] == [("stale_event", encode_event(first))] * 3
    details = [header(r, "loopwatch.detail") for r in dead]
    assert "before its record's Kafka timestamp" in details[0]
    assert all("before the newest event its run applied" in d for d in details[1:])
    # The first event was answered once, when it was new: no replay reached the engine.
    assert sum(1 for r in records if decode_verdict(r.value).verdict_id == "r-0/decision") == 1
    assert worker.metric("loopwatch_dead_letters_total", reason="stale_event") == 1  # since the restart


async def test_a_signed_event_replayed_within_the_max_age_after_64_newer_ones_is_dead_lettered_replayed(lw):
    """The runner is the Python client with main's key: it numbers its events (``seq``).  Its
    first call's record, replayed byte for byte (headers too) a few seconds later, after 70
    newer calls of the run, is well within the 300 s max age and out of the 64-id window:
    before sequence numbers it was applied again.  Now it is dead-lettered
    ``replayed_event``, and so is a replay after the worker is killed and restarted."""
    worker = signed_worker(lw, max_age_s=300)
    client = LoopwatchClient(
        lw.broker,
        timeout=30.0,
        signing_key=MAIN,
        tool_calls_topic=lw.names.tool_calls,
        verdicts_topic=lw.names.verdicts,
    )
    await client.start()
    try:
        run = client.run("q", session_key="s-q", agent_id="main")
        for i in range(NEWER + 1):
            decision = await run.before_tool_call("read", {"path": f"/f/{i}"}, tool_call_id=f"c{i}")
            assert decision is not None and decision.action == "allow", i
    finally:
        await client.stop()
    published = await collect(lw.broker, lw.names.tool_calls, until=lambda rs: len(rs) >= NEWER + 1, timeout=30)
    events = [decode_event(bytes(r.value)) for r in published]
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs)) and len(seqs) == NEWER + 1  # strictly increasing
    first = published[0]
    replay = (first.key, bytes(first.value), list(first.headers), None)

    def sentinel(i: int):
        return signed(msgspec.structs.replace(call("q", i, int(time.time() * 1000)), seq=seqs[-1] + i), None)

    await publish(lw.broker, lw.names.tool_calls, [replay, sentinel(1)])
    answered = [f"{e.event_id}/decision" for e in events]
    await collect_verdicts(lw.broker, lw.names.verdicts, [*answered, "q-1/decision"], timeout=60)
    await wait_committed(lw)
    worker.kill()
    worker.start()
    worker.wait_ready(90)
    await publish(lw.broker, lw.names.tool_calls, [replay, sentinel(2)])
    records = await collect_verdicts(
        lw.broker, lw.names.verdicts, [*answered, "q-1/decision", "q-2/decision"], timeout=90
    )

    dead = await collect(lw.broker, lw.names.dead_letters, until=lambda rs: len(rs) >= 2, timeout=30, settle=1.0)
    assert [(header(r, "loopwatch.reason"), bytes(r.value)) for r in dead] == [
        ("replayed_event", bytes(first.value))
    ] * 2
    assert all(
        f"has seq {seqs[0]}, not above {seqs[-1] + n}" in header(r, "loopwatch.detail") for r, n in zip(dead, (0, 1))
    )
    assert sum(1 for r in records if decode_verdict(r.value).verdict_id == f"{events[0].event_id}/decision") == 1
    assert worker.metric("loopwatch_dead_letters_total", reason="replayed_event") == 1  # since the restart
