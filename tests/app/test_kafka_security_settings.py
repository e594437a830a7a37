"""Bad Kafka security and signing settings stop the worker at start with one clear line;
refusals the broker will repeat for ever (credentials, TLS trust) are told apart from a
broker that is merely unreachable (streams.edge.broker).  The same refusals from the real
broker are in tests/integration/test_secure_kafka.py."""

from __future__ import annotations

import logging
import os
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka import errors

from streams.app.settings import Settings, SettingsError
from streams.edge.broker import BrokerAccessError, broker_access, explain

REPO = Path(__file__).resolve().parents[2]
SASL = {
    "LOOPWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
    "LOOPWATCH_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    "LOOPWATCH_KAFKA_SASL_USERNAME": "loopwatch",
    "LOOPWATCH_KAFKA_SASL_PASSWORD": "pw",
}


@pytest.fixture
def not_pem(tmp_path) -> Path:
    path = tmp_path / "ca.crt"
    path.write_text("this is not a certificate\n")
    return path


@pytest.mark.parametrize(
    "env, message",
    [
        (
            {**SASL, "LOOPWATCH_KAFKA_SSL_CAFILE": "/nonexistent/ca.crt"},
            "LOOPWATCH_KAFKA_SSL_CAFILE: /nonexistent/ca.crt does not exist",
        ),
        (
            {**SASL, "LOOPWATCH_KAFKA_SASL_MECHANISM": "GSSAPI"},
            "LOOPWATCH_KAFKA_SASL_MECHANISM must be one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 with SASL_SSL, got 'GSSAPI'",
        ),
        (
            {**SASL, "LOOPWATCH_KAFKA_SASL_PASSWORD": ""},
            "LOOPWATCH_KAFKA_SASL_USERNAME and LOOPWATCH_KAFKA_SASL_PASSWORD are required with SASL_SSL",
        ),
        (
            {"LOOPWATCH_KAFKA_SSL_CAFILE": "/etc/hostname"},
            "LOOPWATCH_KAFKA_SSL_CAFILE is set but LOOPWATCH_KAFKA_SECURITY_PROTOCOL=PLAINTEXT does not use TLS",
        ),
        (
            {**SASL, "LOOPWATCH_KAFKA_SECURITY_PROTOCOL": "SSL"},
            "LOOPWATCH_KAFKA_SASL_MECHANISM is set but LOOPWATCH_KAFKA_SECURITY_PROTOCOL=SSL does not use SASL",
        ),
        ({"LOOPWATCH_SIGNING_KEYS": "/nonexistent/keys"}, "LOOPWATCH_SIGNING_KEYS: /nonexistent/keys does not exist"),
    ],
    ids=["missing-ca", "unknown-mechanism", "no-password", "ca-without-tls", "sasl-without-sasl", "missing-keys"],
)
def test_bad_security_settings_are_refused(env, message):
    with pytest.raises(SettingsError) as info:
        Settings.from_env(env)
    assert str(info.value).startswith(message)


def test_a_ca_file_that_is_not_pem_is_refused(not_pem):
    with pytest.raises(SettingsError, match=f"LOOPWATCH_KAFKA_SSL_CAFILE: cannot load {not_pem} as PEM certificates"):
        Settings.from_env({**SASL, "LOOPWATCH_KAFKA_SSL_CAFILE": str(not_pem)})


def test_a_client_certificate_that_does_not_load_is_refused(not_pem):
    with pytest.raises(SettingsError, match="LOOPWATCH_KAFKA_SSL_CERTFILE/KEYFILE: cannot load"):
        Settings.from_env({**SASL, "LOOPWATCH_KAFKA_SSL_CERTFILE": str(not_pem)})


