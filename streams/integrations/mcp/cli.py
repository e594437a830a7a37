"""``loopwatch mcp-gateway``: its options, the YAML file of upstreams, stdio or HTTP serving."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import yaml

from schemas.config import ConfigError
from streams.app.broker_options import add_broker_options, client_settings, signing_key_of
from streams.client import LoopwatchUnavailable
from streams.edge.broker import BrokerAccessError

from .gateway import Gateway, GatewayOptions
from .relay import Relay, relays
from .upstream import UpstreamSpec, UpstreamUnavailable

PROG = "loopwatch mcp-gateway"


class UsageError(ConfigError):
    """Bad flags or a bad upstreams file: one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "An MCP server in front of one or more upstream MCP servers: every tools/call is checked with "
            "loopwatch (arguments and results are hashed here; only hashes are published)."
        ),
    )
    p.add_argument(
        "--upstream",
        action="append",
        default=[],
        metavar="[NAME=]COMMAND|URL",
        help="an upstream server: a command line (stdio) or an http(s) URL (repeat for several)",
    )
    p.add_argument(
        "--prefix",
        action="append",
        default=[],
        metavar="NAME=PREFIX",
        help="put PREFIX before the tool and prompt names of upstream NAME",
    )
    p.add_argument("--upstreams-file", metavar="FILE", help="a YAML file of upstreams (see docs/integrations.md)")
    p.add_argument("--tool-calls-topic", default="tool-calls")
    p.add_argument("--verdicts-topic", default="loop-verdicts")
    p.add_argument("--mode", choices=("gate", "advisory"), default="gate")
    p.add_argument(
        "--timeout",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds to wait for loopwatch's decision (default 1, as the clients)",
    )
    p.add_argument(
        "--fail-closed", action="store_true", help="refuse a call when no decision arrives in time (default: run it)"
    )
    p.add_argument("--agent-id", help="the agent's id (default: the MCP client's name)")
    p.add_argument("--session-key", help="the session key (default: mcp:<agent id>:<run id>)")
    p.add_argument("--run-id", help="the run id (default: a new one per session)")
    p.add_argument(
        "--upstream-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds a forwarded call may take before the agent gets an error (default 60)",
    )
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds to connect to an upstream server (default 30)",
    )
    p.add_argument(
        "--run-idle-timeout",
        type=float,
        default=1800.0,
        metavar="S",
        help="over HTTP: a run also ends after this long without a call (default 1800)",
    )
    p.add_argument(
        "--restart-after-timeouts",
        type=int,
        default=3,
        metavar="N",
        help="restart (stdio) or reconnect (HTTP) an upstream after N calls in a row timed out; 0: never (default 3)",
    )
    p.add_argument(
        "--restart-after-silence",
        type=float,
        default=120.0,
        metavar="S",
        help="... or when a call times out and the upstream has answered nothing for S seconds (default 120)",
    )
    p.add_argument(
        "--restart-backoff-max",
        type=float,
        default=60.0,
        metavar="S",
        help="restarts without an answer in between wait 1, 2, 4 ... up to S seconds (default 60)",
    )
    p.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on PORT instead of stdio")
    p.add_argument(
        "--http-max-sessions",
        type=int,
        default=1000,
        metavar="N",
        help="over HTTP: at most N open sessions; one more is refused with 503 (default 1000)",
    )
    p.add_argument(
        "--http-session-idle-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="over HTTP: close a session without a request for S seconds (default 600)",
    )
    p.add_argument(
        "--sdk-proxy",
        action="store_true",
        help="over stdio with one upstream command, serve through the SDK's server and client "
        "instead of relaying its messages as they are (the default; docs/mcp-gateway.md)",
    )
    p.add_argument("--host", default="127.0.0.1", help="the HTTP address (default 127.0.0.1)")
    p.add_argument("--log-level", default="WARNING")
    add_broker_options(p, signing="sign")
    return p


