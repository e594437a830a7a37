"""Runtime config resolution (spec §2.5, §4): defaults, ``posInt`` fallback, clamping and the
per-agent merge.  Like upstream's runtime it accepts unvalidated input: a wrong-typed value
falls back to its default instead of failing (``schemas.config.validate`` is the strict gate).

Two profiles (``loopwatch.profile``, globally or per agent): ``configurable-final`` (the
default) resolves the numeric tuning above; ``latest`` (openclaw-latest.md §2) reads only
``enabled`` and uses upstream's fixed values.  Two more reproduce other agent families
(``streams.engine.peers``): ``openhands`` and ``gemini-cli``, which read no loopDetection block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from schemas.config import (
    AGENT_RING_DEFAULTS,
    CONFIGURABLE_FINAL,
    EARLY_WARNING_DEFAULTS,
    FLEET_INCIDENT_DEFAULTS,
    GEMINI_CLI,
    LATEST,
    MAX_EARLY_WARNING_WINDOW,
    OPENHANDS,
    PEER_PROFILES,
    PROFILES,
    RUN_SCOPE,
    SESSION_SCOPE,
)
from schemas.names import ENFORCE, SHADOW

__all__ = [
    "CONFIGURABLE_FINAL",
    "AgentRingSettings",
    "ConfigSet",
    "FleetIncidentSettings",
    "GEMINI_CLI",
    "LATEST",
    "OPENHANDS",
    "PEER_PROFILES",
    "PROFILES",
    "DETECTION_OFF_HINT",
    "DetectorSettings",
    "GuardSettings",
    "Settings",
    "detection_line",
    "merge_loop_detection",
    "pos_int",
    "resolve_detector",
    "resolve_guard",
    "with_profile",
    "with_scope",
]

_MAX_SAFE = 2**53


def pos_int(value: Any, default: int) -> int | float:
    """Upstream's ``asPositiveInt``: a positive integral number, else the default.

    The result behaves as a JavaScript double: integers beyond 2**53 become floats, so
    ``1e21 - 1 == 1e21`` exactly as upstream's guard counter never counts down.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer() or value <= 0:
            return default
        return int(value) if value <= _MAX_SAFE else value
    if value <= 0:
        return default
    return value if value <= _MAX_SAFE else float(value)


def _js_truthy(value: Any) -> bool:
    if isinstance(value, float) and value != value:
        return False
    return bool(value) or isinstance(value, (dict, list))


@dataclass(frozen=True, slots=True)
class DetectorSettings:
    """The resolved ``tools.loopDetection`` for one agent (``resolveLoopDetectionConfig``)."""

    enabled: bool = False
    """Detection runs (upstream tests the config value for truthiness)."""
    records_calls: bool = True
    """Pre-call recording runs unless ``enabled`` is exactly false."""
    history_size: int | float = 30
    warning_threshold: int | float = 10
    critical_threshold: int | float = 20
    global_circuit_breaker_threshold: int | float = 30
    unknown_tool_threshold: int | float = 10
    generic_repeat: bool = True
    known_poll_no_progress: bool = True
    ping_pong: bool = True
    outcome_warnings: bool = False
    """Profile latest: the outcome-time churn warning runs (``enabled`` is exactly true)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "historySize": self.history_size,
            "warningThreshold": self.warning_threshold,
            "criticalThreshold": self.critical_threshold,
            "globalCircuitBreakerThreshold": self.global_circuit_breaker_threshold,
            "unknownToolThreshold": self.unknown_tool_threshold,
            "detectors": {
                "genericRepeat": self.generic_repeat,
                "knownPollNoProgress": self.known_poll_no_progress,
                "pingPong": self.ping_pong,
            },
        }


@dataclass(frozen=True, slots=True)
class GuardSettings:
    """The post-compaction guard's gate: on unless ``enabled`` is exactly false."""

    enabled: bool = True
    window_size: int | float = 3


