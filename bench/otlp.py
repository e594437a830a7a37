"""``loopwatch otlp``'s own cost per span on one core: an OTLP protobuf export of tool spans
decoded, each span turned into its two hashed events and each event encoded as the record
value the receiver publishes (what the receiver does besides HTTP and Kafka's produce).

    python -m bench.otlp [--spans 20000] [--per-export 500] [--repeats 5] [--broker HOST:PORT]

Prints spans per second for each repeat and their median.  With ``--broker``, the whole
receiver instead: ``loopwatch otlp`` started as its own process on that broker, the exports
POSTed to it over HTTP, and its process's CPU seconds (user + system, from /proc) until it has
published every event: spans per CPU second of the receiver, HTTP and Kafka included.  Each span carries ~120-byte
arguments and a ~400-byte result, as Pydantic AI records them with include_content.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from bench.kafka import create_topics, process_cpu_seconds
from schemas.events import encode_event
from streams.integrations.otlp import decode_protobuf
from streams.integrations.otlp.receiver import events_of


def export(first: int, count: int) -> bytes:
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    resource.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="bench-agent")))
    scope = resource.scope_spans.add()
    for n in range(first, first + count):
        span = scope.spans.add(
            trace_id=(n // 50).to_bytes(16, "big"), span_id=n.to_bytes(8, "big"), name="execute_tool"
        )
        span.end_time_unix_nano = 1_700_000_000_000_000_000 + n
        for key, value in (
            ("gen_ai.operation.name", "execute_tool"),
            ("gen_ai.tool.name", "read_file"),
            ("gen_ai.tool.call.id", f"call-{n}"),
            (
                "gen_ai.tool.call.arguments",
                f'{{"path": "src/module_{n % 7}.py", "offset": {n % 3}, "limit": 200, "encoding": "utf-8"}}',
            ),
            ("gen_ai.tool.call.result", "line of source code\n" * 20),
            ("gen_ai.agent.name", "bench-agent"),
        ):
            span.attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
    return request.SerializeToString()


def end_to_end(broker: str, bodies: list[bytes], total: int, repeats: int) -> list[float]:
    port = 43180 + os.getpid() % 1000
    topic = f"bench-otlp-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topics(broker, [topic, f"{topic}-verdicts"]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "streams.cli", "otlp", "--bootstrap", broker, "--port", str(port),
         "--tool-calls-topic", topic, "--verdicts-topic", f"{topic}-verdicts"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert "observe-only" in proc.stdout.readline()
        url = f"http://127.0.0.1:{port}"

        def status() -> dict:
            return json.load(urllib.request.urlopen(f"{url}/status", timeout=30))

        rates = []
        for repeat in range(repeats):
            before, taken = process_cpu_seconds(proc.pid), status()["tool_spans"]
            for body in bodies:
                request = urllib.request.Request(
                    f"{url}/v1/traces", data=body, headers={"Content-Type": "application/x-protobuf"}
                )
                urllib.request.urlopen(request, timeout=60).read()
            while status()["tool_spans"] < taken + total:
                time.sleep(0.05)
            time.sleep(1.0)  # the producer's last batches: counted in its CPU too
            seconds = process_cpu_seconds(proc.pid) - before
            rates.append(total / seconds)
            print(
                f"repeat {repeat + 1}: {total} spans, receiver CPU {seconds:.3f} s: {total / seconds:,.0f} spans/s",
                flush=True,
            )
        assert status()["undelivered"] == 0
        return rates
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.otlp", description=__doc__.splitlines()[0])
    p.add_argument("--spans", type=int, default=20_000)
    p.add_argument("--per-export", type=int, default=500)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--broker", default=None, help="time the whole receiver on this Kafka broker")
    args = p.parse_args()
    bodies = [export(first, args.per_export) for first in range(0, args.spans, args.per_export)]
    total = args.per_export * len(bodies)
    if args.broker:
        rates = end_to_end(args.broker, bodies, total, args.repeats)
        print(f"median: {statistics.median(rates):,.0f} spans per CPU second of the receiver (HTTP and Kafka included)")
        return
    ids = iter(range(10**12))

    def next_id() -> str:
        return f"bench-{next(ids)}"

    rates = []
    for repeat in range(args.repeats):
        start = time.process_time()
        for body in bodies:
            for call in decode_protobuf(body).calls:
                for event in events_of(call, next_id):
                    encode_event(event)
        seconds = time.process_time() - start
        rates.append(total / seconds)
        print(
            f"repeat {repeat + 1}: {total} spans in {seconds:.3f} s of CPU: {total / seconds:,.0f} spans/s", flush=True
        )
    print(f"median: {statistics.median(rates):,.0f} spans/s on one core ({total} spans, {args.per_export} per export)")


if __name__ == "__main__":
    main()
