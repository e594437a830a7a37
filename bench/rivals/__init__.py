"""The peers of ``make bench``: the same workload, with the same engine, as a user would
process it with another Python stream processor.

* ``quix_streams`` (d1): a Quix Streams ``Application`` with one keyed stateful function;
* ``faust_agent`` (d2): an idiomatic Faust agent with a table write per event;
* ``common``: the per-event work both share, their progress stamps and command line;
* ``runner``: the benchmark's side: run a peer as a subprocess on a preloaded topic, time
  it and check that its verdicts are the engine's.

The peers' frameworks are the ``bench`` extra (``pip install -e '.[bench]'``), not runtime
dependencies: only the peer modules import them.
"""

from typing import NamedTuple


class Peer(NamedTuple):
    tag: str
    """Its measurement's name in the bench's output."""
    label: str
    module: str
    distribution: str
    """The framework's package, whose version the bench prints."""
    shape: str
    """What the peer is, in a few words."""


RIVALS = {
    "quix": Peer(
        "d1",
        "Quix Streams",
        "bench.rivals.quix_streams",
        "quixstreams",
        "Application, keyed stateful function, RocksDB state + changelog, at-least-once",
    ),
    "faust": Peer(
        "d2",
        "Faust",
        "bench.rivals.faust_agent",
        "faust-streaming",
        "agent (concurrency 1), a table write per event, RocksDB + changelog, at-least-once",
    ),
}
"""Peer name (``make bench --peer NAME``) -> what it is."""