def load_upstreams_file(path: str) -> list[UpstreamSpec]:
    """``upstreams:`` a list of ``{name, command | url, args?, env?, cwd?, prefix?}``."""
    try:
        root = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not YAML: {str(exc).splitlines()[0]}") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise UsageError(f"{path}: nested too deep to be a file of upstreams") from None
    entries = root.get("upstreams") if isinstance(root, dict) else None
    if not isinstance(entries, list) or not entries:
        raise UsageError(f"{path}: expected a non-empty list under 'upstreams'")
    specs = []
    for i, entry in enumerate(entries):
        where = f"{path}: upstreams[{i}]"
        if not isinstance(entry, dict):
            raise UsageError(f"{where}: expected a mapping")
        unknown = set(entry) - {"name", "command", "args", "url", "env", "cwd", "prefix"}
        if unknown:
            raise UsageError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        command = entry.get("command")
        if isinstance(command, str):
            command = [command]
        if command is not None and not (
            isinstance(command, list) and command and all(isinstance(c, str) for c in command)
        ):
            raise UsageError(f"{where}: 'command' is a string or a list of strings")
        args = entry.get("args", [])
        if not (isinstance(args, list) and all(isinstance(a, str) for a in args)):
            raise UsageError(f"{where}: 'args' is a list of strings")
        env = entry.get("env", {})
        if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
            raise UsageError(f"{where}: 'env' maps names to strings")
        for key in ("name", "url", "cwd", "prefix"):
            if entry.get(key) is not None and not isinstance(entry[key], str):
                raise UsageError(f"{where}: '{key}' is a string")
        argv = tuple([*(command or []), *args])
        name = entry.get("name") or (entry.get("url") or (os.path.basename(argv[0]) if argv else f"upstream-{i}"))
        try:
            specs.append(
                UpstreamSpec(
                    name=name,
                    command=argv,
                    url=entry.get("url"),
                    env=env,
                    cwd=entry.get("cwd"),
                    prefix=entry.get("prefix") or "",
                )
            )
        except ValueError as exc:
            raise UsageError(f"{where}: {exc}") from None
    return specs


def options_from(args: argparse.Namespace) -> GatewayOptions:
    specs: list[UpstreamSpec] = []
    if args.upstreams_file:
        specs += load_upstreams_file(args.upstreams_file)
    try:
        specs += [UpstreamSpec.parse(text) for text in args.upstream]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not specs:
        raise UsageError("give at least one --upstream (a command or a URL) or --upstreams-file")
    prefixes: dict[str, str] = {}
    for text in args.prefix:
        name, sep, prefix = text.partition("=")
        if not sep or not name:
            raise UsageError(f"--prefix {text!r}: expected NAME=PREFIX")
        prefixes[name] = prefix
    unknown = set(prefixes) - {s.name for s in specs}
    if unknown:
        raise UsageError(
            f"--prefix for unknown upstream(s): {', '.join(sorted(unknown))} "
            f"(upstreams: {', '.join(s.name for s in specs)})"
        )
    specs = [
        UpstreamSpec(
            name=s.name, command=s.command, url=s.url, env=s.env, cwd=s.cwd, prefix=prefixes.get(s.name, s.prefix)
        )
        for s in specs
    ]
    if len({s.name for s in specs}) != len(specs):
        raise UsageError("two upstreams have the same name: name them (NAME=COMMAND or 'name:' in the file)")
    for flag in (
        "timeout",
        "upstream_timeout",
        "connect_timeout",
        "run_idle_timeout",
        "restart_after_silence",
        "restart_backoff_max",
        "http_max_sessions",
        "http_session_idle_timeout",
    ):
        if not getattr(args, flag) > 0:
            raise UsageError(f"--{flag.replace('_', '-')} must be positive")
    try:
        settings = client_settings(args, PROG)
        kafka_options = settings.kafka_client_options()
        key = signing_key_of(args)
    except ConfigError as exc:  # SettingsError, SigningKeyError
        raise UsageError(str(exc)) from None
    agent_id = args.agent_id
    if key is not None:
        # A worker that checks signatures refuses an event naming another agent than the key's.
        if agent_id is not None and agent_id != key.agent_id:
            raise UsageError(f"--agent-id {agent_id!r}: the signing key {key.key_id} is agent {key.agent_id!r}'s")
        agent_id = key.agent_id
        kafka_options["signing_key"] = key
    if args.restart_after_timeouts < 0:
        raise UsageError("--restart-after-timeouts must be 0 (never) or more")
    return GatewayOptions(
        upstreams=tuple(specs),
        bootstrap_servers=settings.broker,
        mode=args.mode,
        timeout=args.timeout,
        fail_closed=args.fail_closed,
        tool_calls_topic=args.tool_calls_topic,
        verdicts_topic=args.verdicts_topic,
        agent_id=agent_id,
        session_key=args.session_key,
        run_id=args.run_id,
        upstream_timeout=args.upstream_timeout,
        connect_timeout=args.connect_timeout,
        run_idle_timeout=args.run_idle_timeout,
        relay=not args.sdk_proxy,
        kafka_options=tuple(kafka_options.items()),
        restart_after_timeouts=args.restart_after_timeouts,
        restart_after_silence=args.restart_after_silence,
        restart_backoff_max=args.restart_backoff_max,
        http_max_sessions=args.http_max_sessions,
        http_session_idle_timeout=args.http_session_idle_timeout,
    )


