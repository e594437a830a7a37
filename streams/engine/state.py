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

from collections.abc import Callable
from sys import intern
from typing import cast

import msgspec

from streams.edge.hashing import TERMINAL_EXEC_FAILURE, TOOL_LOOP_VETO, WRITE_MUTATION

from .peer_state import PeerState

__all__ = [
    "AWAITING",
    "MUTATION",
    "NO_PROGRESS",
    "NO_PROGRESS_PLAIN",
    "OBSERVED",
    "OUTCOME_KIND_NAMES",
    "PLAIN",
    "REREAD_MEMORY",
    "TERMINAL_FAILURE",
    "VETO",
    "CallRecord",
    "CompactionRereads",
    "EntropyWindow",
    "GuardWindow",
    "LatestState",
    "RunState",
    "copy_state",
    "decode_state",
    "encode_state",
]

STATE_VERSION = 2

REREAD_MEMORY = 16
"""Profile latest's guard: how many recent observations an arming takes as its baseline."""


class CallRecord(msgspec.Struct, array_like=True, gc=False):
    """One history record (upstream's ``ToolCallRecord``; the run id is the state's).

    The last four fields exist under profile latest only (openclaw-latest.md §3)."""

    tool_name: str
    args_hash: str
    tool_call_id: str | None = None
    result_hash: str | None = None
    unknown_tool_name: str | None = None
    timestamp: int = 0
    outcome_kind: str | None = None
    failure_identity_hash: str | None = None
    no_progress: bool = False
    mutation_target_hash: str | None = None


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


class CompactionRereads(msgspec.Struct, gc=False):
    """Profile latest's post-compaction instrumentation (openclaw-latest.md §7): which calls
    of a window repeat a call from before the compaction.

    Observations are keyed by signature alone: a signature begins with its tool's name
    (``schemas.events.check_event``), so it identifies upstream's (tool, args hash) pair.
    """

    baseline: tuple[str, ...] = ()
    """The signatures of the guard's last 16 observations when it was armed (where the
    observations are kept: ``LatestState.recent_observations``)."""
    calls: int = 0
    """Observations in the open window."""
    repeats: int = 0
    """Of those, the ones whose signature is in the baseline."""
    repeat_tools: tuple[str, ...] = ()
    """Their tools, sorted, each once.  (Tuples: most runs never arm, and an empty tuple is
    shared where an empty list would be one more object per run.)"""


# A record's outcome under profile latest, as held in ``LatestState.flags``: one byte per
# record, so that the detectors' scans (``in``, ``count``) run at memchr speed (on a list, each
# element is a rich comparison: 30 of them cost as much as the rest of a detection), and
# "pending" is a kind of its own (upstream: neither a result hash nor an outcome kind yet).
AWAITING = 0
"""No outcome yet (pending)."""
PLAIN = 1
"""An outcome without an ``outcomeKind``."""
VETO = 2
"""``tool-loop-veto``."""
TERMINAL_FAILURE = 3
"""``terminal-exec-failure``."""
MUTATION = 4
"""``write-mutation``."""
NO_PROGRESS = 8
"""Added to PLAIN for a record upstream flags ``noProgress`` (errors, writes that changed
nothing; no other kind ever has it)."""
NO_PROGRESS_PLAIN = PLAIN | NO_PROGRESS
OBSERVED = 16
"""Added to a record whose outcome the post-compaction guard observed (only records with a
result hash: PLAIN, NO_PROGRESS_PLAIN, TERMINAL_FAILURE, MUTATION)."""
OUTCOME_KIND_NAMES = (None, None, TOOL_LOOP_VETO, TERMINAL_EXEC_FAILURE, WRITE_MUTATION)
"""Upstream's ``outcomeKind`` of each code."""


