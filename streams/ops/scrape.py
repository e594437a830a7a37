"""Read a worker's ``/metrics`` the way Prometheus does: the text exposition format, parsed
with ``prometheus_client.parser``.  Used by ``streams.ops.render`` and the live metric tests.

    snap = scrape(9108)
    snap.value("loopwatch_decisions_total", action="block")   # sum over matching samples
    snap.labels("loopwatch_loop_detections_total", "tool")     # {"web_search", "process", …}
"""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Sample", "Snapshot", "parse", "scrape", "histogram_quantile"]


@dataclass(frozen=True)
class Sample:
    name: str
    """The sample's own name (``…_total``, ``…_bucket``, …), not the family's."""
    labels: dict[str, str]
    value: float


@dataclass
class Snapshot:
    """One scrape: every sample, and every declared family with its type."""

    samples: list[Sample] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)
    """Family name (as the parser reports it: counters without ``_total``) -> type."""
    at: float = 0.0
    """``time.time()`` of the scrape."""

    def select(self, name: str, **labels: str) -> Iterator[Sample]:
        for s in self.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                yield s

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples called ``name`` whose labels include ``labels`` (0 if none)."""
        return sum(s.value for s in self.select(name, **labels))

    def has(self, name: str, **labels: str) -> bool:
        return any(True for _ in self.select(name, **labels))

    def labels(self, name: str, label: str) -> set[str]:
        return {s.labels[label] for s in self.select(name) if label in s.labels}

    def by(self, name: str, *keys: str) -> dict[tuple[str, ...], float]:
        """Sum of ``name``'s samples grouped by the label values ``keys``."""
        out: dict[tuple[str, ...], float] = {}
        for s in self.select(name):
            k = tuple(s.labels.get(key, "") for key in keys)
            out[k] = out.get(k, 0.0) + s.value
        return out

    def declared(self, family: str) -> str | None:
        """The type of a declared family (``loopwatch_x_total`` and ``loopwatch_x`` both work)."""
        if family in self.types:
            return self.types[family]
        if family.endswith("_total"):
            return self.types.get(family[: -len("_total")])
        return None

    def buckets(self, name: str) -> list[tuple[float, float]]:
        """A histogram's cumulative ``(le, count)`` pairs, sorted by ``le`` (``+Inf`` last)."""
        pairs = [(float(s.labels["le"]), s.value) for s in self.select(f"{name}_bucket")]
        return sorted(pairs)


def parse(text: str, at: float | None = None) -> Snapshot:
    snap = Snapshot(at=time.time() if at is None else at)
    for family in text_string_to_metric_families(text):
        snap.types[family.name] = family.type
        for s in family.samples:
            snap.samples.append(Sample(s.name, dict(s.labels), float(s.value)))
    return snap


def scrape(port: int, host: str = "127.0.0.1", timeout: float = 3.0) -> Snapshot | None:
    """GET ``http://host:port/metrics`` and parse it; None when the server does not answer."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as resp:
            if resp.status != 200:
                return None
            text = resp.read().decode("utf-8")
    except (OSError, urllib.error.URLError):
        return None
    return parse(text)


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """Prometheus' ``histogram_quantile`` over cumulative ``(le, count)`` pairs (e.g. the
    differences of two scrapes): linear interpolation inside the bucket that holds the rank;
    the highest finite bound when the rank falls in ``+Inf``; NaN without observations."""
    pairs = sorted(buckets)
    if not pairs or not math.isinf(pairs[-1][0]):
        return math.nan
    total = pairs[-1][1]
    if total <= 0:
        return math.nan
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for le, count in pairs:
        if count >= rank:
            if math.isinf(le):
                return lower_bound
            if count == lower_count:
                return le
            return lower_bound + (le - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = le, count
    return pairs[-2][0] if len(pairs) > 1 else math.nan
