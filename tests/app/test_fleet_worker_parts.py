"""Issue 17's parts of the worker without Kafka: the processor's repartition by session and
its records for the fleet topology, the fleet mirror, the metrics, and the refusal of a
reload that changes the topology."""

from __future__ import annotations

import json
import struct

import msgspec
from prometheus_client import CollectorRegistry

from schemas import decode_verdict, encode_event
from schemas.fleet import FleetOutcome, FleetSend, decode_fleet_record, encode_incident, encode_ring_notice
from schemas.keys import record_key
from schemas.names import KEY_MISMATCH
from streams.app.app import _topology_change
from streams.app.fleet import FleetMirror
from streams.app.metrics import Metrics
from streams.app.processor import BatchProcessor
from streams.app.records import Record
from streams.app.reload import ConfigWatcher
from streams.app.settings import Settings
from streams.edge.events import requested_event
from streams.engine import RunDriver, engine_for
from streams.engine.fleet import FleetView, digest16
from streams.offline.replay import fleet_simulator
from streams.offline.scenarios import agent_ring, session_loop, tool_outage

ENABLED = {"tools": {"loopDetection": {"enabled": True}}}
SESSION = {**ENABLED, "loopwatch": {"scope": "session"}}
FLEET = {**ENABLED, "loopwatch": {"fleetIncidents": {"enabled": True}, "agentRings": {"enabled": True}}}


def tool_calls(events, partition=0):
    return [
        Record("tool-calls", partition, i, record_key(e).encode(), encode_event(e), 1.0, [("loopwatch.key_id", b"k1")])
        for i, e in enumerate(events)
    ]


def no_store(partition, key):
    return None


def processor(config):
    p = BatchProcessor(engine_for(config), Metrics(CollectorRegistry(), process_metrics=False))
    p.sessions_topic = "lw-sessions" if "scope" in config.get("loopwatch", {}) else None
    return p


def test_session_scope_forwards_every_tool_calls_record_under_its_sessions_key():
    events = session_loop(gate=True)
    p = processor(SESSION)
    result = p.process(tool_calls(events), no_store)
    assert result.verdicts == [] and result.events == 0  # nothing reaches the engine from tool-calls
    assert len(result.forwards) == len(events)
    assert {key for key, _v, _h, _t in result.forwards} == {b"scope:session:agent:main:support-42|"}
    assert [value for _k, value, _h, _t in result.forwards] == [encode_event(e) for e in events]  # unchanged, in order
    # The runner's headers (its signature) kept, and where each came from (partition 0, offset i).
    assert [headers for _k, _v, headers, _t in result.forwards] == [
        [("loopwatch.key_id", b"k1"), ("loopwatch.forwarded_from", struct.pack(">Iq", 0, i))]
        for i in range(len(events))
    ]
    assert p.metrics.events_forwarded._value.get() == len(events)


def test_session_scope_forwarded_records_reach_the_engine_and_verdicts_stay_the_runs():
    events = session_loop(gate=True)
    p = processor(SESSION)
    forwards = p.process(tool_calls(events), no_store).forwards
    records = [Record("lw-sessions", 2, i, key, value, 1.0) for i, (key, value, _h, _t) in enumerate(forwards)]
    result = p.process(records, no_store)
    got = [decode_verdict(v.value) for v in result.verdicts]
    want = RunDriver(engine_for(SESSION)).verdicts(events)  # the engine under session scope
    assert got == want and any(v.action == "block" for v in got)
    assert all(v.key == f"run:{v.verdict.run_id}".encode() and v.partition == 2 for v in result.verdicts)


def test_a_record_on_the_repartition_topic_under_another_key_is_a_key_mismatch():
    event = requested_event("e", "read", {}, run_id="r1", session_key="s1")
    result = processor(SESSION).process([Record("lw-sessions", 0, 0, b"run:r1", encode_event(event))], no_store)
    assert [(d.reason, d.detail) for d in result.dead_letters] == [
        (KEY_MISMATCH, "Kafka key 'run:r1' of a forwarded record is not its state key 'scope:session:s1|'")
    ]


