"""``loopwatch backtest --bootstrap --topic`` on the real broker (issue 16): a recorded fleet is
produced to a topic as runners publish it, then backtested with two configs.

The small fleet is hand-worked (``harness.fleets.hand_worked_fleet``'s docstring), with the
records the worker dead-letters, including the two only a Kafka record can be wrong in (no
key, another run's key); the generated fleet is checked against the engine driven directly
(``harness.fleets.reference_report``).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from harness import REPO, encode_all, produce, wait_for_topic
from harness.cli import one_line_error
from harness.fleets import BAD_RECORDS, BASELINE, CANDIDATE, assert_matches_reference, hand_worked_fleet
from schemas import encode_event
from streams.edge.events import run_ended_event
from streams.engine import engine_for
from streams.offline.scenarios import fleet_trace

pytestmark = pytest.mark.kafka


async def fleet_topic(lw, records: list) -> None:
    """The recorded fleet on a new topic of 4 partitions, as runners published it."""
    admin = AIOKafkaAdminClient(bootstrap_servers=lw.broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(lw.names.tool_calls, 4, 1)])
    finally:
        await admin.close()
    await wait_for_topic(lw.broker, lw.names.tool_calls)
    await produce(lw.broker, lw.names.tool_calls, records)


def backtest(lw, *args: object) -> subprocess.CompletedProcess[str]:
    base, cand = lw.tmp / "baseline.json", lw.tmp / "candidate.json"
    base.write_text(json.dumps(BASELINE))
    cand.write_text(json.dumps(CANDIDATE))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "streams.cli",
            "backtest",
            "--bootstrap",
            lw.broker,
            "--baseline",
            base,
            "--candidate",
            cand,
            *map(str, args),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


def report_of(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


async def test_a_hand_worked_fleet_read_from_the_topic(lw):
    events, retry = hand_worked_fleet()
    records = encode_all(events[:30]) + encode_all([retry]) + encode_all(events[30:])
    stray = run_ended_event("stray", reason="completed", run_id="e", session_key="agent:main:e", agent_id="main")
    records += [(b"k", value) for value in BAD_RECORDS.values()]
    records += [(None, encode_event(stray)), (b"not-e", encode_event(stray))]  # no key; another run's key
    await fleet_topic(lw, records)
    report = report_of(backtest(lw, "--topic", lw.names.tool_calls, "--json"))
    assert (report["records"], report["events"], report["runs"], report["duplicates"]) == (90, 83, 4, 1)
    assert report["dead_letters"] == {
        "invalid_json": 1,
        "key_mismatch": 1,
        "missing_key": 2,
        "oversized": 1,
        "unsupported_version": 1,
    }
    assert report["verdicts"] == {
        "baseline": {"warn": 1, "block": 1, "abort": 1},
        "candidate": {"warn": 0, "block": 15, "abort": 1},
    }
    assert report["outcomes"] == {
        "baseline": {"none": 2, "warn": 0, "block": 1, "abort": 1},
        "candidate": {"none": 1, "warn": 0, "block": 2, "abort": 1},
    }
    [changed] = report["changed_runs"]
    first = changed["first_disagreement"]
    assert (changed["run"], changed["baseline"], changed["candidate"], first["event_id"]) == (
        "run:a",
        "none",
        "block",
        "a:9",
    )
    assert first["at"].startswith(f"{lw.names.tool_calls}[")  # topic[partition]@offset
    assert report["runs_disagreeing"] == 2
    fp = report["likely_false_positives"]
    assert (fp["baseline"]["blocks"], fp["candidate"]["blocks"], fp["candidate"]["runs"]) == (0, 2, ["run:a"])


async def test_a_generated_fleet_matches_the_engine_driven_directly(lw):
    events, _kinds = fleet_trace(200, 15, seed=5, engine=engine_for(BASELINE), end=True, run_prefix=lw.names.tag)
    await fleet_topic(lw, encode_all(events))
    report = report_of(backtest(lw, "--topic", lw.names.tool_calls, "--json"))
    assert assert_matches_reference(report, events, BASELINE, CANDIDATE)
    assert (report["events"], report["runs"], report["dead_letters"]) == (len(events), 200, {})


async def test_ranges_by_offset_and_by_time(lw):
    events, _retry = hand_worked_fleet()
    await fleet_topic(lw, encode_all(events))
    produced_at = int(time.time() * 1000)
    # offsets 0 to 0 of every partition: nothing
    one_line_error(
        backtest(lw, "--topic", lw.names.tool_calls, "--to-offset", "0"),
        1,
        "the range holds no events",
        f"topic {lw.names.tool_calls}, offsets beginning to 0",
    )
    # from the first offset of every partition to the end: the whole fleet
    whole = report_of(backtest(lw, "--topic", lw.names.tool_calls, "--from-offset", "0", "--json"))
    assert (whole["events"], whole["runs"]) == (83, 4)
    # by time: everything was produced before now, nothing after it
    await asyncio.sleep(0.05)
    since = report_of(backtest(lw, "--topic", lw.names.tool_calls, "--until", str(int(time.time() * 1000)), "--json"))
    assert since["events"] == 83
    one_line_error(
        backtest(lw, "--topic", lw.names.tool_calls, "--since", str(produced_at + 60_000)),
        1,
        "the range holds no events",
    )
    one_line_error(backtest(lw, "--topic", f"{lw.names.app_id}-no-such-topic", "--timeout", "5"), 2, "does not exist")