@dataclass(frozen=True, slots=True)
class EarlyWarningSettings:
    """``loopwatch.detectors.earlyWarning``, resolved (``streams.engine.early_warning``)."""

    window: int = int(EARLY_WARNING_DEFAULTS["window"])
    ratio: float = float(EARLY_WARNING_DEFAULTS["ratio"])
    min_calls: int = int(EARLY_WARNING_DEFAULTS["minCalls"])

    def as_dict(self) -> dict[str, Any]:
        return {"window": self.window, "ratio": self.ratio, "minCalls": self.min_calls}


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the engine needs for one agent's runs."""

    detection: DetectorSettings = DetectorSettings()
    guard: GuardSettings = GuardSettings()
    latest: bool = False
    """Profile ``latest`` (else ``configurable-final``): the engine's own code paths."""
    abort_after_critical_blocks: int | None = None
    """loopwatch option: end the run after this many critical blocks (upstream: never)."""
    surface_warnings: bool = False
    """loopwatch option: ask runners to show emitted warnings to the model (upstream: no)."""
    cycle: bool = False
    """loopwatch option: the ``cycle`` detector (``loopwatch.detectors.cycle``; upstream: none)."""
    near_identical: bool = False
    """loopwatch option: count calls by ``near_args_hash`` where an event carries it
    (``loopwatch.detectors.nearIdentical``; upstream: ``args_hash`` always)."""
    early_warning: EarlyWarningSettings | None = None
    """loopwatch option: the warn-only entropy-collapse detector
    (``loopwatch.detectors.earlyWarning``; upstream: none), None when off."""
    peer: str | None = None
    """Profile ``openhands`` or ``gemini-cli`` (``streams.engine.peers``): another agent
    family's rules instead of OpenClaw's; None for the two OpenClaw profiles."""


@dataclass(frozen=True, slots=True)
class FleetIncidentSettings:
    """``loopwatch.fleetIncidents``, resolved (root only)."""

    # Numbers as ``pos_int`` resolves them (an unvalidated root may hold floats beyond 2**53).
    min_runs: int | float = FLEET_INCIDENT_DEFAULTS["minRuns"]
    min_agents: int | float = FLEET_INCIDENT_DEFAULTS["minAgents"]
    window_s: int | float = FLEET_INCIDENT_DEFAULTS["windowSeconds"]
    hop_s: int | float = FLEET_INCIDENT_DEFAULTS["hopSeconds"]
    quiet_s: int | float = FLEET_INCIDENT_DEFAULTS["quietSeconds"]
    max_open: int | float = FLEET_INCIDENT_DEFAULTS["maxOpenIncidents"]
    max_tools_per_agent: int | float = FLEET_INCIDENT_DEFAULTS["maxToolsPerAgentPerMinute"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "enabled": True,
            "minRuns": self.min_runs,
            "minAgents": self.min_agents,
            "windowSeconds": self.window_s,
            "hopSeconds": self.hop_s,
            "quietSeconds": self.quiet_s,
            "maxOpenIncidents": self.max_open,
            "maxToolsPerAgentPerMinute": self.max_tools_per_agent,
        }


@dataclass(frozen=True, slots=True)
class AgentRingSettings:
    """``loopwatch.agentRings``, resolved (root only): thresholds in rounds."""

    # Numbers as ``pos_int`` resolves them (an unvalidated root may hold floats beyond 2**53).
    warning_rounds: int | float = AGENT_RING_DEFAULTS["warningThreshold"]
    critical_rounds: int | float = AGENT_RING_DEFAULTS["criticalThreshold"]
    window_s: int | float = AGENT_RING_DEFAULTS["windowSeconds"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "enabled": True,
            "warningThreshold": self.warning_rounds,
            "criticalThreshold": self.critical_rounds,
            "windowSeconds": self.window_s,
        }


DETECTION_OFF_HINT = (
    "tools.loopDetection.enabled is not true; every call is allowed unchecked "
    "(turn it on: start the worker with --config examples/getting-started.yaml, docs/configuration.md)"
)


def detection_line(agent: str, profile: str, on: bool) -> str:
    """One line saying whether an agent's calls are checked (worker logs, ``config check``)."""
    if on:
        return f"detection on for agent {agent} (profile {profile})"
    return f"detection OFF for agent {agent} (profile {profile}): {DETECTION_OFF_HINT}"


