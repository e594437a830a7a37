"""The worker's side of signed events without Kafka: the batch processor with a keyring
dead-letters what is not signed by the event's agent and processes the rest as before; the
keyring watcher swaps keys when the key files change (rotation) and keeps the running keys
when new ones do not load."""

from __future__ import annotations

import base64
import json
import logging

import msgspec
from prometheus_client import CollectorRegistry

from schemas import encode_event
from schemas.signing import Keyring, SigningKey
from streams.app.metrics import Metrics
from streams.app.processor import BatchProcessor
from streams.app.records import Record
from streams.app.reload import KeyringWatcher
from streams.edge.events import completed_event, requested_event
from streams.engine import engine_for

CONFIG = {"tools": {"loopDetection": {"enabled": True}}}
MAIN = SigningKey("main-1", "main", b"m" * 32)
MAIN_NEXT = SigningKey("main-2", "main", b"n" * 32)
BILLING = SigningKey("billing-1", "billing", b"b" * 32)


def loop_events(run_id: str, agent_id: str | None, n: int = 12):
    events = []
    for i in range(n):
        common = dict(run_id=run_id, session_key=f"s-{run_id}", agent_id=agent_id, ts_ms=1000 + i)
        events.append(requested_event(f"{run_id}-{i}q", "read", {"p": 1}, gate=True, **common))
        events.append(completed_event(f"{run_id}-{i}c", "read", {"p": 1}, result="same", **common))
    return events


def signed(events, key: SigningKey | None, start: int = 0, forged_key: SigningKey | None = None):
    """Records as a runner with ``key`` publishes them (``forged_key``: the headers claim
    ``key``'s id but the signature is made with another secret)."""
    out = []
    for i, event in enumerate(events):
        value = encode_event(event)
        headers = ()
        if key is not None:
            headers = key.headers(value)
            if forged_key is not None:
                headers = [
                    (headers[0][0], headers[0][1]),
                    ("loopwatch.signature", forged_key.signature(value).encode()),
                ]
        out.append(Record("tool-calls", 0, start + i, event.run_id.encode(), value, 1.0, headers))
    return out


def run(processor, records):
    return processor.process(records, lambda partition, key: None)


def test_with_a_keyring_only_events_signed_by_their_agent_are_applied():
    keyring = Keyring([MAIN, BILLING])
    metrics = Metrics(CollectorRegistry())
    p = BatchProcessor(engine_for(CONFIG), metrics, keyring=keyring)
    good = loop_events("good", "main")
    batch = (
        signed(good, MAIN)
        + signed(loop_events("unsigned", "main", 2), None, start=100)
        + signed(loop_events("as-billing", "billing", 2), MAIN, start=200)  # main's key, billing's events
        + signed(loop_events("forged", "main", 2), MAIN, start=300, forged_key=BILLING)
    )
    result = run(p, batch)
    # The signed run is processed exactly as without signing.
    plain = run(BatchProcessor(engine_for(CONFIG)), signed(good, None))
    assert [v.value for v in result.verdicts] == [v.value for v in plain.verdicts]
    assert any(v.verdict.action == "warn" for v in result.verdicts)
    assert result.events == len(good)
    by_run = {}
    for letter in result.dead_letters:
        by_run.setdefault(letter.record.key.decode(), []).append((letter.reason, letter.detail))
    assert by_run == {
        "unsigned": [("bad_signature", "unsigned: no loopwatch.signature header")] * 4,
        "as-billing": [("bad_signature", "key main-1 belongs to agent 'main', the event names agent 'billing'")] * 4,
        "forged": [("bad_signature", "the signature does not match the record (key main-1)")] * 4,
    }
    assert metrics.dead_letters.labels("bad_signature")._value.get() == 12


def test_without_a_keyring_signatures_are_ignored():
    p = BatchProcessor(engine_for(CONFIG))
    result = run(p, signed(loop_events("r", "main", 2), None) + signed(loop_events("s", "x", 2), MAIN, start=10))
    assert result.dead_letters == [] and result.events == 8


def test_a_rotated_key_is_accepted_next_to_the_old_one():
    p = BatchProcessor(engine_for(CONFIG), keyring=Keyring([MAIN, MAIN_NEXT]))
    events = loop_events("r", "main", 4)
    result = run(p, signed(events[:4], MAIN) + signed(events[4:], MAIN_NEXT, start=4))
    assert result.dead_letters == [] and result.events == 8


def key_file(path, *keys: SigningKey) -> None:
    path.write_text(
        json.dumps(
            [{"key_id": k.key_id, "agent_id": k.agent_id, "secret": base64.b64encode(k.secret).decode()} for k in keys]
        )
    )


