"""Worker settings: ``LOOPWATCH_*`` environment variables, optionally a settings file.

Precedence, lowest first: built-in defaults, the settings file named by
``LOOPWATCH_SETTINGS_FILE`` (a flat JSON or YAML mapping whose keys are the variable names
with or without the ``LOOPWATCH_`` prefix, in any case), then the environment.  Explicit
keyword overrides (``Settings.from_env(env, **overrides)``, used by the worker's command
line) win over everything.

Every value is validated when read; a bad value raises ``SettingsError`` naming the
variable, so a misconfigured worker fails at start instead of at the first record.  So is
every name: a ``LOOPWATCH_*`` variable that no loopwatch process reads (``VARIABLES``, the
one registry of them), or a settings-file key the worker does not know, is refused with the
closest valid name, because a misspelt ``LOOPWATCH_KAFKA_SECURITY_PROTOCOL`` would otherwise
leave the worker on PLAINTEXT without a word.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import re
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.config import ConfigError

__all__ = [
    "DEPRECATED_BROKER_ENV",
    "Settings",
    "SettingsError",
    "PREFIX",
    "VARIABLES",
    "closest",
    "refuse_a_runners_signing_key",
    "refuse_unknown_variables",
]

PREFIX = "LOOPWATCH_"
DEPRECATED_BROKER_ENV = PREFIX + "BROKER"
"""The bootstrap servers' old variable, read when ``LOOPWATCH_BOOTSTRAP`` is not set."""

_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_INSTANCE_ID = re.compile(r"[A-Za-z0-9._-]{1,240}")  # Kafka's rule for group.instance.id, 9 left for the suffix
_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class SettingsError(ConfigError):
    """A setting with a value the worker cannot use."""


