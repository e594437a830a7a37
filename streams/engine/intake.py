"""What the worker checks before a record reaches the engine, without I/O: the record's value,
signature and Kafka key (``check_record``), and the window of a run's recently applied event ids
that skips an event published again (``event_digest``, ``seen_before``, ``remember``).

The worker (``streams.app.processor``) and the offline tools (``loopwatch backtest`` and
``evaluate``) take records through these same checks, so a file is judged as the worker would
judge it."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from schemas.events import InvalidEvent, ToolCallEvent, decode_event
from schemas.keys import record_key, session_scope_key, state_key
from schemas.names import INVALID_JSON, KEY_MISMATCH, MISSING_KEY
from schemas.signing import Keyring

__all__ = [
    "DIGEST_SIZE",
    "SEEN_BYTES",
    "SEEN_EVENT_IDS",
    "check_record",
    "event_digest",
    "forwarded_key_problem",
    "kafka_key_problem",
    "remember",
    "seen_before",
]

DIGEST_SIZE = 8
SEEN_EVENT_IDS = 64
"""Per run, the ids of this many most recently applied events are remembered (as 8-byte
digests, 512 bytes a run) to skip an event published again.  A retry follows its original
within a few events of the same run; a run's events are sequential (each call waits for its
tool), so 64 covers any retry a runner makes while the run goes on."""
SEEN_BYTES = SEEN_EVENT_IDS * DIGEST_SIZE


def kafka_key_problem(key: bytes | None, event: Any, state_key_bytes: bytes) -> tuple[str, str] | None:
    """Why a record's Kafka key does not fit its event, as ``(reason, detail)``; None if it does.

    Kafka picks a record's partition from its key, and a run's state lives on one partition:
    a record keyed otherwise than its run's other events is processed against an empty
    state elsewhere, and its loop is never seen.  Accepted keys, as UTF-8 bytes
    (``schemas.keys``):

    * the runner's key, ``record_key``: the event's run id, or without one its state key
      (what docs/events-and-verdicts.md tells runners, and what the clients of this repository send);
    * the key the documentation gave before ``record_key``: the event's ``run_id`` exactly as
      published, or without one its ``session_key``, else its ``session_id``;
    * the event's state key, ``state_key``: ``run:<run id>``, ``session:<session key>|`` or
      ``session:|<session id>`` (the form verdicts are keyed by);
    * its session's key, ``session_scope_key`` (``scope:session:<session key>|``): runners that
      key by session, for ``loopwatch.scope: session`` (a run's events share their session
      key, so under run scope too they land on one partition).

    A missing or empty key is ``missing_key``; any other key is ``key_mismatch``.
    """
    if not key:
        return MISSING_KEY, "the record has no Kafka key: key every event by its run id (schemas.keys.record_key)"
    if key == state_key_bytes:
        return None
    expected = record_key(event).encode("utf-8", "surrogatepass")
    if key == expected:
        return None
    legacy = event.run_id or event.session_key or event.session_id
    if legacy and key == legacy.encode("utf-8", "surrogatepass"):
        return None
    if key == session_scope_key(event).encode("utf-8", "surrogatepass"):
        return None  # a runner keying by session (schemas.keys.session_scope_key): its runs stay whole
    shown = key[:200].decode("utf-8", "replace")
    return KEY_MISMATCH, (
        f"Kafka key {shown!r} is not the event's run key {expected.decode('utf-8', 'replace')!r}"
        f" nor its state key {state_key_bytes.decode('utf-8', 'replace')!r}"
    )


def forwarded_key_problem(key: bytes | None, event: Any, state_key_bytes: bytes) -> tuple[str, str] | None:
    """``kafka_key_problem`` under session scope, for the records of the repartition topic:
    the worker forwarded each under its state key."""
    if key == state_key_bytes:
        return None
    shown = (key or b"")[:200].decode("utf-8", "replace")
    return KEY_MISMATCH, (
        f"Kafka key {shown!r} of a forwarded record is not its state key {state_key_bytes.decode('utf-8', 'replace')!r}"
    )


def check_record(
    record: Any,
    keyring: Keyring | None = None,
    keyed: bool = True,
    key_of: Callable[[Any], str] = state_key,
    key_problem: Callable[[bytes | None, Any, bytes], tuple[str, str] | None] = kafka_key_problem,
    memo: dict[bytes | None, tuple[Any, ...]] | None = None,
) -> tuple[ToolCallEvent, bytes]:
    """The event in a ``tool-calls`` record and its state key (UTF-8), as the worker takes it;
    ``InvalidEvent`` (the dead letter's reason and detail) when the worker would dead-letter
    it: no value, a bad signature (with a ``keyring``), not a valid event
    (``schemas.decode_event``: JSON, bounds, version, type), a Kafka key that does not fit
    (``kafka_key_problem``; not checked when ``keyed`` is false: a record read from a file
    has none).  ``loopwatch backtest`` counts what this refuses.  Under session scope the
    worker passes the engine's ``key_of`` and ``forwarded_key_problem``.

    ``memo``: a dict kept between calls (the worker's), in which the state key and the key
    check are remembered: they depend on four values only, the Kafka key and the event's
    run fields, which a run's events share, so they are worked out once per run, not per
    event (the caller empties it when ``key_of`` changes).  It is looked up by the Kafka key
    alone and the run fields compared: hashing one key costs less than hashing four."""
    value = record.value
    if value is None:
        raise InvalidEvent(INVALID_JSON, "the record has no value (null)")
    signer = keyring.verify(record.headers, value) if keyring is not None else None
    event = decode_event(value)
    if signer is not None:
        signer.check_agent(event)
    if memo is None or not keyed:
        key = key_of(event).encode("utf-8", "surrogatepass")
        problem = key_problem(record.key, event, key) if keyed else None
    else:
        known = memo.get(record.key)
        run_id, session_key, session_id = event.run_id, event.session_key, event.session_id
        if known is None or known[0] != run_id or known[1] != session_key or known[2] != session_id:
            key = key_of(event).encode("utf-8", "surrogatepass")
            known = memo[record.key] = (run_id, session_key, session_id, key, key_problem(record.key, event, key))
        key, problem = known[3], known[4]
    if problem is not None:
        raise InvalidEvent(*problem)
    return event, key


# -- recently applied event ids -------------------------------------------------------------


def event_digest(event_id: str) -> bytes:
    """The 8 bytes an event id is remembered by (a collision within one run's last 64 ids
    is a 1 in 2^58 chance)."""
    return hashlib.blake2b(event_id.encode("utf-8", "surrogatepass"), digest_size=DIGEST_SIZE).digest()


def seen_before(seen: bytearray, digest: bytes) -> bool:
    at = seen.find(digest)
    while at >= 0:
        if at % DIGEST_SIZE == 0:
            return True
        at = seen.find(digest, at + 1)
    return False


def remember(seen: bytearray, digest: bytes) -> None:
    seen += digest
    if len(seen) > SEEN_BYTES:
        del seen[:DIGEST_SIZE]