def test_the_keyring_watcher_reloads_rotated_keys_and_keeps_them_on_a_bad_file(tmp_path, caplog):
    path = tmp_path / "keys.json"
    key_file(path, MAIN)
    swapped = []
    watcher = KeyringWatcher(path, swapped.append)
    first = watcher.load_initial()
    assert first.agents == {"main": ["main-1"]}
    assert watcher.poll() is False and swapped == []
    key_file(path, MAIN, MAIN_NEXT)  # rotation step 1: both keys
    assert watcher.poll() is True
    assert swapped[-1].agents == {"main": ["main-1", "main-2"]}
    path.write_text('{"key_id": "main-3"}')  # a bad edit: the running keys stay
    with caplog.at_level(logging.ERROR, logger="loopwatch.config"):
        assert watcher.poll() is False
        assert watcher.poll() is False
    assert len([r for r in caplog.records if "rejected new signing keys" in r.message]) == 1
    key_file(path, MAIN_NEXT)  # rotation step 3: the old key is gone
    assert watcher.poll() is True
    assert swapped[-1].agents == {"main": ["main-2"]}
    assert len(swapped) == 2
    for record in caplog.records:
        assert base64.b64encode(MAIN.secret).decode() not in record.getMessage()


def test_a_key_of_one_agent_cannot_write_into_a_run_of_another_agent_even_after_a_checkpoint():
    """A compromised runner of agent billing, holding billing's key, names main's run id: its
    correctly signed events are dead-lettered, in the same batch and after main's run was
    stored and read back, and main's run is exactly what main's own events made of it."""
    p = BatchProcessor(engine_for(CONFIG), keyring=Keyring([MAIN, BILLING]))
    store: dict = {}

    def read(partition, key):
        return store.get((partition, key))

    def checkpoint():
        for pk, value in p.runs.checkpoint().writes.items():
            if value is None:
                store.pop(pk, None)
            else:
                store[pk] = value

    main_events = loop_events("victim", "main", 12)
    hostile = [
        requested_event(
            f"evil-{i}", "read", {"p": 1}, run_id="victim", session_key="s-victim", agent_id="billing", ts_ms=5000 + i
        )
        for i in range(3)
    ]
    first = p.process(signed(main_events[:4], MAIN) + signed(hostile[:1], BILLING, start=4), read)
    checkpoint()
    p2 = BatchProcessor(engine_for(CONFIG), keyring=Keyring([MAIN, BILLING]))  # a restarted worker
    p2_result = p2.process(signed(hostile[1:], BILLING, start=5) + signed(main_events[4:], MAIN, start=7), read)

    letters = first.dead_letters + p2_result.dead_letters
    assert [(l.reason, l.record.offset) for l in letters] == [
        ("bad_signature", 4),
        ("bad_signature", 5),
        ("bad_signature", 6),
    ]
    assert all("belongs to agent 'main'" in l.detail for l in letters)
    # main's verdicts are those of the same events without the hostile ones and without signing.
    plain = BatchProcessor(engine_for(CONFIG)).process(signed(main_events, None), lambda partition, key: None)
    assert [v.value for v in first.verdicts + p2_result.verdicts] == [v.value for v in plain.verdicts]


def test_without_a_keyring_the_owner_is_recorded_but_not_enforced():
    p = BatchProcessor(engine_for(CONFIG))
    other = [
        requested_event(f"other-{i}", "read", {"p": 1}, run_id="r", session_key="s-r", agent_id="other", ts_ms=9000 + i)
        for i in range(4)
    ]
    events = loop_events("r", "main", 2) + other
    result = run(p, signed(events, None))
    assert result.dead_letters == [] and result.events == 8
    writes = p.runs.checkpoint().writes
    from streams.app.run_store import unpack_state

    (value,) = writes.values()
    assert unpack_state(value).owner == "main"


