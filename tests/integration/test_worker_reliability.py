"""No record stops the worker, no retry counts twice, no state is lost in silence (issue 13),
on the real broker.

Each test gets its own app id and topics (``lw``) and runs workers as subprocesses.  Every
failure reproduced here stopped the worker, or lost state without a word, before the fix.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from kafka_proxy import KafkaCutProxy

from harness import (
    collect,
    collect_verdicts,
    committed_offsets,
    dedupe,
    encode_all,
    group_lag,
    header,
    produce,
    reference_verdicts,
    write_config,
)
from schemas import decode_verdict
from streams.edge.events import completed_event, requested_event

pytestmark = pytest.mark.kafka

ENABLED = {"tools": {"loopDetection": {"enabled": True}}}
MiB = 1024 * 1024


def config_file(lw, root=ENABLED):
    path = lw.tmp / "loop-detection.json"
    write_config(path, root)
    return path


async def create_topic(broker: str, name: str, partitions: int = 4, **config: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=config)])
    finally:
        await admin.close()


async def all_committed(lw, timeout: float = 30.0) -> None:
    """Wait until the group has committed every record of tool-calls (its checkpoints
    succeeded up to the end)."""
    deadline = time.monotonic() + timeout
    while any((lag := await group_lag(lw.broker, lw.names.app_id, lw.names.tool_calls)).values()):
        assert time.monotonic() < deadline, f"offsets not committed up to the end: {lag}"
        await asyncio.sleep(0.3)


def gated(run_id: str, i: int, now_ms: int, **fields):
    return requested_event(
        f"{run_id}:{i}", "read", {"i": i}, run_id=run_id, session_key=f"s:{run_id}", gate=True, ts_ms=now_ms, **fields
    )


# -- poison pills --------------------------------------------------------------------------------


async def test_event_times_beyond_any_clock_neither_stop_nor_stall_the_worker(lw):
    # ts_ms = 2^63 once passed the schema, got its verdict, then stopped the next checkpoint
    # (the state envelope packed it as a signed 64-bit integer) and every restart after it.
    # Whatever the schema lets through is clamped to the worker's clock or dead-lettered.
    worker = lw.worker(config=config_file(lw)).start()
    worker.wait_ready()
    now = int(time.time() * 1000)
    far = {"pill-63": 2**63, "pill-64": 2**64 - 1, "pill-9999": 253402300799999}  # the last: year 9999
    pills = [gated(run, 0, ts) for run, ts in far.items()]
    good = [gated(f"good-{i}", 0, now) for i in range(20)]
    await produce(lw.broker, lw.names.tool_calls, encode_all(pills + good))
    await all_committed(lw)  # every checkpoint went through (so every verdict was delivered)
    records = await collect_verdicts(lw.broker, lw.names.verdicts, [e.event_id + "/decision" for e in good], settle=1)
    answered = {decode_verdict(r.value).run_id: decode_verdict(r.value) for r in records}
    dead = await collect(lw.broker, lw.names.dead_letters, until=lambda rs: len(rs) + len(answered) >= 23, timeout=10)
    for run, _ts in far.items():
        if run in answered:  # clamped to the worker's clock
            assert now <= answered[run].ts_ms <= int(time.time() * 1000), (run, answered[run].ts_ms)
        else:  # refused by the schema
            assert [header(r, "loopwatch.reason") for r in dead if json.loads(r.value)["run_id"] == run] == [
                "invalid_event"
            ]
    assert "pill-9999" in answered  # within every schema bound: only the worker's clock can refuse it
    assert worker.metric("loopwatch_event_time_clamped_total") >= 1
    assert worker.running


async def test_a_record_too_large_for_the_dead_letter_topic_is_dead_lettered_cut(lw):
    # tool-calls takes 5 MiB records, the dead-letter topic 2 MiB: the whole 2.5 MB record
    # could not be dead-lettered, and the failed send stopped every checkpoint.
    await create_topic(lw.broker, lw.names.tool_calls, **{"max.message.bytes": str(5 * MiB)})
    worker = lw.worker(config=config_file(lw)).start()
    worker.wait_ready()
    now = int(time.time() * 1000)
    big = b'{"type": "run.ended", "event_id": "big", "run_id": "big", "reason": "' + b"x" * 2_500_000 + b'"}'
    good = [gated(f"good-{i}", 0, now) for i in range(5)]
    await produce(lw.broker, lw.names.tool_calls, [(b"big", big)] + encode_all(good))
    await collect_verdicts(lw.broker, lw.names.verdicts, [e.event_id + "/decision" for e in good])
    await all_committed(lw)
    [letter] = await collect(lw.broker, lw.names.dead_letters, until=lambda rs: len(rs) >= 1, timeout=30, settle=1)
    assert header(letter, "loopwatch.reason") == "oversized"
    assert header(letter, "loopwatch.truncated") == "value"
    assert header(letter, "loopwatch.source.value_bytes") == str(len(big))
    assert letter.key == b"big"
    assert letter.value == big[:MiB]  # a prefix, to see what the runner sent
    assert worker.running


async def test_a_dead_letter_the_topic_still_refuses_goes_as_its_headers(lw):
    # Someone lowered the dead-letter topic's limit below the worker's cut (1 MiB): the
    # dead letter goes again without key and value rather than stopping the worker.
    await create_topic(lw.broker, lw.names.dead_letters, **{"max.message.bytes": str(64 * 1024)})
    worker = lw.worker(config=config_file(lw)).start()
    worker.wait_ready()
    big = b"{" + b" " * (300 * 1024) + b"}"  # oversized (> 64 KiB), and over the topic's limit
    small = b"{not json"
    good = [gated("good", 0, int(time.time() * 1000))]
    await produce(lw.broker, lw.names.tool_calls, [(b"r1", big), (b"r1", small)] + encode_all(good))
    await collect_verdicts(lw.broker, lw.names.verdicts, ["good:0/decision"])
    await all_committed(lw)
    dead = await collect(lw.broker, lw.names.dead_letters, until=lambda rs: len(rs) >= 2, timeout=30, settle=1)
    by_reason = {header(r, "loopwatch.reason"): r for r in dead}
    assert set(by_reason) == {"oversized", "invalid_json"} and len(dead) == 2
    assert by_reason["oversized"].value == b"" and header(by_reason["oversized"], "loopwatch.truncated") == "key,value"
    assert header(by_reason["oversized"], "loopwatch.source.value_bytes") == str(len(big))
    assert by_reason["invalid_json"].value == small  # small ones still go whole
    assert "sending its headers without key or value" in worker.log_text()
    assert worker.running


# -- a changelog write that fails -------------------------------------------------------------------


async def test_a_state_the_changelog_refuses_fails_the_checkpoint_and_nothing_is_acked(lw):
    # With a changelog that takes less than a run's state (here: its limit lowered to 1 KiB;
    # in the field, a historySize of 10^9), the local store kept the state, the changelog
    # did not, the offsets were committed, and a restore lost the history without a word.
    changelog = f"{lw.names.app_id}-runs-changelog"
    await create_topic(lw.broker, changelog, **{"max.message.bytes": "1024", "cleanup.policy": "compact"})
    config = config_file(lw)
    worker = lw.worker(config=config).start()
    worker.wait_ready()
    events = []
    now = int(time.time() * 1000)
    for i in range(25):  # one run, 25 identical reads (blocked from the 21st): ~3 KiB of state
        common = dict(run_id="big-run", session_key="s", tool_call_id=f"c{i}-" + "x" * 120, ts_ms=now + i)
        events.append(requested_event(f"big-run:{i}", "read", {"path": "/a"}, gate=True, **common))
        events.append(completed_event(f"big-run:{i}:done", "read", {"path": "/a"}, result="same", **common))
    expected = reference_verdicts(events, ENABLED)
    await produce(lw.broker, lw.names.tool_calls, encode_all(events))
    deadline = time.monotonic() + 60
    while worker.running:
        assert time.monotonic() < deadline, "the checkpoint did not fail"
        await asyncio.sleep(0.2)
    assert worker.proc.returncode != 0
    assert "changelog records for" in worker.log_text() and "not written" in worker.log_text()
    assert await committed_offsets(lw.broker, lw.names.app_id, lw.names.tool_calls) == {}, "acked a lost state"

    # The operator raises the limit; the restarted worker redoes the work from the last good
    # offsets (none) and the changelog gets the state.
    admin = AIOKafkaAdminClient(bootstrap_servers=lw.broker)
    await admin.start()
    try:
        await admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, changelog, {"max.message.bytes": str(2 * MiB)})]
        )
    finally:
        await admin.close()
    fresh = lw.worker(label="fresh", config=config).start()  # empty data dir: the changelog must hold it all
    fresh.wait_ready(90)
    await all_committed(lw, timeout=60)
    records = await collect_verdicts(lw.broker, lw.names.verdicts, [v.verdict_id for v in expected])
    by_id, _duplicates, differing = dedupe(records)  # the first worker's verdicts come again
    assert differing == 0 and by_id == {v.verdict_id: v for v in expected}
    fresh.kill()
    again = lw.worker(label="again", config=config).start()  # restores the run from the changelog alone
    again.wait_ready(90)
    more = [
        requested_event(
            "big-run:25",
            "read",
            {"path": "/a"},
            run_id="big-run",
            session_key="s",
            gate=True,
            tool_call_id="c25",
            ts_ms=now + 25,
        )
    ]
    await produce(lw.broker, lw.names.tool_calls, encode_all(more))
    by_id, _, _ = dedupe(await collect_verdicts(lw.broker, lw.names.verdicts, ["big-run:25/decision"]))
    last = by_id["big-run:25/decision"]
    assert last == reference_verdicts(events + more, ENABLED)[-1]
    assert last.action == "block"  # the history came back from the changelog (afresh: allowed)


# -- retries ---------------------------------------------------------------------------------------

POLL = {"action": "poll", "sessionId": "s1"}
STILL_RUNNING = {"content": [{"type": "text", "text": "Process still running."}], "details": {"status": "running"}}


def polling_loop(n: int, run_id: str, now_ms: int):
    events = []
    for i in range(n):
        common = dict(
            run_id=run_id, session_key=f"agent:main:{run_id}", agent_id="main", tool_call_id=f"c{i}", ts_ms=now_ms + i
        )
        events.append(requested_event(f"{run_id}:{i}", "process", POLL, gate=True, **common))
        events.append(completed_event(f"{run_id}:{i}:done", "process", POLL, result=STILL_RUNNING, **common))
    return events


async def test_a_polling_loop_published_twice_warns_at_the_11th_poll_across_a_restart(lw):
    # Hand-worked from the spec (§2.10, §2.7 rule 4, warningThreshold 10): the 11th poll sees
    # ten identical completed polls and warns with count 10.  Each event published twice
    # (a runner retrying every send) used to count twice: the 6th poll warned.  Half of the
    # loop goes to one worker, which is killed after its checkpoint; the restarted worker
    # must still know which event ids the run applied.
    config = config_file(lw)
    worker = lw.worker(config=config).start()
    worker.wait_ready()
    events = polling_loop(14, "poll", int(time.time() * 1000))
    twice = [record for record in encode_all(events) for _copy in (1, 2)]
    await produce(lw.broker, lw.names.tool_calls, twice[:28])  # polls 1-7, each event twice
    await collect_verdicts(lw.broker, lw.names.verdicts, ["poll:6/decision"])
    await all_committed(lw)
    worker.kill()
    worker.start()
    worker.wait_ready(60)
    await produce(lw.broker, lw.names.tool_calls, twice[28:])
    records = await collect_verdicts(lw.broker, lw.names.verdicts, ["poll:13/decision"], settle=1.0)
    decisions = {}
    for r in records:
        v = decode_verdict(r.value)
        decisions.setdefault(int(v.verdict_id.split(":")[1].split("/")[0]) + 1, v)
    warnings = sorted(n for n, v in decisions.items() if v.action == "warn")
    assert warnings == [11], {n: (v.action, v.count) for n, v in decisions.items()}
    assert (decisions[11].detector, decisions[11].count) == ("known_poll_no_progress", 10)
    assert [decisions[n] for n in sorted(decisions)] == reference_verdicts(events, ENABLED)
    assert worker.metric("loopwatch_duplicate_events_total") == 14  # polls 8-14, two events each


# -- static membership ------------------------------------------------------------------------------


async def test_a_killed_worker_is_ready_within_15_s_of_its_restart(lw):
    # With the production session timeout (here 45 s), a restarted worker used to wait for
    # the dead member's session to expire before the group would rebalance (~60 s with the
    # defaults).  As a static member it takes its partitions back at once.
    env = {
        "LOOPWATCH_SESSION_TIMEOUT_S": "45",
        "LOOPWATCH_REBALANCE_TIMEOUT_S": "45",
        "LOOPWATCH_HEARTBEAT_INTERVAL_S": "3",
    }
    worker = lw.worker(config=config_file(lw), env=env).start()
    worker.wait_ready(60)
    now = int(time.time() * 1000)
    await produce(lw.broker, lw.names.tool_calls, encode_all([gated(f"r{i}", 0, now) for i in range(8)]))
    await collect_verdicts(lw.broker, lw.names.verdicts, [f"r{i}:0/decision" for i in range(8)])
    worker.kill()
    restarted = time.monotonic()
    worker.start()
    worker.wait_ready(15)  # raises TimeoutError after 15 s
    print(f"ready {time.monotonic() - restarted:.1f} s after the restart")
    await produce(lw.broker, lw.names.tool_calls, encode_all([gated(f"r{i}", 1, now) for i in range(8)]))
    await collect_verdicts(lw.broker, lw.names.verdicts, [f"r{i}:1/decision" for i in range(8)], timeout=15)


async def test_a_worker_restarted_on_another_port_rejoins_instead_of_hanging(lw):
    # A static member is handed its previous assignment, and Faust's assignor refuses one
    # made for another URL: with the pod name alone as instance id, a worker restarted with
    # a new web port never became ready.  The URL's digest in the id makes it a new member.
    from harness import free_port

    worker = lw.worker(config=config_file(lw)).start()
    worker.wait_ready(60)
    worker.kill()
    worker.web_port = free_port()
    worker.start()
    worker.wait_ready(60)  # once the old member's session (6 s here) has timed out
    await produce(lw.broker, lw.names.tool_calls, encode_all([gated("r1", 0, int(time.time() * 1000))]))
    await collect_verdicts(lw.broker, lw.names.verdicts, ["r1:0/decision"])
    assert "AssertionError" not in worker.log_text()


# -- readiness follows the broker -------------------------------------------------------------------


async def test_readyz_drops_while_no_broker_answers_and_comes_back(lw):
    proxy = KafkaCutProxy(lw.broker).start()
    try:
        env = {"LOOPWATCH_BOOTSTRAP": proxy.address, "LOOPWATCH_BROKER_UNREACHABLE_S": "3"}
        worker = lw.worker(config=config_file(lw), env=env).start()
        worker.wait_ready(60)
        assert proxy.rewrites > 0, "the worker learnt the broker's own address: a cut would not cut"
        now = int(time.time() * 1000)
        await produce(lw.broker, lw.names.tool_calls, encode_all([gated("before", 0, now)]))
        await collect_verdicts(lw.broker, lw.names.verdicts, ["before:0/decision"])

        proxy.cut()
        deadline = time.monotonic() + 30
        while (status := worker.http("/readyz"))[0] != 503:
            assert time.monotonic() < deadline, f"/readyz still {status} with the broker cut off"
            await asyncio.sleep(0.2)
        assert json.loads(status[1])["broker_reachable"] is False
        assert worker.metric("loopwatch_ready") == 0
        # The cut is real: an event published meanwhile gets no verdict.
        await produce(lw.broker, lw.names.tool_calls, encode_all([gated("during", 0, now)]))
        silent = await collect_verdicts(lw.broker, lw.names.verdicts, ["during:0/decision"], timeout=3, settle=0)
        assert "during:0/decision" not in {decode_verdict(r.value).verdict_id for r in silent}

        proxy.restore()
        worker.wait_ready(60)
        await collect_verdicts(lw.broker, lw.names.verdicts, ["during:0/decision"], timeout=60)
        assert json.loads(worker.http("/readyz")[1])["broker_reachable"] is True
        assert "no Kafka broker has answered" in worker.log_text()
        assert worker.running
    finally:
        proxy.stop()


# -- what the web and metrics ports serve -----------------------------------------------------------


async def test_only_health_and_metrics_are_served(lw):
    worker = lw.worker(config=config_file(lw)).start()
    worker.wait_ready()
    await produce(lw.broker, lw.names.tool_calls, encode_all([gated("r1", 0, int(time.time() * 1000))]))
    await collect_verdicts(lw.broker, lw.names.verdicts, ["r1:0/decision"])
    assert worker.http("/healthz")[0] == 200
    assert worker.http("/readyz")[0] == 200
    # Faust's views: a run's raw state, the key router, the topology, its index page.
    for path in (
        "/table/runs/run:r1/",
        "/table/runs/",
        "/router/",
        "/router/runs/run:r1/",
        "/graph/",
        "/stats/",
        "/",
        "/performance/",
        "/metrics",
    ):
        assert worker.http(path)[0] == 404, path
    status, text = worker.http("/metrics", worker.metrics_port)
    assert status == 200 and "loopwatch_ready" in text
    for path in ("/", "/healthz", "/anything", "/metrics/x"):
        assert worker.http(path, worker.metrics_port)[0] == 404, path


async def test_a_full_state_disk_is_shown_on_readyz_and_a_metric_before_the_worker_stops(lw):
    # Issue 26: a full state disk (ENOSPC injected in the run store's write path,
    # tests/integration/full_disk_worker.py) stops the worker with its one-line reason; before
    # the exit /readyz says why and loopwatch_state_disk_full is 1.
    import sys
    from pathlib import Path

    from streams.offline.scenarios import run_events

    trigger = lw.tmp / "disk-full"
    worker = lw.worker(
        env={"LOOPWATCH_TEST_DISK_FULL": str(trigger)},
        command=[sys.executable, str(Path(__file__).with_name("full_disk_worker.py"))],
    ).start()
    worker.wait_ready(90)
    trigger.touch()
    events = run_events("healthy", f"{lw.names.tag}-r", length=5, end=False, start_ms=int(time.time() * 1000))
    await produce(lw.broker, lw.names.tool_calls, encode_all(events))  # a run to store: the write fails
    deadline = time.monotonic() + 60
    while worker.metric("loopwatch_state_disk_full") != 1:
        assert time.monotonic() < deadline and worker.running, worker.log_tail()
        await asyncio.sleep(0.3)
    status, body = worker.http("/readyz")
    assert status == 503, (status, body)
    ready = json.loads(body)
    assert ready["ready"] is False and ready["error"].startswith(
        "state disk full: the run table's write failed (IO error: No space left on device"
    )
    code = worker.proc.wait(timeout=120)  # it stops after its hold (a guard, not a timing assertion)
    assert code != 0
    lines = [line for line in worker.log_text().splitlines() if "state disk full" in line]
    assert len(lines) == 1 and "free space on the state volume (LOOPWATCH_DATA_DIR) or grow it" in lines[0], lines