@dataclass(frozen=True)
class Settings:
    broker: str = "127.0.0.1:19092"
    """Bootstrap servers, comma separated, ``host:port`` (a ``kafka://`` prefix is accepted)."""
    app_id: str = "loopwatch"
    """Faust app id: the consumer group and the prefix of the changelog topic."""
    config: Path | None = None
    """The loop-detection config file (JSON5/YAML); None runs upstream's defaults (detection off)."""
    candidate_config: Path | None = None
    """A second config file evaluated beside the live one on the same events, with its own
    per-run state; its verdicts go only to the shadow topic (docs/configuration.md, Changing thresholds
    safely).  Hot-reloaded like the live one.  None: no candidate."""
    data_dir: Path = Path(".loopwatch-state")
    """Where RocksDB keeps the run table (one directory per worker)."""
    web_host: str = "127.0.0.1"
    web_port: int = 6066
    metrics_port: int = 9108
    """Prometheus ``/metrics`` port; 0 disables the metrics server."""
    tool_calls_topic: str = "tool-calls"
    verdicts_topic: str = "loop-verdicts"
    dead_letter_topic: str = "tool-calls-dlq"
    incidents_topic: str = "loop-incidents"
    """Where fleet incidents are published (``loopwatch.fleetIncidents``; compacted, key: tool)."""
    shadow_verdicts_topic: str = "loop-verdicts-shadow"
    """Verdicts of agents in shadow mode and of the candidate config (never read by runners)."""
    partitions: int = 4
    replication: int = 1
    idle_timeout_s: float = 1800.0
    """Runs without events for this long are dropped from the table."""
    max_runs_per_agent: int = 20000
    """At most this many runs of one agent (its runs' owner) on each worker: beyond it, the idle
    sweep deletes the agent's longest idle runs first (``streams.app.expiry``)."""
    config_poll_s: float = 2.0
    """How often the config file's mtime is checked for hot reload."""
    standby_replicas: int = 1
    """Faust standby replicas of the run table (warm copies on other workers)."""
    max_batch: int = 20000
    """At most this many records are fetched and processed as one batch."""
    checkpoint_s: float = 5.0
    """Run states are written (and records acked) at most this long after processing.
    Verdicts never wait for it; it bounds the work redone after a crash (Kafka Streams
    commits every 30 s by default).  Each touched run is encoded once per checkpoint, so a
    shorter interval costs CPU on busy runs."""
    # Kafka client timeouts (seconds); tests lower them for fast joins and failovers.
    session_timeout_s: float = 60.0
    heartbeat_interval_s: float = 3.0
    rebalance_timeout_s: float = 60.0
    commit_interval_s: float = 2.8
    instance_id: str = field(default_factory=socket.gethostname)
    """This worker's static member id in the consumer group (with a digest of its URL:
    ``group_instance_id``), unique per worker and stable across its restarts: a restarted
    worker takes its partitions back at once instead of waiting for the old member's session
    to time out.  The host name by default (a StatefulSet pod's name; the chart sets it
    explicitly)."""
    broker_unreachable_s: float = 15.0
    """``/readyz`` answers 503 once no broker has answered the worker for this long."""
    member_watchdog_s: float | None = None
    """A worker that has not been a member of its consumer group (with partitions, or idle as
    a member), or whose stop has not finished, for this long exits (code 75, one line saying
    why), whatever its event loop is doing; ``/healthz`` answers 503 while it stops
    (``streams.app.watchdog``).  At least the session timeout; unset: twice the session timeout
    plus the rebalance timeout (``member_watchdog_bound_s``)."""
    clock_skew_s: float = 300.0
    """Event times more than this far ahead of the worker's clock are clamped to it."""
    # TLS / SASL
    security_protocol: str = "PLAINTEXT"
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    # Signed events
    signing_keys: Path | None = None
    """A key file, or a directory of key files (a mounted Secret), of the agents whose signed
    events are accepted (``schemas.signing``); None accepts unsigned events (the default)."""
    signed_max_age_s: float = 300.0
    """With signed events: a signed event whose ``ts_ms`` is older than this, measured from its
    record's Kafka timestamp or from the newest event its run applied, is a replay and is
    dead-lettered ``stale_event`` (``streams.app.processor``)."""

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read settings from ``env`` (default: ``os.environ``) and the optional settings file."""
        env = os.environ if env is None else env
        refuse_unknown_variables(env)
        raw: dict[str, Any] = {}
        settings_file = env.get(PREFIX + "SETTINGS_FILE")
        if settings_file:
            raw.update(_read_settings_file(Path(settings_file)))
        if env.get(DEPRECATED_BROKER_ENV) and not env.get(env_name("broker")):
            raw["broker"] = env[DEPRECATED_BROKER_ENV]
        for name in _FIELDS:
            value = env.get(env_name(name))
            if value is not None and value != "":
                raw[name] = value
        for name, value in overrides.items():
            if name not in _FIELDS:
                raise SettingsError(f"unknown setting {name!r}")
            if value is not None:
                raw[name] = value
        return cls(**{name: _parse(name, value) for name, value in raw.items()}).checked()

    def checked(self) -> Settings:
        """These settings, once each is valid; else ``SettingsError`` naming the first that is not."""
        if not self.broker_hosts:
            raise SettingsError(f"{PREFIX}BOOTSTRAP: no bootstrap server given")
        for host in self.broker_hosts:
            if ":" not in host:
                raise SettingsError(f"{PREFIX}BOOTSTRAP: {host!r} is not host:port")
        if not self.app_id:
            raise SettingsError(f"{PREFIX}APP_ID must not be empty")
        if not _INSTANCE_ID.fullmatch(self.instance_id):
            raise SettingsError(
                f"{PREFIX}INSTANCE_ID={self.instance_id!r}: use 1 to 240 ASCII letters, digits, '.', '_' or '-'"
            )
        topics = [
            self.tool_calls_topic,
            self.verdicts_topic,
            self.dead_letter_topic,
            self.incidents_topic,
            self.shadow_verdicts_topic,
        ]
        if len(set(topics)) != 5 or not all(topics):
            raise SettingsError(
                "the tool-calls, verdicts, dead-letter, incidents and shadow verdicts topics must be five distinct "
                f"names, got {topics}"
            )
        if self.security_protocol not in _SECURITY_PROTOCOLS:
            raise SettingsError(
                f"{PREFIX}KAFKA_SECURITY_PROTOCOL must be one of {', '.join(_SECURITY_PROTOCOLS)},"
                f" got {self.security_protocol!r}"
            )
        if self.sasl:
            if self.sasl_mechanism not in _SASL_MECHANISMS:
                raise SettingsError(
                    f"{PREFIX}KAFKA_SASL_MECHANISM must be one of {', '.join(_SASL_MECHANISMS)}"
                    f" with {self.security_protocol}, got {self.sasl_mechanism!r}"
                )
            if not self.sasl_username or self.sasl_password is None:
                raise SettingsError(
                    f"{PREFIX}KAFKA_SASL_USERNAME and {PREFIX}KAFKA_SASL_PASSWORD are required with {self.security_protocol}"
                )
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise SettingsError(f"{PREFIX}KAFKA_SSL_KEYFILE needs {PREFIX}KAFKA_SSL_CERTFILE")
        # Settings a protocol would silently ignore are mistakes: the worker would connect
        # without the TLS or the credentials the operator meant it to use.
        for used, names, what in (
            (self.tls, ("ssl_cafile", "ssl_certfile", "ssl_keyfile"), "TLS (SSL or SASL_SSL)"),
            (self.sasl, ("sasl_mechanism", "sasl_username", "sasl_password"), "SASL (SASL_PLAINTEXT or SASL_SSL)"),
        ):
            for name in names:
                if not used and getattr(self, name) is not None:
                    raise SettingsError(
                        f"{env_name(name)} is set but {PREFIX}KAFKA_SECURITY_PROTOCOL={self.security_protocol}"
                        f" does not use {what}"
                    )
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "signing_keys"):
            path = getattr(self, name)
            if path is not None and not path.exists():
                raise SettingsError(f"{env_name(name)}: {path} does not exist")
        if self.member_watchdog_s is not None and self.member_watchdog_s < self.session_timeout_s:
            raise SettingsError(
                f"{PREFIX}MEMBER_WATCHDOG_S={self.member_watchdog_s:g} is shorter than {PREFIX}SESSION_TIMEOUT_S="
                f"{self.session_timeout_s:g}: a worker would be stopped before it can know it lost its group"
            )
        if self.tls:
            self.ssl_context()  # a CA, certificate or key that does not load fails here, by name
        return self

    # -- derived values ----------------------------------------------------------------------

    @property
    def broker_hosts(self) -> list[str]:
        hosts = []
        for part in self.broker.split(","):
            part = part.strip()
            if part.startswith("kafka://"):
                part = part[len("kafka://") :]
            if part:
                hosts.append(part)
        return hosts

    @property
    def broker_url(self) -> str:
        """Faust's broker URL: ``kafka://h1:p1;h2:p2``."""
        return ";".join(f"kafka://{host}" for host in self.broker_hosts)

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client TLS context (server verification against the CA file, or the system CAs).
        A file that does not load raises ``SettingsError`` naming it."""
        if not self.tls:
            return None
        try:
            context = ssl.create_default_context(
                purpose=ssl.Purpose.SERVER_AUTH,
                cafile=str(self.ssl_cafile) if self.ssl_cafile else None,
            )
        except (ssl.SSLError, OSError) as exc:
            raise SettingsError(
                f"{PREFIX}KAFKA_SSL_CAFILE: cannot load {self.ssl_cafile} as PEM certificates ({exc})"
            ) from None
        if self.ssl_certfile is not None:
            try:
                context.load_cert_chain(str(self.ssl_certfile), str(self.ssl_keyfile) if self.ssl_keyfile else None)
            except (ssl.SSLError, OSError) as exc:
                files = str(self.ssl_certfile) + (f" and {self.ssl_keyfile}" if self.ssl_keyfile else "")
                raise SettingsError(
                    f"{PREFIX}KAFKA_SSL_CERTFILE/KEYFILE: cannot load {files} as a PEM certificate and key ({exc})"
                ) from None
        return context

    def kafka_client_options(self) -> dict[str, Any]:
        """The same security settings as keyword arguments for plain aiokafka clients."""
        options: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.tls:
            options["ssl_context"] = self.ssl_context()
        if self.sasl:
            options.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self.sasl_password,
            )
        return options

    @property
    def web_url(self) -> str:
        """The worker's URL as Faust announces it to the group (its ``canonical_url``)."""
        return f"http://{self.web_host}:{self.web_port}"

    @property
    def group_instance_id(self) -> str:
        """Kafka's ``group.instance.id``: ``instance_id`` and a digest of ``web_url``.

        A static member that rejoins gets the assignment its previous incarnation was given,
        without a rebalance, and Faust's assignor refuses one made for another URL: a worker
        restarted with a new web host or port would wait for ever, never ready.  With the URL
        in the id it joins as a new member instead (after the old one's session times out,
        once); and two workers on one host, which need different ports, never share an id."""
        digest = hashlib.sha256(self.web_url.encode()).hexdigest()[:8]
        return f"{self.instance_id}-{digest}"

    def internal_topic(self, name: str) -> str:
        """A topic of the worker's own (``<app id>-<name>``: its ACLs are the app id's prefix)."""
        return f"{self.app_id}-{name}"

    @property
    def member_watchdog_bound_s(self) -> float:
        """How long a worker may be out of its group before it exits (``member_watchdog_s``):
        by default two session timeouts (the broker's and a rejoin's) and a rebalance."""
        if self.member_watchdog_s is not None:
            return self.member_watchdog_s
        return 2 * self.session_timeout_s + self.rebalance_timeout_s

    @property
    def sweep_interval_s(self) -> float:
        """How often idle runs are looked for: a tenth of the timeout, within 1 s … 60 s."""
        return min(60.0, max(1.0, self.idle_timeout_s / 10.0))