def test_with_signed_events_a_fleet_incident_counts_only_agents_whose_signatures_verified():
    # Issue 26: one runner holding main's key names 20 runs of three agents, all failing on
    # one tool.  Only main's events are processed (the others are bad_signature), so the fleet
    # topology is sent one agent, and no incident can reach minAgents (3).  Without a keyring
    # the same records carry three agents: what the events claim.
    from schemas.events import ToolCallCompleted
    from schemas.fleet import FleetOutcome, decode_fleet_record
    from streams.engine.config import FleetIncidentSettings
    from streams.engine.fleet import count_outcome, digest16, qualifies
    from streams.offline.scenarios import tool_outage

    config = {**CONFIG, "loopwatch": {"fleetIncidents": {"enabled": True}}}
    events = [e for e in tool_outage(runs=20, agents=3, calls_per_run=1) if isinstance(e, ToolCallCompleted)]
    assert {e.agent_id for e in events} == {"agent-0", "agent-1", "agent-2"}
    key = SigningKey("a0-1", "agent-0", b"a" * 32)

    def agents_sent(processor, records) -> tuple[set[str], bool]:
        result = run(processor, records)
        outcomes = [decode_fleet_record(value) for _key, value in result.fleet_outcomes]
        assert all(isinstance(o, FleetOutcome) for o in outcomes)
        value = None
        settings = FleetIncidentSettings()
        for o in outcomes:
            value = count_outcome(value, o.run, o.agent, settings)
        return {o.agent for o in outcomes}, qualifies(value, settings)

    signed_agents, signed_qualifies = agents_sent(
        BatchProcessor(engine_for(config), keyring=Keyring([key])), signed(events, key)
    )
    assert signed_agents == {digest16("agent-0")} and not signed_qualifies
    claimed_agents, claimed_qualifies = agents_sent(BatchProcessor(engine_for(config)), signed(events, key))
    assert claimed_agents == {digest16(f"agent-{i}") for i in range(3)} and claimed_qualifies


T0 = 1_760_000_000_000
"""A fixed epoch time (ms) the freshness tests count from."""


