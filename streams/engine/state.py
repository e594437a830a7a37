"""Per-run state: the value the engine takes and returns, serialisable with msgspec so a
Faust table (RocksDB + changelog) can hold it.

Upstream keeps one history per session and filters it by run id at read time; loopwatch
keys state by run id (the partition key), so every record of a state belongs to its run
and the run id is stored once, not per record (spec §8).
"""

from __future__ import annotations

import msgspec

__all__ = ["CallRecord", "GuardWindow", "RunState", "decode_state", "encode_state"]

STATE_VERSION = 1


class CallRecord(msgspec.Struct, array_like=True):
    """One history record (upstream's ``ToolCallRecord`` less the run id, held by the state)."""

    tool_name: str
    args_hash: str
    tool_call_id: str | None = None
    result_hash: str | None = None
    unknown_tool_name: str | None = None
    timestamp: int = 0


class GuardWindow(msgspec.Struct, array_like=True):
    """The post-compaction guard of one run (spec §4).

    The window only ever aborts when *every* observation in it is the same triple, so it
    is kept as its first triple, whether all later ones matched it, and its length: the
    same answers as upstream's list, in constant space.
    """

    remaining: int | float = 0
    window_size: int | float = 3
    length: int = 0
    uniform: bool = True
    first: tuple[str, str, str] | None = None


class RunState(msgspec.Struct, array_like=True):
    """Everything loopwatch remembers about one run."""

    run_id: str | None = None
    history: list[CallRecord] = []
    warning_buckets: dict[str, int] = {}
    """Upstream's ``toolLoopWarningBuckets``: insertion-ordered, at most 256 keys."""
    guard: GuardWindow = msgspec.field(default_factory=GuardWindow)
    critical_blocks: int = 0
    aborted: str | None = None
    """The detector that ended the run, once it has been aborted."""
    last_event_ms: int = 0
    version: int = STATE_VERSION


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RunState)


def encode_state(state: RunState) -> bytes:
    return _encoder.encode(state)


def decode_state(data: bytes) -> RunState:
    return _decoder.decode(data)