# Environment names differ from field names only for the Kafka security settings.
_ENV_ALIASES = {
    "broker": "bootstrap",
    "security_protocol": "kafka_security_protocol",
    "ssl_cafile": "kafka_ssl_cafile",
    "ssl_certfile": "kafka_ssl_certfile",
    "ssl_keyfile": "kafka_ssl_keyfile",
    "sasl_mechanism": "kafka_sasl_mechanism",
    "sasl_username": "kafka_sasl_username",
    "sasl_password": "kafka_sasl_password",
}
_FIELD_TYPES = {f.name: f.type for f in dataclasses.fields(Settings)}


# field name -> environment suffix (``broker`` -> ``BROKER``)
_FIELDS = {name: _ENV_ALIASES.get(name, name) for name in _FIELD_TYPES}


def env_name(name: str) -> str:
    return PREFIX + _FIELDS[name].upper()


def _parse(name: str, value: Any) -> Any:
    kind = _FIELD_TYPES[name]
    where = env_name(name)
    if isinstance(value, str):
        value = value.strip()
    try:
        if kind == "int":
            number = int(value)
            if name in ("web_port", "metrics_port") and not 0 <= number <= 65535:
                raise ValueError("not a port number")
            if name in ("partitions", "replication", "max_batch", "max_runs_per_agent") and number < 1:
                raise ValueError("must be at least 1")
            if name == "standby_replicas" and number < 0:
                raise ValueError("must not be negative")
            if name == "web_port" and number == 0:
                raise ValueError("the web server needs a port")
            return number
        if kind in ("float", "float | None"):
            if value is None or value == "":
                if kind == "float":
                    raise ValueError("must be a positive number of seconds")
                return None
            number = float(value)
            if not number > 0 or number != number or number == float("inf"):
                raise ValueError("must be a positive number of seconds")
            return number
        if kind == "Path":
            return Path(str(value))
        if kind == "Path | None":
            return Path(str(value)) if value else None
        if name == "security_protocol":
            return str(value).upper()
        if name == "sasl_mechanism":
            return str(value).upper() if value else None
        return str(value)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"{where}={value!r}: {exc}") from None


