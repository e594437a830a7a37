"""loopwatch's extensions of upstream's engine, each off by default.

* ``loopwatch.scope: session``: one state per session key holds every run of the session
  (``schemas.keys.session_scope_key``).  A ``run.ended`` no longer frees it (the session goes
  on; idle expiry frees it), and an abort ends its run, not the session: the run's later
  calls are refused, as a run-scoped abort refuses them, while the session's next run
  continues the shared history with a fresh guard and block count (as upstream's per-session
  buffer does for a session without run ids).
* ``loopwatch.detectors.cycle``: ``detectors.detect_cycle`` on the history before the call is
  recorded.
* ``loopwatch.detectors.nearIdentical``: a call event that carries ``near_args_hash`` is judged
  as if its ``args_hash`` were ``<tool>:<near_args_hash>``, so every detector (and the
  decision's ``args_hash``) counts near-identical calls as one.
* ``loopwatch.detectors.earlyWarning``: ``early_warning.observe`` on every checked call, its
  warning shown only on a call no other detector has a finding on (it never blocks).
* ``loopwatch.agentRings``: a send whose (sender, target) is a hop of a ring the fleet
  topology found in its trace (``FleetView.ring_for``).
* ``loopwatch.fleetIncidents``: a call of a tool with an open incident publishes its decision,
  which carries the incident (``with_incident``).

The two detectors only add to upstream's answer: upstream's detectors run as they do without
them, and an extension's finding replaces theirs only where it is more severe (a block where
upstream warns or allows, a warning where upstream says nothing).  Ping-pong (a cycle of two)
therefore stays upstream's, and wins.

A config that uses none of them gets ``LoopEngine`` or its profile-latest engine, whose paths
carry no check of them (``streams.engine.choose.engine_for``; ``ConfigSet.uses_extensions``).
"""

from __future__ import annotations

from sys import intern
from types import SimpleNamespace
from typing import Any

import msgspec

from schemas.config import SESSION_SCOPE
from schemas.events import UNSET, RunEnded, ToolCallCompleted, ToolCallRequested, check_event
from schemas.fleet import IncidentOpened
from schemas.keys import normalize_run_id, session_scope_key
from schemas.names import CRITICAL, WARNING
from schemas.verdicts import Decision

from . import early_warning, history
from .config import ConfigSet, Settings
from .detectors import Detection, Finding, detect, detect_cycle, detect_latest
from .engine import LatestEngine, LoopEngine, Step, refused_after_abort
from .fleet import FleetView, RingDetection
from .state import EntropyWindow, RunState

__all__ = ["FleetStep", "engine_class", "with_incident"]

ABORTED_RUNS = 16
"""Under session scope, a session remembers its last 16 aborted run ids (their calls are refused)."""


class FleetStep(Step, gc=False):
    """A step whose decision carries a fleet incident: published whatever its action (a call
    that is not gated, allowed, still learns that its tool is failing across the fleet)."""

    @property
    def published_decision(self) -> Decision | None:
        return self.built_decision


def with_incident(decision: Decision, incident: IncidentOpened) -> Decision:
    """The decision as published during the tool's incident: the incident's id, its message
    before the detector's, and shown to the model."""
    message = incident.message if not decision.message else f"{incident.message} {decision.message}"
    return msgspec.structs.replace(decision, incident_id=incident.incident_id, message=message, notify_model=True)