def test_a_record_that_cannot_be_forwarded_is_dead_lettered_where_it_is():
    result = processor(SESSION).process([Record("tool-calls", 0, 0, b"k", b"{not json")], no_store)
    assert result.forwards == [] and [d.reason for d in result.dead_letters] == ["invalid_json"]


def test_failing_outcomes_and_sends_go_to_the_fleet_topology():
    events = (
        tool_outage(runs=3, agents=2)
        + tool_outage("read", runs=2, failing=False, run_prefix="ok")
        + agent_ring(rounds=1)
    )
    result = processor(FLEET).process(tool_calls(events), no_store)
    outcomes = [(k, decode_fleet_record(v)) for k, v in result.fleet_outcomes]
    sends = [(k, decode_fleet_record(v)) for k, v in result.fleet]
    # Each run failed twice the same way: once per run and batch is all a window counts.
    # Outcomes go by agent, to the per-agent limit (run r is agent r mod 2's).
    assert len(outcomes) == 3 and [k for k, _ in outcomes] == [
        f"agent:{digest16(f'agent-{r % 2}')}".encode() for r in range(3)
    ]
    assert all(type(o) is FleetOutcome and o.error and o.tool_name == "web_search" for _, o in outcomes)
    assert len({o.run for _, o in outcomes}) == 3 and len({o.agent for _, o in outcomes}) == 2
    assert len(sends) == 3 and {k for k, _ in sends} == {b"trace:trace-standup"}
    assert all(type(s) is FleetSend and s.count == 1 for _, s in sends)
    assert dict(result.fleet_kinds) == {"outcome": 3, "send": 3}


def test_under_session_scope_each_run_of_a_session_counts_for_the_fleet_topology():
    """Three runs of one session fail the same way in one batch: the window counts three runs."""
    events = [msgspec.structs.replace(e, session_key="agent:main:one-session") for e in tool_outage(runs=3, agents=1)]
    p = processor({**ENABLED, "loopwatch": {"scope": "session", "fleetIncidents": {"enabled": True}}})
    forwards = p.process(tool_calls(events), no_store).forwards
    result = p.process([Record("lw-sessions", 0, i, k, v) for i, (k, v, _h, _t) in enumerate(forwards)], no_store)
    outcomes = [decode_fleet_record(v) for _k, v in result.fleet_outcomes]
    assert len(outcomes) == 3 and len({o.run for o in outcomes}) == 3


def test_a_runs_identical_sends_in_a_batch_go_as_one_record_with_their_count():
    ring = agent_ring(rounds=4)  # agent 0's run: 4 identical sends to agent 1
    own = [e for e in ring if e.session_key == "agent:ring-0:trace-standup"]
    result = processor(FLEET).process(tool_calls(own), no_store)
    ((key, value),) = result.fleet
    send = decode_fleet_record(value)
    assert (key, send.target, send.count) == (b"trace:trace-standup", "agent:ring-1:trace-standup", 4)
    # ... and the fleet topology counts them as the four sends they are.
    from streams.engine.config import AgentRingSettings
    from streams.engine.fleet import Hop, TraceSends, observe_send

    trace = TraceSends()
    observe_send(trace, send, 0, AgentRingSettings())
    assert trace.hops[Hop(send.session_key, send.agent_id, send.target)][1] == 4


def test_without_the_options_the_processor_sends_nothing_more():
    events = tool_outage(runs=3) + agent_ring(rounds=1)
    result = BatchProcessor(engine_for(ENABLED)).process(tool_calls(events), no_store)
    assert result.fleet == result.fleet_outcomes == result.forwards == [] and result.incident_decisions == 0


def test_decisions_during_an_incident_are_published_and_counted():
    engine = engine_for({**ENABLED, "loopwatch": {"fleetIncidents": {"enabled": True}}})
    simulator = fleet_simulator(engine)
    for event in tool_outage(runs=30):
        simulator.observe(event)
    assert "web_search" in engine.fleet.incidents
    p = BatchProcessor(engine, Metrics(CollectorRegistry(), process_metrics=False))
    result = p.process(tool_calls(tool_outage(runs=1, run_prefix="next")), no_store)
    assert result.incident_decisions == 2 and len(result.verdicts) == 2  # not gated, still published
    assert all(decode_verdict(v.value).incident_id for v in result.verdicts)


