"""The peers of ``make bench`` (d) without a broker: their per-event work answers as the
engine run directly, and the check that guards their figures catches a peer that drops,
adds or changes a verdict."""

from __future__ import annotations

import msgspec
import pytest

from bench.kafka import CONFIG, fleet
from bench.rivals.common import EventStep
from bench.rivals.runner import RivalFailed, compare_verdicts, verdict_counts
from harness import reference_verdicts
from schemas import decode_verdict, encode_event
from schemas.keys import record_key


@pytest.fixture(scope="module")
def events():
    return fleet(3_000, 40, seed=7, start_ms=1_700_000_000_000)


@pytest.fixture(scope="module")
def expected(events):
    return reference_verdicts(events, CONFIG)


def test_the_workload_has_every_kind_of_verdict(expected):
    # Otherwise the comparisons below would prove little.
    counts = verdict_counts(expected)
    assert set(counts) == {"allow", "warn", "block", "abort"}, counts


def test_event_step_with_state_stored_as_bytes_answers_as_the_engine(events, expected):
    """What both peers do per event: the state goes through encode_state/decode_state (the
    frameworks' stores hold bytes), keyed by the record's Kafka key as their stores are."""
    step = EventStep(CONFIG)
    store: dict[bytes, bytes] = {}
    published = []
    for event in events:
        key = record_key(event).encode("utf-8", "surrogatepass")
        stored, out = step(store.get(key), encode_event(event))
        if stored is None:
            store.pop(key, None)
        else:
            store[key] = stored
        published.extend(decode_verdict(v) for v in out)
    assert published == expected
    assert not store  # every run of the workload ends, and its state goes with it


def test_compare_verdicts_accepts_exactly_the_engines(expected):
    compare_verdicts("peer", {v.verdict_id: v for v in expected}, expected)


def test_compare_verdicts_catches_a_missing_verdict(expected):
    got = {v.verdict_id: v for v in expected}
    blocked = next(v for v in expected if getattr(v, "action", None) == "block")
    del got[blocked.verdict_id]
    with pytest.raises(RivalFailed, match="by action"):
        compare_verdicts("peer", got, expected)


def test_compare_verdicts_catches_a_changed_verdict_with_the_same_counts(expected):
    got = {v.verdict_id: v for v in expected}
    warned = next(v for v in expected if getattr(v, "action", None) == "warn")
    got[warned.verdict_id] = msgspec.structs.replace(warned, count=warned.count + 1)
    with pytest.raises(RivalFailed, match="1 differing"):
        compare_verdicts("peer", got, expected)


def test_compare_verdicts_catches_a_verdict_for_another_event(expected):
    got = {v.verdict_id: v for v in expected}
    allowed = [v for v in expected if getattr(v, "action", None) == "allow"]
    del got[allowed[0].verdict_id]
    other = msgspec.structs.replace(allowed[0], verdict_id="elsewhere/decision")
    got[other.verdict_id] = other
    with pytest.raises(RivalFailed, match="1 of the engine's verdicts missing, 1 others published"):
        compare_verdicts("peer", got, expected)
