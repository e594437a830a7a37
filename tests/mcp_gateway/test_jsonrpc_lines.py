"""The gateway's reading of JSON-RPC lines (``streams.integrations.mcp.jsonrpc``) and its
restart policy (``health.UpstreamHealth``), on hand-written lines and hand-worked sequences."""

from __future__ import annotations

import asyncio

import pytest

from streams.integrations.mcp import health as health_module
from streams.integrations.mcp.health import UpstreamHealth
from streams.integrations.mcp.jsonrpc import Oversize, healed_error, oversize_id, parse, read_line, refusal


@pytest.mark.parametrize(
    "head, tail, expected",
    [
        # the Python SDK writes the id before the result
        (b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"text":"xxxx', b'xxxx"}]}}', (7, False)),
        # JavaScript SDKs write it last, after the result
        (b'{"result":{"content":[{"text":"xxxx', b'xxxx"}]},"jsonrpc":"2.0","id":"call-9"}', ("call-9", False)),
        # an "id" inside the result is not the message's, at the start or at the end
        (b'{"result":{"id":1,"content":[{"text":"xx', b'xx"}]},"jsonrpc":"2.0","id":2}', (2, False)),
        (b'{"jsonrpc":"2.0","result":{"content":[{"text":"xx', b'xx"}],"id":5}}', (None, False)),
        # a request of the agent: its method says so
        (b'{"jsonrpc":"2.0","id":"r1","method":"tools/call","params":{"arguments":{"a":"xx', b'xx"}}}', ("r1", True)),
        # a string holding what looks like an id is text
        (b'{"jsonrpc":"2.0","note":",\\"id\\":3","result":{"a":"xx', b'xx"}}', (None, False)),
        (b"garbage", b"garbage", (None, False)),
    ],
)
def test_the_id_of_an_oversize_message_is_its_own(head, tail, expected):
    assert oversize_id(Oversize(head, tail, 1 << 27)) == expected


def test_an_oversize_request_is_refused_and_an_oversize_notification_is_not():
    request = Oversize(b'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"a":"', b'"}}', 100)
    line = refusal(request)
    message, fault = parse(line)
    assert fault is None
    assert message["id"] == 4 and message["error"]["code"] == -32600
    assert message["error"]["message"].startswith("refused by loopwatch: a message of 100 bytes, over")
    assert refusal(Oversize(b'{"jsonrpc":"2.0","method":"notifications/x","params":{"a":"', b'"}}', 100)) is None


@pytest.mark.parametrize(
    "error, problem",
    [
        ({"code": "x", "message": "m"}, "a code that is a string, not an integer"),
        ({"code": -32000}, "no message"),
        ("just a string", "not an object but a string"),
        ({"code": True, "message": "m"}, "a code that is a boolean, not an integer"),
        ({"code": 1.5, "message": "m"}, "a code that is a number, not an integer"),
        ({"code": 3, "message": 4}, "a message that is a number"),
    ],
)
def test_an_invalid_error_object_is_healed_into_a_json_rpc_error(error, problem):
    healed = healed_error({"jsonrpc": "2.0", "id": 3, "error": error}, "upstream MCP server 'u' failed")
    assert healed == {
        "jsonrpc": "2.0",
        "id": 3,
        "error": {
            "code": -32603,
            "message": f"upstream MCP server 'u' failed ({problem})",
            "data": {"upstreamError": error},
        },
    }


def test_a_valid_error_and_a_result_are_left_alone():
    assert healed_error({"jsonrpc": "2.0", "id": 3, "error": {"code": -32602, "message": "m"}}, "x") is None
    assert healed_error({"jsonrpc": "2.0", "id": 3, "result": {}}, "x") is None


def test_read_line_reads_past_a_line_over_the_limit_and_goes_on():
    async def run() -> list:
        reader = asyncio.StreamReader(limit=16)
        reader.feed_data(b'{"id":1}\n{"id":2,"result":"' + b"x" * 100 + b'"}\n{"id":3}\n{"id":4}')
        reader.feed_eof()
        return [await read_line(reader) for _ in range(5)]

    first, big, third, last, end = asyncio.run(run())
    assert (first, third, last, end) == (b'{"id":1}\n', b'{"id":3}\n', b'{"id":4}', b"")
    assert isinstance(big, Oversize)
    assert big.size == len(b'{"id":2,"result":"' + b"x" * 100 + b'"}\n')
    assert oversize_id(big) == (2, False)


def test_restarts_after_n_timeouts_in_a_row_with_backoff_reset_by_an_answer(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(health_module.time, "monotonic", lambda: now[0])
    health = UpstreamHealth("u", restart_after_timeouts=2, restart_after_silence=1e9, backoff_max=5.0)
    assert health.timed_out() is None
    assert health.timed_out() == "2 calls in a row timed out"
    delays = []
    for _ in range(5):  # restarts with no answer in between: 0, 1, 2, 4, then the cap
        delays.append(health.restarting("r", "restarted"))
    assert delays == [0.0, 1.0, 2.0, 4.0, 5.0]
    health.heard()
    assert health.restarting("r", "restarted") == 0.0
    assert health.status() == {"restarts": 6, "timeouts": 2, "timeouts_in_a_row": 0, "invalid_answers": 0}


def test_restarts_when_a_call_times_out_after_s_seconds_of_silence(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(health_module.time, "monotonic", lambda: now[0])
    health = UpstreamHealth("u", restart_after_timeouts=0, restart_after_silence=30.0)
    health.waiting()
    now[0] += 29
    assert health.timed_out() is None
    now[0] += 2
    assert health.timed_out() == "no answer for 31s"
    assert health.timeouts == 2  # 0: never restarted for timeouts in a row alone
