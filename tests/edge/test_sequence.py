"""The ``seq`` a runner numbers its events with (``streams.edge.sequence``), and the Python
client putting it on every event it publishes, inside the signed value."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.events import MAX_SAFE_INT, decode_event
from schemas.signing import Keyring, SigningKey
from streams.client import LoopwatchClient
from streams.edge.events import agent_message_event, compaction_event, requested_event, run_ended_event
from streams.edge.sequence import SeqCounter

KEY = SigningKey("main-1", "main", b"k" * 32)
NOW_US = st.integers(min_value=0, max_value=4_000_000_000_000_000)
"""Clock readings in microseconds since the epoch, up to the year 2096."""


def counter_over(readings: list[int]) -> tuple[SeqCounter, list[int]]:
    """A counter whose clock gives ``readings`` (microseconds) one after another, and what it drew."""
    clock = iter(readings)
    counter = SeqCounter(clock=lambda: next(clock) * 1000)
    return counter, [counter() for _ in readings]


def test_hand_worked_numbers_follow_the_clock_and_never_fall_back():
    # Clock (µs): 1000, 1000, 1000, 500 (stepped back), 5000, 4999.
    _counter, drawn = counter_over([1000, 1000, 1000, 500, 5000, 4999])
    assert drawn == [1000, 1001, 1002, 1003, 5000, 5001]


@settings(max_examples=300)
@given(st.lists(NOW_US, min_size=1, max_size=60))
def test_numbers_rise_strictly_and_are_at_least_the_clock(readings):
    _counter, drawn = counter_over(readings)
    assert all(b > a for a, b in zip(drawn, drawn[1:]))
    assert all(seq >= now for seq, now in zip(drawn, readings))


@settings(max_examples=300)
@given(st.lists(NOW_US, min_size=1, max_size=30), st.integers(min_value=1, max_value=10**9), st.data())
def test_a_publisher_restarted_after_its_predecessors_last_number_continues_above_it(readings, later, data):
    """Whatever its predecessor drew, a new counter whose clock is past the predecessor's last
    number (the restart took longer than the predecessor ran ahead of its clock) draws above it."""
    _old, before = counter_over(readings)
    start = before[-1] + later
    after_readings = [start] + data.draw(st.lists(st.integers(min_value=0, max_value=start), max_size=10))
    _new, after = counter_over(after_readings)
    assert min(after) > max(before)


def test_a_number_over_the_schemas_bound_is_refused():
    with pytest.raises(OverflowError, match="over the schema's bound"):
        SeqCounter(clock=lambda: (MAX_SAFE_INT + 1) * 1000)()


async def test_the_client_numbers_every_event_in_the_signed_value_in_the_order_it_queues_them():
    client = LoopwatchClient("127.0.0.1:1", signing_key=KEY)  # never started: nothing is sent
    await client.stop()  # (closes what the constructor made; _record needs no connection)
    fields = dict(run_id="r", session_key="s", agent_id="main", session_id=None)
    events = [
        requested_event("e1", "read", {"p": 1}, **fields),
        compaction_event("e2", **fields),
        agent_message_event("e3", "hello", **fields),
        run_ended_event("e4", "done", **fields),
    ]
    keyring = Keyring([KEY])
    numbers = []
    for event in events:
        key, value, headers = client._record(event)
        keyring.verify(headers, value)  # the signature covers the value with its seq
        numbered = decode_event(value)
        assert numbered.event_id == event.event_id and key == b"r"
        assert value.endswith(b',"seq":%d}' % numbered.seq)  # the last field, as the TypeScript client writes it
        numbers.append(numbered.seq)
    assert all(b > a for a, b in zip(numbers, numbers[1:]))
    # A seq the caller set is kept.
    explicit = msgspec.structs.replace(requested_event("e5", "read", {"p": 1}, **fields), seq=7)
    _key, value, _headers = client._record(explicit)
    assert decode_event(value).seq == 7
