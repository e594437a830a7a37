"""``run_worker``: start the loopwatch Faust worker (``python -m streams.app.worker``).

Settings come from ``LOOPWATCH_*`` variables (``streams.app.settings``); the few options
below override them for one run.  Defaults: log level info, web server on 127.0.0.1, RocksDB
under ``LOOPWATCH_DATA_DIR``.  Returns the process exit code (0 after a clean stop by
SIGTERM/SIGINT; non-zero when the worker could not start or crashed).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from .broker_options import add_broker_options, broker_overrides

__all__ = ["build_parser", "run_worker"]

LOGLEVELS = ("debug", "info", "warn", "error", "crit")


def build_parser(prog: str = "loopwatch worker") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Run the loopwatch stream processor (a Faust worker).",
        epilog=_settings_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-l", "--loglevel", default="info", choices=LOGLEVELS, help="log level (default: info)")
    p.add_argument("--logfile", default=None, help="log to this file instead of stderr")
    p.add_argument("--app-id", dest="app_id", help="Faust app id / consumer group (LOOPWATCH_APP_ID)")
    p.add_argument("--config", type=Path, help="loop-detection config file (LOOPWATCH_CONFIG)")
    p.add_argument("--data-dir", dest="data_dir", type=Path, help="RocksDB directory (LOOPWATCH_DATA_DIR)")
    p.add_argument("--web-host", dest="web_host", help="web server bind address (LOOPWATCH_WEB_HOST)")
    p.add_argument("--web-port", dest="web_port", type=int, help="web server port (LOOPWATCH_WEB_PORT)")
    p.add_argument(
        "--metrics-port", dest="metrics_port", type=int, help="Prometheus port, 0 = off (LOOPWATCH_METRICS_PORT)"
    )
    p.add_argument("--quiet", action="store_true", help="no start-up banner")
    add_broker_options(p, signing="verify")
    return p


def _settings_epilog() -> str:
    """Every setting with its variable and default, from the Settings class itself, so the
    help never misses one."""
    import dataclasses

    from .settings import PREFIX, Settings, env_name

    lines = [
        f"Settings: {PREFIX}* environment variables (or the file named by {PREFIX}SETTINGS_FILE);",
        "the options above override them. A LOOPWATCH_* variable no loopwatch process reads is",
        "refused, naming the closest valid one. Variables and defaults:",
    ]
    for f in dataclasses.fields(Settings):
        default = f.default if f.default is not dataclasses.MISSING else None
        shown = "(unset)" if default is None or not f.repr else str(default)
        lines.append(f"  {env_name(f.name):<36} {shown}")
    return "\n".join(lines)


def run_worker(argv: list[str] | None = None) -> int:
    from .settings import Settings, SettingsError, refuse_a_runners_signing_key

    args = build_parser().parse_args(argv)
    overrides = {
        name: getattr(args, name) for name in ("app_id", "config", "data_dir", "web_host", "web_port", "metrics_port")
    }
    overrides.update(broker_overrides(args, "loopwatch worker"))
    try:
        refuse_a_runners_signing_key(os.environ)
        settings = Settings.from_env(**overrides)
    except SettingsError as exc:
        print(f"loopwatch worker: {exc}", file=sys.stderr)
        return 2

    # Faust's worker wants the event loop it runs on to exist before the app is built.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)

    from schemas.config import ConfigError
    from schemas.signing import SigningKeyError

    try:
        from streams.edge.broker import BrokerAccessError, redact_sasl_exchanges

        from . import faust_adapter, logs
        from .app import build_worker
        from .topics import ensure_topics
    except ImportError as exc:  # streams.app.faust_adapter.DependencyVersionError among them
        print(f"loopwatch worker: {exc}", file=sys.stderr)
        return 2

    try:
        built = build_worker(settings)
        app = built.app
    except (ConfigError, SigningKeyError) as exc:
        print(f"loopwatch worker: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the config file named by LOOPWATCH_CONFIG, say
        print(f"loopwatch worker: cannot read {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    worker = faust_adapter.Worker(  # faust.Worker; SIGUSR2 dumps every thread's and task's stack
        app,
        loglevel=args.loglevel,
        logfile=args.logfile,
        quiet=args.quiet,
        redirect_stdouts=False,
        loop=loop,
    )
    logs.configure(args.logfile)
    redact_sasl_exchanges()
    try:
        loop.run_until_complete(ensure_topics(settings, built.extra_topics(), shadow=built.uses_shadow_topic()))
    except BrokerAccessError as exc:
        # Refused credentials or an untrusted certificate do not get better by retrying.
        print(f"loopwatch worker: cannot use the Kafka cluster: {exc}", file=sys.stderr)
        loop.close()
        return 2
    logging.getLogger("loopwatch.worker").debug("settings: %r", settings)
    if built.watchdog is not None:
        built.watchdog.start(loop)  # from here on, a worker out of its group for too long exits
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def main() -> None:
    sys.exit(run_worker(sys.argv[1:]))


if __name__ == "__main__":
    main()