def worker(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWATCH_")}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-m", "streams.app.worker", "--quiet"],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("case", ["missing-ca", "bad-key-file"])
def test_the_worker_stops_with_one_line_and_exit_2(tmp_path, case):
    if case == "missing-ca":
        env = {**SASL, "LOOPWATCH_KAFKA_SSL_CAFILE": str(tmp_path / "absent.crt")}
        expected = f"loopwatch worker: LOOPWATCH_KAFKA_SSL_CAFILE: {tmp_path / 'absent.crt'} does not exist"
    else:
        keys = tmp_path / "keys.json"
        keys.write_text('{"key_id": "main-1", "agent_id": "main", "secret": "c2hvcnQ="}')
        env = {"LOOPWATCH_SIGNING_KEYS": str(keys), "LOOPWATCH_DATA_DIR": str(tmp_path / "data")}
        expected = f"loopwatch worker: {keys}: key main-1: the secret must be at least 32 bytes"
    result = worker(env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [expected]
    assert result.stdout == ""


# -- telling refusals from an unreachable broker ------------------------------------------------


def verify_error() -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    error.verify_message = "self-signed certificate in certificate chain"
    return error


@pytest.mark.parametrize(
    "error, expected",
    [
        (verify_error(), "TLS: the broker's certificate is not trusted (self-signed certificate in certificate chain)"),
        (
            errors.SaslAuthenticationFailed("invalid credentials"),
            "SASL SCRAM-SHA-512 authentication as 'runner' refused: wrong username or password",
        ),
        (
            errors.UnsupportedSaslMechanismError("enabled: ['PLAIN']"),
            "the broker does not offer SASL mechanism SCRAM-SHA-512",
        ),
        (ConnectionRefusedError(111, "Connection refused"), None),
        (TimeoutError(), None),
    ],
)
def test_explain_names_permanent_refusals_only(error, expected):
    text = explain(error, username="runner", mechanism="SCRAM-SHA-512")
    if expected is None:
        assert text is None
    else:
        assert text.startswith(expected)


@pytest.mark.parametrize(
    "error, tls, expected",
    [
        # what asyncio raises when a PLAINTEXT listener drops a TLS handshake (issue 26)
        (ConnectionResetError(), True, "the listener did not speak TLS"),
        (ssl.SSLEOFError(8, "EOF occurred in violation of protocol"), True, "the listener did not speak TLS"),
        (ConnectionResetError(), False, None),  # a plaintext client: a reset is not explained
        (ConnectionResetError(104, "Connection reset by peer"), True, None),  # a reset with a cause of its own
        (ConnectionRefusedError(111, "Connection refused"), True, None),
    ],
)
def test_a_tls_client_dropped_in_its_handshake_is_told_the_listener_does_not_speak_tls(error, tls, expected):
    text = explain(error, tls=tls)
    assert (text is None) if expected is None else text.startswith(expected)


async def test_broker_access_turns_an_explained_bootstrap_failure_into_one_error(caplog):
    """The way aiokafka fails a bootstrap: it logs the cause, then raises a bare error."""
    log = logging.getLogger("aiokafka")
    with caplog.at_level(logging.ERROR, logger="aiokafka"):
        with pytest.raises(BrokerAccessError) as info:
            async with broker_access("kafka-0:9093,kafka-1:9093", username="runner", mechanism="SCRAM-SHA-512"):
                log.error('Unable connect to "%s:%s": %s', "kafka-0", 9093, errors.SaslAuthenticationFailed("bad"))
                raise errors.KafkaConnectionError("Unable to bootstrap from [...]")
        assert (
            str(info.value)
            == "kafka-0:9093: SASL SCRAM-SHA-512 authentication as 'runner' refused: wrong username or password"
        )
        assert not [r for r in caplog.records if "Unable connect" in r.getMessage()]  # said once, by us

        # An unreachable broker is not explained: its error is logged and raised as before.
        with pytest.raises(errors.KafkaConnectionError):
            async with broker_access("kafka-0:9093"):
                log.error('Unable connect to "%s:%s": %s', "kafka-0", 9093, ConnectionRefusedError(111, "refused"))
                raise errors.KafkaConnectionError("Unable to bootstrap from [...]")
        assert [r for r in caplog.records if "Unable connect" in r.getMessage()]
    assert log.filters == []  # the filter is gone afterwards


def test_sasl_bytes_are_redacted_from_aiokafka_debug_records(caplog):
    """What aiokafka.conn logs at DEBUG for a SASL PLAIN exchange (the request's repr carries
    ``\\x00user\\x00password``); the real exchange is in the secured-broker tests."""
    from streams.edge.broker import redact_sasl_exchanges

    class Request:
        def __repr__(self) -> str:
            return "SaslAuthenticateRequest_v1(sasl_auth_bytes=b'\\x00runner\\x00hunter2-password')"

    redact_sasl_exchanges()
    redact_sasl_exchanges()  # idempotent
    conn = logging.getLogger("aiokafka.conn")
    with caplog.at_level(logging.DEBUG, logger="aiokafka.conn"):
        conn.debug("Request to %s %s: %s", "h:1", 3, Request())
        conn.debug("Request to %s %s: %s", "h:1", 4, "MetadataRequest_v5(topics=NULL)")
    assert [r.getMessage() for r in caplog.records] == [
        "Request to h:1 3: SaslAuthenticateRequest_v1(sasl_auth_bytes=<redacted>)",
        "Request to h:1 4: MetadataRequest_v5(topics=NULL)",
    ]
    assert len([f for f in conn.filters if type(f).__name__ == "_RedactSasl"]) == 1