def spaced(run_id: str, n: int, step_ms: int = 10_000):
    """``n`` loop events of agent main, each ``step_ms`` after the one before from ``T0``."""
    events = loop_events(run_id, "main", (n + 1) // 2)[:n]
    return [msgspec.structs.replace(e, ts_ms=T0 + i * step_ms) for i, e in enumerate(events)]


def published(record: Record, offset: int, at_ms: int) -> Record:
    """``record``'s exact bytes and headers published again at ``offset``, Kafka timestamp ``at_ms``."""
    return Record(record.topic, record.partition, offset, record.key, record.value, at_ms, record.headers)


def signed_as_made(events, key: SigningKey = MAIN, start: int = 0):
    """Records of ``events`` published when each was made (Kafka timestamp = ``ts_ms``)."""
    return [published(r, r.offset, e.ts_ms) for r, e in zip(signed(events, key, start=start), events, strict=True)]


def test_a_signed_event_replayed_within_the_64_id_window_is_skipped_as_a_duplicate():
    # A replay is the record's exact bytes (its signature verifies) on a new offset; the worker
    # skips an event id among the last SEEN_EVENT_IDS (64) its run applied.
    from streams.engine.intake import SEEN_EVENT_IDS

    p = BatchProcessor(engine_for(CONFIG), keyring=Keyring([MAIN]))
    records = signed(loop_events("r", "main", 40), MAIN)  # 80 events
    first = run(p, records)
    assert first.events == 80 and first.dead_letters == []
    within = run(p, [published(records[80 - SEEN_EVENT_IDS], 80, records[80 - SEEN_EVENT_IDS].timestamp)])
    assert (within.events, within.duplicates, within.dead_letters) == (0, 1, [])


def test_a_signed_event_replayed_after_more_than_64_newer_ones_is_refused_once_older_than_the_max_age():
    """80 events 10 s apart (T0 ... T0 + 790 s), each published when made; max age 300 s.
    The oldest replayed (70+ newer ids later, so out of the id window) is stale whatever the
    replayer stamps its record with: now (790 s > 300 s after its ts_ms), or its original
    time (the run's newest event, T0 + 790 s, is 790 s after it).  So is the 65th newest
    (T0 + 150 s: 640 s before the run's newest)."""
    metrics = Metrics(CollectorRegistry())
    p = BatchProcessor(engine_for(CONFIG), metrics, keyring=Keyring([MAIN]), signed_max_age_s=300)
    events = spaced("r", 80)
    records = signed_as_made(events)
    first = run(p, records)
    assert first.events == 80 and first.dead_letters == []
    now = T0 + 800_000
    replays = [published(records[0], 80, now), published(records[0], 81, T0), published(records[15], 82, T0 + 150_000)]
    result = run(p, replays)
    assert result.events == 0 and result.duplicates == 0
    assert [(l.reason, l.record.offset) for l in result.dead_letters] == [
        ("stale_event", 80),
        ("stale_event", 81),
        ("stale_event", 82),
    ]
    assert result.dead_letters[0].detail == (
        f"signed event 'r-0q' is stamped {T0} ms, 800000 ms before its record's Kafka timestamp ({now} ms; "
        "at most 300000 ms): a replay"
    )
    assert result.dead_letters[1].detail == (
        f"signed event 'r-0q' is stamped {T0} ms, more than 300000 ms before the newest event its run applied "
        f"({T0 + 790_000} ms): a replay"
    )
    assert metrics.dead_letters.labels("stale_event")._value.get() == 3


def test_the_max_age_bounds_are_inclusive():
    """Hand-worked bounds, max age 300 s: 300,000 ms before the record's time (or the run's
    newest) is fresh, 300,001 ms is stale."""
    p = BatchProcessor(engine_for(CONFIG), keyring=Keyring([MAIN]), signed_max_age_s=300)
    a, b, c, d = spaced("r", 4, step_ms=1)
    at = [
        msgspec.structs.replace(a, ts_ms=T0),
        msgspec.structs.replace(b, ts_ms=T0 + 300_000),
        msgspec.structs.replace(c, ts_ms=T0 - 1),  # 300,001 ms before the run's newest
        msgspec.structs.replace(d, ts_ms=T0),  # exactly 300,000 ms before it
    ]
    records = signed(at, MAIN)
    result = run(
        p,
        [
            published(records[0], 0, T0 + 300_000),  # 300,000 ms old: fresh
            published(records[1], 1, T0 + 300_000),
            published(records[2], 2, T0 + 300_000),
            published(records[3], 3, T0 + 300_000),
        ],
    )
    assert [(l.reason, l.record.offset) for l in result.dead_letters] == [("stale_event", 2)]
    assert result.events == 3
    (late,) = signed([msgspec.structs.replace(d, event_id="late", ts_ms=T0 + 1)], MAIN)
    result = run(p, [published(late, 4, T0 + 300_002)])  # 300,001 ms after its ts_ms
    assert [(l.reason, l.record.offset) for l in result.dead_letters] == [("stale_event", 4)]


def test_signed_events_in_a_backlog_or_processed_again_after_a_restart_are_not_refused():
    """The check reads the record and the run's stored state, never the worker's clock: a
    backlog processed a day after it was published is applied, and after a restart from a
    checkpoint the same offsets redelivered are skipped as already applied, not dead-lettered."""
    day = 86_400_000
    store: dict = {}

    def read(partition, key):
        return store.get((partition, key))

    events = spaced("r", 40, step_ms=1_000)
    records = signed_as_made(events)
    p = BatchProcessor(engine_for(CONFIG), keyring=Keyring([MAIN]), clock=lambda: (T0 + day) / 1000)
    first = p.process(records[:20], read)
    store.update(p.runs.checkpoint().writes)
    assert first.events == 20 and first.dead_letters == []
    restarted = BatchProcessor(engine_for(CONFIG), keyring=Keyring([MAIN]), clock=lambda: (T0 + 2 * day) / 1000)
    again = restarted.process(records, read)  # the crash lost the commit: offsets 0-19 redelivered
    assert (again.dead_letters, again.skipped, again.events) == ([], 20, 20)
    plain = BatchProcessor(engine_for(CONFIG)).process(signed(events, None), lambda partition, key: None)
    assert [v.value for v in first.verdicts + again.verdicts] == [v.value for v in plain.verdicts]


def test_a_signed_record_without_a_kafka_timestamp_is_refused_and_unsigned_events_are_never_aged():
    p = BatchProcessor(engine_for(CONFIG), keyring=Keyring([MAIN]))
    (record,) = signed(loop_events("r", "main", 1)[:1], MAIN)
    result = run(p, [published(record, 0, None)])
    assert [(l.reason, l.detail) for l in result.dead_letters] == [
        ("stale_event", "signed event without a Kafka timestamp to check its age against")
    ]
    old = [published(r, r.offset, T0) for r in signed(loop_events("u", "main", 2), None)]
    assert run(BatchProcessor(engine_for(CONFIG)), old).dead_letters == []


def test_events_signed_with_a_key_rotated_out_are_refused_from_the_next_batch_on():
    # An expired key is one removed from the keyring (keys carry no expiry date): the worker
    # swaps its keyring between batches (KeyringWatcher -> BatchProcessor.keyring).
    p = BatchProcessor(engine_for(CONFIG), keyring=Keyring([MAIN, MAIN_NEXT]))
    events = loop_events("r", "main", 4)
    assert run(p, signed(events[:2], MAIN)).dead_letters == []
    p.keyring = Keyring([MAIN_NEXT])
    result = run(p, signed(events[2:4], MAIN, start=2) + signed(events[4:6], MAIN_NEXT, start=4))
    assert [(l.reason, l.detail, l.record.offset) for l in result.dead_letters] == [
        ("bad_signature", "unknown key id 'main-1'", 2),
        ("bad_signature", "unknown key id 'main-1'", 3),
    ]
    assert result.events == 2
