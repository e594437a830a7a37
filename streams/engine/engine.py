"""The sans-I/O detection engine: one event in, the decisions and log lines it causes out.

``LoopEngine.handle(state, event)`` is the only entry point.  It reproduces upstream's
before-tool-call wrapper (spec §3) around the detectors, history and post-compaction
guard, on one run's ``RunState``, in the profile its agent's config names: profile latest
(openclaw-latest.md §6) lives in ``LatestEngine``, the engine of a config that uses it.  No Kafka, clock or logging happens here: the Faust app,
``loopwatch replay``, the conformance runners and the benchmarks all drive this object.

An event the engine rejects raises ``InvalidEvent`` before any state is touched.
"""

from __future__ import annotations

from sys import intern
from typing import TYPE_CHECKING, Any, cast

import msgspec

from schemas.events import (
    AgentMessage,
    CompactionRetried,
    InvalidEvent,
    ModelText,
    RunEnded,
    ToolCallCompleted,
    ToolCallEvent,
    ToolCallRequested,
    check_event,
)
from schemas.keys import normalize_run_id, state_key
from schemas.names import ARGUMENT_CHURN, CRITICAL, CRITICAL_BLOCK_LIMIT, UNKNOWN_TYPE, WARNING
from schemas.verdicts import Decision, RunAborted
from streams.edge.hashing import TERMINAL_EXEC_FAILURE, WRITE_MUTATION

from . import compaction_guard as guard_mod
from . import history
from .config import ConfigSet, Settings
from .detectors import Detection, Finding, LatestDetection, Warned, detect, detect_latest, write_churn
from .history import LATEST_HISTORY_SIZE
from .state import (
    AWAITING,
    MUTATION,
    NO_PROGRESS,
    OBSERVED,
    PLAIN,
    TERMINAL_FAILURE,
    VETO,
    CallRecord,
    CompactionRereads,
    GuardWindow,
    LatestState,
    RunState,
)

if TYPE_CHECKING:
    from .fleet import FleetView

__all__ = ["LogLine", "LoopEngine", "Step", "allow_decision", "normalize_run_id", "state_key"]

MAX_WARNING_BUCKETS = 256
_DORMANT = guard_mod.DORMANT


class LogLine(msgspec.Struct, frozen=True, gc=False):
    """One of upstream's log lines.  (A msgspec Struct: a blocked call builds three, and a
    frozen dataclass's constructor costs seven times as much.)"""

    level: str  # "info" | "warn" | "error"
    subsystem: str
    message: str


class Step(msgspec.Struct, gc=False):
    """What one event caused.

    ``decision`` answers a requested call (None for other events); ``abort`` ends the run;
    ``logs`` are upstream's log lines in order.  ``record`` (the history record the outcome
    was attached to or appended as), ``guard`` and ``detection`` expose the intermediate
    answers conformance checks compare.  (Under profile latest an outcome can raise a
    warning too, the write churn of openclaw-latest.md §6.3: then ``detection`` is that
    warning and ``decision`` its emitted decision.)  ``state`` is the run's new state, None once freed.

    The decision, the log lines and the record are built when first read: a worker
    publishes few decisions (gated calls, warnings, blocks), most events need none of them,
    and only conformance checks read records.  Like ``state``, which the run's next event
    changes in place, they describe the run as of this step: read them before handling the
    run's next event.  (A msgspec Struct because it is created once per event and its
    constructor runs in C.  The hot paths pass ``state, request`` or ``state, None,
    record_at, guard, record`` positionally: msgspec matches keyword arguments one at a
    time, which cost about 2 % of the engine.)
    """

    state: RunState | None
    request: ToolCallRequested | None = None
    record_at: int = -1
    """Index in ``state`` of the record an outcome was attached to (-1: see built_record)."""
    guard: guard_mod.GuardVerdict | None = None
    built_record: CallRecord | None = None
    abort: RunAborted | None = None
    detection: Finding | None = None
    vetoed: bool = False
    action: str = "allow"
    emitted: bool | None = None
    notify: bool = False
    built_decision: Decision | None = None
    built_logs: tuple[LogLine, ...] | None = ()
    unchecked: bool = False
    """The agent's config runs no detection: its decision says so (``detection_off``)."""

    @property
    def decision(self) -> Decision | None:
        if self.built_decision is None and self.request is not None:
            self.built_decision = build_decision(self.request, self.action, self.detection, self.emitted, self.notify)
            if self.unchecked:
                self.built_decision = msgspec.structs.replace(self.built_decision, detection_off=True)
        return self.built_decision

    @property
    def published_decision(self) -> Decision | None:
        """The decision loopwatch publishes for this step, or None: the decision of a gated
        call, and every decision whose action is not ``allow`` (a warning shown, a block).

        The one rule for what goes on ``loop-verdicts`` (with every abort:
        ``streams.engine.drive.published``).  An allow nobody waits for is not even built."""
        decision = self.built_decision
        request = self.request
        if decision is None:
            if request is None or (self.action == "allow" and not request.gate):
                return None
            decision = build_decision(request, self.action, self.detection, self.emitted, self.notify)
            if self.unchecked:
                decision = msgspec.structs.replace(decision, detection_off=True)
            self.built_decision = decision
            return decision
        if decision.action != "allow" or (request is not None and request.gate):
            return decision
        return None

    @property
    def record(self) -> CallRecord | None:
        if self.built_record is None and self.record_at >= 0:
            # (a step that points at a record holds the state it is in)
            self.built_record = cast(RunState, self.state).record(self.record_at)
        return self.built_record

    @property
    def logs(self) -> tuple[LogLine, ...]:
        if self.built_logs is None:
            self.built_logs = _request_logs(self)
        return self.built_logs