def _read_settings_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"{PREFIX}SETTINGS_FILE: cannot read {path}: {exc.strerror or exc}") from None
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:  # noqa: BLE001 - any parser error means the same thing (a RecursionError too)
        reason = " ".join(str(exc).split()) or type(exc).__name__  # YAML's span lines, with a caret
        raise SettingsError(f"{PREFIX}SETTINGS_FILE: cannot parse {path}: {reason}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"{PREFIX}SETTINGS_FILE: {path} must hold a mapping")
    by_suffix = {suffix: name for name, suffix in _FIELDS.items()}
    out: dict[str, Any] = {}
    for key, value in data.items():
        norm = str(key).lower()
        if norm.startswith(PREFIX.lower()):
            norm = norm[len(PREFIX) :]
        name = by_suffix.get(norm) or (norm if norm in _FIELDS else None)
        if name is None:
            known = sorted(set(by_suffix) | set(_FIELDS))
            raise SettingsError(
                f"{PREFIX}SETTINGS_FILE: unknown setting {key!r} in {path}: did you mean {closest(norm, known)!r}?"
            )
        if value is not None:
            out[name] = value
    return out


# -- the registry of LOOPWATCH_* names ------------------------------------------------------------

VARIABLES: dict[str, str] = {
    **{env_name(name): "the worker (a setting above)" for name in _FIELDS},
    PREFIX + "SETTINGS_FILE": "the worker: a file of settings, below the environment",
    PREFIX + "BOOTSTRAP": "every command that reaches Kafka: the default of --bootstrap",
    DEPRECATED_BROKER_ENV: "every command that reaches Kafka: LOOPWATCH_BOOTSTRAP's old name (deprecated)",
    PREFIX + "SIGNING_KEY": "loopwatch mcp-gateway and loopwatch hook --serve: the default of --signing-key",
    PREFIX + "HOOK_SOCKET": "loopwatch hook call: the socket of the hook server",
    PREFIX + "HOOK_TOKEN": "loopwatch hook --serve --http and Claude Code's HTTP hooks: the bearer token",
    PREFIX + "CACHE": "make and scripts/: where Kafka, the ops tools and the test caches live",
    PREFIX + "VENV": "scripts/install-ops-tools.sh: the virtualenv it installs into",
    PREFIX + "MCP_SERVERS": "make test: the npm MCP servers the gateway tests start",
    PREFIX + "AGENT_CLIS": "make test: the agent CLIs the integration tests drive",
    PREFIX + "ORACLES": "make test: upstream checkouts the peer-profile tests compare against",
    PREFIX + "FRAMEWORKS": "make test: the venvs of the frameworks that cannot share loopwatch's (CrewAI, Google ADK)",
    PREFIX + "PYTHON": "the TypeScript client's tests: the Python of the cross-language checks",
    PREFIX + "FC_SEED": "the TypeScript client's tests: fast-check's random seed",
    PREFIX + "TEST_BROKER": "the integration tests: a broker to use instead of starting one",
    PREFIX + "TEST_DISK_FULL": "the integration tests: the full-disk worker's switch",
    PREFIX + "TEST_KEEP_LOGS": "the integration tests: keep the workers' logs",
}
"""Every ``LOOPWATCH_*`` environment variable some loopwatch process reads, and which one.
The worker refuses any other (``refuse_unknown_variables``); tests/app/test_environment_registry.py
fails when the source reads a name that is not here."""


def closest(name: str, known: list[str]) -> str:
    """The known name most like ``name`` (always one: a refusal should point somewhere)."""
    matches = difflib.get_close_matches(name, known, n=1, cutoff=0.0)
    return matches[0] if matches else known[0]


def refuse_a_runners_signing_key(env: Mapping[str, str]) -> None:
    """The worker's own refusal of ``LOOPWATCH_SIGNING_KEY``, the gateway's and the hook's key
    (one agent's, to sign with), set where ``LOOPWATCH_SIGNING_KEYS`` (the keys a worker checks
    signatures with) is not: one letter away, it would otherwise leave signatures unchecked."""
    if env.get(PREFIX + "SIGNING_KEY") and not env.get(PREFIX + "SIGNING_KEYS"):
        raise SettingsError(
            f"{PREFIX}SIGNING_KEY is a runner's key to sign with (the gateway's, the hook's); the worker checks"
            f" signatures with {PREFIX}SIGNING_KEYS: did you mean it?"
        )


def refuse_unknown_variables(env: Mapping[str, str]) -> None:
    """``SettingsError`` (one line) naming each ``LOOPWATCH_*`` variable in ``env`` that no
    loopwatch process reads, with the closest registered name."""
    unknown = sorted(name for name in env if name.startswith(PREFIX) and name not in VARIABLES)
    if not unknown:
        return
    suffixes = sorted(name[len(PREFIX) :] for name in VARIABLES)
    named = "; ".join(
        f"{name}: did you mean {PREFIX}{closest(name[len(PREFIX) :].upper(), suffixes)}?" for name in unknown
    )
    raise SettingsError(f"unknown setting {named} (no loopwatch process reads it, so it is refused, not ignored)")
