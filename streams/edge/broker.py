"""Why a Kafka client could not connect: a refused password, an untrusted certificate or a
SASL mechanism the broker does not offer are told apart from a broker that is merely
unreachable, so the worker and the runner client stop at once with one clear line instead
of retrying something that cannot succeed.

aiokafka's bootstrap raises only ``KafkaConnectionError("Unable to bootstrap from [...]")``;
the cause is in the error line it logs just before (logger ``aiokafka``), with the
exception as the record's last argument.  ``broker_access`` reads those records through a
logging filter (their format is aiokafka's, parsed by ``unable_to_connect`` below), keeps the ones it can explain out of the logs, and raises ``BrokerAccessError`` with
the explanation.  Unexplained failures (connection refused, timeouts) are logged as before
and re-raised unchanged: those may pass.

``redact_sasl_exchanges``: at DEBUG, aiokafka logs every request it sends, and a SASL PLAIN
``SaslAuthenticateRequest`` carries the password in clear (``\x00user\x00password``); the
worker and the runner client install a filter that blanks the SASL bytes of those records.
"""

from __future__ import annotations

import contextlib
import logging
import re
import ssl
from collections.abc import AsyncIterator, Iterable

from aiokafka import errors

from schemas.errors import LoopwatchError

__all__ = ["BrokerAccessError", "NOT_TLS", "broker_access", "explain", "redact_sasl_exchanges", "speaks_tls"]


# -- aiokafka's log lines -------------------------------------------------------------------

AIOKAFKA_CLIENT_LOGGER = "aiokafka"
"""The logger aiokafka's client (bootstrap) logs to."""
AIOKAFKA_CONN_LOGGER = "aiokafka.conn"
"""Every request and response, at DEBUG."""
_UNABLE_TO_CONNECT = "Unable connect"
_SASL_BYTES = re.compile(r"(sasl_auth_bytes=)(b'(?:[^'\\]|\\.)*'|b\"(?:[^\"\\]|\\.)*\"|\S+)")


def unable_to_connect(record: logging.LogRecord) -> tuple[str, BaseException] | None:
    """``("host:port", error)`` when ``record`` is aiokafka's bootstrap failing on one host
    (``'Unable connect to "%s:%s": %s', host, port, err``); else None."""
    args = record.args if isinstance(record.args, tuple) else ()
    if len(args) != 3 or not isinstance(args[2], BaseException) or not str(record.msg).startswith(_UNABLE_TO_CONNECT):
        return None
    return f"{args[0]}:{args[1]}", args[2]


def redact_sasl_bytes(text: str) -> str | None:
    """``text`` with the SASL bytes of a logged ``SaslAuthenticateRequest`` blanked (a SASL
    PLAIN request carries the password in clear); None when it has none."""
    if "sasl_auth_bytes=" not in text:
        return None
    return _SASL_BYTES.sub(r"\1<redacted>", text)


class BrokerAccessError(LoopwatchError, ConnectionError):
    """The broker refused this client for good (credentials, TLS trust, SASL mechanism)."""


NOT_TLS = (
    "the listener did not speak TLS: it closed the connection during the TLS handshake; is it a PLAINTEXT "
    "listener (check the port and the security protocol)?"
)


def explain(
    error: BaseException, *, username: str | None = None, mechanism: str | None = None, tls: bool = False
) -> str | None:
    """One line saying why ``error`` (raised while connecting) will not go away; None when it might.
    ``tls``: the client speaks TLS (``SSL``/``SASL_SSL``).  A PLAINTEXT listener reads the
    TLS ClientHello as an absurdly large Kafka request and drops the connection, which asyncio
    reports as a bare ``ConnectionResetError()`` (or an unexpected EOF) during the handshake."""
    if tls and _dropped_in_handshake(error):
        return NOT_TLS
    if isinstance(error, ssl.SSLCertVerificationError):
        return (
            f"TLS: the broker's certificate is not trusted ({error.verify_message}); "
            "is the CA file the one that signed the brokers' certificates?"
        )
    if isinstance(error, ssl.SSLError):
        return f"TLS handshake failed ({error.reason or error}); does this listener speak TLS?"
    if isinstance(error, (errors.SaslAuthenticationFailed, errors.AuthenticationFailedError)):
        how = f"SASL {mechanism}" if mechanism else "SASL"
        who = f" as {username!r}" if username else ""
        return f"{how} authentication{who} refused: wrong username or password"
    if isinstance(error, errors.UnsupportedSaslMechanismError):
        return f"the broker does not offer SASL mechanism {mechanism} ({error})"
    if isinstance(error, errors.IllegalSaslStateError):
        return f"SASL {mechanism} handshake failed ({error})"
    return None