def build_decision(
    event: ToolCallRequested | ToolCallCompleted,
    action: str,
    d: Finding | None,
    emitted: bool | None,
    notify: bool,
    **override: Any,
) -> Decision:
    # A gated runner gets a decision for every call, and msgspec matches keyword arguments
    # one by one: passing only the fields an allowed call has costs a fifth of passing
    # them all, so the detection's fields are added only when there is one.
    decision = Decision(
        verdict_id=f"{event.event_id}/decision",
        cause_event_id=event.event_id,
        run_id=event.run_id,
        session_key=event.session_key,
        agent_id=event.agent_id,
        ts_ms=event.ts_ms,
        tool_call_id=event.tool_call_id,
        tool_name=event.tool_name,
        args_hash=event.args_hash,
        action=action,
        warning_emitted=emitted,
        notify_model=notify,
    )
    if d is not None:
        override = {
            "level": d.level,
            "detector": d.detector,
            "count": d.count,
            "message": d.message,
            "paired_tool_name": d.paired_tool_name,
            "warning_key": d.warning_key,
            **override,
        }
        if d.liveness_signal is not None:
            override["liveness_signal"] = d.liveness_signal
    return msgspec.structs.replace(decision, **override) if override else decision


def refused_after_abort(state: RunState, event: ToolCallRequested, detector: str) -> Step:
    """The block of a late call of a run that loopwatch aborted (``detector``)."""
    message = f"CRITICAL: this run was aborted by loopwatch ({detector}); no further tool calls are allowed."
    decision = build_decision(event, "block", None, None, True, level=CRITICAL, detector=detector, message=message)
    return Step(state=state, built_decision=decision, request=event, vetoed=True)


def allow_decision(event: ToolCallRequested) -> Decision:
    """A plain ``allow`` for a requested call, as the engine decides one without detection."""
    return build_decision(event, "allow", None, None, False)


def build_run_aborted(event: ToolCallEvent, detector: str, count: int, tool_name: str, message: str) -> RunAborted:
    # A verdict's id derives from its event's id, so a redelivered event yields the same id.
    return RunAborted(
        verdict_id=f"{event.event_id}/abort",
        cause_event_id=event.event_id,
        run_id=event.run_id,
        session_key=event.session_key,
        agent_id=event.agent_id,
        ts_ms=event.ts_ms,
        detector=detector,
        count=count,
        tool_name=tool_name,
        message=message,
    )


