"""Test and benchmark harness: worker subprocesses and Kafka helpers, shared by ``tests/`` and
``bench/``.  Not part of the installed package (a wheel holds ``streams`` and ``schemas``
only): run from the repository (``pytest`` and ``make bench`` put it on the path).

``harness.workers``  worker subprocesses (``WorkerProcess``), unique topic names, ports;
``harness.kafka``    producing, collecting, offsets, topics, and the engine-alone answers;
``harness.fleets``   the backtest's fleets (hand-worked, generated) and their reference;
``harness.fleet_limit``  the per-agent rate limit's scenario (one agent, many tools);
``harness.cli``      the ``loopwatch`` command as a subprocess, and its one-line errors.
"""

from streams.app.processes import signal_group, stop_group, wait_http_ok

from .kafka import (
    collect,
    collect_verdicts,
    committed_offsets,
    create_topic,
    dedupe,
    delete_topics,
    encode_all,
    end_offsets,
    group_lag,
    header,
    produce,
    reference_verdicts,
    wait_for_topic,
)
from .workers import FAST_GROUP_ENV, REPO, WorkerNames, WorkerProcess, free_port, write_config

__all__ = [
    "FAST_GROUP_ENV",
    "REPO",
    "WorkerNames",
    "WorkerProcess",
    "collect",
    "collect_verdicts",
    "committed_offsets",
    "create_topic",
    "dedupe",
    "delete_topics",
    "encode_all",
    "end_offsets",
    "free_port",
    "group_lag",
    "header",
    "produce",
    "reference_verdicts",
    "signal_group",
    "stop_group",
    "wait_for_topic",
    "wait_http_ok",
    "write_config",
]
