"""The runner client (``streams.client``) against the real broker and a real worker.

Expected decisions are hand-worked from the spec's defaults (§2: warningThreshold 10,
criticalThreshold 20; §3: warnings are emitted when count // 10 reaches a new bucket; §4: the
post-compaction guard's window of 3): the same call with the same result, over and over,
warns at the 11th call (10 identical calls before it) and is blocked from the 21st on; after
a compaction, 3 identical calls with identical results end the run.
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import subprocess
import sys
import time
import warnings
from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from harness import REPO, collect, free_port
from schemas.keys import verdict_partitions
from schemas.verdicts import decode_verdict
from streams.client import (
    LoopBlocked,
    LoopwatchClient,
    LoopwatchUnavailable,
    NoDecisionError,
    PostCompactionLoopPersistedError,
    RunAbortedError,
)

pytestmark = pytest.mark.kafka

CONFIG = {"tools": {"loopDetection": {"enabled": True}}}
SAME = {"content": [{"type": "text", "text": "same page"}]}
WAIT_S = 60.0


@pytest.fixture(scope="module")
def worker(lw_module):
    lw_module.configured_worker(CONFIG)
    return lw_module


async def eventually(check, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.05)


async def same_call(run, n: int, *, gate_result=True):
    """One identical read: before, then after with the same result (unless blocked)."""
    try:
        decision = await run.before_tool_call("read", {"path": "/same"}, tool_call_id=f"c{n}")
    except LoopBlocked as blocked:
        await run.after_tool_call("read", {"path": "/same"}, tool_call_id=f"c{n}")  # the loop's own veto
        return blocked.decision
    await run.after_tool_call("read", {"path": "/same"}, tool_call_id=f"c{n}", result=SAME)
    return decision


# -- gate ------------------------------------------------------------------------------------------


async def test_gate_allows_warns_at_the_11th_identical_call_and_blocks_from_the_21st(worker):
    async with worker.client(mode="gate") as client:
        run = client.run(f"{worker.names.tag}-gate", session_key="agent:main:gate", agent_id="main")
        decisions = [await same_call(run, n) for n in range(23)]
    assert all(d is not None for d in decisions), "gate mode gets a decision for every call"
    assert [d.action for d in decisions[:10]] == ["allow"] * 10
    assert (decisions[10].action, decisions[10].detector, decisions[10].count) == ("warn", "generic_repeat", 10)
    assert [d.action for d in decisions[11:20]] == ["allow"] * 9  # warnings 11..19 hidden by the bucket rule
    assert [(d.action, d.count) for d in decisions[20:]] == [("block", 20)] * 3  # vetoed calls are not recorded
    assert run.warnings == [decisions[10]] and run.blocked == decisions[20:]


async def test_gate_with_raise_on_block_false_returns_the_block(worker):
    async with worker.client(mode="gate", raise_on_block=False) as client:
        run = client.run(f"{worker.names.tag}-noraise", session_key="agent:main:noraise")
        decisions = [await same_call(run, n) for n in range(21)]
    assert (
        decisions[20].action == "block" and decisions[20].notify_model and decisions[20].message.startswith("CRITICAL")
    )


# -- advisory --------------------------------------------------------------------------------------


async def test_advisory_never_waits_and_collects_warnings_and_blocks(worker):
    async with worker.client(mode="advisory") as client:
        run = client.run(f"{worker.names.tag}-advisory", session_key="agent:main:advisory")
        for n in range(21):
            assert await run.before_tool_call("read", {"path": "/same"}, tool_call_id=f"c{n}") is None
            await run.after_tool_call("read", {"path": "/same"}, tool_call_id=f"c{n}", result=SAME)
        await eventually(lambda: run.blocked, "the block of the 21st call")
        assert [(d.action, d.count) for d in run.warnings] == [("warn", 10)]
        assert [(d.action, d.detector, d.count) for d in run.blocked] == [("block", "generic_repeat", 20)]


# -- aborts ---------------------------------------------------------------------------------------


async def _loop_after_compaction(run):
    for n in range(2):
        await same_call(run, n)
    await run.compaction_retried()
    for n in range(2, 5):  # the guard's window: 3 identical (call, result) observations
        await same_call(run, n)


@pytest.mark.parametrize("mode", ["gate", "advisory"])
async def test_an_abort_reaches_the_runner_and_ends_the_run(worker, mode):
    async with worker.client(mode=mode) as client:
        run = client.run(f"{worker.names.tag}-abort-{mode}", session_key=f"agent:main:abort-{mode}")
        await _loop_after_compaction(run)
        await eventually(lambda: run.aborted is not None, "the run.aborted verdict")
        assert run.aborted.detector == "compaction_loop_persisted" and run.aborted.count == 3
        with pytest.raises(PostCompactionLoopPersistedError) as info:
            await run.before_tool_call("read", {"path": "/next"})
        assert isinstance(info.value, RunAbortedError) and info.value.tool_name == "read"


async def test_a_run_without_run_id_gets_its_verdicts_whatever_its_session_id(worker):
    """No run id: the run's state and its verdicts' key is the session's (spec §2.1: upstream keys
    session state by session key, by session id only without one).  The client used to wait on
    session:<key>|<id> while verdicts came for session:<key>|."""
    tag = worker.names.tag
    async with worker.client(mode="advisory") as client:
        run = client.run(None, session_key=f"agent:main:{tag}-norun", session_id="sess-1")
        assert run.key == f"session:agent:main:{tag}-norun|"
        await _loop_after_compaction(run)
        await eventually(lambda: run.aborted is not None, "the abort of a run without run id")
        assert run.aborted.run_id is None and run.aborted.session_key == f"agent:main:{tag}-norun"
        with pytest.raises(PostCompactionLoopPersistedError):
            await run.before_tool_call("read", {"path": "/next"})


async def test_a_session_id_only_run_gets_its_gate_decisions(worker):
    async with worker.client(mode="gate") as client:
        run = client.run(None, session_key=None, session_id=f"{worker.names.tag}-sess")
        assert run.key == f"session:|{worker.names.tag}-sess"
        decision = await run.before_tool_call("read", {"path": "/x"})
    # Upstream detects only with a session key (HOOK-D03): always allowed, but answered.
    assert decision is not None and decision.action == "allow"


# -- which verdict partitions a client reads ---------------------------------------------------------


def runs_by_partitions(tag: str, count: int) -> dict[frozenset[int], list[str]]:
    """Run ids (``<tag>-p<n>``, session ``agent:main:<run id>``) grouped by the verdict partitions
    they can be read on, with the worker's 4 and 4 partitions; ``count`` candidates."""
    groups: dict[frozenset[int], list[str]] = {}
    for n in range(count):
        run_id = f"{tag}-p{n}"
        fields = SimpleNamespace(run_id=run_id, session_key=f"agent:main:{run_id}", session_id=None)
        groups.setdefault(verdict_partitions(fields, 4, 4), []).append(run_id)
    return groups