def _request_logs(step: Step) -> tuple[LogLine, ...]:
    """Upstream's log lines for a requested call, in order (spec §2.13, §3)."""
    d = step.detection
    if d is None:
        return ()
    event = cast(ToolCallRequested, step.request)  # (only a request's steps have logs to build)
    lines = []
    own = d.log
    if own is not None:
        lines.append(LogLine(own[0], LOOP_SUBSYSTEM, own[1]))
    message = d.message  # built on each read
    if step.vetoed:
        lines.append(LogLine("error", WRAPPER_SUBSYSTEM, f"Blocking {event.tool_name} due to critical loop: {message}"))
        lines.append(LogLine("error", DIAGNOSTIC_SUBSYSTEM, _tool_loop_line(event, d, "block", message)))
        if step.abort is not None:
            lines.append(
                LogLine("error", WRAPPER_SUBSYSTEM, f"Run aborted: {step.abort.count} critical tool-loop blocks")
            )
    elif step.emitted:
        lines.append(LogLine("warn", WRAPPER_SUBSYSTEM, f"Loop warning for {event.tool_name}: {message}"))
        lines.append(LogLine("warn", DIAGNOSTIC_SUBSYSTEM, _tool_loop_line(event, d, "warn", message)))
    return tuple(lines)


LOOP_SUBSYSTEM = "agents/loop-detection"
WRAPPER_SUBSYSTEM = "agents/tools"
DIAGNOSTIC_SUBSYSTEM = "diagnostic"


def _tool_loop_line(event: ToolCallRequested | ToolCallCompleted, d: Finding, action: str, message: str) -> str:
    paired = f" pairedTool={d.paired_tool_name}" if d.paired_tool_name else ""
    return (
        f"tool loop: sessionId={event.session_id or 'unknown'} sessionKey={event.session_key or 'unknown'} "
        f"tool={event.tool_name} level={d.level} action={action} detector={d.detector} count={d.count}"
        f'{paired} message="{message}"'
    )