def test_the_mirror_applies_incidents_rings_and_tombstones():
    engine = engine_for(FLEET)
    simulator = fleet_simulator(engine)
    published = []
    for event in (
        tool_outage(runs=30)
        + agent_ring(rounds=4)
        + tool_outage("read", runs=1, failing=False, run_prefix="later", start_ms=1_700_000_000_000 + 400_000)
    ):
        published += simulator.observe(event)
    metrics = Metrics(CollectorRegistry(), process_metrics=False)
    view = FleetView()
    mirror = FleetMirror(Settings(), ["incidents", "rings"], view, metrics, "incidents")
    opened = published[0]
    mirror.apply("incidents", b"web_search", encode_incident(opened))
    ring = next(p for p in published if hasattr(p, "ring_id"))
    mirror.apply("rings", b"trace-standup", encode_ring_notice(ring))
    assert view.incidents == {"web_search": opened} and view.rings["trace-standup"][0] == ring
    metrics.set_open_incidents(list(view.incidents))
    assert metrics.fleet_incidents_open.labels("web_search")._value.get() == 1
    mirror.apply("rings", b"trace-standup", None)
    mirror.apply("incidents", b"web_search", encode_incident(published[-1]))  # resolved
    mirror.apply("incidents", b"web_search", b"{not json")  # logged, skipped
    assert view.incidents == {} and view.rings == {}
    metrics.set_open_incidents(list(view.incidents))
    assert metrics.fleet_incidents_open.labels("web_search")._value.get() == 0


def test_a_reload_that_changes_the_topology_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(FLEET))
    applied = []
    initial = engine_for(FLEET).config.topology()
    watcher = ConfigWatcher(path, applied.append, check=lambda engine: _topology_change(initial, engine))
    watcher.load_initial()
    path.write_text(json.dumps({**FLEET, "tools": {"loopDetection": {"enabled": True, "warningThreshold": 5}}}))
    assert watcher.poll() and len(applied) == 1  # a threshold: applied
    path.write_text(json.dumps(SESSION))
    assert not watcher.poll() and watcher.rejections == 1 and len(applied) == 1


def session_keyed(events, partitions=4):
    """Records as a runner keying by session publishes them: on the partition their key gives."""
    from schemas.keys import partition_for, session_scope_key

    out = []
    for i, e in enumerate(events):
        key = session_scope_key(e).encode()
        out.append(Record("tool-calls", partition_for(key, partitions), i, key, encode_event(e)))
    return out


def test_session_keyed_records_on_their_partition_skip_the_repartition():
    events = session_loop(gate=True)
    p = processor(SESSION)
    p.partitions = 4
    records = session_keyed(events)
    direct = p.process(records, no_store)
    assert direct.forwards == [] and direct.events == len(events)
    assert [decode_verdict(v.value) for v in direct.verdicts] == RunDriver(engine_for(SESSION)).verdicts(events)
    moved = [Record(r.topic, (r.partition + 1) % 4, r.offset, r.key, r.value) for r in records]
    assert len(processor(SESSION).process(moved, no_store).forwards) == len(events)  # elsewhere: forwarded


def test_under_run_scope_a_session_key_is_accepted():
    events = session_loop(gate=True)
    result = BatchProcessor(engine_for(ENABLED)).process(session_keyed(events), no_store)
    assert result.dead_letters == [] and result.events == len(events)


