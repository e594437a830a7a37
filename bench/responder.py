"""The latency floor of ``make bench``: a raw aiokafka responder with no loopwatch logic.

``python -m bench.responder BROKER SOURCE SINK READY_FILE`` consumes ``SOURCE`` from
its end and answers every gated ``tool_call.requested`` event with a fixed ``allow`` decision
on ``SINK`` (same partition, one record batch per fetched partition, ``acks=all``): what the
worker does minus the engine, the state and the checkpoints.  Measured at the same offered
load on the same broker right after the worker, it shows how much of the decision latency
the machine and aiokafka take by themselves.  ``READY_FILE`` is written once it consumes.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from harness import wait_for_topic
from schemas import encode_verdict
from schemas.events import InvalidEvent, ToolCallRequested, decode_event
from schemas.verdicts import Decision


def allow(event: ToolCallRequested) -> bytes:
    return encode_verdict(
        Decision(
            verdict_id=f"floor:{event.event_id}",
            cause_event_id=event.event_id,
            run_id=event.run_id,
            session_key=event.session_key,
            agent_id=event.agent_id,
            ts_ms=event.ts_ms,
            tool_call_id=event.tool_call_id,
            tool_name=event.tool_name,
            args_hash=event.args_hash,
            action="allow",
        )
    )


async def respond(broker: str, source: str, sink: str, ready_file: Path) -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers=broker, enable_auto_commit=False)
    producer = AIOKafkaProducer(bootstrap_servers=broker, linger_ms=0, acks="all")
    await consumer.start()
    await producer.start()
    try:
        partitions = [TopicPartition(source, p) for p in range(await wait_for_topic(broker, source))]
        consumer.assign(partitions)
        await consumer.seek_to_end(*partitions)
        for tp in partitions:
            await consumer.position(tp)
        ready_file.write_text("ready\n")
        while True:
            fetched = await consumer.getmany(timeout_ms=1000)
            for tp, records in fetched.items():
                batch = producer.create_batch()
                answered = 0
                for record in records:
                    try:
                        event = decode_event(record.value)
                    except InvalidEvent:
                        continue
                    if isinstance(event, ToolCallRequested) and event.gate:
                        batch.append(key=record.key, value=allow(event), timestamp=None)
                        answered += 1
                if answered:
                    batch.close()
                    await producer.send_batch(batch, sink, partition=tp.partition)
    finally:
        await producer.stop()
        await consumer.stop()


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: python -m bench.responder BROKER SOURCE_TOPIC SINK_TOPIC READY_FILE", file=sys.stderr)
        return 2
    broker, source, sink, ready = argv
    try:
        asyncio.run(respond(broker, source, sink, Path(ready)))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