class LatestState(msgspec.Struct, gc=False):
    """What profile latest keeps beyond configurable-final: the four record fields of
    openclaw-latest.md §3 (kind, no-progress and the guard's observed mark in one byte per
    record, aligned with ``RunState``'s columns; targets and failure identities by record
    serial number), and the guard's re-read instrumentation."""

    flags: bytearray = msgspec.field(default_factory=bytearray)
    """Each record's outcome: AWAITING, PLAIN (| NO_PROGRESS), VETO, TERMINAL_FAILURE or MUTATION."""
    digests: dict[int, str] = {}
    """A ``write`` record's ``mutationTargetHash``, an ``exec`` record's
    ``failureIdentityHash``, by record serial number (record i is ``first + i``).  Few records
    have one, so a dict rather than a column: a record without one costs nothing.  (A record
    has at most one: events carry targets for write only and failure identities for exec
    only, schemas.events.check_event.)  Keys below ``first`` are stale, dropped in batches."""
    first: int = 0
    """The serial number of the oldest record in the history."""
    # The guard's recent observations (an arming takes the last 16 as its baseline) are kept
    # in the history itself, as OBSERVED flags: an outcome then costs a bit in a byte already
    # at hand, not a list of its own (whose cold lines cost ~5 % of a healthy run's time).
    # In observation order = record order, the history's observed records are the newest
    # observations; those it drops are kept in ``dropped`` only while fewer than 16 observed
    # records remain.  An observation out of record order (a parallel call completing late,
    # when a newer record is already observed) switches the run to an explicit ``ring``.
    observed: int = 0
    """Records of the history with the OBSERVED flag."""
    dropped: list[str] = []
    """Signatures of observed records the history dropped while fewer than 16 observed
    records remained, oldest first, at most 16."""
    ring: list[str] | None = None
    """Every observation's signature, oldest first (the last 16 count), once observations
    came out of record order; None while the flags tell."""
    rereads: CompactionRereads = msgspec.field(default_factory=CompactionRereads)
    checked_by: object = None
    """The engine that last found these columns aligned with the history (never stored):
    the latest paths keep them aligned, so one engine checks once, not at every event."""

    def digest(self, i: int) -> str | None:
        """Record i's target or failure identity."""
        return self.digests.get(self.first + i)

    def column(self) -> list[str | None]:
        """Every record's digest (None: none), oldest first."""
        get, first = self.digests.get, self.first
        return [get(first + i) for i in range(len(self.flags))]

    def recent_observations(self, sigs: list[str]) -> list[str]:
        """The signatures of the guard's last 16 observations, oldest first."""
        if self.ring is not None:
            return self.ring[-REREAD_MEMORY:]
        flags = self.flags
        return (self.dropped + [sig for sig, f in zip(sigs, flags) if f & OBSERVED])[-REREAD_MEMORY:]

    def forget_observations(self) -> None:
        """A fresh guard (after an abort) has observed nothing yet."""
        self.flags = bytearray(f & ~OBSERVED for f in self.flags)
        self.observed = 0
        self.dropped = []
        self.ring = None


class EntropyWindow(msgspec.Struct, array_like=True, gc=False):
    """What the detector keeps for a run (``RunState.early``): ``streams.engine.early_warning``."""

    actions: list[int] = []
    """The last ``window`` actions, oldest first (``action_id``)."""
    calls: int = 0
    """Calls observed in the run."""
    entropy_sum: float = 0.0
    windows: int = 0
    """The baseline: the sum of the entropies of the run's earlier full windows outside a
    collapse, and how many."""
    collapsed: bool = False
    """In a collapse (warned; quiet until the entropy recovers)."""


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
    latest: LatestState | None = None
    """Profile latest's extra state (None for a run only configurable-final has seen)."""
    aborted_runs: tuple[tuple[str, str], ...] = ()
    """Under ``loopwatch.scope: session``: the session's aborted runs (the last 16), as (run
    id, the detector that ended it); their late calls are refused."""
    peer: PeerState | None = None
    """What profile openhands or gemini-cli keeps (``streams.engine.peers``), None without one."""
    early: EntropyWindow | None = None
    """What ``loopwatch.detectors.earlyWarning`` keeps, None without it."""

    def __len__(self) -> int:
        return len(self.sigs)

    def record(self, i: int) -> CallRecord:
        latest = self.latest
        if latest is None:
            return CallRecord(
                self.tools[i], self.sigs[i], self.call_ids[i], self.results[i], self.unknowns[i], self.stamps[i]
            )
        tool, digest = self.tools[i], latest.digest(i)
        return CallRecord(
            tool,
            self.sigs[i],
            self.call_ids[i],
            self.results[i],
            self.unknowns[i],
            self.stamps[i],
            OUTCOME_KIND_NAMES[latest.flags[i] & 7],
            digest if tool == "exec" else None,
            bool(latest.flags[i] & NO_PROGRESS),
            digest if tool == "write" else None,
        )

    def records(self) -> list[CallRecord]:
        return [self.record(i) for i in range(len(self.sigs))]


