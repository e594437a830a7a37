"""Per-run state: the value the engine takes and returns, serialisable with msgspec so a
Faust table (RocksDB + changelog) can hold it.

Upstream keeps one history per session and filters it by run id at read time; loopwatch
keys state by run id (the partition key), so every record of a state belongs to its run
and the run id is stored once, not per record (spec §8).

The history is held column-wise (one list per record field): the detectors' hot paths
become C-level list scans (``sigs.count(sig)``, ``sig in sigs``) instead of Python loops
over record objects.  ``encode_state`` stores it compactly: each distinct tool, signature
and result hash once, as raw 32-byte digests, with per-record indices.
"""

from __future__ import annotations

from sys import intern

import msgspec

__all__ = ["CallRecord", "GuardWindow", "RunState", "copy_state", "decode_state", "encode_state"]

STATE_VERSION = 2


class CallRecord(msgspec.Struct, array_like=True, gc=False):
    """One history record (upstream's ``ToolCallRecord``; the run id is the state's)."""

    tool_name: str
    args_hash: str
    tool_call_id: str | None = None
    result_hash: str | None = None
    unknown_tool_name: str | None = None
    timestamp: int = 0


class GuardWindow(msgspec.Struct, array_like=True, gc=False):
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


# gc=False: a state holds lists of strings and a dict of ints, never a cycle; keeping tens
# of thousands of states out of the cyclic collector's scans matters on a busy worker.
class RunState(msgspec.Struct, gc=False):
    """Everything loopwatch remembers about one run.  History columns, oldest first."""

    run_id: str | None = None
    tools: list[str] = []
    sigs: list[str] = []
    call_ids: list[str | None] = []
    results: list[str | None] = []
    unknowns: list[str | None] = []
    stamps: list[int] = []
    warning_buckets: dict[str, int] = {}
    """Upstream's ``toolLoopWarningBuckets``: insertion-ordered, at most 256 keys."""
    guard: GuardWindow = msgspec.field(default_factory=GuardWindow)
    critical_blocks: int = 0
    aborted: str | None = None
    """The detector that ended the run, once it has been aborted."""
    last_event_ms: int = 0

    def __len__(self) -> int:
        return len(self.sigs)

    def record(self, i: int) -> CallRecord:
        return CallRecord(self.tools[i], self.sigs[i], self.call_ids[i], self.results[i], self.unknowns[i], self.stamps[i])

    def records(self) -> list[CallRecord]:
        return [self.record(i) for i in range(len(self.sigs))]


def copy_state(state: RunState) -> RunState:
    """A copy that later calls of the engine on ``state`` leave as it is.

    The engine changes a state in place (its history lists, warning buckets and guard);
    everything else in it is immutable.  A few list copies: far cheaper than a round trip
    through ``encode_state``.
    """
    return msgspec.structs.replace(
        state,
        tools=state.tools.copy(),
        sigs=state.sigs.copy(),
        call_ids=state.call_ids.copy(),
        results=state.results.copy(),
        unknowns=state.unknowns.copy(),
        stamps=state.stamps.copy(),
        warning_buckets=state.warning_buckets.copy(),
        guard=msgspec.structs.replace(state.guard),
    )


# -- compact storage --------------------------------------------------------------------------


class _Stored(msgspec.Struct, array_like=True, omit_defaults=True):
    version: int
    run_id: str | None
    tool_table: list[str]
    sig_table: list[bytes]
    result_table: list[bytes]
    tool_idx: list[int]
    sig_idx: list[int]
    result_idx: list[int]
    call_ids: list[str | None]
    stamp_ages: list[int]
    last_event_ms: int
    warning_buckets: dict[str, int]
    guard: GuardWindow
    critical_blocks: int = 0
    aborted: str | None = None
    unknowns: list[str | None] = []
    verbatim: dict[str, str] = {}
    """Table entries that are not standard digests, by "s<i>"/"r<i>" (empty bytes in the table)."""


def _digest_bytes(text: str) -> bytes | None:
    """32 raw bytes for exactly 64 lowercase hex characters, else None."""
    if len(text) != 64:
        return None
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        return None
    # fromhex also takes upper case and spaces; only the canonical form round-trips.
    return raw if len(raw) == 32 and raw.hex() == text else None


# Packing is pure and a run's history barely changes between two checkpoints, so the
# packed digests are memoised (bounded; cleared wholesale when full), signatures and results
# apart: "error:<64 hex>" packs to 32 bytes as a signature (of a tool named "error") and to
# 33 as a result.
_PACKED_SIGS: dict[str, bytes | None] = {}
_PACKED_RESULTS: dict[str, bytes | None] = {}
_PACKED_MAX = 100_000


