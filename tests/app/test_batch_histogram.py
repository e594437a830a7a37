"""``metrics.BatchHistogram`` exposes what prometheus_client's own ``Histogram`` exposes for
the same values observed one by one (the independent reference), batch by batch."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from streams.app.metrics import LATENCY_BUCKETS, BatchHistogram

BOUNDS = [b for b in LATENCY_BUCKETS if b != math.inf]
# Values on the bucket bounds themselves (``le`` is inclusive), just beside them, and anywhere.
values = st.one_of(
    st.sampled_from(BOUNDS),
    st.sampled_from(BOUNDS).map(lambda b: math.nextafter(b, math.inf)),
    st.floats(min_value=0.0, max_value=100.0, allow_nan=False),
)


def samples(registry: CollectorRegistry, name: str) -> dict:
    out = {}
    for family in registry.collect():
        for s in family.samples:
            if s.name.startswith(name) and not s.name.endswith("_created"):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@given(st.lists(st.lists(values, max_size=30), max_size=5))
def test_the_same_samples_as_prometheus_clients_histogram(batches):
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    batch_histogram = BatchHistogram("lat_seconds", "doc", buckets=LATENCY_BUCKETS, registry=ours)
    reference = Histogram("lat_seconds", "doc", buckets=LATENCY_BUCKETS, registry=theirs)
    for batch in batches:
        batch_histogram.observe_many(batch)
        for v in batch:
            reference.observe(v)
    got, want = samples(ours, "lat_seconds"), samples(theirs, "lat_seconds")
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_buckets_must_increase():
    with pytest.raises(ValueError, match="increasing"):
        BatchHistogram("x_seconds", "doc", buckets=[0.1, 0.05], registry=CollectorRegistry())
    with pytest.raises(ValueError, match="increasing"):
        BatchHistogram("x_seconds", "doc", buckets=[], registry=CollectorRegistry())
