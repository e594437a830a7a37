"""``loopwatch otlp``: the OTLP/HTTP receiver for GenAI tool spans (observe-only)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys

from .receiver import ReceiverOptions, serve

PROG = "loopwatch otlp"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Receive OpenTelemetry GenAI execute_tool spans over OTLP/HTTP (protobuf or JSON) and publish "
        "them to loopwatch as hashed tool-call events. Observe-only: a span closes after its call ran, so no call is "
        "gated; verdicts, aborts and metrics are as for any runner.",
    )
    from streams.app.broker_options import add_broker_options

    add_broker_options(p, signing="sign")
    p.add_argument("--tool-calls-topic", default="tool-calls")
    p.add_argument("--verdicts-topic", default="loop-verdicts")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=4318, help="port to listen on (default: 4318, OTLP/HTTP's)")
    p.add_argument(
        "--run-from",
        default="trace",
        metavar="trace|attribute:NAME",
        help="which run a span belongs to: its trace (default), or a span or resource attribute such as "
        "attribute:gen_ai.conversation.id (spans without it fall back to their trace)",
    )
    p.add_argument(
        "--without-arguments",
        action="store_true",
        help="also take tool spans that carry no arguments (every call of a tool then looks alike); by default they "
        "are passed over and counted",
    )
    p.add_argument("--start-timeout", type=float, default=30.0, metavar="S", help="seconds to reach Kafka at start")
    return p


async def _run(args: argparse.Namespace, options: ReceiverOptions, kafka_options: dict) -> int:
    from streams.client import LoopwatchClient

    client = LoopwatchClient(
        args.bootstrap,
        mode="advisory",
        tool_calls_topic=args.tool_calls_topic,
        verdicts_topic=args.verdicts_topic,
        start_timeout=args.start_timeout,
        linger_ms=5,
        **kafka_options,
    )
    await client.start()
    runner = await serve(client, options, args.host, args.port)
    print(
        f"{PROG}: receiving OTLP/HTTP traces on http://{args.host}:{args.port}/v1/traces, runs from {options.run_from};"
        " observe-only (spans cannot be gated)",
        flush=True,
    )
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    try:
        await stopping.wait()
    finally:
        await runner.cleanup()
        await client.stop()
    return 0


def main(argv: list[str]) -> int:
    from schemas.config import ConfigError
    from streams.app.broker_options import client_settings, signing_key_of

    args = build_parser().parse_args(argv)
    try:
        options = ReceiverOptions(run_from=args.run_from, without_arguments=args.without_arguments)
        settings = client_settings(args, PROG)
        kafka_options = settings.kafka_client_options()
        key = signing_key_of(args)
    except (ValueError, ConfigError) as exc:  # SettingsError, SigningKeyError
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    args.bootstrap = settings.broker
    if key is not None:  # every run's agent is then the key's (the worker refuses another)
        kafka_options["signing_key"] = key
        options = dataclasses.replace(options, agent_id=key.agent_id)
    from streams.client import LoopwatchUnavailable
    from streams.edge.broker import BrokerAccessError

    try:
        return asyncio.run(_run(args, options, kafka_options))
    except (LoopwatchUnavailable, BrokerAccessError, OSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