class LoopEngine:
    """Loop detection for many runs; holds only configuration, never run state.

    The engine of profile configurable-final.  ``streams.engine.choose.engine_for(config)``
    picks the class a config needs: ``LatestEngine`` when some agent uses profile latest (each
    event first looks up its agent's profile, a check kept off configurable-final's paths), the
    extensions' and the peer profiles' classes above them.  Built directly, this class refuses
    a config that needs another.
    """

    key_of = staticmethod(state_key)
    """The key a run's state lives under, for an event (``streams.engine.extensions`` keys by
    session under ``loopwatch.scope: session``)."""
    incidents_on = rings_on = fleet_records = False
    """loopwatch's fleet options (``streams.engine.extensions``): off."""
    fleet: FleetView | None = None
    """What the fleet topology found (``streams.engine.fleet.FleetView``), for the engines of
    configs that use it."""

    def __init__(self, config: ConfigSet | dict | None = None) -> None:
        self.config = config if isinstance(config, ConfigSet) else ConfigSet(config)
        self._settings = self.config.resolved  # resolved once per agent
        if type(self) is LoopEngine and (
            self.config.uses_latest() or self.config.uses_extensions() or self.config.uses_peers()
        ):
            raise TypeError("this config needs another engine class: build it with streams.engine.engine_for(config)")

    def settings_for(self, agent_id: str | None) -> Settings:
        return self._settings.get(agent_id) or self.config.settings_for(agent_id)

    def handle(self, state: RunState | None, event: ToolCallEvent, validated: bool = False) -> Step:
        """Apply one event to a run's state (None for a run not seen yet).

        The state object is updated in place and also returned in the ``Step``.  Pass
        ``validated=True`` for events that came through ``schemas.decode_event`` (the worker
        passes it positionally: a keyword argument costs a fifth more per call).
        """
        if not validated:
            check_event(event)
        # Exact types (the wire decoder builds no subclasses), which narrow ``event`` too.
        if state is None:
            if type(event) is RunEnded:
                return Step(None)
            state = RunState(run_id=normalize_run_id(event.run_id))  # (dropped if the kind is rejected)
        if type(event) is ToolCallRequested:  # the two common kinds first
            step = self._requested(state, event)
        elif type(event) is ToolCallCompleted:
            step = self._completed(state, event)
        elif type(event) is RunEnded:
            return Step(None)
        elif type(event) is CompactionRetried:
            step = self._compaction(state, event)
        elif type(event) is AgentMessage or type(event) is ModelText:
            return Step(state)  # read by the peer profiles only (streams.engine.peers)
        else:
            raise InvalidEvent(UNKNOWN_TYPE, f"unsupported event {type(event).__name__}")
        if event.ts_ms > state.last_event_ms:
            state.last_event_ms = event.ts_ms
        return step

    # -- tool call requested: detect, veto or warn, record (spec §3 steps 1-2) -------------

    def _requested(self, state: RunState, event: ToolCallRequested) -> Step:
        settings = self._settings.get(event.agent_id) or self.config.settings_for(event.agent_id)
        if state.aborted is not None:
            return self._after_abort(state, event)
        # Upstream detects and records only with a session key (HOOK-D03).
        if not event.session_key:
            return Step(state, event)
        cfg = settings.detection
        # Interned: a loop's history holds one string object, and list scans compare by
        # identity first.
        sig = intern(event.args_hash)
        detection = detect(state, event.tool_name, sig, event.known_poll, cfg) if cfg.enabled else None
        if detection is not None and detection.level == CRITICAL:
            return self.block(state, event, settings, detection)
        if cfg.records_calls:
            # history.record_call, inlined: it runs for nearly every requested call.
            sigs = state.sigs
            state.tools.append(event.tool_name)
            sigs.append(sig)
            state.call_ids.append(event.tool_call_id)
            state.results.append(None)
            state.unknowns.append(None)
            state.stamps.append(event.ts_ms)
            size = cfg.history_size
            if len(sigs) > size:
                if len(sigs) == size + 1:  # a full history: drop the oldest
                    del state.tools[0], sigs[0], state.call_ids[0], state.results[0], state.unknowns[0], state.stamps[0]
                else:
                    history.trim(state, size)
        if detection is None:
            # (a detection-off agent's decisions say so: the runner can tell its guard is off)
            return Step(state, event) if cfg.enabled else Step(state, event, unchecked=True)
        return self._warning(state, event, settings, detection)

    final_requested = _requested
    """configurable-final's request path whatever the class, for ``LatestEngine``'s agents of
    that profile (called as ``LoopEngine.final_requested(self, ...)``: ``super()`` costs 0.14 µs
    more a call on CPython 3.11, and this is most events' path)."""

    def _warning(self, state: RunState, event: ToolCallRequested, settings: Settings, detection: Finding) -> Step:
        """A warning for a call that runs: emitted or hidden by the bucket rule."""
        emitted = self.warning_bucket(state, detection)
        return Step(
            state=state,
            request=event,
            detection=detection,
            built_logs=None,
            action="warn" if emitted else "allow",
            emitted=emitted,
            notify=emitted and settings.surface_warnings,
        )

    def block(self, state: RunState, event: ToolCallRequested, settings: Settings, detection: Finding) -> Step:
        """A critical detection vetoes the call (also for loopwatch's own detectors,
        ``streams.engine.extensions``)."""
        # The vetoed call is not recorded: the next identical call sees the same history.
        state.critical_blocks += 1
        abort = None
        limit = settings.abort_after_critical_blocks
        if limit is not None and state.critical_blocks >= limit:
            blocks = state.critical_blocks
            end_run(state, CRITICAL_BLOCK_LIMIT)
            abort = build_run_aborted(
                event,
                CRITICAL_BLOCK_LIMIT,
                blocks,
                event.tool_name,
                f"CRITICAL: loopwatch ended this run after {blocks} critical tool-loop blocks "
                f"(last: {detection.detector} on {event.tool_name}). Blocking single calls did not stop the loop.",
            )
        return Step(
            state=state,
            request=event,
            detection=detection,
            built_logs=None,
            action="block",
            notify=True,
            abort=abort,
            vetoed=True,
        )

    def _after_abort(self, state: RunState, event: ToolCallRequested) -> Step:
        # Upstream's run is over after an abort; a late call of the same run is refused.
        # (Called only for an aborted run: ``aborted`` names its detector.)
        return refused_after_abort(state, event, cast(str, state.aborted))

    def warning_bucket(self, state: RunState, detection: Warned) -> bool:
        """Upstream's bucket rule: a warning is emitted when count // 10 reaches a new high
        for its key.  (Upstream prefixes keys with the run id; every key of a run's state
        shares that prefix, so it is left out.)"""
        buckets = state.warning_buckets
        bucket = detection.count // 10
        key = detection.warning_key
        if bucket <= buckets.get(key, 0):
            return False
        if key not in buckets and len(buckets) >= MAX_WARNING_BUCKETS:
            del buckets[next(iter(buckets))]  # oldest inserted key goes first
        buckets[key] = bucket
        return True

    # -- tool call completed: record the outcome, feed the guard (spec §2.4, §3 step 4) ----

    def _completed(self, state: RunState, event: ToolCallCompleted) -> Step:
        result_hash = event.result_hash
        if event.loop_veto or not result_hash or not (event.session_key or event.session_id):
            return Step(state)  # no hash (or no session to record in): nothing changes
        settings = self._settings.get(event.agent_id) or self.config.settings_for(event.agent_id)
        result_hash = intern(result_hash)
        sigs, results, call_ids = state.sigs, state.results, state.call_ids
        call_id = event.tool_call_id
        if sigs and results[-1] is None and sigs[-1] == event.args_hash and (not call_id or call_ids[-1] == call_id):
            # The usual case: the outcome of the call just recorded.  record_outcome's first
            # branch, inlined, and the record built only if read: the call and the
            # state.record() cost 1.8 % of the engine's instructions per event (cachegrind).
            results[-1] = result_hash
            state.unknowns[-1] = event.unknown_tool_name
            record, record_at = None, len(sigs) - 1
            if record_at >= settings.detection.history_size:  # historySize shrank on a reload
                record, record_at = state.record(record_at), -1
                history.trim(state, settings.detection.history_size)
        else:
            record, record_at = (
                history.record_outcome(
                    state,
                    event.tool_name,
                    event.args_hash,
                    call_id,
                    result_hash,
                    event.unknown_tool_name,
                    event.ts_ms,
                    settings.detection.history_size,
                ),
                -1,
            )

        guard = state.guard
        if guard.remaining <= 0 or not settings.guard.enabled:
            return Step(state, None, record_at, _DORMANT, record)  # the guard is not armed
        verdict, error_line = guard_mod.observe(guard, True, event.tool_name, event.args_hash, result_hash)
        if not verdict.should_abort:
            return Step(state, None, record_at, verdict, record)
        abort, log = _guard_abort(state, event, verdict, error_line)
        return Step(state, None, record_at, verdict, record, abort=abort, built_logs=(log,))

    final_completed = _completed
    """configurable-final's outcome path whatever the class (as ``final_requested``)."""

    # -- compaction retried: arm the guard (spec §4) ----------------------------------------

    def _compaction(self, state: RunState, event: CompactionRetried) -> Step:
        settings = self.settings_for(event.agent_id)
        line = guard_mod.arm(state.guard, settings.guard)
        logs = (LogLine("info", guard_mod.SUBSYSTEM, line),) if line else ()
        return Step(state=state, built_logs=logs)


