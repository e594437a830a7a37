"""aiokafka says why its bootstrap failed, and carries SASL bytes, only in log lines:
``streams.edge.broker`` reads and redacts them, so their format is checked against the installed
aiokafka here."""

from __future__ import annotations

import logging
import socket

import pytest

from streams.edge import broker


async def test_aiokafka_still_logs_why_its_bootstrap_failed(caplog):
    # The record streams.edge.broker explains: a closed port gives ConnectionRefusedError.
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaConnectionError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends
    producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=2000)
    with caplog.at_level(logging.ERROR, logger=broker.AIOKAFKA_CLIENT_LOGGER):
        with pytest.raises(KafkaConnectionError):
            await producer.start()
    await producer.stop()
    parsed = [broker.unable_to_connect(r) for r in caplog.records]
    assert [(where, type(error)) for where, error in filter(None, parsed)] == [
        (f"127.0.0.1:{port}", ConnectionRefusedError)
    ]


def test_sasl_bytes_are_redacted_in_the_request_line_aiokafka_logs():
    from aiokafka.protocol.admin import SaslAuthenticateRequest_v0

    request = SaslAuthenticateRequest_v0(sasl_auth_bytes=b"\x00user\x00secret")
    record = logging.LogRecord(
        broker.AIOKAFKA_CONN_LOGGER,
        logging.DEBUG,
        "conn.py",
        1,
        "Request to %s:%d %d: %s",
        ("127.0.0.1", 9092, 7, request),
        None,
    )
    line = record.getMessage()  # as aiokafka.conn logs each request
    assert "secret" in line
    redacted = broker.redact_sasl_bytes(line)
    assert redacted is not None and "secret" not in redacted and "sasl_auth_bytes=<redacted>" in redacted
    assert broker.redact_sasl_bytes("Sending request MetadataRequest_v1(topics=[])") is None
