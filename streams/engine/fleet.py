"""What no single run shows, sans I/O: fleet incidents and agent rings.

Two topologies need it.  The per-run topology (the engine, keyed by run) reads a
``FleetView``: the open incidents by tool and the agent rings by trace, as every worker
mirrors them from ``loop-incidents`` and ``<app id>-rings``.  The fleet topology (keyed by
tool or by trace: ``streams.app.fleet`` on Faust's windowed tables, ``FleetSimulator`` for
``loopwatch replay``) decides them with the functions here:

* **incidents**: ``outcome_fingerprint`` says which completed calls count (an error or a
  no-progress outcome); a window's value (``count_outcome``) holds the distinct runs and
  agents that had one (tool, outcome) pair, capped at the thresholds; ``qualifies`` says
  whether it reached them; ``open_or_refresh`` and ``resolve_if_quiet`` move a tool's
  incident.  Windows hop: ``window_starts`` and ``earliest_start`` are Faust's
  ``HoppingWindow`` arithmetic (``ranges`` and ``earliest``), which the worker's table uses.
* **the per-agent limit**: ``admit_tool`` decides whether an agent may add an outcome for one
  more tool this minute (the worker keeps each agent's tools in an agent-keyed table, so the
  limit is fleet-wide; ``SourceLimit`` keeps them in memory for ``FleetSimulator``).
* **rings**: ``observe_send`` keeps each hop of a trace with its outcome's streak, looks for
  a ring through the hop that just sent (``find_ring``) and says when to publish (or
  withdraw) a ``RingNotice``.

Nothing here reads a clock: times come in as arguments (the worker's clock in the worker,
the events' times in a replay).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final, Literal, NamedTuple, TypedDict, cast, overload

from schemas.events import ToolCallCompleted
from schemas.fleet import (
    MAX_RING_MEMBERS,
    FleetOutcome,
    FleetSend,
    Incident,
    IncidentOpened,
    IncidentResolved,
    RingHop,
    RingNotice,
)
from schemas.keys import state_key
from schemas.names import CRITICAL, WARNING

from .config import AgentRingSettings, FleetIncidentSettings

__all__ = [
    "FleetSimulator",
    "FleetView",
    "IncidentState",
    "MAX_TRACKED_SOURCES",
    "SourceLimit",
    "TRACE_HOPS",
    "TraceSends",
    "WITHDRAWN",
    "Withdrawn",
    "admit_tool",
    "count_outcome",
    "digest16",
    "earliest_start",
    "fleet_outcome",
    "fleet_send",
    "find_ring",
    "incident_message",
    "observe_send",
    "open_or_refresh",
    "opening_refused",
    "outcome_fingerprint",
    "qualifies",
    "resolve_if_quiet",
    "window_starts",
]


def digest16(text: str) -> str:
    """16 hex characters standing for ``text`` (runs and agents counted without their ids)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


# -- incidents --------------------------------------------------------------------------------------


def outcome_fingerprint(event: ToolCallCompleted) -> str | None:
    """The outcome a fleet incident counts for a completed call, or None: only an error or a
    no-progress outcome with a hash counts.  A failing command's drift-free failure identity
    (profile latest's field) stands for it when the event has one, then the canonical result."""
    result = event.result_hash
    if event.loop_veto or not result:
        return None
    if not (event.is_error or event.no_progress or result.startswith("error:")):
        return None
    return event.failure_identity_hash or event.normalized_result_hash or result


def fleet_outcome(event: ToolCallCompleted) -> FleetOutcome | None:
    """What the per-run topology sends the fleet topology for ``event`` (keyed ``tool:<name>``)."""
    fingerprint = outcome_fingerprint(event)
    if fingerprint is None:
        return None
    return FleetOutcome(
        event.tool_name,
        fingerprint,
        digest16(state_key(event)),
        digest16(event.agent_id or ""),
        event.is_error or fingerprint.startswith("error:"),
    )