class LatestEngine(LoopEngine):
    """The engine for a config in which some agent uses profile latest: each event first
    looks up its agent's profile.  (A config without latest gets ``LoopEngine`` itself,
    whose configurable-final paths carry no such check: see ``streams.engine.choose``.)"""

    # -- profile latest (openclaw-latest.md §6) ---------------------------------------------

    def _requested(self, state: RunState, event: ToolCallRequested) -> Step:
        settings = self._settings.get(event.agent_id) or self.config.settings_for(event.agent_id)
        if not settings.latest:
            if state.latest is not None:
                state.latest.checked_by = None  # configurable-final records leave no latest fields
            return LoopEngine.final_requested(self, state, event)
        if state.aborted is not None:
            return self._after_abort(state, event)
        if not event.session_key:
            return Step(state, event)
        cfg = settings.detection
        latest = state.latest
        if latest is None or latest.checked_by is not self:
            latest = history.latest_columns(state, self)
        sig = intern(event.args_hash)
        tool = event.tool_name
        detection = detect_latest(state, tool, sig, event.known_poll, event.target_hash) if cfg.enabled else None
        if detection is not None and detection.level == CRITICAL:
            # The runner completes the vetoed call with the blocked result (loop_veto), which
            # records the veto (_completed), as upstream's wrapper records its blocked result.
            return self.block(state, event, settings, detection)
        if cfg.records_calls:
            # history.append_latest of a pending record, inlined but for the trimming: it runs
            # for nearly every requested call.
            sigs = state.sigs
            state.tools.append(tool)
            sigs.append(sig)
            state.call_ids.append(event.tool_call_id)
            state.results.append(None)
            state.unknowns.append(None)
            state.stamps.append(event.ts_ms)
            latest.flags.append(AWAITING)
            target = event.target_hash
            if target is not None:
                latest.digests[latest.first + len(sigs) - 1] = target
            if len(sigs) > LATEST_HISTORY_SIZE:
                history.trim_latest(state, latest)
        if detection is None:
            # (a detection-off agent's decisions say so: the runner can tell its guard is off)
            return Step(state, event) if cfg.enabled else Step(state, event, unchecked=True)
        return self._warning(state, event, settings, detection)

    def _completed(self, state: RunState, event: ToolCallCompleted) -> Step:
        """Outcome kinds, no-progress flags and write targets on the record, loop vetoes as
        records, the outcome-time write-churn warning (§6.3), the guard's re-read
        instrumentation.  (The uncommon cases are methods of their own, so that the common
        path's bytecode stays short and contiguous: the interpreter reads it as data.)"""
        settings = self._settings.get(event.agent_id) or self.config.settings_for(event.agent_id)
        if not settings.latest:
            if state.latest is not None:
                state.latest.checked_by = None
            return LoopEngine.final_completed(self, state, event)
        if not (event.session_key or event.session_id):
            return Step(state)  # no session to record in
        if event.loop_veto:
            return self._veto(state, event)
        result_hash = event.normalized_result_hash or event.result_hash
        if not result_hash:
            return Step(state)  # the tool returned nothing (an outcome kind comes with a hash)
        latest = state.latest
        if latest is None or latest.checked_by is not self:
            latest = history.latest_columns(state, self)
        result_hash = intern(result_hash)
        flags = PLAIN if event.outcome_kind is None else _OUTCOME_KINDS[event.outcome_kind]
        if event.no_progress or event.is_error:
            flags |= NO_PROGRESS
        sig = event.args_hash
        call_id = event.tool_call_id
        sigs = state.sigs
        observing = settings.guard.enabled  # the guard keeps every hashed outcome (history.observe)
        if sigs and latest.flags[-1] == AWAITING and sigs[-1] == sig and (not call_id or state.call_ids[-1] == call_id):
            # The usual case: the outcome of the call just recorded (record_outcome_latest's
            # first branch, inlined as LoopEngine._completed inlines configurable-final's),
            # observed in the same store (history.observe's common case, inlined too).
            at = len(sigs) - 1
            state.results[at] = result_hash
            state.unknowns[at] = event.unknown_tool_name
            if observing and latest.ring is None:
                latest.flags[at] = flags | OBSERVED
                latest.observed += 1
                observing = False
            else:
                latest.flags[at] = flags
            if event.failure_identity_hash is not None:  # (exec; a pending record has none to clear)
                latest.digests[latest.first + at] = event.failure_identity_hash
        else:
            at = history.record_outcome_latest(
                state,
                latest,
                event.tool_name,
                sig,
                call_id,
                result_hash,
                event.unknown_tool_name,
                flags,
                event.failure_identity_hash,
                event.target_hash,
                event.ts_ms,
            )
        if state.guard.remaining > 0 or (flags == MUTATION and settings.detection.outcome_warnings):
            return self._outcome_observed(state, event, settings, latest, at, result_hash, observing)
        if observing:
            history.observe(state, latest, at)
        return Step(state, None, at, _DORMANT)

    def _veto(self, state: RunState, event: ToolCallCompleted) -> Step:
        """A loop veto (the blocked result of a vetoed call) records a tool-loop-veto (§4.5):
        no hash, so the guard never sees it."""
        latest = state.latest
        if latest is None or latest.checked_by is not self:
            latest = history.latest_columns(state, self)
        if AWAITING in latest.flags:
            at = history.record_outcome_latest(
                state,
                latest,
                event.tool_name,
                event.args_hash,
                event.tool_call_id,
                None,
                None,
                VETO,
                None,
                event.target_hash,
                event.ts_ms,
            )
        else:  # the vetoed call itself was never recorded: with nothing pending, it is appended
            sigs, sig = state.sigs, event.args_hash
            # A loop's signature is usually the newest one already (and interned).
            sig = sigs[-1] if sigs and sigs[-1] == sig else intern(sig)
            # history.append_latest of a veto record, inlined but for the trimming: every block
            # of a loop comes back as one.
            state.tools.append(event.tool_name)
            sigs.append(sig)
            state.call_ids.append(event.tool_call_id)
            state.results.append(None)
            state.unknowns.append(None)
            state.stamps.append(event.ts_ms)
            latest.flags.append(VETO)
            target = event.target_hash
            if target is not None:
                latest.digests[latest.first + len(sigs) - 1] = target
            if len(sigs) > LATEST_HISTORY_SIZE:
                history.trim_latest(state, latest)
            at = len(sigs) - 1
        return Step(state, None, at)

    def _outcome_observed(
        self,
        state: RunState,
        event: ToolCallCompleted,
        settings: Settings,
        latest: LatestState,
        at: int,
        result_hash: str,
        observing: bool,
    ) -> Step:
        """An outcome while the guard is armed, or a write mutation that may raise the
        outcome-time churn warning (``observing``: the guard still has to keep it)."""
        tool, sig = event.tool_name, event.args_hash
        warning = decision = None
        logs: list[LogLine] = []
        if latest.flags[at] & 7 == MUTATION and settings.detection.outcome_warnings:
            warning = self._outcome_churn_warning(state, latest, at)
        if warning is not None:
            decision = build_decision(event, "warn", warning, True, True)
            message = cast(str, decision.message)  # (a decision with a detection carries its message)
            logs.append(LogLine("warn", WRAPPER_SUBSYSTEM, f"Loop warning for {tool}: {message}"))
            logs.append(LogLine("warn", DIAGNOSTIC_SUBSYSTEM, _tool_loop_line(event, warning, "warn", message)))
        verdict, error_line, info_line = guard_mod.observe_latest(
            state.guard, latest.rereads, settings.guard.enabled, tool, sig, result_hash
        )
        if observing:
            history.observe(state, latest, at)
        abort = None
        if info_line is not None:
            logs.append(LogLine("info", guard_mod.SUBSYSTEM, info_line))
        if verdict.should_abort:
            abort, log = _guard_abort(state, event, verdict, error_line)
            logs.append(log)
        return Step(
            state, None, at, verdict, abort=abort, detection=warning, built_logs=tuple(logs), built_decision=decision
        )

    def _compaction(self, state: RunState, event: CompactionRetried) -> Step:
        settings = self.settings_for(event.agent_id)
        if not settings.latest:
            return super()._compaction(state, event)  # (LoopEngine's: mixins come before this class)
        latest = history.latest_columns(state, self)
        line = guard_mod.arm_latest(state.guard, latest.rereads, settings.guard, latest.recent_observations(state.sigs))
        logs = (LogLine("info", guard_mod.SUBSYSTEM, line),) if line else ()
        return Step(state=state, built_logs=logs)

    def _outcome_churn_warning(self, state: RunState, latest: LatestState, at: int) -> Detection | None:
        """§6.3: a write-mutation record judged against the rest of the run's history;
        the warning if the bucket rule emits it."""
        target = latest.digest(at)  # (a write-mutation record: its target)
        if target is None:
            return None
        sig = state.sigs[at]
        count = write_churn(state, sig, target, skip=at)
        if count < 10:
            return None
        found = LatestDetection(
            WARNING,
            ARGUMENT_CHURN,
            count,
            "write",
            sig,
            variant_count=count,
            liveness_signal=ARGUMENT_CHURN,
            write_target=target,
            write_mutation=True,
        )
        return found if self.warning_bucket(state, found) else None