class _Extensions(LoopEngine):
    """The extensions over either profile's engine (mixed in before it: a ``LoopEngine`` only
    so that its methods are typed, the class it is mixed into keeps its place in the MRO)."""

    def __init__(self, config: ConfigSet | dict | None = None) -> None:
        super().__init__(config)
        options = self.config
        self.session_scope = options.scope == SESSION_SCOPE
        if self.session_scope:
            self.key_of = session_scope_key
        self.rings_on = options.agent_rings is not None
        self.incidents_on = options.fleet_incidents is not None
        self.fleet_records = self.rings_on or self.incidents_on
        self.near_on = any(map(self._near_for, (None, *options.agent_ids())))
        self.fleet: FleetView | None = None
        """The fleet topology's findings (set by whoever drives the engine: the worker's mirror,
        ``FleetSimulator`` in a replay); None: no rings or incidents are known."""

    def _near_for(self, agent_id: str | None) -> bool:
        return self.settings_for(agent_id).near_identical

    def handle(self, state: RunState | None, event: Any, validated: bool = False) -> Step:
        if self.near_on:
            kind = type(event)
            if (
                (kind is ToolCallRequested or kind is ToolCallCompleted)
                and event.near_args_hash is not UNSET
                and self._near_for(event.agent_id)
            ):
                if not validated:  # the event as sent, both hashes, before one replaces the other
                    check_event(event)
                    validated = True
                event = msgspec.structs.replace(event, args_hash=f"{event.tool_name}:{event.near_args_hash}")
        if not self.session_scope:
            return super().handle(state, event, validated=validated)
        kind = type(event)
        if kind is RunEnded and event.session_key:  # the session's history outlives its runs
            if not validated:
                check_event(event)
            return Step(state)
        if state is None:
            if not validated:
                check_event(event)
                validated = True
            state = RunState(run_id=None)
        run_id = normalize_run_id(event.run_id)
        aborted = state.aborted_runs
        if aborted and run_id is not None and kind is ToolCallRequested:  # (no aborted run without an id)
            detector = dict(aborted).get(run_id)
            if detector is not None:
                if not validated:
                    check_event(event)
                return refused_after_abort(state, event, detector)
        step = super().handle(state, event, validated=validated)
        if step.abort is not None and run_id is not None:
            state.aborted_runs = (*aborted, (run_id, step.abort.detector))[-ABORTED_RUNS:]
        return step

    def _requested(self, state: RunState, event: ToolCallRequested) -> Step:
        settings = self.settings_for(event.agent_id)
        found: Finding | None = None
        early = None
        if event.session_key and state.aborted is None and settings.detection.enabled:
            cfg = settings.detection
            if settings.early_warning is not None:
                if state.early is None:
                    state.early = EntropyWindow()
                early = early_warning.observe(state.early, event.tool_name, event.args_hash, settings.early_warning)
            if settings.cycle:
                found = detect_cycle(
                    state, event.tool_name, intern(event.args_hash), cfg.warning_threshold, cfg.critical_threshold
                )
            fleet = self.fleet
            if self.rings_on and fleet is not None and event.trace_id and event.target:
                notice = fleet.ring_for(event.trace_id, event.session_key, event.agent_id, event.target)
                if notice is not None and (found is None or (notice.level == CRITICAL and found.level != CRITICAL)):
                    found = RingDetection(notice.level, event.tool_name, notice)
        if found is None:
            step = super()._requested(state, event)
        elif found.level == CRITICAL and not self._upstream_blocks(state, event, settings):
            step = self.block(state, event, settings, found)
        else:
            step = super()._requested(state, event)
            if step.detection is None and not step.vetoed and found.level == WARNING:
                self._warn(state, step, settings, found)
        if early is not None and step.detection is None and not step.vetoed:
            # Once per collapse, not by the bucket rule: the collapse already counts once.
            step.detection = early
            step.action = "warn"
            step.emitted = True
            step.notify = settings.surface_warnings
            step.built_logs = None
        if self.incidents_on and self.fleet is not None:
            incident = self.fleet.incidents.get(event.tool_name)
            if incident is not None:
                return _annotated(step, incident)
        return step

    def _upstream_blocks(self, state: RunState, event: ToolCallRequested, settings: Settings) -> bool:
        """Whether upstream's own detectors block this call (they then decide it)."""
        sig = intern(event.args_hash)
        found: Detection | None
        if settings.latest:
            history.latest_columns(state, self)
            found = detect_latest(state, event.tool_name, sig, event.known_poll, event.target_hash)
        else:
            found = detect(state, event.tool_name, sig, event.known_poll, settings.detection)
        return found is not None and found.level == CRITICAL

    def _warn(self, state: RunState, step: Step, settings: Settings, found: Finding) -> None:
        """An extension's warning on a call upstream let through silently (already recorded)."""
        if isinstance(found, RingDetection):
            # A ring's warning is emitted at each new round: its bucket is the round count.
            emitted = self.warning_bucket(state, SimpleNamespace(warning_key=found.warning_key, count=found.count * 10))
        else:
            emitted = self.warning_bucket(state, found)
        step.detection = found
        step.action = "warn" if emitted else "allow"
        step.emitted = emitted
        step.notify = emitted and settings.surface_warnings
        step.built_logs = None


def _annotated(step: Step, incident: IncidentOpened) -> Step:
    decision = step.decision
    if decision is None:
        return step
    fields = msgspec.structs.asdict(step)
    fields["built_decision"] = with_incident(decision, incident)
    return FleetStep(**fields)


class _ExtendedEngine(_Extensions, LoopEngine):
    """configurable-final with loopwatch's extensions."""


class _ExtendedLatestEngine(_Extensions, LatestEngine):
    """Profile latest (for some agent) with loopwatch's extensions."""


def engine_class(latest: bool) -> type[LoopEngine]:
    return _ExtendedLatestEngine if latest else _ExtendedEngine