def window_starts(ts: float, size: float, step: float) -> range:
    """Starts of the hopping windows that contain ``ts`` (seconds), oldest first: Faust's
    ``HoppingWindow.ranges``."""
    first = (ts // step) * step - size + step
    return range(int(first), int(ts) + 1, int(step))


def earliest_start(ts: float, size: float, step: float) -> float:
    """Start of the oldest window that contains ``ts``: the one that has seen the most of the
    last ``size`` seconds (Faust's ``HoppingWindow.earliest``)."""
    return (ts // step) * step - size + step


def count_outcome(value: Any, run: str, agent: str, settings: FleetIncidentSettings) -> list[list[str]]:
    """A window's value after one more outcome: ``[runs, agents]``, the distinct run and agent
    digests seen, each list capped at its threshold (more would change no decision)."""
    runs, agents = (list(value[0]), list(value[1])) if value else ([], [])
    if run not in runs and len(runs) < settings.min_runs:
        runs.append(run)
    if agent not in agents and len(agents) < settings.min_agents:
        agents.append(agent)
    return [runs, agents]


def qualifies(value: Any, settings: FleetIncidentSettings) -> bool:
    return bool(value) and len(value[0]) >= settings.min_runs and len(value[1]) >= settings.min_agents


MAX_TRACKED_SOURCES = 10_000
"""Agents a ``SourceLimit`` (or a worker's limiter, per worker) starts following in one minute;
outcomes of further agents that minute are limited (a flood of made-up agent ids must not
grow its table)."""


def admit_tool(tools: list[str] | None, tool: str, limit: int | float) -> list[str] | None:
    """The per-agent rate limit's one decision: ``tools``, the distinct tools an agent added
    outcomes for in the current minute (None: none yet), and one more outcome of ``tool``.
    Returns the agent's tools after it (``tools`` itself when ``tool`` is among them already),
    or None when the outcome is refused: the agent has ``limit`` other tools this minute.

    Keyed by agent and nothing else, so it is one decision fleet-wide wherever the agent's
    tools are kept: ``SourceLimit`` in one process, the worker's agent-keyed windowed table
    (``streams.app.fleet``) across workers.  A decision made again on the same list gives the
    same answer (a redelivered record is admitted or refused as it was)."""
    if tools is None:
        tools = []
    if tool in tools:
        return tools
    if len(tools) >= limit:
        return None
    return [*tools, tool]


class SourceLimit:
    """The rate limit per source of fleet outcomes in one process (``FleetSimulator``): an
    agent (its digest, as the events name it) adds outcomes for at most
    ``maxToolsPerAgentPerMinute`` distinct tools in a minute of ``now_ms`` (``admit_tool``);
    its outcomes for the tools it already added pass.  A real agent calls a handful of tools;
    a producer forging incidents needs many.  Holds at most ``MAX_TRACKED_SOURCES`` agents,
    each with at most the limit's tools, and forgets them every minute."""

    __slots__ = ("limit", "minute", "tools", "limited")

    def __init__(self, limit: int | float) -> None:
        self.limit = limit
        self.minute = -1
        self.tools: dict[str, list[str]] = {}
        self.limited = 0
        """Outcomes refused, all told."""

    def admit(self, agent: str, tool: str, now_ms: int) -> bool:
        minute = now_ms // 60_000
        if minute != self.minute:
            self.minute, self.tools = minute, {}
        tools = self.tools.get(agent)
        if tools is None and len(self.tools) >= MAX_TRACKED_SOURCES:
            self.limited += 1
            return False
        after = admit_tool(tools, tool, self.limit)
        if after is None:
            self.limited += 1
            return False
        self.tools[agent] = after
        return True


def opening_refused(current: IncidentState | None, value: Any, open_now: int, settings: FleetIncidentSettings) -> bool:
    """Whether a tool that qualifies now is refused an incident: ``maxOpenIncidents`` are open
    (``open_now``, the open incidents the caller knows of)."""
    return current is None and open_now >= settings.max_open and qualifies(value, settings)


@dataclass
class IncidentState:
    """The fleet topology's record of a tool's incident (the worker's ``fleet-incidents`` table)."""

    incident_id: str
    tool_name: str
    outcome_hash: str
    error: bool
    runs: int
    agents: int
    opened_ms: int
    last_qualified_ms: int
    """The last time an outcome of the tool met the thresholds; quiet is measured from it."""

    def as_json(self) -> dict[str, Any]:
        return self.__dict__.copy()

    @classmethod
    def from_json(cls, value: Any) -> IncidentState | None:
        return cls(**value) if isinstance(value, dict) and value else None


def incident_message(tool: str, runs: int, agents: int, window_s: int | float, error: bool, incident_id: str) -> str:
    what = "error" if error else "no-progress outcome"
    return (
        f"WARNING: tool {tool} is failing across the fleet: the same {what} in at least {runs} runs of "
        f"{agents} or more agents within {window_s} s (incident {incident_id}). Stop retrying {tool}: report that "
        "it is failing and continue without it if you can."
    )


class _IncidentFields(TypedDict):
    """The fields an opened and a resolved incident share."""

    incident_id: str
    tool_name: str
    outcome_hash: str
    runs: int
    agents: int
    window_s: int
    opened_ms: int
    message: str


@overload
def _notice(state: IncidentState, settings: FleetIncidentSettings, resolved_ms: None = None) -> IncidentOpened: ...
@overload
def _notice(state: IncidentState, settings: FleetIncidentSettings, resolved_ms: int) -> IncidentResolved: ...
def _notice(state: IncidentState, settings: FleetIncidentSettings, resolved_ms: int | None = None) -> Incident:
    fields = _IncidentFields(
        incident_id=state.incident_id,
        tool_name=state.tool_name,
        outcome_hash=state.outcome_hash,
        runs=state.runs,
        agents=state.agents,
        # An int: every config a worker or a replay loads passed ``schemas.config``, which bounds
        # windowSeconds to a day, and ``pos_int`` keeps such a number an int.
        window_s=cast(int, settings.window_s),
        opened_ms=state.opened_ms,
        message=incident_message(
            state.tool_name, state.runs, state.agents, settings.window_s, state.error, state.incident_id
        ),
    )
    if resolved_ms is None:
        return IncidentOpened(**fields)
    return IncidentResolved(**fields, resolved_ms=resolved_ms)


def open_or_refresh(
    current: IncidentState | None,
    outcome: FleetOutcome,
    value: Any,
    now_ms: int,
    settings: FleetIncidentSettings,
    open_now: int = 0,
) -> tuple[IncidentState | None, IncidentOpened | None]:
    """After ``outcome`` was counted into its window (``value``, the oldest window containing
    now): the tool's incident state, and the incident to publish if one opens now (none while
    ``open_now``, the incidents open, is ``maxOpenIncidents``: ``opening_refused``)."""
    if not qualifies(value, settings) or opening_refused(current, value, open_now, settings):
        return current, None
    if current is not None:
        current.last_qualified_ms = now_ms
        return current, None
    tool = outcome.tool_name
    state = IncidentState(
        incident_id=f"inc-{digest16(tool)}-{now_ms}",
        tool_name=tool,
        outcome_hash=outcome.fingerprint,
        error=outcome.error,
        runs=len(value[0]),
        agents=len(value[1]),
        opened_ms=now_ms,
        last_qualified_ms=now_ms,
    )
    return state, _notice(state, settings)


def resolve_if_quiet(
    current: IncidentState | None, now_ms: int, settings: FleetIncidentSettings
) -> IncidentResolved | None:
    """The resolution to publish when the tool has not met the thresholds for ``quietSeconds``."""
    if current is None or now_ms - current.last_qualified_ms < settings.quiet_s * 1000:
        return None
    return _notice(current, settings, resolved_ms=now_ms)


# -- rings ------------------------------------------------------------------------------------------


class Hop(NamedTuple):
    """A sender (its session key and agent id, as its events carry them) and its target."""

    session_key: str | None
    agent_id: str | None
    target: str


def fleet_send(event: ToolCallCompleted) -> FleetSend | None:
    """What the per-run topology sends the fleet topology for a completed send of a trace
    (keyed ``trace:<id>``), or None."""
    if not (event.trace_id and event.target and event.result_hash) or event.loop_veto:
        return None
    outcome = event.normalized_result_hash or event.result_hash
    return FleetSend(event.trace_id, event.session_key, event.agent_id, event.target, outcome)


@dataclass
class TraceSends:
    """The fleet topology's state of one trace: each hop's latest outcome and how many of its
    sends in a row had it (its streak), and the ring last published.

    Hops, not the order of sends: the sends of a ring's agents come from runs on different
    partitions and may be seen in any order within a round (the per-run topology forwards a
    batch's records run by run); a hop's streak only counts its own sends."""

    hops: dict[Hop, list] = field(default_factory=dict)
    """hop -> [outcome, streak, when it last sent (the trace's send count then)]."""
    sent: int = 0
    published: tuple[str, str, int] | None = None
    """(ring id, level, rounds) of the notice in force, None when none is."""
    published_hops: frozenset[Hop] = frozenset()

    def as_json(self) -> list:
        return [
            [[*hop, *entry] for hop, entry in self.hops.items()],
            self.sent,
            list(self.published) if self.published else None,
            [list(h) for h in self.published_hops],
        ]

    @classmethod
    def from_json(cls, value: Any) -> TraceSends:
        if not isinstance(value, list) or len(value) != 4:
            return cls()
        hops = {Hop(*row[:3]): list(row[3:]) for row in value[0]}
        return cls(hops, value[1], tuple(value[2]) if value[2] else None, frozenset(Hop(*h) for h in value[3]))

    def record(self, hop: Hop, outcome: str, count: int = 1) -> None:
        """``count`` sends of ``hop`` in a row with ``outcome``."""
        self.sent += count
        entry = self.hops.get(hop)
        if entry is not None and entry[0] == outcome:
            entry[1] += count
            entry[2] = self.sent
        else:
            self.hops.pop(hop, None)  # (re-inserted: the dict stays in order of last use)
            self.hops[hop] = [outcome, count, self.sent]
            while len(self.hops) > TRACE_HOPS:
                del self.hops[next(iter(self.hops))]  # the hop that sent longest ago


TRACE_HOPS = 128
"""Hops kept per trace (the least recently used go first)."""
RING_SEARCH_STEPS = 10_000
"""Hops a ring search may try (a trace whose agents all message each other has many paths)."""


def _senders(hops: dict[Hop, list], name: str) -> list[Hop]:
    return [hop for hop in hops if name == hop.session_key or name == hop.agent_id]


def find_ring(trace: TraceSends, start: Hop) -> tuple[list[Hop], int] | None:
    """The ring through hop ``start`` whose hops repeated their outcome the most times, and
    that number (its rounds: the smallest streak on the ring); None without a ring.

    A ring: at least 3 (at most ``MAX_RING_MEMBERS``) distinct senders, each sending to the
    next one and the last to the first (a target names a sender by its session key or agent
    id).  The search walks the trace's hops from ``start``'s target back to ``start``'s
    sender, depth first."""
    hops = trace.hops
    origin = (start.session_key, start.agent_id)
    best: tuple[list[Hop], int] | None = None
    budget = [RING_SEARCH_STEPS]

    def walk(path: list[Hop], seen: set, rounds: int) -> None:
        nonlocal best
        target = path[-1].target
        if len(path) >= 3 and target in origin:
            if best is None or rounds > best[1]:
                best = (list(path), rounds)
            return
        if len(path) >= MAX_RING_MEMBERS or (best is not None and rounds <= best[1]):
            return
        for hop in _senders(hops, target):
            sender = (hop.session_key, hop.agent_id)
            if sender in seen:  # (the origin among them: a ring of two is ping-pong)
                continue
            budget[0] -= 1
            if budget[0] < 0:
                return
            seen.add(sender)
            path.append(hop)
            walk(path, seen, min(rounds, hops[hop][1]))
            path.pop()
            seen.discard(sender)

    if start in hops:
        walk([start], {origin}, hops[start][1])
    return best


def _canonical(hops: list[Hop]) -> list[Hop]:
    """The ring's hops from its smallest one on, so that a ring has one id however it is entered."""
    keys = [(h.session_key or "", h.agent_id or "", h.target) for h in hops]
    start = keys.index(min(keys))
    return hops[start:] + hops[:start]


def ring_id(trace_id: str, hops: Iterable[Hop]) -> str:
    return digest16("\n".join([trace_id, *(f"{h.session_key or ''}\t{h.agent_id or ''}\t{h.target}" for h in hops)]))


class Withdrawn(Enum):
    """``observe_send``'s answer when the trace's ring notice is to be withdrawn (a tombstone)."""

    WITHDRAWN = "withdrawn"


WITHDRAWN: Final = Withdrawn.WITHDRAWN


def observe_send(
    trace: TraceSends, record: FleetSend, now_ms: int, settings: AgentRingSettings
) -> RingNotice | Literal[Withdrawn.WITHDRAWN] | None:
    """Add a send to its trace; a ``RingNotice`` to publish when a ring through its hop reaches
    a level or a new round, ``WITHDRAWN`` when the ring in force lost this hop's streak, else
    None."""
    hop = Hop(record.session_key, record.agent_id, record.target)
    trace.record(hop, record.outcome, record.count)
    found = find_ring(trace, hop)
    level = None
    if found is not None:
        ring, rounds = found
        if rounds >= settings.critical_rounds:
            level = CRITICAL
        elif rounds >= settings.warning_rounds:
            level = WARNING
    if level is None:
        if trace.published is None or hop not in trace.published_hops:
            return None
        trace.published, trace.published_hops = None, frozenset()
        return WITHDRAWN
    ring = _canonical(ring)
    rid = ring_id(record.trace_id, ring)
    if trace.published == (rid, level, rounds):
        return None
    trace.published, trace.published_hops = (rid, level, rounds), frozenset(ring)
    return RingNotice(
        trace_id=record.trace_id,
        ring_id=rid,
        level=level,
        rounds=rounds,
        hops=[RingHop(h.session_key, h.agent_id, h.target) for h in ring],
        updated_ms=now_ms,
    )


def ring_members(notice: RingNotice) -> list[str]:
    """The ring's agents in order, each named as its events name it."""
    return [h.session_key or h.agent_id or "?" for h in notice.hops]


# -- the view every worker mirrors --------------------------------------------------------------------


class FleetView:
    """The open incidents by tool and the agent rings by trace, as the engine reads them.

    The worker fills it from ``loop-incidents`` and ``<app id>-rings`` (every worker reads
    every partition of both); ``FleetSimulator`` fills it in a replay.  Between two batches
    it changes only on the worker's event loop, so one batch sees one view.
    """

    def __init__(self) -> None:
        self.incidents: dict[str, IncidentOpened] = {}
        """Open incidents by tool name."""
        self.rings: dict[str, tuple[RingNotice, frozenset[tuple[str, str]]]] = {}
        """Rings by trace id, with their hops as (sender id, target) pairs, for both ids."""

    def apply_incident(self, incident: Incident) -> None:
        if isinstance(incident, IncidentOpened):
            self.incidents[incident.tool_name] = incident
        else:
            current = self.incidents.get(incident.tool_name)
            if current is not None and current.incident_id == incident.incident_id:
                del self.incidents[incident.tool_name]

    def apply_ring(self, trace_id: str, notice: RingNotice | None) -> None:
        """A notice for the trace, or None: its ring is broken (a tombstone)."""
        if notice is None:
            self.rings.pop(trace_id, None)
            return
        pairs = set()
        for hop in notice.hops:
            for sender in (hop.session_key, hop.agent_id):
                if sender:
                    pairs.add((sender, hop.target))
        self.rings[trace_id] = (notice, frozenset(pairs))

    def expire_rings(self, now_ms: int, settings: AgentRingSettings | None) -> None:
        """Forget the rings nobody continued within the window."""
        if settings is None or not self.rings:
            return
        horizon = now_ms - settings.window_s * 1000
        for trace_id in [t for t, (notice, _) in self.rings.items() if notice.updated_ms < horizon]:
            del self.rings[trace_id]

    def ring_for(self, trace_id: str, session_key: str | None, agent_id: str | None, target: str) -> RingNotice | None:
        """The ring of ``trace_id`` if this send is one of its hops."""
        entry = self.rings.get(trace_id)
        if entry is None:
            return None
        notice, pairs = entry
        if (session_key, target) in pairs or (agent_id, target) in pairs:
            return notice
        return None


# -- the fleet topology without Kafka (loopwatch replay) -----------------------------------------------


class FleetSimulator:
    """The fleet topology over a stream of events, in one process: the same windows, incident
    and ring rules as the worker's, with event times for the clock and no delay between a
    finding and the view the engine reads.  ``observe`` returns what the worker would publish
    on ``loop-incidents`` and ``<app id>-rings`` for the event."""

    def __init__(self, incidents: FleetIncidentSettings | None, rings: AgentRingSettings | None) -> None:
        self.incident_settings = incidents
        self.ring_settings = rings
        self.view = FleetView()
        self._windows: dict[tuple[str, str, int], list] = {}
        self._incidents: dict[str, IncidentState] = {}
        self._traces: dict[str, TraceSends] = {}
        self.limit = None if incidents is None else SourceLimit(incidents.max_tools_per_agent)
        self.capped = 0
        """Outcomes that qualified a tool while ``maxOpenIncidents`` were open (not opened)."""
        self._swept_hop = -1

    def observe(self, event: Any) -> list[Incident | RingNotice | tuple[str, None]]:
        """Feed one event (after the engine handled it); returns the records published."""
        out: list[Incident | RingNotice | tuple[str, None]] = []
        now_ms = event.ts_ms
        settings, limit, ring_settings = self.incident_settings, self.limit, self.ring_settings
        if settings is not None:
            for tool in list(self._incidents):  # a quiet window passes with the events' time
                resolved = resolve_if_quiet(self._incidents[tool], now_ms, settings)
                if resolved is not None:
                    del self._incidents[tool]
                    self.view.apply_incident(resolved)
                    out.append(resolved)
        if not isinstance(event, ToolCallCompleted):
            return out
        outcome = fleet_outcome(event) if settings is not None else None
        if outcome is not None and settings is not None and limit is not None:  # (settings and limit: both or neither)
            out.extend(self._count(outcome, now_ms, settings, limit))
        send = fleet_send(event) if ring_settings is not None else None
        if send is not None and ring_settings is not None:
            trace = self._traces.setdefault(send.trace_id, TraceSends())
            found = observe_send(trace, send, now_ms, ring_settings)
            if found is WITHDRAWN:
                self.view.apply_ring(send.trace_id, None)
                out.append((send.trace_id, None))
            elif found is not None:
                self.view.apply_ring(send.trace_id, found)
                out.append(found)
        return out

    def _count(
        self, outcome: FleetOutcome, now_ms: int, settings: FleetIncidentSettings, limit: SourceLimit
    ) -> list[Incident]:
        ts = now_ms / 1000.0
        hop = int(ts // settings.hop_s)
        if hop != self._swept_hop:  # once a hop: windows that ended, which no later event reads
            self._swept_hop = hop
            horizon = ts - settings.window_s
            for window in [w for w in self._windows if w[2] + settings.window_s <= horizon]:
                del self._windows[window]
        if not limit.admit(outcome.agent, outcome.tool_name, now_ms):
            return []
        key = (outcome.tool_name, outcome.fingerprint)
        for start in window_starts(ts, settings.window_s, settings.hop_s):
            window = key + (start,)
            self._windows[window] = count_outcome(self._windows.get(window), outcome.run, outcome.agent, settings)
        value = self._windows.get(key + (int(earliest_start(ts, settings.window_s, settings.hop_s)),))
        current, open_now = self._incidents.get(outcome.tool_name), len(self._incidents)
        if opening_refused(current, value, open_now, settings):
            self.capped += 1
        state, opened = open_or_refresh(current, outcome, value, now_ms, settings, open_now)
        if state is not None:
            self._incidents[outcome.tool_name] = state
        if opened is None:
            return []
        self.view.apply_incident(opened)
        return [opened]


# -- the ring's decision -----------------------------------------------------------------------------


_MEMBERS_SHOWN = 8


class RingDetection:
    """The engine's finding for a send along a ring (detector ``agent_ring``): warning from
    ``warningThreshold`` rounds, critical from ``criticalThreshold``.  Quacks like a
    ``detectors.Detection`` (the engine builds decisions and log lines from these fields)."""

    __slots__ = ("level", "count", "tool", "notice")
    detector = "agent_ring"
    paired_tool_name = None
    liveness_signal = None

    def __init__(self, level: str, tool: str, notice: RingNotice) -> None:
        self.level = level
        self.count = notice.rounds
        self.tool = tool
        self.notice = notice

    @property
    def ring(self) -> str:
        members = ring_members(self.notice)
        shown = members[:_MEMBERS_SHOWN]
        tail = f" → … ({len(members)} agents)" if len(members) > _MEMBERS_SHOWN else f" → {members[0]}"
        return " → ".join(shown) + tail

    @property
    def message(self) -> str:
        rounds = self.count
        if self.level == CRITICAL:
            return (
                f"CRITICAL: agents {self.ring} have sent each other the same messages with identical outcomes "
                f"for {rounds} rounds with no progress. This appears to be a stuck agent ring. Sending blocked to "
                "prevent runaway loops."
            )
        return (
            f"WARNING: agents {self.ring} have sent each other the same messages with identical outcomes for "
            f"{rounds} rounds. This looks like an agent ring loop; stop sending and report the task as failed."
        )

    @property
    def warning_key(self) -> str:
        return f"ring:{self.notice.ring_id}"

    @property
    def log(self) -> tuple[str, str]:
        size, trace = len(self.notice.hops), self.notice.trace_id
        if self.level == CRITICAL:
            return "error", f"Critical agent ring detected: trace={trace} agents={size} rounds={self.count}"
        return "warn", f"Agent ring warning: trace={trace} agents={size} rounds={self.count}"