def _guard_abort(
    state: RunState, event: ToolCallCompleted, verdict: guard_mod.GuardVerdict, error_line: str | None
) -> tuple[RunAborted, LogLine]:
    """The post-compaction guard ended the run: its abort and error log line."""
    # An aborting verdict names its detector, count, tool and message, and comes with its
    # error line (``compaction_guard.observe`` and ``observe_latest`` build them together).
    detector = cast(str, verdict.detector)
    end_run(state, detector)
    abort = build_run_aborted(
        event, detector, cast(int, verdict.count), cast(str, verdict.tool_name), cast(str, verdict.message)
    )
    return abort, LogLine("error", guard_mod.SUBSYSTEM, cast(str, error_line))


def end_run(state: RunState, detector: str) -> None:
    """An abort ends the run.  A run-id scope stays closed (late calls are refused); the
    session's "no run" scope goes on with the next run, which gets a fresh guard and block
    count while sharing the history, as upstream's per-session buffer does."""
    if state.run_id is not None:
        state.aborted = detector
    state.guard = GuardWindow()
    state.critical_blocks = 0
    if state.latest is not None:
        state.latest.rereads = CompactionRereads()
        state.latest.forget_observations()


_OUTCOME_KINDS = {TERMINAL_EXEC_FAILURE: TERMINAL_FAILURE, WRITE_MUTATION: MUTATION}
"""Wire outcome kinds to the codes histories hold."""
