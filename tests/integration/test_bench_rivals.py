"""The peers of ``make bench`` (d) on the real broker: each drains a small preloaded
workload in its own subprocess and publishes exactly the verdicts of the engine run
directly on the same events (read back from its verdicts topic), so its figure is the
figure of a peer that does the work."""

from __future__ import annotations

import asyncio

import pytest

from bench.kafka import CONFIG, fleet, peer_throughput
from bench.rivals import RIVALS
from bench.rivals.runner import RivalFailed, verdict_counts
from harness import delete_topics, encode_all, reference_verdicts

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize("peer", sorted(RIVALS))
async def test_peer_publishes_the_engines_verdicts(kafka_broker, tmp_path, peer):
    events = fleet(1_500, 30, seed=7)
    records = encode_all(events)
    expected = reference_verdicts(events, CONFIG)
    used: list[str] = []
    try:
        result = await peer_throughput(kafka_broker, peer, records, expected, tmp_path, used=used)
    finally:
        await asyncio.wait_for(delete_topics(kafka_broker, used), 30)
    assert result["events"] == len(records)
    # Counted on what the peer published, de-duplicated by verdict id.
    assert result["verdicts"] == verdict_counts(expected)
    assert {"allow", "warn", "block"} <= set(result["verdicts"])
    assert result["rate"] > 0 and result["cpu_us"] > 0


async def test_a_peer_short_of_one_verdict_fails_the_benchmark(kafka_broker, tmp_path):
    """The check runs on what the peer published: measured against one verdict fewer than
    it (rightly) publishes, the peer is reported, not timed."""
    events = fleet(600, 12, seed=7)
    expected = reference_verdicts(events, CONFIG)
    used: list[str] = []
    try:
        with pytest.raises(RivalFailed, match="verdicts by action"):
            await peer_throughput(kafka_broker, "quix", encode_all(events), expected[:-1], tmp_path, used=used)
    finally:
        await asyncio.wait_for(delete_topics(kafka_broker, used), 30)