async def test_a_client_reads_the_verdict_partitions_of_its_live_runs_only(worker):
    """Fail-closed gate mode: a decision on a partition the client did not read raises.  The
    partitions read are checked against where the worker really published each run's verdicts.
    The runs are picked so that their run key and session key fall on one partition."""
    tag = worker.names.tag
    single = [ids for parts, ids in runs_by_partitions(tag, 200).items() if len(parts) == 1]
    shared = next(ids for ids in single if len(ids) >= 2)  # two runs on one partition
    other = next(ids[0] for ids in single if ids is not shared)  # one on another
    async with worker.client(mode="gate", fail_closed=True, timeout=10.0) as client:
        assert client.reading == frozenset()  # no run has published
        first, second, third = (
            client.run(i, session_key=f"agent:main:{i}", agent_id="main") for i in (shared[0], shared[1], other)
        )
        assert client.reading == frozenset()  # nor yet: a run is read from its first event
        for n in range(3):
            for run in (first, second, third):
                assert (await same_call(run, n)).action == "allow"
        while_three = client.reading
        await first.end()
        after_one = client.reading
        await second.end()
        after_two = client.reading
        assert (await same_call(third, 3)).action == "allow"
        await third.end()
        assert client.reading == frozenset()
    ids = (shared[0], shared[1], other)
    records = await collect(
        worker.broker,
        worker.names.verdicts,
        until=lambda rs: sum(decode_verdict(r.value).run_id in ids for r in rs) >= 10,
    )
    where = {run_id: {r.partition for r in records if decode_verdict(r.value).run_id == run_id} for run_id in ids}
    assert where[shared[0]] == where[shared[1]] != where[other] and len(where[other]) == 1
    assert while_three == after_one == where[shared[0]] | where[other]  # 2 of the 4: the first's end kept the second's
    assert after_two == where[other]


