"""The runs touched since the last checkpoint, in memory, and the checkpoint being taken.

``LiveRuns`` holds each run the processor changed since the last checkpoint (``LiveRun``: the
authoritative copy until it is written), freezes them for a checkpoint, encodes them into the
run store's envelopes (``Checkpoint``) and serves reads of them until the store has them.  No
I/O: when a checkpoint is taken and in which order it makes work durable is
``streams.app.checkpoint``'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streams.engine import RunState, copy_state, decode_state

from .run_store import (
    COMPARED_FROM_START,
    MAX_STATE_BYTES,
    candidate_section,
    owner_of,
    pack_ended,
    pack_within_limit,
    parse_header,
    seq_stamps,
    source_stamps,
)

__all__ = ["Checkpoint", "LiveRun", "LiveRuns"]

log = logging.getLogger("loopwatch.worker")


@dataclass
class Checkpoint:
    writes: dict[tuple[int, bytes], bytes | None] = field(default_factory=dict)
    """``(partition, key) -> envelope`` to store, or None to delete; one entry per run touched
    since the previous checkpoint."""
    created: int = 0
    """Runs that had no stored state before and have one now."""
    deleted: int = 0
    """Runs that had a stored state before and have none now."""


class LiveRun:
    """A run touched since the last checkpoint: the authoritative copy until it is written."""

    __slots__ = (
        "base",
        "state",
        "offset",
        "applied",
        "seen",
        "owner",
        "candidate",
        "compared",
        "sources",
        "seqs",
        "ended",
    )

    def __init__(
        self,
        base: bytes | RunState | None,
        state: RunState | None,
        offset: int,
        seen: bytes = b"",
        owner: str | None = None,
        candidate: RunState | None = None,
        compared: int = COMPARED_FROM_START,
        sources: dict[int, int] | None = None,
        seqs: dict[bytes, int] | None = None,
    ) -> None:
        self.base = base
        """What is stored for the run at the first touch: its envelope, or the state that the
        checkpoint being taken will store (None: nothing stored)."""
        self.state = state
        self.offset = offset
        """Offset of the last source record applied (-1: none)."""
        self.applied: list[Any] = []
        """Events applied since the checkpoint, in order (to rebuild after an engine error):
        each as its record's value, or as the event when that differs (``processor``)."""
        self.seen = bytearray(seen)
        """Digests of the run's last applied event ids, oldest first (``streams.engine.intake.SEEN_EVENT_IDS``)."""
        self.owner = owner
        """The agent id of the run's first applied event (None: not known yet)."""
        self.candidate = candidate
        """The candidate config's state of the run (only with a candidate: ``LiveRuns.with_candidate``)."""
        self.compared = compared
        """The comparison of the run's outcomes under both configs (``run_store.COMPARED_FROM_START``)."""
        self.sources = dict(sources) if sources else None
        """Under session scope: ``tool-calls`` partition -> offset of the last record forwarded
        from it and applied (``run_store.Envelope.sources``); None: none yet."""
        self.seqs = dict(seqs) if seqs else None
        """With signed events: run id digest -> the highest ``seq`` of that run applied
        (``run_store.Envelope.seqs``, least recently raised first); None: none yet.  Kept
        when the run ends (its marker holds it)."""
        self.ended = False
        """The run ended (``run.ended``; or its marker was read): with no state, it is stored as
        its marker (``run_store.pack_ended``), so a redelivery of its events is skipped."""


