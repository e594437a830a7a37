"""``loopwatch mcp-gateway`` on the secured broker (``scripts/kafka.sh --secure``: TLS, SCRAM-SHA-512
and ACLs), with the worker's flags: it publishes as the ``runner`` principal and signs every
event with its agent's key; the records read back carry the signature that key gives."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import sys
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from mcp import Client, StdioServerParameters

from schemas.events import InvalidEvent, ToolCallCompleted, ToolCallRequested, decode_event
from schemas.signing import KEY_ID_HEADER, SIGNATURE_HEADER, SigningKey

pytestmark = pytest.mark.kafka

BIN = Path(sys.executable).parent
CONVERT = {"source_timezone": "Europe/Berlin", "time": "12:00", "target_timezone": "Asia/Tokyo"}


async def records_of(secure_kafka, run_id: str, want: int, timeout: float = 60.0) -> list:
    consumer = AIOKafkaConsumer(
        "tool-calls",  # shared with the other secured-broker tests, whose records may be malformed on purpose
        bootstrap_servers=secure_kafka.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **secure_kafka.client_options("admin"),
    )
    await consumer.start()
    found = []
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(found) < want and loop.time() < deadline:
            batch = await consumer.getmany(timeout_ms=1000)
            for records in batch.values():
                found += [r for r in records if _run_of(r.value) == run_id]
    finally:
        await consumer.stop()
    return found


def test_the_gateway_publishes_signed_events_to_the_secured_broker(secure_kafka, tmp_path):
    key = SigningKey("gw-" + secrets.token_hex(4), "mcp-secure", secrets.token_bytes(32))
    key_file = tmp_path / "key.json"
    key_file.write_text(
        json.dumps({"key_id": key.key_id, "agent_id": key.agent_id, "secret": base64.b64encode(key.secret).decode()})
    )
    run_id = "secure-" + uuid.uuid4().hex[:8]
    args = [
        "mcp-gateway",
        "--upstream",
        str(BIN / "mcp-server-time"),
        "--bootstrap",
        secure_kafka.bootstrap,
        "--security-protocol",
        "SASL_SSL",
        "--ssl-cafile",
        str(secure_kafka.cafile),
        "--sasl-mechanism",
        "SCRAM-SHA-512",
        "--sasl-username",
        "runner",
        "--signing-key",
        str(key_file),
        "--run-id",
        run_id,
        "--timeout",
        "0.5",  # no worker reads the secured topics here: each call fails open after this
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWATCH_")}
    env["LOOPWATCH_KAFKA_SASL_PASSWORD"] = secure_kafka.password("runner")

    async def scenario() -> list:
        params = StdioServerParameters(command=str(BIN / "loopwatch"), args=args, env=env)
        async with Client(params, read_timeout_seconds=60) as client:
            result = await client.call_tool("convert_time", CONVERT)
            assert not result.is_error, result
        return await records_of(secure_kafka, run_id, want=2)

    records = asyncio.run(scenario())
    kinds = [type(decode_event(r.value)) for r in records]
    assert kinds[:2] == [ToolCallRequested, ToolCallCompleted], kinds
    for record in records:
        headers = dict(record.headers)
        assert decode_event(record.value).agent_id == "mcp-secure"  # the key's agent
        assert headers[KEY_ID_HEADER] == key.key_id.encode()
        assert headers[SIGNATURE_HEADER] == key.signature(record.value).encode()


def _run_of(value: bytes) -> str | None:
    try:
        return decode_event(value).run_id
    except InvalidEvent:  # another test's malformed record
        return None