def test_bench_verdict_readers_runs(kafka_broker):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.verdict_readers",
            "--broker",
            kafka_broker,
            "--readers",
            "2",
            "--partitions",
            "4",
            "--calls",
            "5",
            "--rounds",
            "2",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if "decision p50" in line}
    assert set(rows) == {"all", "runs"}, proc.stdout
    assert "partitions read per reader 4-4 " in rows["all"], proc.stdout  # every partition
    read = rows["runs"].split("partitions read per reader ")[1].split()[0]
    assert set(read.split("-")) <= {"1", "2"}, proc.stdout  # its run's one or two


# -- duplicates ------------------------------------------------------------------------------------


async def test_duplicate_verdicts_are_dropped(worker):
    run_id = f"{worker.names.tag}-dups"
    async with worker.client(mode="advisory") as client:
        run = client.run(run_id, session_key="agent:main:dups")
        for n in range(21):
            await run.before_tool_call("read", {"path": "/same"}, tool_call_id=f"c{n}")
            await run.after_tool_call("read", {"path": "/same"}, tool_call_id=f"c{n}", result=SAME)
        await eventually(lambda: run.blocked, "the block")
        # Kafka delivers at least once: deliver this run's verdicts again, as a redelivery would.
        records = await collect(
            worker.broker,
            worker.names.verdicts,
            until=lambda rs: sum(decode_verdict(r.value).run_id == run_id for r in rs) >= 2,
        )
        mine = [r for r in records if decode_verdict(r.value).run_id == run_id]
        assert len(mine) == 2  # the warning and the block
        before = client.duplicates_dropped
        producer = AIOKafkaProducer(bootstrap_servers=worker.broker)
        await producer.start()
        try:  # a redelivery: the same records, on their own partition
            for r in mine:
                await producer.send_and_wait(worker.names.verdicts, r.value, key=r.key, partition=r.partition)
        finally:
            await producer.stop()
        await eventually(lambda: client.duplicates_dropped == before + 2, "2 duplicates dropped")
        assert len(run.warnings) == 1 and len(run.blocked) == 1


# -- no decision: fail open or closed --------------------------------------------------------------


@pytest.fixture(scope="module")
def without_worker(kafka_broker, lw_module):
    """Topics nobody answers on (named under the module's app id, so they are deleted after)."""
    names = (f"{lw_module.names.app_id}-idle-calls", f"{lw_module.names.app_id}-idle-verdicts")

    async def create():
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(name, 2, 1) for name in names])
        finally:
            await admin.close()

    asyncio.run(create())
    return kafka_broker, names


async def test_no_decision_fails_open_after_the_timeout(without_worker):
    broker, (calls, verdicts) = without_worker
    async with LoopwatchClient(
        broker, mode="gate", timeout=0.5, tool_calls_topic=calls, verdicts_topic=verdicts
    ) as client:
        run = client.run("idle-open", session_key="agent:main:idle")
        assert await run.before_tool_call("read", {}) is None


async def test_no_decision_fails_closed_when_asked(without_worker):
    broker, (calls, verdicts) = without_worker
    async with LoopwatchClient(
        broker, mode="gate", timeout=0.5, fail_closed=True, tool_calls_topic=calls, verdicts_topic=verdicts
    ) as client:
        run = client.run("idle-closed", session_key="agent:main:idle")
        with pytest.raises(NoDecisionError, match="fail-closed"):
            await run.before_tool_call("read", {})


# -- the broker goes away ---------------------------------------------------------------------------


@pytest.fixture
def spare_broker(tmp_path):
    """A broker of this test's own (free ports, its own state dir), so stopping it disturbs no
    other test; stopped and wiped at the end whatever happens."""
    env = {
        **os.environ,
        "KAFKA_PORT": str(free_port()),
        "KAFKA_CONTROLLER_PORT": str(free_port()),
        "KAFKA_STATE_DIR": str(tmp_path / "kafka"),
    }
    script = str(REPO / "scripts" / "kafka.sh")
    log = tmp_path / "kafka.sh.log"
    # Output to a file: the broker it starts inherits it, and would hold a pipe open for ever.
    with open(log, "w") as out:
        started = subprocess.run([script, "start"], env=env, stdout=out, stderr=subprocess.STDOUT)
    assert started.returncode == 0, log.read_text()

    def stop() -> None:
        with open(log, "a") as out:
            subprocess.run([script, "stop", "--wipe"], env=env, stdout=out, stderr=subprocess.STDOUT)

    try:
        yield f"127.0.0.1:{env['KAFKA_PORT']}", stop
    finally:
        stop()
        shutil.rmtree(tmp_path / "kafka", ignore_errors=True)