class LiveRuns:
    """The runs touched since the last checkpoint, and the checkpoint being taken.

    ``touched``: ``(partition, key) -> LiveRun``, the runs changed since the last
    ``begin_checkpoint`` (the processor changes them in place).  A checkpoint freezes them
    (``begin_checkpoint``), encodes them (``encode_some``, in slices), hands their writes over
    (``end_checkpoint``) and serves reads of them until the store has them
    (``checkpoint_written``).  ``checkpoint()`` does it all at once.

    ``clock``: the wall clock (seconds) of the envelopes' write time; ``metrics``: counts
    states that could not be stored or read, and trimmed ones.
    """

    def __init__(self, metrics: Any = None, *, clock: Callable[[], float] = time.time, cache_size: int = 4096) -> None:
        self.metrics = metrics
        self.clock = clock
        self.cache_size = cache_size
        self.with_candidate = False
        """A candidate config is loaded: its states are read and written with the runs'
        (a version 4 envelope).  Without one they are neither decoded nor stored."""
        self.touched: dict[tuple[int, bytes], LiveRun] = {}
        self._frozen: dict[tuple[int, bytes], LiveRun] | None = None
        """Runs of the checkpoint being taken, not encoded yet."""
        self._out: Checkpoint | None = None
        self._written: dict[tuple[int, bytes], bytes | None] | None = None
        """The last checkpoint's writes until the store has them."""
        self._now_ms = 0
        self._cache: dict[
            tuple[int, bytes],
            tuple[
                int,
                int,
                RunState,
                bytes,
                str | None,
                RunState | None,
                int,
                dict[int, int] | None,
                dict[bytes, int] | None,
            ],
        ] = {}
        """The state object this worker last wrote per run (insertion-ordered, LRU-ish):
        used only while the stored envelope still carries the same offset and time stamp,
        so a state changed elsewhere (another worker, a deletion) is never used."""

    @property
    def dirty(self) -> int:
        """Runs touched since the last checkpoint (begun)."""
        return len(self.touched)

    def is_dirty(self, partition: int, key: bytes) -> bool:
        """Touched since the last checkpoint, or part of one not written yet."""
        pk = (partition, key)
        return (
            pk in self.touched
            or (self._frozen is not None and pk in self._frozen)
            or (self._out is not None and pk in self._out.writes)
            or (self._written is not None and pk in self._written)
        )

    def forget(self, partition: int, key: bytes) -> None:
        """Drop a clean cached state (its stored value was deleted or replaced elsewhere)."""
        self._cache.pop((partition, key), None)

    # -- a checkpoint ----------------------------------------------------------------------------

    def checkpoint(self) -> Checkpoint:
        """Encode every run touched since the last checkpoint, once, in one go (the worker
        takes it in steps: ``begin_checkpoint`` ...)."""
        self.begin_checkpoint()
        self.encode_some(None)
        out = self.end_checkpoint()
        self.checkpoint_written()
        return out

    def begin_checkpoint(self) -> None:
        """Freeze the runs touched so far as the next checkpoint's content.

        Batches may go on while it is encoded (``encode_some`` in slices): a frozen run that a
        batch touches is copied first (``copy_state``), before the batch changes it, so the
        checkpoint holds exactly the effects of the batches processed before
        ``begin_checkpoint``.
        """
        if self._frozen is not None or self._written is not None:
            raise RuntimeError("a checkpoint is already being taken")
        self._frozen = self.touched
        self.touched = {}
        self._out = Checkpoint()
        self._now_ms = int(self.clock() * 1000)

    def encode_some(self, n: int | None = 256) -> bool:
        """Encode up to ``n`` frozen runs (None: all).  True when none is left."""
        frozen = self._frozen
        if frozen is None:
            return True
        while frozen and (n is None or n > 0):
            pk, live = frozen.popitem()
            self._emit(pk, live)
            if n is not None:
                n -= 1
        return not frozen

    def end_checkpoint(self) -> Checkpoint:
        """The checkpoint's writes; until ``checkpoint_written`` they also serve reads."""
        self.encode_some(None)
        out = self._out
        self._written = out.writes
        self._frozen = None
        self._out = None
        return out

    def checkpoint_written(self) -> None:
        """The checkpoint's writes are in the store: reads go to the store again."""
        self._written = None

    def _emit(self, pk: tuple[int, bytes], live: LiveRun) -> bytes | None:
        out = self._out
        if live.state is None and live.ended:
            out.writes[pk] = pack_ended(live.offset, self._now_ms, live.sources, live.seqs)
            if live.base is not None:
                out.deleted += 1  # a state replaced by the marker: one run fewer tracked
            self._cache.pop(pk, None)
            return None
        value = None if live.state is None else self._pack(pk, live)
        if value is None:
            if live.base is not None:
                out.writes[pk] = None
                out.deleted += 1
            else:
                out.writes.pop(pk, None)
            return None
        out.writes[pk] = value
        if live.base is None:
            out.created += 1
        cache = self._cache
        cache[pk] = (
            live.offset,
            self._now_ms,
            live.state,
            bytes(live.seen),
            live.owner,
            live.candidate,
            live.compared,
            live.sources,
            live.seqs,
        )
        if len(cache) > self.cache_size:
            del cache[next(iter(cache))]
        return value

    def _pack(self, pk: tuple[int, bytes], live: LiveRun) -> bytes | None:
        """The run's envelope (``run_store.pack_within_limit``); None when it cannot be stored
        (the run is then dropped: a state the checkpoint cannot write would stop the worker
        at every restart)."""
        state = live.state
        candidate, compared = (live.candidate, live.compared) if self.with_candidate else (None, None)
        try:
            value, trimmed = pack_within_limit(
                state, live.offset, self._now_ms, live.seen, live.owner, candidate, compared, live.sources, live.seqs
            )
        except Exception as exc:  # noqa: BLE001 - one bad state must not stop the worker
            log.error(
                "cannot store the state of %r on partition %d (%r): the run starts afresh at its next event",
                pk[1],
                pk[0],
                exc,
            )
            self.count_error("state_encode")
            self._cache.pop(pk, None)
            return None
        if trimmed is not None:
            size, records = trimmed
            log.error(
                "state of %r on partition %d was %d bytes, over the %d-byte limit: kept its newest %d of %d "
                "history records",
                pk[1],
                pk[0],
                size,
                MAX_STATE_BYTES,
                len(state),
                records,
            )
            if self.metrics is not None:
                self.metrics.states_trimmed.inc()
        return value

    # -- a run's first touch -----------------------------------------------------------------------

    def load(self, pk: tuple[int, bytes], read: Callable[[int, bytes], bytes | None]) -> LiveRun:
        """A run's state at its first touch since the last checkpoint (``read``: the store)."""
        frozen = self._frozen
        if frozen is not None:
            live = frozen.get(pk)
            if live is not None:
                # Part of the checkpoint being taken.  The checkpoint keeps a copy of the state
                # as it is and encodes it in its own time; encoding it here, before this batch
                # changes the state, put most of a checkpoint's encoding into the decisions
                # made while it ran.
                self._cache.pop(pk, None)
                if live.state is None:
                    del frozen[pk]
                    self._emit(pk, live)  # a deletion or a marker: nothing to encode
                    again = LiveRun(None, None, live.offset, sources=live.sources, seqs=live.seqs)
                    again.ended = live.ended
                    return again
                snapshot = copy_state(live.state)
                candidate = live.candidate
                frozen[pk] = LiveRun(
                    live.base,
                    snapshot,
                    live.offset,
                    live.seen,
                    live.owner,
                    None if candidate is None else copy_state(candidate),
                    live.compared,
                    live.sources,
                    live.seqs,
                )
                return LiveRun(
                    snapshot,
                    live.state,
                    live.offset,
                    live.seen,
                    live.owner,
                    candidate,
                    live.compared,
                    live.sources,
                    live.seqs,
                )
        partition, key = pk
        written = self._written if self._written is not None else (self._out.writes if self._out is not None else None)
        if written is not None and pk in written:
            stored = written[pk]  # encoded by the checkpoint in progress, not in the store yet
        else:
            stored = read(partition, key)
        cached = self._cache.pop(pk, None)  # becomes the live object (mutated in place)
        if stored is None:
            return LiveRun(None, None, -1)
        try:
            offset, touched_ms, seen_at, owner_at, state_at = parse_header(stored)
        except Exception as exc:  # noqa: BLE001
            log.error("unreadable state for %r on partition %d (%r): starting the run afresh", key, partition, exc)
            self.count_error("state_decode")
            return LiveRun(None, None, -1)
        if state_at == len(stored):  # an ended run's marker: its stamps, no state
            marker = LiveRun(None, None, offset, sources=source_stamps(stored), seqs=seq_stamps(stored))
            marker.ended = True
            return marker
        if cached is not None and cached[0] == offset and cached[1] == touched_ms:
            # The objects this worker wrote: no decode.
            return LiveRun(stored, cached[2], offset, cached[3], cached[4], cached[5], cached[6], cached[7], cached[8])
        state = self.decode(stored, pk)
        if state is None:
            return LiveRun(None, None, -1)
        live = LiveRun(
            stored,
            state,
            offset,
            stored[seen_at:owner_at],
            owner_of(stored, owner_at, state_at),
            sources=source_stamps(stored),
            seqs=seq_stamps(stored),
        )
        if self.with_candidate:
            self._load_candidate(live, stored, pk)
        return live

    def _load_candidate(self, live: LiveRun, stored: bytes, pk: tuple[int, bytes]) -> None:
        """The candidate's state of a stored run; a run stored without one (the candidate was
        loaded after it began) is judged by the candidate from here on, but not compared."""
        live.compared = 0
        try:
            section = candidate_section(stored)
            if section is not None:
                live.compared, encoded = section
                live.candidate = decode_state(encoded) if encoded else None
        except Exception as exc:  # noqa: BLE001 - the live state is fine: only the candidate starts afresh
            log.error(
                "undecodable candidate state for %r on partition %d (%r): the candidate starts the run afresh",
                pk[1],
                pk[0],
                exc,
            )
            self.count_error("state_decode")
            live.compared, live.candidate = 0, None

    def decode(self, stored: bytes, pk: tuple[int, bytes]) -> RunState | None:
        """The state in a stored envelope; None (logged, counted) when it cannot be decoded."""
        try:
            return decode_state(stored[parse_header(stored)[4] :])
        except Exception as exc:  # noqa: BLE001
            log.error("undecodable state for %r on partition %d (%r): starting the run afresh", pk[1], pk[0], exc)
            self.count_error("state_decode")
            return None

    def count_error(self, stage: str) -> None:
        if self.metrics is not None:
            self.metrics.count_error(stage)