def _get(block: Any, key: str) -> Any:
    return block.get(key) if isinstance(block, dict) else None


def _toggle(value: Any) -> bool:
    # `detectors.x ?? true`, then tested for truthiness: null keeps a detector on, 0 turns it off.
    return True if value is None else _js_truthy(value)


def resolve_detector(block: Any) -> DetectorSettings:
    """Effective detector settings of a (merged) ``tools.loopDetection`` block."""
    warning = pos_int(_get(block, "warningThreshold"), 10)
    critical = pos_int(_get(block, "criticalThreshold"), 20)
    breaker = pos_int(_get(block, "globalCircuitBreakerThreshold"), 30)
    if critical <= warning:
        critical = warning + 1
    if breaker <= critical:
        breaker = critical + 1
    detectors = _get(block, "detectors")
    enabled = _get(block, "enabled")
    return DetectorSettings(
        enabled=_js_truthy(enabled),
        records_calls=enabled is not False,
        history_size=pos_int(_get(block, "historySize"), 30),
        warning_threshold=warning,
        critical_threshold=critical,
        global_circuit_breaker_threshold=breaker,
        unknown_tool_threshold=pos_int(_get(block, "unknownToolThreshold"), 10),
        generic_repeat=_toggle(_get(detectors, "genericRepeat")),
        known_poll_no_progress=_toggle(_get(detectors, "knownPollNoProgress")),
        ping_pong=_toggle(_get(detectors, "pingPong")),
    )


def resolve_latest(block: Any) -> tuple[DetectorSettings, GuardSettings]:
    """Profile latest (openclaw-latest.md §2): only ``enabled`` is read, through four
    different JS tests; everything else is fixed (history 30, warning 10, critical 20,
    global breaker 30, unknown tool 10, guard window 3, every detector on)."""
    enabled = _get(block, "enabled")
    detection = DetectorSettings(
        enabled=_js_truthy(enabled), records_calls=enabled is not False, outcome_warnings=enabled is True
    )
    return detection, GuardSettings(enabled=enabled is not False, window_size=3)


def resolve_guard(block: Any) -> GuardSettings:
    return GuardSettings(
        enabled=_get(block, "enabled") is not False,
        window_size=pos_int(_get(_get(block, "postCompactionGuard"), "windowSize"), 3),
    )


def _spread(value: Any) -> dict:
    # `{...value}` in JavaScript: objects copy their keys; strings and arrays their indices.
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, (str, list)):
        return {str(i): item for i, item in enumerate(value)}
    return {}


def merge_loop_detection(global_block: Any, agent_block: Any) -> Any:
    """Per-agent overlay (``resolveToolLoopDetectionConfig``): one level deep for the
    ``detectors`` and ``postCompactionGuard`` objects; not re-validated."""
    if not _js_truthy(agent_block):
        return global_block
    if not _js_truthy(global_block):
        return agent_block
    merged = {**_spread(global_block), **_spread(agent_block)}
    merged["detectors"] = {**_spread(_get(global_block, "detectors")), **_spread(_get(agent_block, "detectors"))}
    merged["postCompactionGuard"] = {
        **_spread(_get(global_block, "postCompactionGuard")),
        **_spread(_get(agent_block, "postCompactionGuard")),
    }
    return merged


def merge_loop_detection_latest(global_block: Any, agent_block: Any) -> Any:
    """Profile latest's per-agent merge: only ``enabled`` survives, the agent's unless it
    is null or missing (``agent.enabled ?? global.enabled``)."""
    if not _js_truthy(agent_block):
        return global_block
    if not _js_truthy(global_block):
        return agent_block
    enabled = _get(agent_block, "enabled")
    return {"enabled": _get(global_block, "enabled") if enabled is None else enabled}


def _with_option(root: Any, key: str, value: Any) -> Any:
    root = dict(root) if isinstance(root, dict) else {}
    options = root.get("loopwatch")
    root["loopwatch"] = {**(options if isinstance(options, dict) else {}), key: value}
    return root


def with_profile(root: Any, profile: str) -> Any:
    """A config root with ``loopwatch.profile`` (the default profile) set; agents that name
    their own profile keep it."""
    return _with_option(root, "profile", profile)