async def serve(
    options: GatewayOptions, *, http_port: int | None = None, host: str = "127.0.0.1", ready: Any = None
) -> None:
    if http_port is None and relays(options):
        if await _relay(options):
            return
    gateway = Gateway(options)
    server = await gateway.start()
    _freeze_startup_objects()
    try:
        if http_port is None:
            from .stdio import agent_stdio

            async with agent_stdio() as (read, write):
                await server.run(read, write, server.create_initialization_options())
            await gateway.end_session_run()
        else:
            import uvicorn

            app = gateway.http_app(host)
            config = uvicorn.Config(app, host=host, port=http_port, log_level="warning", lifespan="on")
            http = uvicorn.Server(config)

            # uvicorn shuts down on SIGINT/SIGTERM, then raises the signal again for the handler it
            # found: the default one would kill the process before ``stop`` ends the open runs.
            # This one only asks uvicorn to shut down (a signal before it took over, too).
            def shut_down(signum: int, frame: Any) -> None:
                http.should_exit = True

            previous = {sig: signal.signal(sig, shut_down) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                await http.serve()
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
    finally:
        await gateway.stop()


def _freeze_startup_objects() -> None:
    """Keep what start-up made (the SDK's, pydantic's and aiokafka's modules and classes, about
    90,000 objects) out of every later garbage collection: they live as long as the process,
    and a full collection that walks them takes about 50 ms, stalling every call in flight
    (docs/benchmarks.md)."""
    gc.collect()
    gc.freeze()


async def _relay(options: GatewayOptions) -> bool:
    """Serve stdio as a relay; False when stdin cannot be read by the event loop (a regular
    file): the SDK's server reads it with threads then."""
    from .stdio import agent_pipes

    async with agent_pipes() as pipes:
        if pipes is None:
            return False
        relay = Relay(options)
        await relay.start()
        _freeze_startup_objects()
        try:
            await relay.serve(*pipes)
        finally:
            await relay.stop()
    return True


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # stdout is the MCP channel over stdio: every log line goes to stderr.
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if logging.getLogger().level > logging.DEBUG:
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # its retries while a topic is missing
    try:
        options = options_from(args)
        asyncio.run(serve(options, http_port=args.http, host=args.host))
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except (LoopwatchUnavailable, BrokerAccessError, UpstreamUnavailable) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
