"""The broker and its security on every command line: one set of flags, read one way.

Every command that talks to Kafka (the worker, the MCP gateway, ``backtest``, ``hook --serve``,
``demo``) takes ``--bootstrap`` (``LOOPWATCH_BOOTSTRAP``) and the worker's TLS and SASL
settings as flags (``--security-protocol``, ``--ssl-cafile``, ``--ssl-certfile``,
``--ssl-keyfile``, ``--sasl-mechanism``, ``--sasl-username``; the password only from
``LOOPWATCH_KAFKA_SASL_PASSWORD``, never a flag that ``ps`` shows).  Signing: the worker
and ``backtest`` verify with ``--signing-keys`` (a keyring); a publisher signs with ``--signing-key`` (one
agent's key file, ``LOOPWATCH_SIGNING_KEY``).

The flags override ``LOOPWATCH_*`` variables, which ``Settings`` validates (a bad value is
one line naming it).  The old spellings, ``--broker`` and ``LOOPWATCH_BROKER``, still work
and print one deprecation line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .settings import DEPRECATED_BROKER_ENV, PREFIX, Settings

if TYPE_CHECKING:
    from schemas.signing import SigningKey

__all__ = ["SIGNING_KEY_ENV", "add_broker_options", "broker_overrides", "client_settings", "signing_key_of"]

SIGNING_KEY_ENV = PREFIX + "SIGNING_KEY"

_SECURITY_FLAGS = (
    # flag, Settings field, help
    ("--security-protocol", "security_protocol", "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"),
    ("--ssl-cafile", "ssl_cafile", "CA file the brokers' certificates are checked against"),
    ("--ssl-certfile", "ssl_certfile", "client certificate (mutual TLS)"),
    ("--ssl-keyfile", "ssl_keyfile", "client certificate's key"),
    ("--sasl-mechanism", "sasl_mechanism", "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"),
    ("--sasl-username", "sasl_username", "SASL user (the password: $LOOPWATCH_KAFKA_SASL_PASSWORD)"),
)


def add_broker_options(
    parser: argparse.ArgumentParser, *, signing: Literal["verify", "sign"] | None = None
) -> argparse.ArgumentParser:
    """Add ``--bootstrap``, the deprecated ``--broker``, the TLS/SASL flags and, by ``signing``,
    ``--signing-keys`` (the worker's keyring) or ``--signing-key`` (a publisher's key)."""
    from .settings import env_name

    group = parser.add_argument_group("Kafka (flags override the LOOPWATCH_* variables)")
    group.add_argument(
        "--bootstrap",
        metavar="HOST:PORT[,…]",
        help="Kafka bootstrap servers ($LOOPWATCH_BOOTSTRAP, default 127.0.0.1:19092)",
    )
    group.add_argument("--broker", dest="deprecated_broker", help=argparse.SUPPRESS)
    for flag, field, text in _SECURITY_FLAGS:
        group.add_argument(flag, dest=field, help=f"{text} (${env_name(field)})")
    if signing == "verify":
        group.add_argument(
            "--signing-keys",
            dest="signing_keys",
            type=Path,
            help="accept only events signed by these keys: a key file or a directory of them ($LOOPWATCH_SIGNING_KEYS)",
        )
    elif signing == "sign":
        group.add_argument(
            "--signing-key",
            dest="signing_key",
            type=Path,
            help=f"sign every event with this agent's key file (${SIGNING_KEY_ENV})",
        )
    return parser


def broker_overrides(args: argparse.Namespace, prog: str, *, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``Settings`` overrides the broker flags give (None where a flag is absent); prints the
    deprecation line for ``--broker`` or ``LOOPWATCH_BROKER``."""
    env = os.environ if env is None else env
    bootstrap = args.bootstrap
    if args.deprecated_broker is not None:
        print(f"{prog}: --broker is deprecated, use --bootstrap", file=sys.stderr)
        bootstrap = bootstrap or args.deprecated_broker
    elif bootstrap is None and env.get(DEPRECATED_BROKER_ENV) and not env.get(PREFIX + "BOOTSTRAP"):
        print(f"{prog}: {DEPRECATED_BROKER_ENV} is deprecated, use {PREFIX}BOOTSTRAP", file=sys.stderr)
    overrides: dict[str, Any] = {"broker": bootstrap}
    for _flag, field, _text in _SECURITY_FLAGS:
        overrides[field] = getattr(args, field)
    if hasattr(args, "signing_keys"):
        overrides["signing_keys"] = args.signing_keys
    return overrides


def client_settings(args: argparse.Namespace, prog: str, *, env: Mapping[str, str] | None = None) -> Settings:
    """``Settings`` from the environment and the broker flags (``SettingsError`` on a bad one)."""
    return Settings.from_env(env, **broker_overrides(args, prog, env=env))


def signing_key_of(args: argparse.Namespace, *, env: Mapping[str, str] | None = None) -> SigningKey | None:
    """The key a publisher signs with (``--signing-key`` or ``LOOPWATCH_SIGNING_KEY``): a key
    file holding exactly one key; None when neither is given.  ``SigningKeyError`` (one line,
    naming the file) otherwise."""
    from schemas.signing import SigningKeyError, load_keys

    env = os.environ if env is None else env
    path = getattr(args, "signing_key", None) or (Path(env[SIGNING_KEY_ENV]) if env.get(SIGNING_KEY_ENV) else None)
    if path is None:
        return None
    keys = load_keys(Path(path))
    if len(keys) != 1:
        raise SigningKeyError(f"{path}: a publisher signs with one key, the file holds {len(keys)}")
    return keys[0]
