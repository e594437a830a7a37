"""What every importer produces: runs of tool calls, turned into ``tool-calls`` events here.

A format's module reads its files and yields ``Run``s; ``run_events`` hashes each call's raw
arguments and result at the edge (``streams.edge.events``, ``streams.edge.hashing``: the bytes a runner
would publish) and drops them.  The raw values live only in memory, one run at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

from schemas.errors import LoopwatchError
from schemas.events import MAX_ID_LENGTH, MAX_TOOL_NAME_LENGTH, ToolCallEvent

from ..edge.events import compaction_event, completed_from_outcome, requested_event, run_ended_event
from ..edge.hashing import hash_outcome

__all__ = [
    "Call",
    "Compaction",
    "ENDED",
    "ImportFailed",
    "MAX_ITERATIONS",
    "Run",
    "iso_ms",
    "label_reason",
    "run_events",
    "run_id_of_file",
    "text_of",
]

ENDED = "ended"
"""``run.ended`` reason of a run whose source says nothing of how it went."""
MAX_ITERATIONS = "max-iterations"
"""The run was stopped by its agent's iteration (step, cost) limit."""


class ImportFailed(LoopwatchError):
    """Input an importer cannot use: one line for the user; ``code`` the exit status."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(" ".join(message.split()))
        self.code = code


@dataclass(slots=True)
class Call:
    """One tool call as the source recorded it (raw: hashed by ``run_events``, never written)."""

    name: str
    args: Any
    result: Any = None
    error: bool = False
    """The source marks the call as failed (an error observation, a non-zero exit code)."""
    ts_ms: int = 0
    call_id: str | None = None


@dataclass(slots=True)
class Compaction:
    """The context was compacted (condensed) here: a ``compaction.retried`` event."""

    ts_ms: int = 0


@dataclass(slots=True)
class Run:
    run_id: str
    items: list = field(default_factory=list)
    """``Call`` and ``Compaction`` in the order they happened."""
    end: str = ENDED
    """The ``run.ended`` reason: the outcome label (``label_reason``) or ``ENDED``."""
    agent_id: str | None = None

    @property
    def calls(self) -> int:
        return sum(type(item) is Call for item in self.items)


def label_reason(*, resolved: bool | None = None, reward: float | None = None) -> str:
    """The ``run.ended`` reason carrying an outcome label: ``resolved`` / ``unresolved``
    (SWE-bench), ``reward:<value>`` (tau-bench's 0.0 to 1.0)."""
    if resolved is not None:
        return "resolved" if resolved else "unresolved"
    if reward is not None:
        return f"reward:{float(reward):g}"
    return ENDED


def run_id_of_file(name: str) -> str:
    """The run id a transcript file names when its content names none: its base name without
    ``.gz``, ``.json`` or ``.traj`` (``runs/abc.traj.gz`` is run ``abc``)."""
    base = name.rsplit("/", 1)[-1]
    for suffix in (".gz", ".json", ".traj"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return base


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit]


def run_events(run: Run, *, agent_id: str | None = None) -> Iterator[ToolCallEvent]:
    """The run's events: per call a requested and a completed event (the run id is also the
    session key: upstream detects only in a session, and a recorded run is one), a compaction where the
    source compacted, then ``run.ended`` with the run's reason.  Event times are the source's
    (epoch ms) where it has them, else the call's position (ms), so they keep their order."""
    run_id = _bounded(run.run_id, MAX_ID_LENGTH - 16)
    agent = agent_id if agent_id is not None else run.agent_id
    last_ts = 0
    n = 0
    for n, item in enumerate(run.items, 1):
        ts = item.ts_ms if item.ts_ms > last_ts else last_ts + 1
        last_ts = ts
        if type(item) is Compaction:
            yield compaction_event(f"{run_id}#{n}c", run_id=run_id, session_key=run_id, agent_id=agent, ts_ms=ts)
            continue
        name = item.name or "unknown"
        if len(name) > MAX_TOOL_NAME_LENGTH:
            name = name[:MAX_TOOL_NAME_LENGTH]
        call_id = item.call_id
        if type(call_id) is not str or not call_id:  # a source's id of another type: not an id here
            call_id = None
        elif len(call_id) > MAX_ID_LENGTH:
            call_id = call_id[:MAX_ID_LENGTH]
        requested = requested_event(
            f"{run_id}#{n}",
            name,
            item.args,
            tool_call_id=call_id,
            run_id=run_id,
            session_key=run_id,
            agent_id=agent,
            ts_ms=ts,
        )
        yield requested
        if item.error:
            outcome = hash_outcome(name, item.args, error=item.result if item.result is not None else "error")
        else:
            outcome = hash_outcome(name, item.args, result=item.result, returned=item.result is not None)
        yield completed_from_outcome(
            f"{run_id}#{n}r",
            name,
            requested.args_hash,
            outcome,
            target_hash=requested.target_hash,
            near_args_hash=requested.near_args_hash,
            tool_call_id=call_id,
            run_id=run_id,
            session_key=run_id,
            agent_id=agent,
            ts_ms=ts,
        )
    yield run_ended_event(
        f"{run_id}#end",
        _bounded(run.end, MAX_TOOL_NAME_LENGTH),
        run_id=run_id,
        session_key=run_id,
        agent_id=agent,
        ts_ms=last_ts + 1,
    )


def iso_ms(value: object) -> int:
    """Epoch milliseconds of an ISO 8601 time (UTC unless it says otherwise), 0 if it is not one."""
    if not isinstance(value, str) or not value:
        return 0
    from datetime import datetime

    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return 0
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max(0, int(moment.timestamp() * 1000))


def text_of(content: object) -> object:
    """A message's content as text where it is a list of content blocks (OpenAI, Anthropic):
    the blocks' text joined; other block types kept as they are (hashed alike)."""
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                parts.append(block["text"])
            else:
                parts.append(block)
        if all(isinstance(p, str) for p in parts):
            return "\n".join(parts)
        return parts
    return content
