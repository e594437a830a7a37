"""``loopwatch backtest --topic`` over signed events on the real broker: with the worker's keys
(``--signing-keys``, the worker's flag) every record is verified as the worker verifies it, and
the two that fail (a value changed after signing, an event signed with agent main's key that
names agent other) are counted ``bad_signature``, in one process and in two; without keys the
backtest says in one line that the signatures went unchecked.

Hand-worked: 3 runs of 5 calls, each a requested and a completed event, then ``run.ended``:
33 events, all signed; with the 2 bad records, 35 records."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import pytest

from harness import REPO
from schemas import encode_event
from schemas.keys import record_key
from schemas.signing import SigningKey
from streams.edge.events import completed_event, requested_event, run_ended_event
from tests.integration.test_backtest_kafka import fleet_topic

pytestmark = pytest.mark.kafka

SECRET = b"backtest-signing-test-key-0123456789"
MAIN = SigningKey("main-1", "main", SECRET)


def signed_fleet(tag: str) -> list[tuple[bytes, bytes, list]]:
    records = []
    for r in range(3):
        run = f"{tag}-run-{r}"
        ids = {"run_id": run, "session_key": f"agent:main:{run}", "agent_id": "main"}
        events = []
        for i in range(5):
            events.append(requested_event(f"{run}:{i}", "read", {"path": "/same"}, ts_ms=1000 * i + 1, **ids))
            events.append(
                completed_event(f"{run}:{i}r", "read", {"path": "/same"}, result="x", ts_ms=1000 * i + 2, **ids)
            )
        events.append(run_ended_event(f"{run}:end", "completed", ts_ms=9000, **ids))
        for event in events:
            value = encode_event(event)
            records.append((record_key(event).encode(), value, MAIN.headers(value)))
    # a value changed after it was signed (the headers are the original's)
    key, value, headers = records[0]
    records.append((key, value.replace(b':0"', b':0-changed"', 1), headers))
    # signed with main's key, naming another agent
    run = f"{tag}-run-0"
    event = requested_event(f"{run}:x", "read", {}, run_id=run, session_key=f"agent:main:{run}", agent_id="other")
    other = encode_event(event)
    records.append((record_key(event).encode(), other, MAIN.headers(other)))
    return records


def backtest(lw, *args: object) -> subprocess.CompletedProcess[str]:
    config = lw.tmp / "enabled.json"
    config.write_text(json.dumps({"tools": {"loopDetection": {"enabled": True}}}))
    return subprocess.run(
        [sys.executable, "-m", "streams.cli", "backtest", "--bootstrap", lw.broker, "--topic", lw.names.tool_calls,
         "--baseline", config, "--candidate", config, "--json", *map(str, args)],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip


async def test_a_backtest_verifies_signed_events_with_the_workers_keys_and_says_so_without(lw):
    await fleet_topic(lw, signed_fleet(lw.names.tag))
    keys = lw.tmp / "keys.json"
    keys.write_text(json.dumps({"key_id": "main-1", "agent_id": "main", "secret": base64.b64encode(SECRET).decode()}))

    for jobs in (1, 2):
        proc = backtest(lw, "--signing-keys", keys, "--jobs", jobs)
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        assert (report["records"], report["events"], report["dead_letters"]) == (35, 33, {"bad_signature": 2}), jobs
        assert "signatures checked with 1 keys: 33 of 35 records passed, 2 bad_signature" in proc.stderr
        assert "not checked" not in proc.stderr

    proc = backtest(lw)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["records"], report["events"], report["dead_letters"]) == (35, 35, {})
    said = [line for line in proc.stderr.splitlines() if "sign" in line]
    assert said == [
        "loopwatch backtest: 35 records are signed and their signatures were not checked: give --signing-keys "
        "(the worker's keys) to verify them as the worker does"
    ]


def test_signing_keys_on_files_is_one_line_naming_topic(tmp_path):
    events = tmp_path / "events.jsonl"
    events.write_text("")
    config = tmp_path / "c.json"
    config.write_text("{}")
    proc = subprocess.run(
        [sys.executable, "-m", "streams.cli", "backtest", events, "--baseline", config, "--candidate", config,
         "--signing-keys", tmp_path / "keys.json"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "loopwatch backtest: --signing-keys checks the signatures in a topic's record headers, which files do not "
        "hold: it needs --topic"
    ]
