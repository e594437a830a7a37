"""The loopwatch worker: a Faust app around the detection engine.

``settings``   ``LOOPWATCH_*`` configuration;
``processor``  the per-batch logic, no I/O (decode, group per run, engine, dead letters);
``transport``  Faust's consumer with batch delivery;
``app``        the Faust app: topics, the RocksDB run table, commit pipeline, timers, health;
``reload``     hot reload of the loop-detection config;
``metrics``    the Prometheus metrics of docs/metrics.md;
``logs``       buffered plain logging for ``loopwatch.*``;
``worker``     ``run_worker(argv)`` (``python -m streams.app.worker``);
``harness``    worker subprocesses and Kafka helpers for tests and benchmarks.

Importing this package is cheap; Faust is imported by ``app``/``worker`` only.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Settings", "create_app", "run_worker"]


def __getattr__(name: str) -> Any:
    if name == "Settings":
        from .settings import Settings

        return Settings
    if name == "create_app":
        from .app import create_app

        return create_app
    if name == "run_worker":
        from .worker import run_worker

        return run_worker
    raise AttributeError(name)
