"""The contract's keys (schemas.keys): the worker keys state and verdicts by ``state_key``,
runners publish under ``record_key``.  Expected forms are hand-written from the spec (§2.1:
upstream keys a session's state by sessionKey, or by sessionId when there is no key; §8:
loopwatch keys by run id, and events without one form the session's "no run" scope)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given
from hypothesis import strategies as st

from schemas.keys import (
    murmur2,
    normalize_run_id,
    partition_for,
    record_key,
    session_scope_key,
    state_key,
    verdict_partitions,
)
from streams.edge.events import completed_event, requested_event
from streams.engine import engine_for


def keyed(run_id=None, session_key=None, session_id=None):
    return SimpleNamespace(run_id=run_id, session_key=session_key, session_id=session_id)


@pytest.mark.parametrize(
    "fields, state, record",
    [
        (dict(run_id="r1", session_key="s", session_id="i"), "run:r1", "r1"),
        (dict(run_id="  r1\ufeff", session_key="s"), "run:r1", "r1"),  # trimmed as JavaScript trims
        (dict(run_id=" \u00a0 ", session_key="s"), "session:s|", "session:s|"),  # blank: no run
        (dict(session_key="s", session_id="i"), "session:s|", "session:s|"),  # the key wins over the id
        (dict(session_key="s"), "session:s|", "session:s|"),
        (dict(session_id="i"), "session:|i", "session:|i"),
        (dict(session_key="x", session_id=None), "session:x|", "session:x|"),
    ],
)
def test_key_forms(fields, state, record):
    assert state_key(keyed(**fields)) == state
    assert record_key(keyed(**fields)) == record


def test_a_session_key_and_an_equal_session_id_name_different_scopes():
    assert state_key(keyed(session_key="abc")) != state_key(keyed(session_id="abc"))


def test_verdicts_name_their_run_as_events_do():
    # A verdict carries run_id and session_key but no session_id: for every run with a run id or
    # a session key, its state key is the one its events name.
    from schemas.verdicts import RunAborted

    for fields in (dict(run_id="r", session_key="s"), dict(session_key="s")):
        event = keyed(session_id="sess-9", **fields)
        verdict = RunAborted(
            verdict_id="e/abort", cause_event_id="e", detector="d", count=1, tool_name="t", message="m", **fields
        )
        assert state_key(verdict) == state_key(event)


def test_calls_of_one_session_without_run_id_share_history_whatever_their_session_id():
    """Upstream keeps one buffer per session key: the session id does not split it."""
    engine = engine_for({"tools": {"loopDetection": {"enabled": True}}})
    states: dict[str, object] = {}
    counts = []
    for n in range(12):
        ids = dict(session_key="agent:main:x", session_id=f"sess-{n % 3}")
        req = requested_event(f"e{n}", "read", {"p": 1}, tool_call_id=f"c{n}", **ids)
        step = engine.handle(states.get(state_key(req)), req)
        counts.append(step.decision.count)
        done = completed_event(f"d{n}", "read", {"p": 1}, result="same", tool_call_id=f"c{n}", **ids)
        states[state_key(done)] = engine.handle(step.state, done).state
    assert len(states) == 1
    assert counts[10] == 10  # the 11th identical call sees the 10 before it: warning (spec §2, threshold 10)


@given(
    st.one_of(st.none(), st.text(max_size=20)),
    st.one_of(st.none(), st.text(max_size=20)),
    st.one_of(st.none(), st.text(max_size=20)),
)
def test_record_key_is_the_run_id_or_the_state_key(run_id, session_key, session_id):
    event = keyed(run_id, session_key, session_id)
    run = normalize_run_id(run_id)
    if run is not None:
        assert (record_key(event), state_key(event)) == (run, f"run:{run}")
    else:
        assert record_key(event) == state_key(event)
        assert state_key(event).startswith("session:")


# Kafka's own test vectors for its murmur2 (clients/src/test/java/org/apache/kafka/common/utils/
# UtilsTest.java, testMurmur2), as signed 32-bit ints; the partition is the positive part mod n.
JAVA_MURMUR2 = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]


@pytest.mark.parametrize("key, java", JAVA_MURMUR2)
@pytest.mark.parametrize("partitions", [1, 3, 4, 12, 1000])
def test_partition_for_is_the_java_clients_default_partition(key, java, partitions):
    assert partition_for(key, partitions) == (java & 0x7FFFFFFF) % partitions


@given(st.binary(max_size=300), st.integers(min_value=1, max_value=500))
def test_partition_for_is_where_the_runner_clients_producer_sends_a_key(key, partitions):
    everyone = list(range(partitions))
    assert partition_for(key, partitions) == DefaultPartitioner()(key, everyone, everyone)


def test_a_runs_verdict_partitions_are_its_run_ids_and_its_sessions():
    # "r1" and the session key "scope:session:agent:main:1|" by hand, on 4 and 2 partitions.
    run = keyed("r1", "agent:main:1")
    by_run = (murmur2_java(b"r1") & 0x7FFFFFFF) % 4
    by_session = (murmur2_java(b"scope:session:agent:main:1|") & 0x7FFFFFFF) % 4
    assert verdict_partitions(run, 4, 4) == {by_run, by_session}
    assert verdict_partitions(run, 4, 2) == {by_run % 2, by_session % 2}  # fewer verdict partitions: mod theirs
    alone = keyed(None, None, "i-1")  # no run id, no session key: one key both ways, up to the prefix
    assert verdict_partitions(alone, 8, 8) == {
        (murmur2_java(b"session:|i-1") & 0x7FFFFFFF) % 8,
        (murmur2_java(b"scope:session:|i-1") & 0x7FFFFFFF) % 8,
    }


@given(
    st.one_of(st.none(), st.text(max_size=20)),
    st.one_of(st.none(), st.text(max_size=20)),
    st.integers(min_value=1, max_value=64),
    st.integers(min_value=1, max_value=64),
)
def test_verdict_partitions_hold_the_partitions_of_both_scopes_keys(run_id, session_key, calls, verdicts):
    event = keyed(run_id, session_key, "i")
    found = verdict_partitions(event, calls, verdicts)
    for key in (record_key(event), session_scope_key(event)):
        assert partition_for(key.encode("utf-8", "surrogatepass"), calls) % verdicts in found
    assert 1 <= len(found) <= 2 and all(0 <= p < verdicts for p in found)


def murmur2_java(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``, transcribed from the Java source (signed 32-bit result), so the
    hand-worked cases above do not rest on the function under test."""
    length, seed, m, r = len(data), 0x9747B28C, 0x5BD1E995, 24
    h = (seed ^ length) & 0xFFFFFFFF
    for i in range(length // 4):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail, rest = length & ~3, length % 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h >= 1 << 31 else h


@pytest.mark.parametrize("key, java", JAVA_MURMUR2)
def test_the_transcribed_murmur2_gives_kafkas_vectors(key, java):
    assert murmur2_java(key) == java


@given(st.binary(max_size=300))
def test_murmur2_is_aiokafkas(data):
    from aiokafka.partitioner import murmur2 as aiokafka_murmur2

    assert murmur2(data) == aiokafka_murmur2(data) & 0xFFFFFFFF
    assert murmur2(data) == murmur2_java(data) & 0xFFFFFFFF


def test_the_runner_client_depends_only_on_schemas_and_the_edge():
    """The client is what runners embed: it must not reach into the engine or the worker."""
    import ast
    from pathlib import Path

    client = Path(__file__).resolve().parents[2] / "streams" / "client"
    imported = set()
    for path in client.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                imported.add(("." * node.level) + (node.module or ""))
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
    ours = {name for name in imported if name.startswith((".", "streams", "schemas"))}
    allowed = ("schemas", "..edge.", ".errors", ".runner")
    assert {name for name in ours if not name.startswith(allowed)} == set()
    assert "..edge.events" in ours and any(name.startswith("schemas") for name in ours)