def _dropped_in_handshake(error: BaseException) -> bool:
    if isinstance(error, ssl.SSLEOFError):
        return True
    return isinstance(error, (ConnectionResetError, ConnectionAbortedError)) and not error.args


class _Explained(logging.Filter):
    """Keeps aiokafka's "Unable connect to" records for our hosts that ``explain`` explains."""

    def __init__(
        self,
        hosts: Iterable[str],
        username: str | None,
        mechanism: str | None,
        unreachable: bool = False,
        tls: bool = False,
    ) -> None:
        super().__init__()
        self.hosts = set(hosts)
        self.username = username
        self.mechanism = mechanism
        self.tls = tls
        self.unreachable = unreachable
        self.reasons: list[tuple[str, str]] = []

    def filter(self, record: logging.LogRecord) -> bool:
        failure = unable_to_connect(record)
        if failure is None:
            return True
        where, error = failure
        if where not in self.hosts:
            return True
        reason = explain(error, username=self.username, mechanism=self.mechanism, tls=self.tls)
        if reason is None:
            if not self.unreachable:
                return True
            reason = f"no broker answers ({error})"
        self.reasons.append((where, reason))
        return False


@contextlib.asynccontextmanager
async def broker_access(
    bootstrap: str | Iterable[str],
    *,
    username: str | None = None,
    mechanism: str | None = None,
    unreachable: bool = False,
    tls: bool = False,
) -> AsyncIterator[None]:
    """Around a client's ``start()``: a bootstrap that failed for a reason ``explain`` knows
    raises ``BrokerAccessError("<host:port>: <reason>")``.  ``unreachable``: so does one that
    failed because no broker answered (for a caller that cannot go on without one).  ``tls``:
    the client speaks TLS (its ``security_protocol`` is ``SSL`` or ``SASL_SSL``)."""
    hosts = [h.strip() for h in (bootstrap.split(",") if isinstance(bootstrap, str) else bootstrap) if h.strip()]
    hosts = [h[len("kafka://") :] if h.startswith("kafka://") else h for h in hosts]
    explained = _Explained(hosts, username, mechanism, unreachable, tls)
    logger = logging.getLogger(AIOKAFKA_CLIENT_LOGGER)
    logger.addFilter(explained)
    try:
        yield
    except errors.KafkaConnectionError:
        if explained.reasons:
            where, reason = explained.reasons[-1]
            raise BrokerAccessError(f"{where}: {reason}") from None
        raise
    finally:
        logger.removeFilter(explained)


def speaks_tls(security_protocol: str | None) -> bool:
    """Whether a client with this ``security_protocol`` (aiokafka's option) speaks TLS."""
    return security_protocol in ("SSL", "SASL_SSL")


class _RedactSasl(logging.Filter):
    """Blanks ``sasl_auth_bytes=...`` in aiokafka's request/response records."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG:  # only ever called for enabled records
            redacted = redact_sasl_bytes(record.getMessage())
            if redacted is not None:
                record.msg = redacted
                record.args = ()
        return True


_REDACTION = _RedactSasl()


def redact_sasl_exchanges() -> None:
    """Install the SASL redaction on aiokafka's connection logger (once; idempotent)."""
    logger = logging.getLogger(AIOKAFKA_CONN_LOGGER)
    if _REDACTION not in logger.filters:
        logger.addFilter(_REDACTION)