def copy_state(state: RunState) -> RunState:
    """A copy that later calls of the engine on ``state`` leave as it is.

    The engine changes a state in place (its history lists, warning buckets and guard);
    everything else in it is immutable.  A few list copies: far cheaper than a round trip
    through ``encode_state``.
    """
    copy = msgspec.structs.replace(
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
    if state.early is not None:
        copy.early = msgspec.structs.replace(state.early, actions=state.early.actions.copy())
    if state.peer is not None:  # (small: a window of at most 20 events)
        copy.peer = msgspec.msgpack.decode(msgspec.msgpack.encode(state.peer), type=PeerState)
    latest = state.latest
    if latest is not None:
        rereads = latest.rereads
        copy.latest = LatestState(
            latest.flags.copy(),
            latest.digests.copy(),
            latest.first,
            latest.observed,
            latest.dropped.copy(),
            None if latest.ring is None else latest.ring.copy(),
            CompactionRereads(rereads.baseline, rereads.calls, rereads.repeats, rereads.repeat_tools),
        )
    return copy


# -- compact storage --------------------------------------------------------------------------


class _StoredLatest(msgspec.Struct, array_like=True, omit_defaults=True):
    """``LatestState``, compactly: empty columns stand for "all absent"."""

    flags: bytes = b""
    """``LatestState.flags``; empty when every record is AWAITING or PLAIN, unobserved
    (told apart by the result)."""
    digest_idx: list[int] = []
    """Per ``write`` or ``exec`` record (no other has a digest): index in digest_table, -1
    for none; empty when none has one."""
    digest_table: list[bytes] = []
    """Each distinct target and failure identity once, 32 raw bytes (b"" when verbatim)."""
    dropped: list[int] = []
    ring: list[int] | None = None
    baseline: list[int] = []
    """Indices in the state's signature table."""
    calls: int = 0
    repeats: int = 0
    repeat_tools: list[str] = []


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
    """Table entries that are not standard digests, by "s<i>"/"r<i>"/"d<i>" (empty bytes in the
    table); and, under profile latest, a digest ("t<i>") on record i where no valid event
    puts one."""
    latest: _StoredLatest | None = None
    aborted_runs: list[tuple[str, str]] | None = None
    """``RunState.aborted_runs`` (None when empty)."""


class _StoredPeer(_Stored, array_like=True, omit_defaults=True):
    """A state with ``RunState.peer``: one element more.  (A state without one is written as
    ``_Stored``, byte for byte as before the peer profiles; both decode as this.)"""

    peer: PeerState | None = None


class _StoredEarly(_StoredPeer, array_like=True, omit_defaults=True):
    """A state with ``RunState.early``: one element more again (``peer`` nil without one).  A
    state without it is written as before; every stored state decodes as this."""

    early: EntropyWindow | None = None


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


def _memo(memo: dict[str, bytes | None], text: str, pack: Callable[[str], bytes | None]) -> bytes | None:
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
_decoder = msgspec.msgpack.Decoder(_StoredEarly)


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
    result_texts = cast("dict[str, int]", result_index)  # (None, the one key that was no result, is gone)

    verbatim: dict[str, str] = {}
    latest = None if state.latest is None else _encode_latest(state.latest, tools, sig_index, verbatim)
    sig_table = []
    for i, sig in enumerate(sig_index):
        tool = sig_tool.get(sig)  # (none for a signature only the guard's instrumentation holds)
        packed = None
        if tool is not None and len(sig) == len(tool) + 65 and sig.startswith(tool):  # else: stored verbatim
            packed = _memo(_PACKED_SIGS, sig, _pack_sig_text)
        if packed is None:
            verbatim[f"s{i}"] = sig
            packed = b""
        sig_table.append(packed)
    result_table = []
    for i, result in enumerate(result_texts):
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
        latest=latest,
        aborted_runs=list(state.aborted_runs) or None,
    )
    if state.early is not None:
        stored = _StoredEarly(**msgspec.structs.asdict(stored), peer=state.peer, early=state.early)
    elif state.peer is not None:
        stored = _StoredPeer(**msgspec.structs.asdict(stored), peer=state.peer)
    return _encoder.encode(stored)


