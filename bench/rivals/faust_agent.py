"""Peer (d2) of ``make bench``: loopwatch's engine in an idiomatic Faust agent.

``python -m bench.rivals.faust_agent BROKER SOURCE SINK GROUP EXPECTED CONFIG STATE_DIR RESULT_FILE``

The same Faust (faust-streaming 0.15) as the worker, as its documentation shows an agent
with a table, and with none of the worker's changes to Faust (no batching transport, no
inline consumer thread: ``streams/app/faust_adapter.py`` is not used):

* a ``faust.App`` with a RocksDB store (the ``rocksdict`` driver: ``python-rocksdb`` does not
  build on current Pythons) and at-least-once processing (its default, stated);
* ``@app.agent(tool_calls, concurrency=1)`` iterating ``stream.items()``: per event, the run's
  engine state is read from a ``Table`` keyed by the record's key (the run id), and written
  back with one table write (or deleted when the run ended), which Faust sends to the
  table's changelog topic;
* every verdict ``await``ed onto the sink with ``topic.send``.

References (faust-streaming documentation, faust-streaming.github.io/faust): "Agents"
(userguide/agents.html: ``@app.agent``, ``concurrency``, ``stream.items()``, sending to a
topic), "Tables and Windowing" (userguide/tables.html: ``app.Table``, a table write per
event, the changelog, co-partitioning with the stream), "Stores" (the RocksDB store's
``driver`` option, ``faust.stores.rocksdb``) and "Configuration Reference"
(userguide/settings.html: ``store``, ``processing_guarantee``, ``topic_partitions``,
``consumer_auto_offset_reset``).

The process runs until it is stopped (SIGTERM: Faust's worker commits and exits); it writes
``RESULT_FILE`` once it has processed ``EXPECTED`` events (``common.Progress``).
"""

from __future__ import annotations

from typing import NoReturn

import faust

from bench.rivals.common import EventStep, Progress, load_config, parse_args

PARTITIONS = 4
"""The source topic's partition count (the bench creates it): the table's changelog must
have as many for Faust to co-partition them."""


def create_app(args) -> faust.App:
    step = EventStep(load_config(args.config))
    progress = Progress(args.expected, args.result_file)

    app = faust.App(
        args.group,
        broker=f"kafka://{args.broker}",
        store="rocksdb://",
        datadir=str(args.state_dir),
        processing_guarantee="at_least_once",
        consumer_auto_offset_reset="earliest",  # the events are in the topic before the app starts
        topic_partitions=PARTITIONS,
        web_enabled=False,  # several of these run on one machine: no fixed web port
        autodiscover=False,
    )
    raw = dict(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
    tool_calls = app.topic(args.source, **raw)
    verdicts = app.topic(args.sink, **raw)
    runs = app.Table(
        "runs", default=None, partitions=PARTITIONS, options={"driver": "rocksdict"}, key_type=bytes, value_type=bytes
    )

    @app.agent(tool_calls, concurrency=1)
    async def detect(stream):
        async for key, value in stream.items():
            progress.started()
            stored, out = step(runs.get(key), value)
            if stored is None:
                runs.pop(key, None)  # the run ended
            else:
                runs[key] = stored
            for verdict in out:
                await verdicts.send(key=key, value=verdict)
            progress.finished(len(out))

    return app


def main(argv: list[str] | None = None) -> NoReturn:
    args = parse_args("python -m bench.rivals.faust_agent", __doc__.splitlines()[0], argv)
    # Runs until SIGTERM, then exits the process (SystemExit) with the worker's status.
    faust.Worker(create_app(args), loglevel="warning", quiet=True, redirect_stdouts=False).execute_from_commandline()


if __name__ == "__main__":
    main()