def with_scope(root: Any, scope: str) -> Any:
    """A config root with ``loopwatch.scope`` set."""
    return _with_option(root, "scope", scope)


def _fleet_incidents(block: Any) -> FleetIncidentSettings | None:
    if not isinstance(block, dict) or block.get("enabled") is not True:
        return None
    d = FLEET_INCIDENT_DEFAULTS
    min_runs = pos_int(block.get("minRuns"), d["minRuns"])
    window = pos_int(block.get("windowSeconds"), d["windowSeconds"])
    return FleetIncidentSettings(
        min_runs=min_runs,
        min_agents=min(pos_int(block.get("minAgents"), d["minAgents"]), min_runs),
        window_s=window,
        hop_s=min(pos_int(block.get("hopSeconds"), d["hopSeconds"]), window),
        quiet_s=pos_int(block.get("quietSeconds"), d["quietSeconds"]),
        max_open=pos_int(block.get("maxOpenIncidents"), d["maxOpenIncidents"]),
        max_tools_per_agent=pos_int(block.get("maxToolsPerAgentPerMinute"), d["maxToolsPerAgentPerMinute"]),
    )


def _agent_rings(block: Any) -> AgentRingSettings | None:
    if not isinstance(block, dict) or block.get("enabled") is not True:
        return None
    d = AGENT_RING_DEFAULTS
    warning = pos_int(block.get("warningThreshold"), d["warningThreshold"])
    critical = pos_int(block.get("criticalThreshold"), d["criticalThreshold"])
    return AgentRingSettings(
        warning, max(critical, warning + 1), pos_int(block.get("windowSeconds"), d["windowSeconds"])
    )


def _early_warning(block: Any) -> EarlyWarningSettings | None:
    """``true`` or an object: on (a key left out, or out of bounds, takes its default)."""
    if block is True:
        return EarlyWarningSettings()
    if not isinstance(block, dict):
        return None
    d = EarlyWarningSettings()
    window = int(pos_int(block.get("window"), d.window))
    window = window if 2 <= window <= MAX_EARLY_WARNING_WINDOW else d.window
    ratio = block.get("ratio")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio < 1:
        ratio = d.ratio
    return EarlyWarningSettings(window, float(ratio), max(int(pos_int(block.get("minCalls"), d.min_calls)), window + 1))


