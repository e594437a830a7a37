"""The worker end to end on the real broker: every detector, crash recovery, rebalancing,
hostile input, config hot reload and idle expiry.

Each test gets its own app id and topics (``lw`` fixture) and runs workers as subprocesses
(``python -m streams.app.worker``).  Expected verdicts always come from the engine alone
(``reference_verdicts``), which is conformance-checked against upstream elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections import defaultdict

import msgspec
import pytest
from aiokafka.partitioner import murmur2

from harness import (
    collect,
    collect_verdicts,
    committed_offsets,
    dedupe,
    encode_all,
    end_offsets,
    group_lag,
    header,
    produce,
    reference_verdicts,
    write_config,
)
from schemas import MAX_EVENT_BYTES, decode_verdict
from schemas.verdicts import Decision
from streams.edge.events import completed_event, requested_event, run_ended_event
from streams.offline.scenarios import run_events

pytestmark = pytest.mark.kafka

ENABLED = {"tools": {"loopDetection": {"enabled": True}}}


def config_file(lw, root=ENABLED, name="loop-detection.json"):
    path = lw.tmp / name
    write_config(path, root)
    return path


def repeat_calls(run_id: str, n: int = 21, *, tool="read", args=None, result="same content", gate=True, start=0):
    """``n`` identical calls with identical results: the generic-repeat loop."""
    args = args if args is not None else {"path": "/etc/hosts"}
    events = []
    now = int(time.time() * 1000)
    for i in range(start, start + n):
        common = dict(run_id=run_id, session_key=f"agent:main:{run_id}", agent_id="main", ts_ms=now + i)
        events.append(requested_event(f"{run_id}:{i}:req", tool, args, tool_call_id=f"c{i}", gate=gate, **common))
        events.append(completed_event(f"{run_id}:{i}:done", tool, args, tool_call_id=f"c{i}", result=result, **common))
    return events


def by_run(verdicts):
    out = defaultdict(list)
    for v in verdicts:
        out[v.run_id or v.session_key].append(v)
    return dict(out)


async def verdicts_for(lw, expected_ids, *, timeout=60.0, settle=0.5):
    """All verdict records, read until every expected id has arrived."""
    return await collect_verdicts(lw.broker, lw.names.verdicts, expected_ids, timeout=timeout, settle=settle)


def assert_same_per_run(records, expected):
    """Kafka's verdicts equal the engine's, run by run, in order, and nothing else arrived."""
    got = by_run(decode_verdict(r.value) for r in records)
    want = by_run(expected)
    assert set(got) == set(want)
    for run, verdicts in want.items():
        assert got[run] == verdicts, f"verdicts differ for {run}"


# -- (a) every detector through Kafka ------------------------------------------------------------


async def test_every_detector_end_to_end(lw):
    worker = lw.worker(config=config_file(lw)).start()
    worker.wait_ready()
    events = repeat_calls("generic-21")
    for kind in (
        "polling_loop",
        "ping_pong",
        "generic_repeat",
        "unknown_tool",
        "post_compaction",
        "healthy",
        "send_loop",
    ):
        events += list(run_events(kind, f"{kind}-run", gate=True, length=32, start_ms=int(time.time() * 1000)))
    expected = reference_verdicts(events, ENABLED)
    await produce(lw.broker, lw.names.tool_calls, encode_all(events))
    records = await verdicts_for(lw, [v.verdict_id for v in expected])

    assert_same_per_run(records, expected)
    by_id, duplicates, _ = dedupe(records)
    assert duplicates == 0
    # The headline case: the 21st identical read is blocked, generic_repeat count 20.
    block = by_id["generic-21:20:req/decision"]
    assert (block.action, block.level, block.detector, block.count) == ("block", "critical", "generic_repeat", 20)
    assert all(by_id[f"generic-21:{i}:req/decision"].action != "block" for i in range(20))
    detectors = {(v.detector, v.action if isinstance(v, Decision) else "abort") for v in by_id.values()}
    for seen in [
        ("known_poll_no_progress", "block"),
        ("ping_pong", "block"),
        ("generic_repeat", "block"),
        ("unknown_tool_repeat", "block"),
        ("compaction_loop_persisted", "abort"),
    ]:
        assert seen in detectors, f"{seen} never fired"
    # verdicts are keyed by the state key and co-partitioned with the events that caused them
    for r in records:
        v = decode_verdict(r.value)
        assert r.key == f"run:{v.run_id}".encode()
        assert r.partition == (murmur2(v.run_id.encode()) & 0x7FFFFFFF) % 4  # the runner's partition
    assert worker.metric("loopwatch_events_consumed_total") == len(events)
    assert worker.metric("loopwatch_decision_latency_seconds_count") > 0
    assert worker.metric("loopwatch_ready") == 1


# -- (b) kill -9 mid-stream: state comes back from the changelog ---------------------------------


def fleet(n_runs: int, seed: int, *, length: int = 40, gate=True):
    """Interleaved runs of every kind, as many runners publishing at once."""
    rng = random.Random(seed)
    kinds = ("generic_repeat", "ping_pong", "polling_loop", "unknown_tool", "post_compaction", "healthy")
    streams = [
        list(run_events(kinds[i % len(kinds)], f"run-{seed}-{i}", gate=gate, length=length, seed=seed, end=i % 3 == 0))
        for i in range(n_runs)
    ]
    events = []
    while streams:
        s = rng.choice(streams)
        events.append(s.pop(0))
        if not s:
            streams.remove(s)
    return events


async def committed_beyond(lw, n: int, timeout: float = 60.0) -> int:
    """Wait until the group has committed more than ``n`` records of tool-calls (a checkpoint
    covered them); returns how many it has committed."""
    deadline = time.monotonic() + timeout
    while (done := sum((await committed_offsets(lw.broker, lw.names.app_id, lw.names.tool_calls)).values())) <= n:
        assert time.monotonic() < deadline, f"only {done} records committed, waiting for more than {n}"
        await asyncio.sleep(0.1)
    return done


async def changelog_records(lw) -> int:
    return sum((await end_offsets(lw.broker, lw.names.changelog)).values())


async def test_kill9_and_restart_recovers_state_from_the_changelog(lw):
    """kill -9 at three points, each after a checkpoint was written: idle, mid-stream, and
    mid-stream on a worker that started with an empty data directory.  The restarted workers
    start from the committed offsets, never from 0, and process only what came after them:
    their verdicts can only be right if the runs' state came back from RocksDB and the
    changelog.  Every verdict must equal the engine's, and a verdict published twice must be
    the same both times."""
    config = config_file(lw)
    events = fleet(120, seed=7)
    expected = reference_verdicts(events, ENABLED)
    payload = encode_all(events)
    q = len(payload) // 4
    parts = [payload[:q], payload[q : 2 * q], payload[2 * q : 3 * q], payload[3 * q :]]
    consumed = "loopwatch_events_consumed_total"
    # Checkpoints every second, so that one falls within each quarter's streaming (~3 s).
    env = {"LOOPWATCH_CHECKPOINT_S": "1"}
    worker = lw.worker(config=config, env=env).start()
    worker.wait_ready()

    # 1. Idle after a checkpoint: the first quarter is processed and committed.
    await produce(lw.broker, lw.names.tool_calls, parts[0])
    assert await committed_beyond(lw, len(parts[0]) - 1) == len(parts[0])
    assert worker.metric(consumed) == len(parts[0]) and await changelog_records(lw) > 0
    worker.kill()
    worker.start()
    worker.wait_ready(60)

    # 2. Mid-stream: the second quarter streams in; once a checkpoint has committed part of
    # it, kill -9 while the rest is still coming.
    producing = asyncio.create_task(produce(lw.broker, lw.names.tool_calls, parts[1], rate=800))
    committed = await committed_beyond(lw, len(parts[0]))
    assert not producing.done(), "the quarter was produced before a checkpoint: kill earlier"
    before_kill = worker.metric(consumed)
    worker.kill()
    assert 0 < before_kill <= len(parts[1]), "the restarted worker processed the first quarter again"
    await producing

    # 3. A worker with an empty data directory: the state can only come from the changelog.
    fresh = lw.worker(label="fresh", config=config, env=env).start()
    fresh.wait_ready(90)
    producing = asyncio.create_task(produce(lw.broker, lw.names.tool_calls, parts[2], rate=800))
    done_before = len(parts[0]) + len(parts[1])
    await committed_beyond(lw, done_before)
    assert not producing.done(), "the quarter was produced before a checkpoint: kill earlier"
    before_kill = fresh.metric(consumed)
    fresh.kill()
    assert 0 < before_kill <= len(parts[1]) + len(parts[2]) - (committed - len(parts[0])), (
        "the fresh worker processed records before the committed offsets again"
    )
    await producing
    fresh.start()
    fresh.wait_ready(90)
    await produce(lw.broker, lw.names.tool_calls, parts[3])

    records = await verdicts_for(lw, [v.verdict_id for v in expected], timeout=90, settle=1.0)
    duplicates, differing = assert_same_verdicts(records, expected)
    assert differing == 0, f"{differing} verdicts published twice with different content"
    print(f"kill -9 x3: {len(records)} verdict records, {duplicates} duplicates, {len(expected)} expected")


async def test_graceful_stop_mid_stream_loses_and_repeats_nothing(lw):
    """SIGTERM while a backlog is being processed: the shutdown checkpoint makes everything
    processed durable and acked, so the restarted worker repeats nothing and misses nothing."""
    config = config_file(lw)
    events = fleet(300, seed=5, length=60)
    expected = reference_verdicts(events, ENABLED)
    worker = lw.worker(config=config).start()
    worker.wait_ready()
    await produce(lw.broker, lw.names.tool_calls, encode_all(events))
    deadline = time.monotonic() + 30
    while worker.metric("loopwatch_events_consumed_total") < len(events) // 4:
        assert time.monotonic() < deadline, "the worker never got going"
        await asyncio.sleep(0.05)
    assert worker.stop() == 0
    worker.start()
    worker.wait_ready(90)
    records = await verdicts_for(lw, [v.verdict_id for v in expected], timeout=90, settle=1.0)
    duplicates, differing = assert_same_verdicts(records, expected)
    assert differing == 0
    assert duplicates == 0, f"{duplicates} verdicts published twice after a graceful stop"
    # Every record is committed once the worker has caught up (acks are per-partition
    # watermarks, streams.app.faust_adapter): nothing would be processed again after a restart.
    deadline = time.monotonic() + 30
    while any((lag := await group_lag(lw.broker, lw.names.app_id, lw.names.tool_calls)).values()):
        assert time.monotonic() < deadline, f"offsets not committed up to the end: {lag}"
        await asyncio.sleep(0.5)


# -- (c) two workers in one group: partitions move, no state is lost -----------------------------


async def test_two_workers_rebalance_without_losing_state(lw):
    config = config_file(lw)
    events = fleet(80, seed=11)
    expected = reference_verdicts(events, ENABLED)
    payload = encode_all(events)
    quarter = len(payload) // 4
    a = lw.worker(label="a", config=config).start()
    a.wait_ready()
    await produce(lw.broker, lw.names.tool_calls, payload[:quarter])
    b = lw.worker(label="b", config=config).start()
    b.wait_ready(90)
    await produce(lw.broker, lw.names.tool_calls, payload[quarter : 2 * quarter])
    b.kill()  # a crash: its partitions move back to a once its session times out
    await produce(lw.broker, lw.names.tool_calls, payload[2 * quarter : 3 * quarter])
    b.start()
    b.wait_ready(90)
    await produce(lw.broker, lw.names.tool_calls, payload[3 * quarter :])

    records = await verdicts_for(lw, [v.verdict_id for v in expected], timeout=90, settle=1.0)
    duplicates, differing = assert_same_verdicts(records, expected)
    assert differing == 0, f"{differing} verdicts published twice with different content"
    # both workers did real work, i.e. partitions (and their run state) moved between them
    assert a.metric("loopwatch_events_consumed_total") > 0
    assert b.metric("loopwatch_events_consumed_total") > 0
    assert "Executing _on_partitions_assigned" in b.log_text()
    # every verdict names its publisher (group.instance.id: the instance id and a digest) and
    # the generation it was decided in; both workers published, a alone in an earlier generation
    # than b's join (b's restart, a static member's rejoin within its session, keeps the generation)
    publishers: dict[str, set[int]] = {}
    for r in records:
        worker, generation = header(r, "loopwatch.worker"), header(r, "loopwatch.generation")
        assert worker is not None and generation is not None and int(generation) >= 1, (worker, generation)
        publishers.setdefault(worker.rsplit("-", 1)[0], set()).add(int(generation))
    assert set(publishers) == {f"{lw.names.app_id}-a", f"{lw.names.app_id}-b"}, publishers
    a_gens, b_gens = publishers[f"{lw.names.app_id}-a"], publishers[f"{lw.names.app_id}-b"]
    assert min(a_gens) < min(b_gens), publishers
    print(f"rebalance: {len(records)} verdict records, {duplicates} duplicates ({differing} differing)")


# -- (d) hostile input --------------------------------------------------------------------------


def hostile_records():
    ok_hash = "read:" + "0" * 64
    bad = [
        (b"run-x", b"{this is not json", "invalid_json"),
        (b"run-x", b"\xff\xfe\x00garbage", "invalid_json"),
        (
            b"run-x",
            json.dumps(
                {"type": "tool_call.requested", "event_id": 7, "run_id": "x", "tool_name": "read", "args_hash": ok_hash}
            ).encode(),
            "invalid_event",
        ),
        (
            b"run-x",
            json.dumps(
                {
                    "type": "tool_call.requested",
                    "event_id": "e",
                    "run_id": "x",
                    "tool_name": "read",
                    "args_hash": ok_hash,
                    "gate": "yes",
                }
            ).encode(),
            "invalid_event",
        ),
        (
            b"run-x",
            json.dumps(
                {
                    "type": "tool_call.requested",
                    "event_id": "e",
                    "run_id": "x",
                    "tool_name": "read",
                    "args_hash": "nothex",
                }
            ).encode(),
            "invalid_event",
        ),
        (b"run-x", json.dumps({"type": "tool_call.exploded", "event_id": "e", "run_id": "x"}).encode(), "unknown_type"),
        (b"run-x", json.dumps({"event_id": "e", "run_id": "x"}).encode(), "unknown_type"),
        (
            b"run-x",
            json.dumps(
                {"type": "run.ended", "event_id": "e", "run_id": "x", "reason": "y" * (MAX_EVENT_BYTES + 10)}
            ).encode(),
            "oversized",
        ),
        (b"run-x", b"x" * (300 * 1024), "oversized"),
        (None, json.dumps({"type": "run.ended", "event_id": "e"}).encode(), "missing_key"),
        (b"", json.dumps({"type": "compaction.retried", "event_id": "e", "run_id": ""}).encode(), "missing_key"),
        (b"run-x", b"[]", "invalid_event"),
        (b"run-x", b"null", "invalid_event"),
        # Valid events keyed otherwise than their run: they would land on a partition where
        # the run's history is not, and its loop would never be seen.
        (
            None,
            json.dumps(
                {
                    "type": "tool_call.requested",
                    "event_id": "nokey",
                    "run_id": "run-x",
                    "session_key": "s",
                    "tool_name": "read",
                    "args_hash": ok_hash,
                }
            ).encode(),
            "missing_key",
        ),
        (
            b"3f9c1e",
            json.dumps(
                {
                    "type": "tool_call.requested",
                    "event_id": "randomkey",
                    "run_id": "run-x",
                    "session_key": "s",
                    "tool_name": "read",
                    "args_hash": ok_hash,
                }
            ).encode(),
            "key_mismatch",
        ),
    ]
    return bad


async def test_hostile_input_is_dead_lettered_and_good_records_answered(lw):
    worker = lw.worker(config=config_file(lw)).start()
    worker.wait_ready()
    bad = hostile_records()
    now = int(time.time() * 1000)
    good = [
        requested_event(
            f"flood-{i}", "read", {"path": f"/f/{i}"}, run_id=f"flood-{i}", session_key=f"s-{i}", gate=True, ts_ms=now
        )
        for i in range(5000)
    ]
    good_records = encode_all(good)
    mixed: list = []
    for i, rec in enumerate(good_records):
        if i % 300 == 0 and i // 300 < len(bad):
            key, value, _ = bad[i // 300]
            mixed.append((key, value))
        mixed.append(rec)
    assert len(mixed) == len(good) + len(bad)
    await produce(lw.broker, lw.names.tool_calls, mixed)

    verdicts = await verdicts_for(lw, [f"flood-{i}/decision" for i in range(5000)], timeout=90)
    assert {decode_verdict(r.value).verdict_id for r in verdicts} == {f"flood-{i}/decision" for i in range(5000)}
    dead = await collect(lw.broker, lw.names.dead_letters, until=lambda rs: len(rs) >= len(bad), timeout=60)
    assert len(dead) == len(bad)
    reasons = sorted(header(r, "loopwatch.reason") for r in dead)
    assert reasons == sorted(reason for _, _, reason in bad)
    by_value = {bytes(r.value or b""): r for r in dead}
    for key, value, reason in bad:
        r = by_value[value]
        assert header(r, "loopwatch.reason") == reason
        assert header(r, "loopwatch.detail")
        assert header(r, "loopwatch.source.topic") == lw.names.tool_calls
        assert int(header(r, "loopwatch.source.offset")) >= 0
        assert header(r, "loopwatch.source.partition") is not None
        assert r.key == key
    assert worker.running and worker.http("/healthz")[0] == 200
    for _, _, reason in bad:
        assert worker.metric("loopwatch_dead_letters_total", reason=reason) >= 1
    assert worker.metric("loopwatch_runs_tracked") >= 5000 or worker.metric("loopwatch_events_consumed_total") == 5000


# -- (e) config hot reload ----------------------------------------------------------------------


async def test_config_hot_reload_changes_behaviour_without_restart(lw):
    path = config_file(lw)
    worker = lw.worker(config=path, env={"LOOPWATCH_CONFIG_POLL_S": "0.3"}).start()
    worker.wait_ready()

    sent = {}

    async def run(run_id):
        sent[run_id] = events = repeat_calls(run_id)
        await produce(lw.broker, lw.names.tool_calls, encode_all(events))
        records = await verdicts_for(lw, [f"{run_id}:20:req/decision"])
        return {decode_verdict(r.value).verdict_id: decode_verdict(r.value) for r in records}

    def expect(run_id, config):
        return {v.verdict_id: v for v in reference_verdicts(sent[run_id], config)}

    def mine(got, run_id):
        return {k: v for k, v in got.items() if k.startswith(f"{run_id}:")}

    first = await run("before")
    assert first["before:20:req/decision"].action == "block"
    assert mine(first, "before") == expect("before", ENABLED)

    # Stricter thresholds: critical at 12 identical calls.
    strict = {"tools": {"loopDetection": {"enabled": True, "warningThreshold": 5, "criticalThreshold": 12}}}
    write_config(path, strict)
    await wait_for_log(worker, "config reloaded")
    got = await run("strict")
    assert got["strict:12:req/decision"].action == "block"
    assert got["strict:12:req/decision"].count == 12
    assert mine(got, "strict") == expect("strict", strict)

    # An invalid file is refused; the stricter config stays in force.
    path.write_text('{"tools": {"loopDetection": {"enabled": true, "warningThreshold": 30, "criticalThreshold": 20}}}')
    await wait_for_log(worker, "refused new config")
    got = await run("still")
    assert mine(got, "still") == expect("still", strict)

    # So is an empty file (what a half-written one looks like): it would turn detection off.
    path.write_text("")
    await wait_for_log(worker, "holds no configuration")
    got = await run("empty")
    assert mine(got, "empty") == expect("empty", strict)
    assert worker.metric("loopwatch_config_file_refused") == 1
    assert worker.metric("loopwatch_config_reloads_total", result="refused") == 2
    assert worker.metric("loopwatch_config_reloads_total", result="applied") == 1

    # Detection off: nothing is blocked any more.
    off = {"tools": {"loopDetection": {"enabled": False}}}
    write_config(path, off)
    await wait_for_log(worker, "config reloaded", count=2)
    got = await run("off")
    assert mine(got, "off") == expect("off", off)
    assert all(v.action == "allow" for v in mine(got, "off").values())
    assert worker.metric("loopwatch_config_file_refused") == 0
    assert worker.metric("loopwatch_config_reloads_total", result="applied") == 2
    assert worker.running


def assert_same_verdicts(records, expected) -> tuple[int, int]:
    """After dropping duplicates by id, the verdicts are exactly ``expected``; returns
    (duplicates, duplicates that differed from the first copy)."""
    by_id, duplicates, differing = dedupe(records)
    assert set(by_id) == {v.verdict_id for v in expected}
    for v in expected:
        assert by_id[v.verdict_id] == v, f"{v.verdict_id}: {by_id[v.verdict_id]} != {v}"
    return duplicates, differing


async def wait_for_log(worker, text, *, count=1, timeout=20.0):
    deadline = time.monotonic() + timeout
    while worker.log_text().count(text) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} x{count} not in the worker log:\n{worker.log_tail()}")
        await asyncio.sleep(0.1)


# -- idle expiry and run.ended --------------------------------------------------------------------


async def test_idle_runs_expire_and_ended_runs_are_freed(lw):
    worker = lw.worker(config=config_file(lw), env={"LOOPWATCH_IDLE_TIMEOUT_S": "2"}).start()
    worker.wait_ready()
    idle = repeat_calls("idle", 15)
    ended = repeat_calls("ended", 15)
    end = [run_ended_event("ended:end", run_id="ended", session_key="agent:main:ended", agent_id="main")]
    # A run stamped in the year 9999: its runner's clock must not keep it alive.
    future = [msgspec.structs.replace(e, ts_ms=253402300799999) for e in repeat_calls("future", 3)]
    await produce(lw.broker, lw.names.tool_calls, encode_all(idle + ended + end + future))
    await verdicts_for(lw, ["idle:14:req/decision", "ended:14:req/decision", "future:2:req/decision"])
    # The idle runs are counted once their first checkpoint stored them (the ended one never is) ...
    deadline = time.monotonic() + 20
    while worker.metric("loopwatch_runs_tracked") != 2:
        assert time.monotonic() < deadline, "the idle runs were never stored"
        await asyncio.sleep(0.1)
    # ... and expire two seconds after their last event.
    while worker.metric("loopwatch_runs_tracked") != 0:
        assert time.monotonic() < deadline, "idle runs were never expired"
        await asyncio.sleep(0.3)
    # Logged by the sweeps that deleted them, in one line or (under load, the two runs stored by
    # different checkpoints) in two; log lines are flushed twice a second.
    deadline = time.monotonic() + 20
    while sum(map(int, re.findall(r"expired (\d+) idle runs", worker.log_text()))) != 2:
        assert time.monotonic() < deadline, f"no log line for the 2 expired runs:\n{worker.log_tail()}"
        await asyncio.sleep(0.1)
    # Both runs start afresh: 6 more identical calls do not reach the critical threshold.
    more = repeat_calls("idle", 6, start=15) + repeat_calls("ended", 6, start=15)
    await produce(lw.broker, lw.names.tool_calls, encode_all(more))
    records = await verdicts_for(lw, ["idle:20:req/decision", "ended:20:req/decision"])
    by_id = {decode_verdict(r.value).verdict_id: decode_verdict(r.value) for r in records}
    assert by_id["idle:20:req/decision"].action == "allow"
    assert by_id["ended:20:req/decision"].action == "allow"


async def test_an_agent_over_its_run_cap_loses_its_longest_idle_runs_and_another_agent_none(lw):
    """Cap 40 runs per agent.  Agent flood opens 120 runs (40 first, then 80 a few seconds
    later), agent quiet 5: the sweeps delete 80 of flood's runs, its first 40 (the longest
    idle) among them, and none of quiet's; nothing is idle for the 30 s timeout."""
    env = {"LOOPWATCH_MAX_RUNS_PER_AGENT": "40", "LOOPWATCH_IDLE_TIMEOUT_S": "30"}  # a sweep every 3 s
    worker = lw.worker(config=config_file(lw), env=env).start()
    worker.wait_ready()
    now = int(time.time() * 1000)

    def runs(agent: str, first: int, n: int):
        return [
            requested_event(
                f"{agent}-{i}", "read", {"i": i}, run_id=f"{agent}-{i}", session_key=f"s-{agent}-{i}",
                agent_id=agent, gate=True, ts_ms=now,
            )
            for i in range(first, first + n)
        ]  # fmt: skip

    await produce(lw.broker, lw.names.tool_calls, encode_all(runs("flood", 0, 40) + runs("quiet", 0, 5)))
    await verdicts_for(lw, ["flood-39/decision", "quiet-4/decision"])
    await asyncio.sleep(4)  # the first 40 are now seconds older than the rest
    await produce(lw.broker, lw.names.tool_calls, encode_all(runs("flood", 40, 80)))
    await verdicts_for(lw, ["flood-119/decision"])
    deadline = time.monotonic() + 30
    while worker.metric("loopwatch_runs_evicted_total") < 80 or worker.metric("loopwatch_runs_tracked") != 45:
        assert time.monotonic() < deadline, (
            worker.metric("loopwatch_runs_evicted_total"),
            worker.metric("loopwatch_runs_tracked"),
        )
        await asyncio.sleep(0.5)
    assert worker.metric("loopwatch_runs_evicted_total") == 80
    await wait_for_log(worker, "over LOOPWATCH_MAX_RUNS_PER_AGENT=40")
    # The deletions went through the changelog (tombstones, so a restore does not bring them
    # back): flood's first 40, the longest idle, among them, and none of quiet's.
    changelog = await collect(lw.broker, lw.names.changelog, until=lambda rs: sum(r.value is None for r in rs) >= 80)
    deleted = {r.key.decode() for r in changelog if r.value is None}
    assert len(deleted) == 80 and all(key.startswith("run:flood-") for key in deleted)
    assert {f"run:flood-{i}" for i in range(40)} <= deleted
