"""The loopwatch worker: a Faust app around the detection engine.

``settings``    ``LOOPWATCH_*`` configuration;
``app``         the wiring: the Faust app, its topics, run table, parts and timers;
``processor``   the per-batch logic, no I/O (decode, group per run, engine, dead letters);
``records``     its record types (``Record``, ``VerdictOut``, ``DeadLetter``, ``BatchResult``);
``live_runs``   the runs changed since the last checkpoint, in memory (``LiveRuns``);
``checkpoint``  when and in which order work is made durable (the batch handler too);
``run_store``   the run table (RocksDB and its changelog) and the state envelope;
``output``      the verdict and dead-letter producers;
``expiry``      the idle sweep;
``health``      readiness, broker reachability, lag, the web pages;
``topics``      the topics, made sure of before the worker starts;
``reload``      hot reload of the loop-detection config and the signing keys;
``metrics``     the Prometheus metrics of docs/metrics.md;
``logs``        buffered plain logging for ``loopwatch.*``;
``faust_options``  the Faust app's settings; ``gc_policy``: the cyclic GC's thresholds and freezes;
``worker``      ``run_worker(argv)`` (``python -m streams.app.worker``).

Faust's and aiokafka's internals are touched in ``streams.app.faust_adapter`` only.  Importing
this package is cheap; Faust is imported by ``app``/``worker`` only.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Settings", "build_worker", "run_worker"]


def __getattr__(name: str) -> Any:
    if name == "Settings":
        from .settings import Settings

        return Settings
    if name == "build_worker":
        from .app import build_worker

        return build_worker
    if name == "run_worker":
        from .worker import run_worker

        return run_worker
    raise AttributeError(name)