class ConfigSet:
    """A config root resolved per agent id, memoised (resolution runs once per agent)."""

    def __init__(self, root: Any = None) -> None:
        self.root = root if isinstance(root, dict) else {}
        self.resolved: dict[str | None, Settings] = {}
        """Settings already resolved, by agent id (read directly on the hot path)."""
        self.modes: dict[str | None, str] = {}
        """``loopwatch.mode`` already resolved, by agent id."""
        options = _get(self.root, "loopwatch")
        self.scope: str = SESSION_SCOPE if _get(options, "scope") == SESSION_SCOPE else RUN_SCOPE
        """``loopwatch.scope`` (root only): ``run`` (the default) or ``session``."""
        self.fleet_incidents = _fleet_incidents(_get(options, "fleetIncidents"))
        """``loopwatch.fleetIncidents`` when enabled, else None."""
        self.agent_rings = _agent_rings(_get(options, "agentRings"))
        """``loopwatch.agentRings`` when enabled, else None."""

    def topology(self) -> tuple[str, FleetIncidentSettings | None, AgentRingSettings | None]:
        """The options that decide how a worker keys and repartitions the fleet's events: it
        builds its topics and tables from them at start (a reload cannot change them)."""
        return self.scope, self.fleet_incidents, self.agent_rings

    def uses_extensions(self) -> bool:
        """Whether any of loopwatch's fleet options or own detectors is on: the engine then
        takes their paths (``streams.engine.extensions``); without them, none of their checks
        runs."""
        if self.scope != RUN_SCOPE or self.fleet_incidents is not None or self.agent_rings is not None:
            return True
        return any(
            settings.cycle or settings.near_identical or settings.early_warning is not None
            for settings in map(self.settings_for, (None, *self.agent_ids()))
        )

    def loop_detection_block(self, agent_id: str | None, profile: str = CONFIGURABLE_FINAL) -> Any:
        global_block = _get(_get(self.root, "tools"), "loopDetection")
        entry = self._agent_entry(agent_id)
        agent_block = _get(_get(entry, "tools"), "loopDetection")
        merge = merge_loop_detection_latest if profile == LATEST else merge_loop_detection
        return merge(global_block, agent_block)

    def options_for(self, agent_id: str | None) -> dict:
        """The ``loopwatch`` options: the agent's entry over the root's, key by key."""
        return {**_spread(_get(self.root, "loopwatch")), **_spread(_get(self._agent_entry(agent_id), "loopwatch"))}

    def uses_peers(self) -> bool:
        """Whether any agent (or the default) resolves to profile openhands or gemini-cli."""
        return any(self.profile_for(agent) in PEER_PROFILES for agent in (None, *self.agent_ids()))

    def uses_latest(self) -> bool:
        """Whether any agent (or the default) resolves to profile latest."""
        return any(self.profile_for(agent) == LATEST for agent in (None, *self.agent_ids()))

    def mode_for(self, agent_id: str | None) -> str:
        """``loopwatch.mode`` (the agent's over the root's): ``shadow``, else ``enforce``.

        Not an engine setting: detection is the same in both modes; the worker decides where
        the verdicts go (``streams.app.processor``)."""
        mode = self.modes.get(agent_id)
        if mode is None:
            mode = self.modes[agent_id] = SHADOW if self.options_for(agent_id).get("mode") == SHADOW else ENFORCE
        return mode

    def uses_shadow(self) -> bool:
        """Whether any agent (or the default) runs in shadow mode."""
        return any(self.mode_for(agent) == SHADOW for agent in (None, *self.agent_ids()))

    def profile_for(self, agent_id: str | None) -> str:
        """``loopwatch.profile`` (the agent's over the root's); anything else is the default."""
        profile = self.options_for(agent_id).get("profile")
        return profile if profile in PROFILES else CONFIGURABLE_FINAL

    def _agent_entry(self, agent_id: str | None) -> Any:
        if agent_id is None:
            return None
        entries = _get(_get(self.root, "agents"), "list")
        if not isinstance(entries, list):
            return None
        for entry in entries:
            if isinstance(entry, dict) and entry.get("id") == agent_id:
                return entry
        return None

    def settings_for(self, agent_id: str | None) -> Settings:
        cached = self.resolved.get(agent_id)
        if cached is not None:
            return cached
        options = self.options_for(agent_id)
        profile = self.profile_for(agent_id)
        latest = profile == LATEST
        block = self.loop_detection_block(agent_id, LATEST if latest else CONFIGURABLE_FINAL)
        detection, guard = resolve_latest(block) if latest else (resolve_detector(block), resolve_guard(block))
        limit = options.get("abortAfterCriticalBlocks")
        settings = Settings(
            detection=detection,
            guard=guard,
            latest=latest,
            abort_after_critical_blocks=limit
            if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0
            else None,
            surface_warnings=options.get("surfaceWarnings") is True,
            cycle=_get(options.get("detectors"), "cycle") is True,
            near_identical=_get(options.get("detectors"), "nearIdentical") is True,
            early_warning=_early_warning(_get(options.get("detectors"), "earlyWarning")),
            peer=profile if profile in PEER_PROFILES else None,
        )
        self.resolved[agent_id] = settings
        return settings

    def detection_status(self) -> list[tuple[str, str, bool]]:
        """Whether detection runs, per agent: ``(agent, profile, on)`` for the default (``*``)
        and each listed agent.  The peer profiles read no loopDetection block: always on."""
        status = []
        for agent in (None, *self.agent_ids()):
            profile = self.profile_for(agent)
            on = profile in PEER_PROFILES or self.settings_for(agent).detection.enabled
            status.append(("*" if agent is None else agent, profile, on))
        return status

    def agent_ids(self) -> list[str]:
        entries = _get(_get(self.root, "agents"), "list")
        if not isinstance(entries, list):
            return []
        return [e["id"] for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str)]