def _memo(memo: dict[str, bytes | None], text: str, pack) -> bytes | None:
    try:
        return memo[text]
    except KeyError:
        pass
    if len(memo) >= _PACKED_MAX:
        memo.clear()
    packed = memo[text] = pack(text)
    return packed


def _pack_sig_text(sig: str) -> bytes | None:
    # A standard signature is "<tool>:<64 hex>"; the tool is stored separately.
    if len(sig) < 66 or sig[-65] != ":":
        return None
    return _digest_bytes(sig[-64:])


def _pack_result_text(result: str) -> bytes | None:
    if result.startswith("error:"):
        raw = _digest_bytes(result[6:])
        return None if raw is None else b"E" + raw
    return _digest_bytes(result)


def _unpack_result(value: bytes) -> str:
    if len(value) == 33:
        return "error:" + value[1:].hex()
    return value.hex()


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Stored)


def encode_state(state: RunState) -> bytes:
    # Runs once per touched run per checkpoint, so the indexing is done with C-level
    # comprehensions: ``index.setdefault(v, len(index))`` numbers values in first-seen order.
    tools, sigs, results = state.tools, state.sigs, state.results
    tool_index: dict[str, int] = {}
    tool_idx = [tool_index.setdefault(t, len(tool_index)) for t in tools]
    sig_index: dict[str, int] = {}
    sig_idx = [sig_index.setdefault(s, len(sig_index)) for s in sigs]
    sig_tool: dict[str, str] = {}  # each signature's tool at its first use (decode rebuilds from it)
    for s, t in zip(sigs, tools):
        sig_tool.setdefault(s, t)
    result_index: dict[str | None, int] = {None: -1}  # pending and vetoed calls: -1
    result_idx = [result_index.setdefault(r, len(result_index) - 1) for r in results]
    del result_index[None]

    verbatim: dict[str, str] = {}
    sig_table = []
    for i, sig in enumerate(sig_index):
        tool = sig_tool[sig]
        packed = None
        if len(sig) == len(tool) + 65 and sig.startswith(tool):  # else: stored verbatim
            packed = _memo(_PACKED_SIGS, sig, _pack_sig_text)
        if packed is None:
            verbatim[f"s{i}"] = sig
            packed = b""
        sig_table.append(packed)
    result_table = []
    for i, result in enumerate(result_index):
        packed = _memo(_PACKED_RESULTS, result, _pack_result_text)
        if packed is None:
            verbatim[f"r{i}"] = result
            packed = b""
        result_table.append(packed)
    last = state.last_event_ms
    unknowns = state.unknowns
    stored = _Stored(
        version=STATE_VERSION,
        run_id=state.run_id,
        tool_table=list(tool_index),
        sig_table=sig_table,
        result_table=result_table,
        tool_idx=tool_idx,
        sig_idx=sig_idx,
        result_idx=result_idx,
        call_ids=state.call_ids,
        stamp_ages=[last - t for t in state.stamps],
        last_event_ms=last,
        warning_buckets=state.warning_buckets,
        guard=state.guard,
        critical_blocks=state.critical_blocks,
        aborted=state.aborted,
        unknowns=unknowns if unknowns.count(None) != len(unknowns) else [],
        verbatim=verbatim,
    )
    return _encoder.encode(stored)


def decode_state(data: bytes) -> RunState:
    s = _decoder.decode(data)
    if s.version != STATE_VERSION:
        raise ValueError(f"unsupported state version {s.version}")
    tools = [s.tool_table[i] for i in s.tool_idx]
    first_use: dict[int, int] = {}
    for position, i in enumerate(s.sig_idx):
        first_use.setdefault(i, position)
    sig_strings = []
    for i, packed in enumerate(s.sig_table):
        text = s.verbatim.get(f"s{i}")
        if text is None:
            text = f"{tools[first_use[i]]}:{packed.hex()}"  # a signature begins with its tool
        sig_strings.append(intern(text))
    # Interned like the engine's own (identity-first compares in the detectors' scans).
    result_strings = [intern(s.verbatim.get(f"r{i}") or _unpack_result(r)) for i, r in enumerate(s.result_table)]
    n = len(tools)
    return RunState(
        run_id=s.run_id,
        tools=tools,
        sigs=[sig_strings[i] for i in s.sig_idx],
        call_ids=s.call_ids,
        results=[None if i < 0 else result_strings[i] for i in s.result_idx],
        unknowns=s.unknowns or [None] * n,
        stamps=[s.last_event_ms - age for age in s.stamp_ages],
        warning_buckets=s.warning_buckets,
        guard=s.guard,
        critical_blocks=s.critical_blocks,
        aborted=s.aborted,
        last_event_ms=s.last_event_ms,
    )
