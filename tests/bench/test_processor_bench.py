"""``python -m bench.processor --signed``: its signed workloads are applied whole (no dead
letter), so the A/B figure in docs/benchmarks.md compares the checks, not refusals."""

from __future__ import annotations

import pytest

from bench.processor import CONFIG, workload
from schemas.events import UNSET, decode_event
from streams.app.processor import BatchProcessor
from streams.engine import engine_for


@pytest.mark.parametrize("signed", ["plain", "seq"])
def test_a_signed_workload_is_applied_whole(signed):
    records, keyring = workload(4_000, 40, signed)
    assert keyring is not None and all(r.headers for r in records)
    numbered = [decode_event(r.value).seq is not UNSET for r in records]
    assert all(numbered) if signed == "seq" else not any(numbered)
    result = BatchProcessor(engine_for(CONFIG), keyring=keyring).process(records, lambda partition, key: None)
    assert (result.events, result.dead_letters, result.duplicates) == (len(records), [], 0)
