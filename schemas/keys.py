"""The keys of the contract: which run an event belongs to, and the Kafka keys that follow.

One function per key, shared by everyone who must agree on it: the worker keeps a run's state
and keys its verdicts by ``state_key``; the runner client publishes under ``record_key`` and
routes the verdicts it reads by their Kafka key, which is ``state_key``.

Upstream keeps one state per session, keyed by ``sessionKey``, or by ``sessionId`` when there
is no key (spec §2.1).  loopwatch keys state by run id instead (spec §8); an event without a
run id belongs to its session's "no run" scope, named the way upstream names the session:

* ``run:<run id>``             the event has a run id (trimmed, as upstream trims it);
* ``session:<session key>|``   no run id: the session key, whatever the session id;
* ``session:|<session id>``    no run id and no session key: the session id.

The ``|`` keeps the two session forms apart, so a session key never names the same scope as an
equal session id.

Under ``loopwatch.scope: session`` one state holds every run of a session
(``session_scope_key``); verdicts stay keyed by ``state_key``, so runners route them as before.

Partitions follow from keys (``partition_for``, Kafka's default partitioner): a run's verdicts
are published on the partition its events were processed from, so a runner reads only the
partitions ``verdict_partitions`` names for its runs.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = [
    "JS_WHITESPACE",
    "normalize_run_id",
    "partition_for",
    "record_key",
    "session_scope_key",
    "state_key",
    "verdict_partitions",
]

# ECMAScript String.prototype.trim() whitespace: note U+FEFF is included and U+0085 and
# U+001C..U+001F are not, unlike Python's str.strip().
JS_WHITESPACE = (
    "\t\n\x0b\x0c\r \xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
    "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)


class _Keyed(Protocol):
    # Read-only: the events are frozen Structs.
    @property
    def run_id(self) -> str | None: ...
    @property
    def session_key(self) -> str | None: ...


def normalize_run_id(run_id: Any) -> str | None:
    """Upstream's run-id normalisation: trimmed; blank or non-string means no run."""
    if not isinstance(run_id, str):
        return None
    return run_id.strip(JS_WHITESPACE) or None


def state_key(event: _Keyed) -> str:
    """The key a run's state lives under, and the Kafka key of its verdicts."""
    run_id = normalize_run_id(event.run_id)
    if run_id is not None:
        return f"run:{run_id}"
    if event.session_key:
        return f"session:{event.session_key}|"
    return f"session:|{getattr(event, 'session_id', None) or ''}"


def record_key(event: _Keyed) -> str:
    """The Kafka key a runner publishes an event under on ``tool-calls``: the run id, or for
    an event without one, its state key.  Every event of a run lands on one partition."""
    return normalize_run_id(event.run_id) or state_key(event)


def session_scope_key(event: _Keyed) -> str:
    """The key a state lives under with ``loopwatch.scope: session``: one state per session key,
    across the session's runs (``scope:session:<session key>|``); an event without a session key
    keeps its own scope (``scope:`` + ``state_key``).

    Prefixed so that states of the two scopes never share a key: a state stamps the offsets of
    the topic that fed it, and under session scope that is the worker's repartition topic,
    not ``tool-calls`` (a worker restarted with the other scope starts fresh histories)."""
    if event.session_key:
        return f"scope:session:{event.session_key}|"
    return "scope:" + state_key(event)


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner (murmur2, as aiokafka's and the Java client's)
    gives a record keyed ``key``: where a run's events land, and its state lives."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (the Java client's default partitioner hash), as an unsigned
    32-bit int.  Written out here so that the contract imports no Kafka client; the tests check
    it against Kafka's own vectors and against aiokafka's partitioner."""
    length, m = len(data), 0x5BD1E995
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    whole = length & ~3
    for i in range(0, whole, 4):
        k = (int.from_bytes(data[i : i + 4], "little") * m) & 0xFFFFFFFF
        k = ((k ^ (k >> 24)) * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h = ((h ^ data[whole]) * m) & 0xFFFFFFFF
    h = ((h ^ (h >> 13)) * m) & 0xFFFFFFFF
    return h ^ (h >> 15)


def verdict_partitions(event: _Keyed, tool_calls_partitions: int, verdicts_partitions: int) -> frozenset[int]:
    """The ``loop-verdicts`` partitions a run's verdicts can be on, whatever the worker's scope.

    The worker publishes a verdict on the partition its cause was processed from, modulo the
    verdicts topic's partitions: under run scope, the ``tool-calls`` partition of the event's
    ``record_key`` (or of ``session_scope_key`` when its runner keyed it by session); under
    session scope, the repartition topic's (as many partitions as ``tool-calls``) partition of
    its ``session_scope_key``.  The runner does not know the worker's scope, so both."""
    return frozenset(
        partition_for(key.encode("utf-8", "surrogatepass"), tool_calls_partitions) % verdicts_partitions
        for key in (record_key(event), session_scope_key(event))
    )
