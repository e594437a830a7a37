"""Fixtures of the fault suite: a broker of the case's own, for the faults that stop or stall one."""

from __future__ import annotations

from pathlib import Path

import pytest
from fault_harness import OwnBroker


@pytest.fixture
def own_broker(tmp_path: Path):
    """A single-node broker on free ports with its own state directory (never the shared one),
    wiped when the test ends."""
    broker = OwnBroker(tmp_path / "kafka")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