def test_a_state_fed_from_both_topics_compares_offsets_within_each():
    """A session whose runners key differently: its state gets records of tool-calls (direct)
    and of the repartition topic (forwarded), whose offsets are not comparable.  None is
    skipped as a redelivery, and a true redelivery of either is."""

    events = session_loop(gate=True)[:8]
    p = processor(SESSION)
    p.partitions = 4
    direct = session_keyed(events[:4])  # offsets 0..3 on tool-calls
    stored: dict = {}

    def read(partition, key):
        return stored.get((partition, key))

    def checkpoint():
        cp = p.runs.checkpoint()
        for pk, value in cp.writes.items():
            stored[pk] = value

    assert p.process(direct, read).events == 4
    checkpoint()
    key, partition = direct[0].key, direct[0].partition
    forwarded = [Record("lw-sessions", partition, 1, key, encode_event(e)) for e in events[4:]]  # offsets 1..4
    assert p.process(forwarded, read).events == 4  # not "older" than the state's tool-calls offset 3
    checkpoint()
    assert p.process(forwarded, read).skipped == 4  # their redelivery is
    again = p.process([Record("tool-calls", partition, 3, key, encode_event(events[3]))], read)
    assert again.events == 0 and again.duplicates == 1  # another topic's: caught by its event id


def test_under_session_scope_a_shadow_agents_verdicts_stay_keyed_by_run():
    """Session scope with an agent in shadow mode (issue 16): its verdicts go to the shadow
    topic and its runner gets an allow, each keyed by the run, as under run scope."""
    events = session_loop(gate=True)
    p = processor({**ENABLED, "loopwatch": {"scope": "session", "mode": "shadow"}})
    forwards = p.process(tool_calls(events), no_store).forwards
    result = p.process([Record("lw-sessions", 1, i, k, v) for i, (k, v, _h, _t) in enumerate(forwards)], no_store)
    shadow = [decode_verdict(v.value) for v in result.shadow]
    assert shadow == RunDriver(engine_for(SESSION)).verdicts(events)  # what enforce mode would publish
    assert any(v.action == "block" for v in shadow)
    answers = [decode_verdict(v.value) for v in result.verdicts]
    assert len(answers) == sum(1 for e in events if getattr(e, "gate", False)) and {a.action for a in answers} == {
        "allow"
    }
    assert all(v.key == f"run:{v.verdict.run_id}".encode() for v in result.shadow + result.verdicts)


def test_a_candidate_config_under_session_scope_keys_its_verdicts_by_run_and_compares_each_run():
    """Session scope with a candidate config (issue 16): the candidate's verdicts are keyed by
    their run, as the live ones are, and a run's outcome is compared when the run ends, though
    the session's state goes on.

    Hand-worked (spec §2.10; 3 runs of 8 identical reads, one session): live (warning 10,
    critical 20) warns at call 11 (run 2) and blocks from call 21 (run 3); the candidate
    (warning 5, critical 8) only warns at counts 5-7, hidden by the bucket rule, and blocks from
    call 9 (run 2 on).  Run 1: none/none; run 2: warn/block (changed); run 3: block/block."""
    strict = {
        "tools": {"loopDetection": {"enabled": True, "warningThreshold": 5, "criticalThreshold": 8}},
        "loopwatch": {"scope": "session"},
    }
    events = session_loop(gate=True)
    registry = CollectorRegistry()
    p = BatchProcessor(engine_for(SESSION), Metrics(registry, process_metrics=False))
    p.sessions_topic = "lw-sessions"
    p.use_candidate(engine_for(strict), "c0ffee")
    forwards = p.process(tool_calls(events), no_store).forwards
    result = p.process([Record("lw-sessions", 1, i, k, v) for i, (k, v, _h, _t) in enumerate(forwards)], no_store)
    judged = [decode_verdict(v.value) for v in result.candidate]
    assert judged == RunDriver(engine_for(strict)).verdicts(events)  # the engine driven directly
    assert all(v.key == f"run:{v.verdict.run_id}".encode() for v in result.candidate + result.verdicts)
    g = registry.get_sample_value
    assert g("loopwatch_candidate_outcome_changes_total", {"live": "warn", "candidate": "block"}) == 1
    assert (
        sum(
            s.value
            for m in registry.collect()
            if m.name == "loopwatch_candidate_outcome_changes"
            for s in m.samples
            if s.name.endswith("_total")
        )
        == 1
    )
