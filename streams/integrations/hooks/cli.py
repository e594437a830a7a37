"""``loopwatch hook``: ``--serve``, ``install``, and the per-call ``claude-code``, ``codex`` and
``gemini`` (``call``, which ``streams.cli`` runs without importing this module)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .call import CLIS, DEFAULT_TIMEOUT_S, default_socket

PROG = "loopwatch hook"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="loopwatch behind an agent CLI's own hooks: a serve process holding the Kafka connection, "
        "the per-call command the CLI runs (loopwatch hook claude-code|codex|gemini), and their installation.",
    )
    p.add_argument("--serve", action="store_true", help="answer the per-call hook commands over a Unix socket")
    p.add_argument("--socket", default=None, help="the Unix socket (default: $LOOPWATCH_HOOK_SOCKET or per user)")
    p.add_argument(
        "--http",
        type=int,
        default=None,
        metavar="PORT",
        help="also answer Claude Code's HTTP hooks at POST http://HOST:PORT/hooks/claude-code (0: any free port)",
    )
    p.add_argument("--http-host", default="127.0.0.1", metavar="HOST", help="the --http address (default: 127.0.0.1)")
    p.add_argument(
        "--http-token-file",
        default=None,
        metavar="PATH",
        help="the --http bearer token's file, made with a random token if missing (default: $LOOPWATCH_HOOK_TOKEN, "
        "else a per-user file next to the default socket)",
    )
    p.add_argument("--tool-calls-topic", default="tool-calls")
    p.add_argument("--verdicts-topic", default="loop-verdicts")
    p.add_argument("--timeout", type=float, default=1.0, metavar="S", help="seconds to wait for a decision")
    p.add_argument("--start-timeout", type=float, default=30.0, metavar="S", help="seconds to reach Kafka at start")
    p.add_argument(
        "--fail-closed", action="store_true", help="deny a call when no decision arrives in time (default: run it)"
    )
    p.add_argument(
        "--agent-id",
        default=None,
        help="the agent id of the runs (default: the signing key's agent, else the CLI's: claude-code, codex or gemini-cli)",
    )
    from streams.app.broker_options import add_broker_options

    add_broker_options(p, signing="sign")
    sub = p.add_subparsers(dest="action")
    i = sub.add_parser("install", help="write loopwatch's hooks into the CLI's settings file")
    i.add_argument("--cli", choices=CLIS, required=True)
    i.add_argument(
        "--settings",
        default=None,
        help="default: the project's .claude/settings.json or .gemini/settings.json, Codex CLI's ~/.codex/hooks.json",
    )
    i.add_argument(
        "--command",
        default=None,
        help="the per-call command (default: the relay --relay names; loopwatch hook <cli> does the same, "
        "slower to start)",
    )
    i.add_argument(
        "--relay",
        choices=("native", "python"),
        default=None,
        help="the per-call relay: native (relay.c compiled with cc into ~/.cache/loopwatch/relay, about 1 ms to "
        "start) or python (python -I -S .../relay.py); default: native when a C compiler is found",
    )
    i.add_argument(
        "--http",
        dest="install_http",
        default=None,
        metavar="URL",
        help="Claude Code only: HTTP hooks to this URL (loopwatch hook --serve --http PORT) instead of commands",
    )
    i.add_argument("--socket", dest="install_socket", default=None, help="the serve process's socket, if not default")
    i.add_argument("--fail-closed", dest="install_fail_closed", action="store_true", help="deny when loopwatch is away")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.action == "install":
        from .install import CLIS as SETTINGS
        from .install import InstallError, chosen_relay, hook_command, http_hook, install

        if args.install_http is not None:
            try:
                hook = http_hook(args.cli, args.install_http)
                if args.command or args.install_socket or args.install_fail_closed or args.relay:
                    raise InstallError(
                        "--http takes no --command, --relay, --socket or --fail-closed (give them to --serve)"
                    )
                print(install(Path(args.settings or SETTINGS[args.cli].path()), hook, args.cli))
            except InstallError as exc:
                print(f"{PROG} install: {exc}", file=sys.stderr)
                return 2
            return 0
        if args.command and args.relay:
            print(f"{PROG} install: give --command or --relay, not both", file=sys.stderr)
            return 2
        try:
            per_call, which = (args.command, None) if args.command else chosen_relay(args.cli, args.relay)
            command = hook_command(per_call, socket=args.install_socket, fail_closed=args.install_fail_closed)
            done = install(Path(args.settings or SETTINGS[args.cli].path()), command, args.cli)
            if which:
                print(which)
            print(done)
        except InstallError as exc:
            print(f"{PROG} install: {exc}", file=sys.stderr)
            return 2
        return 0
    if not args.serve:
        print(f"{PROG}: give --serve, install, or the CLI ({'|'.join(CLIS)}); see {PROG} --help", file=sys.stderr)
        return 2
    if args.http is not None and not 0 <= args.http <= 65535:
        print(f"{PROG}: --http {args.http}: a port is 0 to 65535", file=sys.stderr)
        return 2
    if not 0 < args.timeout <= DEFAULT_TIMEOUT_S:
        print(
            f"{PROG}: --timeout is above 0 and at most {DEFAULT_TIMEOUT_S}s (the per-call command's)", file=sys.stderr
        )
        return 2
    if args.http_token_file is not None and args.http is None:
        print(f"{PROG}: --http-token-file is the --http endpoint's: give --http PORT too", file=sys.stderr)
        return 2
    args.socket = args.socket or default_socket()
    args.http_token = args.http_token_where = None
    if args.http is not None:
        from .http_endpoint import TokenError, http_token

        try:
            args.http_token, args.http_token_where = http_token(args.http_token_file)
        except TokenError as exc:
            print(f"{PROG} --serve: {exc}", file=sys.stderr)
            return 2
    from schemas.config import ConfigError
    from streams.app.broker_options import client_settings, signing_key_of

    try:
        settings = client_settings(args, f"{PROG} --serve")
        args.bootstrap = settings.broker
        args.kafka_options = settings.kafka_client_options()
        key = signing_key_of(args)
    except ConfigError as exc:  # SettingsError, SigningKeyError
        print(f"{PROG} --serve: {exc}", file=sys.stderr)
        return 2
    if key is not None:
        if args.agent_id not in (None, key.agent_id):
            print(
                f"{PROG} --serve: --agent-id {args.agent_id!r}: the signing key is {key.agent_id!r}'s", file=sys.stderr
            )
            return 2
        args.agent_id = key.agent_id
        args.kafka_options["signing_key"] = key
    # Left None, each CLI's runs take the CLI's own name (the serve process's HookServer).
    from streams.client import LoopwatchUnavailable
    from streams.edge.broker import BrokerAccessError

    from .serve import main as serve_main

    try:
        return serve_main(args)
    except (LoopwatchUnavailable, BrokerAccessError, FileExistsError, OSError) as exc:
        print(f"{PROG} --serve: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