_DIGEST_TOOLS = ("write", "exec")


def _encode_latest(
    latest: LatestState, tools: list[str], sig_index: dict[str, int], verbatim: dict[str, str]
) -> _StoredLatest:
    flags = latest.flags
    stored_flags = b"" if flags.count(AWAITING) + flags.count(PLAIN) == len(flags) else bytes(flags)
    digest_index: dict[str | None, int] = {None: -1}
    digest_idx = []
    for i, (digest, tool) in enumerate(zip(latest.column(), tools)):
        if tool in _DIGEST_TOOLS:
            digest_idx.append(digest_index.setdefault(digest, len(digest_index) - 1))
        elif digest is not None:
            verbatim[f"t{i}"] = digest  # (no valid event puts one there)
    if digest_idx.count(-1) == len(digest_idx):
        digest_idx = []
    del digest_index[None]
    digest_texts = cast("dict[str, int]", digest_index)  # (None, the one key that was no digest, is gone)
    digest_table = []
    for i, text in enumerate(digest_texts):
        packed = _digest_bytes(text)
        if packed is None:
            verbatim[f"d{i}"] = text
            packed = b""
        digest_table.append(packed)
    rereads = latest.rereads
    return _StoredLatest(
        flags=stored_flags,
        digest_idx=digest_idx,
        digest_table=digest_table,
        # Signatures the history no longer holds join the table (stored verbatim).
        dropped=[sig_index.setdefault(sig, len(sig_index)) for sig in latest.dropped],
        ring=None
        if latest.ring is None
        else [sig_index.setdefault(sig, len(sig_index)) for sig in latest.ring[-REREAD_MEMORY:]],
        baseline=[sig_index.setdefault(sig, len(sig_index)) for sig in rereads.baseline],
        calls=rereads.calls,
        repeats=rereads.repeats,
        repeat_tools=list(rereads.repeat_tools),
    )


def _decode_digests(idx: list[int], tools: list[str], table: list[str], verbatim: dict[str, str]) -> dict[int, str]:
    owned = iter(idx)
    out: dict[int, str] = {}
    for i, tool in enumerate(tools):
        digest = verbatim.get(f"t{i}")
        if idx and tool in _DIGEST_TOOLS:
            j = next(owned)
            digest = None if j < 0 else table[j]
        if digest is not None:
            out[i] = digest
    return out


def _decode_latest(
    stored: _StoredLatest, tools: list[str], results: list[str | None], sig_strings: list[str], verbatim: dict[str, str]
) -> LatestState:
    table = [intern(verbatim.get(f"d{i}") or packed.hex()) for i, packed in enumerate(stored.digest_table)]
    flags = bytearray(stored.flags or bytes(AWAITING if r is None else PLAIN for r in results))
    return LatestState(
        flags=flags,
        digests=_decode_digests(stored.digest_idx, tools, table, verbatim),
        observed=sum(1 for f in flags if f & OBSERVED),
        dropped=[sig_strings[i] for i in stored.dropped],
        ring=None if stored.ring is None else [sig_strings[i] for i in stored.ring],
        rereads=CompactionRereads(
            tuple(sig_strings[i] for i in stored.baseline), stored.calls, stored.repeats, tuple(stored.repeat_tools)
        ),
    )


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
    results = [None if i < 0 else result_strings[i] for i in s.result_idx]
    latest = None if s.latest is None else _decode_latest(s.latest, tools, results, sig_strings, s.verbatim)
    return RunState(
        run_id=s.run_id,
        tools=tools,
        sigs=[sig_strings[i] for i in s.sig_idx],
        call_ids=s.call_ids,
        results=results,
        unknowns=s.unknowns or [None] * n,
        stamps=[s.last_event_ms - age for age in s.stamp_ages],
        warning_buckets=s.warning_buckets,
        guard=s.guard,
        critical_blocks=s.critical_blocks,
        aborted=s.aborted,
        last_event_ms=s.last_event_ms,
        latest=latest,
        # (msgspec decodes each pair as a tuple already: ``tuple`` copies only the list)
        aborted_runs=tuple(s.aborted_runs) if s.aborted_runs else (),
        peer=s.peer,
        early=s.early,
    )