async def test_with_the_broker_gone_gate_calls_end_within_the_timeout_and_stop_cleans_up(spare_broker):
    bootstrap, stop_broker = spare_broker
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic("tool-calls", 2, 1), NewTopic("loop-verdicts", 2, 1)])
    await admin.close()
    timeout = 1.0
    fail_open = LoopwatchClient(bootstrap, mode="gate", timeout=timeout, delivery_timeout=3.0)
    fail_closed = LoopwatchClient(bootstrap, mode="gate", timeout=timeout, fail_closed=True, delivery_timeout=3.0)
    advisory = LoopwatchClient(bootstrap, mode="advisory", timeout=timeout, delivery_timeout=3.0)
    for client in (fail_open, fail_closed, advisory):
        await client.start()
    stop_broker()

    # The bound is the configured timeout, with slack for a busy machine: before, these calls
    # hung for aiokafka's 40 s request timeout and raised NodeNotReadyError.
    started = time.monotonic()
    assert await fail_open.run("r-open", session_key="s").before_tool_call("read", {}) is None
    assert time.monotonic() - started < timeout + 5
    started = time.monotonic()
    with pytest.raises(NoDecisionError):
        await fail_closed.run("r-closed", session_key="s").before_tool_call("read", {})
    assert time.monotonic() - started < timeout + 5
    run = advisory.run("r-advisory", session_key="s")
    started = time.monotonic()
    assert await run.before_tool_call("read", {}) is None
    await run.after_tool_call("read", {}, result=SAME)
    await run.end("completed")
    assert time.monotonic() - started < 3 * timeout + 5

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for client in (fail_open, fail_closed, advisory):
            await client.stop()  # no CancelledError from aiokafka's fetcher
        del client, fail_open, fail_closed, advisory, run
        gc.collect()
    unclosed = [str(w.message) for w in caught if "Unclosed" in str(w.message)]
    assert unclosed == []


async def test_an_unreachable_broker_at_start_is_one_clear_error():
    client = LoopwatchClient(f"127.0.0.1:{free_port()}", start_timeout=3.0)
    with pytest.raises(LoopwatchUnavailable, match="cannot start on 127.0.0.1"):
        await client.start()


async def test_a_missing_verdicts_topic_at_start_is_named(kafka_broker):
    client = LoopwatchClient(
        kafka_broker, verdicts_topic="lwit-no-such-topic-4f1c", start_timeout=20.0, delivery_timeout=2.0
    )
    with pytest.raises(LoopwatchUnavailable, match="'lwit-no-such-topic-4f1c' does not exist"):
        await client.start()


async def test_enqueue_batch_delivers_every_event_once_and_a_runs_events_in_order(worker):
    """Thousands of events of many runs in one call, filling many record batches: each reaches
    ``tool-calls`` once, on its run's partition, in the order it was given."""
    from schemas.events import decode_event
    from schemas.keys import partition_for, record_key
    from streams.edge.events import requested_event

    events = [
        requested_event(
            f"batch-{n}", "read", {"path": f"/f{n}", "pad": "x" * 300}, run_id=f"run-{n % 7}", session_key="s"
        )
        for n in range(3_000)
    ]
    async with worker.client(mode="advisory") as client:
        await client.enqueue_batch(events)
    assert client.undelivered == 0

    def ours(records):  # the module's worker topic holds the other tests' events too
        found = ((r.partition, decode_event(r.value).event_id, r.key) for r in records)
        return [(p, e, k) for p, e, k in found if e.startswith("batch-")]

    records = await collect(
        worker.broker, worker.names.tool_calls, until=lambda rs: len(ours(rs)) >= len(events), timeout=WAIT_S, settle=1
    )
    got = ours(records)
    assert sorted(e for _, e, _ in got) == sorted(e.event_id for e in events)
    partitions = client._partition_counts[0]
    for partition, _, key in got:
        assert partition == partition_for(key, partitions)
    for run in range(7):
        ids = [e for p, e, k in got if k == record_key(events[run]).encode()]
        assert ids == [e.event_id for e in events if e.run_id == f"run-{run}"]
