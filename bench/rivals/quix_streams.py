"""Peer (d1) of ``make bench``: loopwatch's engine as a Quix Streams user would run it.

``python -m bench.rivals.quix_streams BROKER SOURCE SINK GROUP EXPECTED CONFIG STATE_DIR RESULT_FILE``

Written the way Quix Streams' documentation shows a stateful application, with its defaults
wherever the workload does not need another value:

* an ``Application`` with at-least-once processing (its default, stated) and a RocksDB
  state directory, changelog topics on (the default);
* ``app.dataframe(topic)`` over the preloaded ``tool-calls`` topic (raw bytes in), and one
  keyed stateful function, ``sdf.apply(detect, stateful=True, expand=True)``: Quix hands it
  the ``State`` of the record's Kafka key (the run id), where the run's engine state lives
  as bytes (``State.get_bytes``/``set_bytes``, encoded with ``streams.engine.encode_state``);
* its verdicts, one output record each, to the sink with ``sdf.to_topic`` (raw bytes out,
  keyed by the event's key).

References (Quix Streams 3.x documentation): "Stateful Applications"
(quix.io/docs/quix-streams/advanced/stateful-processing.html: ``stateful=True``, ``State``,
``get_bytes``/``set_bytes``, changelog topics), "Processing & Transforming Data"
(quix.io/docs/quix-streams/processing.html: ``apply(..., expand=True)``, ``to_topic``),
"Serialization" (quix.io/docs/quix-streams/advanced/serialization.html: the ``bytes``
(de)serializers) and the ``Application`` API reference (``processing_guarantee``,
``auto_offset_reset``, ``state_dir``).

The process runs until it is stopped (SIGTERM: Quix commits its checkpoint and exits); it
writes ``RESULT_FILE`` once it has processed ``EXPECTED`` events (``common.Progress``).
"""

from __future__ import annotations

import sys

from quixstreams import Application, State

from bench.rivals.common import EventStep, Progress, load_config, parse_args

RUN_STATE = "run"
"""The name under which a run's engine state is kept in its key's ``State``."""


def main(argv: list[str] | None = None) -> int:
    args = parse_args("python -m bench.rivals.quix_streams", __doc__.splitlines()[0], argv)
    step = EventStep(load_config(args.config))
    progress = Progress(args.expected, args.result_file)

    app = Application(
        broker_address=args.broker,
        consumer_group=args.group,
        auto_offset_reset="earliest",  # the events are in the topic before the app starts
        processing_guarantee="at-least-once",
        state_dir=args.state_dir,
        loglevel="WARNING",
    )
    tool_calls = app.topic(args.source, key_deserializer="bytes", value_deserializer="bytes")
    verdicts = app.topic(args.sink, key_serializer="bytes", value_serializer="bytes")

    def detect(value: bytes, state: State) -> list[bytes]:
        progress.started()
        stored, out = step(state.get_bytes(RUN_STATE), value)
        if stored is None:
            state.delete(RUN_STATE)  # the run ended
        else:
            state.set_bytes(RUN_STATE, stored)
        progress.finished(len(out))
        return out

    sdf = app.dataframe(tool_calls)
    sdf = sdf.apply(detect, stateful=True, expand=True)
    sdf.to_topic(verdicts)
    app.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
