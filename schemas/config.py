"""The loop-detection configuration: OpenClaw's ``tools.loopDetection``, globally and per
agent (``agents.list[].tools.loopDetection``), plus loopwatch's own ``loopwatch`` options.

The Structs describe the accepted shape (and are exported as JSON Schema).  ``validate``
applies upstream's strict schema rules with its exact ordering messages (spec §2.5).
Runtime resolution (defaults, ``posInt`` fallback, clamping, per-agent merge) lives in
``streams.engine.config`` and deliberately tolerates values this validator rejects, as
upstream's runtime does.

Under ``loopwatch.profile: latest`` upstream reads only ``enabled``: a block that only
latest agents use may still carry the retired numeric keys, which are ignored; ``warnings``
names them (``loopwatch config check`` prints it).
"""

from __future__ import annotations

import difflib
import json
import math
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from .errors import LoopwatchError
from .names import MODES

MAX_HISTORY_SIZE = 1000
"""loopwatch's upper bound on ``historySize`` (upstream has none).  A run's stored state must
fit one changelog record (``streams.app.processor.MAX_STATE_BYTES``, 1 MB); 1000 records
of ordinary ids take ~90 KB.  Upstream keeps one history in memory; here every run's history
is written to Kafka, and a larger one was lost at the next restore."""
MAX_COUNT_SETTING = 1_000_000
"""Every other count (thresholds, ``windowSize``, ``abortAfterCriticalBlocks``) above this is
refused.  Upstream accepts any positive integer; counts are bounded by the history, so a
larger threshold means the same as this one (never reached), and values stay far inside the
integers every runtime and the state codec represent exactly."""
MAX_AGENT_ID_LENGTH = 512
"""As an event's ``agent_id``."""
MAX_AGENTS = 1_000
"""Entries in ``agents.list``: each is resolved at load and kept for the config's life."""
MAX_CONFIG_BYTES = 1024 * 1024
"""A config file larger than this is refused before it is parsed."""

PositiveInt = Annotated[int, msgspec.Meta(gt=0, le=MAX_COUNT_SETTING)]
HistorySize = Annotated[int, msgspec.Meta(gt=0, le=MAX_HISTORY_SIZE)]
AgentId = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_AGENT_ID_LENGTH)]
Profile = Literal["configurable-final", "latest", "openhands", "gemini-cli"]
Mode = Literal[MODES]  # type: ignore[valid-type]  # msgspec reads the tuple; mypy wants the values spelled out
CONFIGURABLE_FINAL = "configurable-final"
LATEST = "latest"
OPENHANDS = "openhands"
"""OpenHands' StuckDetector (openhands-sdk), docs/peer-profiles.md."""
GEMINI_CLI = "gemini-cli"
"""Gemini CLI's LoopDetectionService (@google/gemini-cli-core), docs/peer-profiles.md."""
PEER_PROFILES = (OPENHANDS, GEMINI_CLI)
"""The profiles that reproduce another agent family's loop rules, not OpenClaw's: they read no
``tools.loopDetection`` block (their thresholds are their system's defaults)."""
PROFILES = (CONFIGURABLE_FINAL, LATEST, *PEER_PROFILES)
"""``loopwatch.profile`` values; the first is the default."""
Scope = Literal["run", "session"]
RUN_SCOPE = "run"
SESSION_SCOPE = "session"
SCOPES = (RUN_SCOPE, SESSION_SCOPE)
"""``loopwatch.scope`` values; the first is the default."""

# loopwatch's fleet-wide options: bounds and defaults.
MAX_FLEET_COUNT = 1_000
"""``fleetIncidents.minRuns`` and ``minAgents``: an open window keeps up to this many run and
agent digests per tool and outcome, so the bound is the size of a window's value."""
MAX_WINDOW_SECONDS = 86_400
"""Every ``*Seconds`` option: at most a day."""
MAX_RING_ROUNDS = 1_000
"""``agentRings`` thresholds, in rounds."""
MAX_OPEN_INCIDENTS = 10_000
"""``fleetIncidents.maxOpenIncidents``'s bound."""
MAX_TOOLS_PER_AGENT = 10_000
"""``fleetIncidents.maxToolsPerAgentPerMinute``'s bound."""
FLEET_INCIDENT_DEFAULTS = {
    "minRuns": 20,
    "minAgents": 3,
    "windowSeconds": 300,
    "hopSeconds": 60,
    "quietSeconds": 300,
    "maxOpenIncidents": 50,
    "maxToolsPerAgentPerMinute": 30,
}
AGENT_RING_DEFAULTS = {"warningThreshold": 3, "criticalThreshold": 5, "windowSeconds": 3600}
EARLY_WARNING_DEFAULTS = {"window": 10, "ratio": 0.5, "minCalls": 20}
"""``loopwatch.detectors.earlyWarning``: the entropy of the last 10 calls, a warning when it falls
below half of the run's own mean over its earlier windows, from the 20th call on (a window of 20
needs 12 identical calls in it to halve, so it warns deep in a loop if at all; docs/evaluation.md)."""
MAX_EARLY_WARNING_WINDOW = 1_000
"""``earlyWarning.window``'s bound (the calls a run's state keeps for it)."""
MAX_EARLY_WARNING_MIN_CALLS = 1_000_000
FleetCount = Annotated[int, msgspec.Meta(gt=0, le=MAX_FLEET_COUNT)]
WindowSeconds = Annotated[int, msgspec.Meta(gt=0, le=MAX_WINDOW_SECONDS)]
RingRounds = Annotated[int, msgspec.Meta(gt=0, le=MAX_RING_ROUNDS)]


class DetectorToggles(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    genericRepeat: bool | None = None
    knownPollNoProgress: bool | None = None
    pingPong: bool | None = None


class PostCompactionGuardConfig(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    windowSize: PositiveInt | None = None


class LoopDetectionConfig(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``tools.loopDetection``.  Profile latest reads only ``enabled`` (the other keys are
    retired there, and ignored)."""

    enabled: bool | None = None
    historySize: HistorySize | None = None
    warningThreshold: PositiveInt | None = None
    unknownToolThreshold: PositiveInt | None = None
    criticalThreshold: PositiveInt | None = None
    globalCircuitBreakerThreshold: PositiveInt | None = None
    detectors: DetectorToggles | None = None
    postCompactionGuard: PostCompactionGuardConfig | None = None


class EarlyWarningConfig(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``loopwatch.detectors.earlyWarning`` as an object (on; a key left out takes its default)."""

    window: Annotated[int, msgspec.Meta(ge=2, le=MAX_EARLY_WARNING_WINDOW)] | None = None
    """The calls whose action entropy is measured: the last ``window`` (10)."""
    ratio: Annotated[float, msgspec.Meta(gt=0, lt=1)] | None = None
    """Warn when the window's entropy falls below ``ratio`` times the run's mean over its
    earlier windows (0.5)."""
    minCalls: Annotated[int, msgspec.Meta(gt=0, le=MAX_EARLY_WARNING_MIN_CALLS)] | None = None
    """No warning before the run's ``minCalls``-th call (20); above ``window``, so the run has a
    baseline of earlier windows."""


class LoopwatchDetectors(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """loopwatch's own detectors, each off unless true."""

    cycle: bool | None = None
    """Cycles of 3 to 5 calls repeated with identical outcomes (read, edit, test, ...), which
    no upstream detector catches (OpenClaw issues #64500, #117637).  Warns at ``warningThreshold`` calls,
    blocks at ``criticalThreshold``; ping-pong (a cycle of 2) stays upstream's."""
    earlyWarning: bool | EarlyWarningConfig | None = None
    nearIdentical: bool | None = None
    """Count calls by ``near_args_hash`` (their arguments read loosely: whitespace, switches and
    a trailing ``/`` of one-line commands do not count) instead of ``args_hash``, where a call
    event carries it, in every detector: one command varied in ways that do not change what it
    does repeats as one call."""
    """A warning, never a block, when the variety of the run's recent calls collapses against
    the run's own earlier calls, which tends to come before a loop: ``true`` for the defaults,
    or an object of ``window``, ``ratio`` and ``minCalls``."""


class FleetIncidentsConfig(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``loopwatch.fleetIncidents`` (root only): a tool failing the same way across the fleet."""

    enabled: bool | None = None
    minRuns: FleetCount | None = None
    """Distinct runs with the same error (or no-progress outcome) of one tool within a window (20)."""
    minAgents: FleetCount | None = None
    """... of at least this many distinct agents (3)."""
    windowSeconds: WindowSeconds | None = None
    """The hopping window's size (300)."""
    hopSeconds: WindowSeconds | None = None
    """How often a new window starts (60); at most ``windowSeconds``."""
    quietSeconds: WindowSeconds | None = None
    """An open incident is resolved once its tool has not met the thresholds for this long (300)."""
    maxOpenIncidents: Annotated[int, msgspec.Meta(gt=0, le=MAX_OPEN_INCIDENTS)] | None = None
    """At most this many incidents open at once (50): a tool that qualifies beyond it is not
    opened, and counted (``loopwatch_fleet_incidents_capped_total``).  Without signed events the
    runs and agents counted are what the events claim, so this bounds what one producer can forge."""
    maxToolsPerAgentPerMinute: Annotated[int, msgspec.Meta(gt=0, le=MAX_TOOLS_PER_AGENT)] | None = None
    """An agent id (as events name it) adds outcomes for at most this many distinct tools a
    minute (30), fleet-wide; its outcomes for further tools are not counted, and counted
    (``loopwatch_fleet_outcomes_limited_total``)."""


class AgentRingsConfig(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``loopwatch.agentRings`` (root only): agents messaging each other in a ring."""

    enabled: bool | None = None
    warningThreshold: RingRounds | None = None
    """Rounds of the same hops with identical outcomes before the ring's sends are warned (3)."""
    criticalThreshold: RingRounds | None = None
    """... and blocked (5); above ``warningThreshold``."""
    windowSeconds: WindowSeconds | None = None
    """A trace's sends are kept this long (3600) and a ring nobody continues is forgotten after it."""


class AgentLoopwatchOptions(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Behaviour beyond upstream; every option is off by default (upstream behaviour).  Per
    agent (``agents.list[].loopwatch``) over the root's, key by key."""

    profile: Profile | None = None
    """Which upstream loopwatch reproduces: ``configurable-final`` (the default: OpenClaw
    mid 2026, numeric tuning) or ``latest`` (OpenClaw 2a627431: fixed thresholds, veto
    records, terminal exec failures, argument churn, untrusted-content ids canonicalised);
    or another agent family's rules: ``openhands`` (OpenHands' StuckDetector) or
    ``gemini-cli`` (Gemini CLI's LoopDetectionService), docs/peer-profiles.md."""
    abortAfterCriticalBlocks: PositiveInt | None = None
    """End the run (a ``critical_block_limit`` abort) after this many critical blocks.
    Upstream blocks single calls and lets the run continue for ever (OpenClaw issues #106231, #119719)."""
    surfaceWarnings: bool | None = None
    """Set ``notify_model`` on emitted warnings so runners show them to the model.
    Upstream only logs warnings (OpenClaw issue #120449)."""
    mode: Mode | None = None
    """``enforce`` (the default): verdicts go to ``loop-verdicts``.  ``shadow``: detection runs
    exactly as in enforce mode, but verdicts go only to the shadow topic
    (``loop-verdicts-shadow``); a gated call gets an ``allow`` on ``loop-verdicts``, so its
    runner is never blocked, warned or aborted."""
    detectors: LoopwatchDetectors | None = None
    """loopwatch's own detectors (``cycle``), per agent like upstream's."""


class LoopwatchOptions(AgentLoopwatchOptions, forbid_unknown_fields=True, omit_defaults=True):
    """The root ``loopwatch`` block: the per-agent options' defaults, and the options that
    decide how the whole fleet's events are keyed and repartitioned (root only)."""

    scope: Scope | None = None
    """Root only.  ``run`` (the default): one history per run id.  ``session``: one history per
    session key, across the runs of the session (a compaction or a restart that starts a new
    run no longer starts the streak over, OpenClaw issue #126545)."""
    fleetIncidents: FleetIncidentsConfig | None = None
    """Root only: fleet incidents on ``loop-incidents`` (off unless ``enabled``)."""
    agentRings: AgentRingsConfig | None = None
    """Root only: the agent-ring detector (off unless ``enabled``)."""


class AgentTools(msgspec.Struct):
    loopDetection: LoopDetectionConfig | None = None


class AgentEntry(msgspec.Struct):
    id: AgentId
    tools: AgentTools | None = None
    loopwatch: AgentLoopwatchOptions | None = None


class AgentsSection(msgspec.Struct):
    entries: Annotated[list[AgentEntry], msgspec.Meta(max_length=MAX_AGENTS)] = msgspec.field(
        default_factory=list, name="list"
    )


class ToolsSection(msgspec.Struct):
    loopDetection: LoopDetectionConfig | None = None


class LoopwatchConfig(msgspec.Struct):
    """The config root: an OpenClaw config (other keys are ignored) plus ``loopwatch``."""

    tools: ToolsSection | None = None
    agents: AgentsSection | None = None
    loopwatch: LoopwatchOptions | None = None


FORGEABLE_INCIDENTS = (
    "without signed events (LOOPWATCH_SIGNING_KEYS) the runs and agents an incident counts are what events "
    "claim, so one producer can open incidents for any tool (bounded by maxOpenIncidents and "
    "maxToolsPerAgentPerMinute); with signed events only agents whose signatures verified count"
)
"""``config check``'s and the worker's note for ``loopwatch.fleetIncidents`` (docs/configuration.md: Fleet incidents)."""


class ConfigIssue(msgspec.Struct, frozen=True):
    """One validation problem: where (dotted path), what, and a machine-readable code."""

    path: str
    message: str
    code: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


_INT_KEYS = (
    "historySize",
    "warningThreshold",
    "unknownToolThreshold",
    "criticalThreshold",
    "globalCircuitBreakerThreshold",
)
_BLOCK_KEYS = {"enabled", *_INT_KEYS, "detectors", "postCompactionGuard"}
_DETECTOR_KEYS = ("genericRepeat", "knownPollNoProgress", "pingPong")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if _is_number(value):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _check_positive_int(value: Any, path: str, issues: list[ConfigIssue], maximum: int = MAX_COUNT_SETTING) -> None:
    if not _is_number(value):
        issues.append(
            ConfigIssue(path, f"Invalid input: expected number, received {_type_name(value)}", "invalid_type")
        )
    elif not math.isfinite(value) or value != math.floor(value):
        issues.append(ConfigIssue(path, "Invalid input: expected int, received number", "not_integer"))
    elif value <= 0:
        issues.append(ConfigIssue(path, "Too small: expected number to be >0", "too_small"))
    elif value > maximum:  # loopwatch's bound (see MAX_COUNT_SETTING), in zod's words
        issues.append(ConfigIssue(path, f"Too big: expected number to be <={maximum}", "too_big"))


def _check_strict(obj: dict, allowed: Any, path: str, issues: list[ConfigIssue]) -> None:
    for key in obj:
        if key not in allowed:
            issues.append(
                ConfigIssue(path or "(root)", f'Unrecognized key: "{key}"{_hint(key, allowed)}', "unrecognized_keys")
            )


def _hint(key: Any, allowed: Any) -> str:
    """After upstream's message: the valid key the misspelt one most likely meant, or the
    valid keys when none is close."""
    known = sorted(allowed)
    match = difflib.get_close_matches(str(key), known, n=1, cutoff=0.5)
    if match:
        return f'; did you mean "{match[0]}"?'
    return f"; expected one of: {', '.join(known)}"


_NEAR_MISS = 0.8
"""How alike a key of an open section (the config's root, ``tools``, an agent entry: keys
loopwatch does not read belong to OpenClaw) must be to one loopwatch reads to be taken for
its misspelling: ``loopDetecton`` would otherwise leave detection off without a word."""


def _check_near_misses(obj: dict, wanted: tuple[str, ...], path: str, issues: list[ConfigIssue]) -> None:
    for key in obj:
        if not isinstance(key, str) or key in wanted:
            continue
        match = difflib.get_close_matches(key, wanted, n=1, cutoff=_NEAR_MISS) or [
            name for name in wanted if name.lower() == key.lower().replace("_", "").replace("-", "")
        ]
        if match:
            issues.append(
                ConfigIssue(
                    path,
                    f'Unrecognized key: "{key}"; did you mean "{match[0]}"? (loopwatch would ignore it)',
                    "unrecognized_keys",
                )
            )


def validate_loop_detection(block: Any, path: str = "tools.loopDetection") -> list[ConfigIssue]:
    """Upstream's strict ``ToolLoopDetectionSchema`` for one block."""
    issues: list[ConfigIssue] = []
    if not isinstance(block, dict):
        return [ConfigIssue(path, f"Invalid input: expected object, received {_type_name(block)}", "invalid_type")]
    _check_strict(block, _BLOCK_KEYS, path, issues)
    if "enabled" in block and not isinstance(block["enabled"], bool):
        issues.append(
            ConfigIssue(
                f"{path}.enabled",
                f"Invalid input: expected boolean, received {_type_name(block['enabled'])}",
                "invalid_type",
            )
        )
    for key in _INT_KEYS:
        if key in block:
            maximum = MAX_HISTORY_SIZE if key == "historySize" else MAX_COUNT_SETTING
            _check_positive_int(block[key], f"{path}.{key}", issues, maximum)
    if "detectors" in block:
        detectors = block["detectors"]
        sub = f"{path}.detectors"
        if not isinstance(detectors, dict):
            issues.append(
                ConfigIssue(sub, f"Invalid input: expected object, received {_type_name(detectors)}", "invalid_type")
            )
        else:
            _check_strict(detectors, _DETECTOR_KEYS, sub, issues)
            for key in _DETECTOR_KEYS:
                if key in detectors and not isinstance(detectors[key], bool):
                    issues.append(
                        ConfigIssue(
                            f"{sub}.{key}",
                            f"Invalid input: expected boolean, received {_type_name(detectors[key])}",
                            "invalid_type",
                        )
                    )
    if "postCompactionGuard" in block:
        guard = block["postCompactionGuard"]
        sub = f"{path}.postCompactionGuard"
        if not isinstance(guard, dict):
            issues.append(
                ConfigIssue(sub, f"Invalid input: expected object, received {_type_name(guard)}", "invalid_type")
            )
        else:
            _check_strict(guard, ("windowSize",), sub, issues)
            if "windowSize" in guard:
                _check_positive_int(guard["windowSize"], f"{sub}.windowSize", issues)
    if issues:
        return issues
    # Ordering refinements (run only on an otherwise valid block, as zod's superRefine does).
    warning, critical = block.get("warningThreshold"), block.get("criticalThreshold")
    breaker = block.get("globalCircuitBreakerThreshold")
    if warning is not None and critical is not None and warning >= critical:
        issues.append(
            ConfigIssue(
                f"{path}.criticalThreshold",
                "tools.loopDetection.warningThreshold must be lower than criticalThreshold.",
                "custom",
            )
        )
    if critical is not None and breaker is not None and critical >= breaker:
        issues.append(
            ConfigIssue(
                f"{path}.globalCircuitBreakerThreshold",
                "tools.loopDetection.criticalThreshold must be lower than globalCircuitBreakerThreshold.",
                "custom",
            )
        )
    return issues


def validate_loop_detection_latest(
    block: Any, path: str = "tools.loopDetection"
) -> tuple[list[ConfigIssue], list[ConfigIssue]]:
    """A block only profile latest reads: (errors, warnings).  ``enabled`` must be a
    boolean and unknown keys are errors as before; the retired keys are warnings."""
    if not isinstance(block, dict):
        return [ConfigIssue(path, f"Invalid input: expected object, received {_type_name(block)}", "invalid_type")], []
    issues: list[ConfigIssue] = []
    _check_strict(block, _BLOCK_KEYS, path, issues)
    if "enabled" in block and not isinstance(block["enabled"], bool):
        issues.append(
            ConfigIssue(
                f"{path}.enabled",
                f"Invalid input: expected boolean, received {_type_name(block['enabled'])}",
                "invalid_type",
            )
        )
    warnings = [
        ConfigIssue(
            f"{path}.{key}", "retired under profile latest (upstream's values are fixed); ignored", "retired_key"
        )
        for key in block
        if key in _BLOCK_KEYS and key != "enabled"
    ]
    return issues, warnings


_AGENT_OPTIONS = ("profile", "abortAfterCriticalBlocks", "surfaceWarnings", "mode", "detectors")
_ROOT_OPTIONS = (*_AGENT_OPTIONS, "scope", "fleetIncidents", "agentRings")
"""``scope``, ``fleetIncidents`` and ``agentRings`` decide how the whole fleet's events are
keyed and repartitioned: one setting for every agent, at the root."""


def _check_bool(value: Any, path: str, issues: list[ConfigIssue]) -> None:
    if value is not None and not isinstance(value, bool):
        issues.append(
            ConfigIssue(path, f"Invalid input: expected boolean, received {_type_name(value)}", "invalid_type")
        )


def _check_block_of(
    block: Any, path: str, issues: list[ConfigIssue], ints: dict[str, int], bools: tuple[str, ...] = ("enabled",)
) -> dict | None:
    """An options object with boolean and bounded positive integer keys; the block if it has
    no issue of its own (for the cross-key checks), else None."""
    if not isinstance(block, dict):
        issues.append(
            ConfigIssue(path, f"Invalid input: expected object, received {_type_name(block)}", "invalid_type")
        )
        return None
    before = len(issues)
    _check_strict(block, (*bools, *ints), path, issues)
    for key in bools:
        _check_bool(block.get(key), f"{path}.{key}", issues)
    for key, maximum in ints.items():
        if key in block:
            _check_positive_int(block[key], f"{path}.{key}", issues, maximum)
    return block if len(issues) == before else None


def _validate_fleet_options(options: dict, path: str, issues: list[ConfigIssue]) -> None:
    if "scope" in options and options["scope"] not in SCOPES:
        issues.append(
            ConfigIssue(
                f"{path}.scope",
                f"Invalid option: expected one of {' | '.join(repr(s) for s in SCOPES)}",
                "invalid_value",
            )
        )
    if "fleetIncidents" in options:
        where = f"{path}.fleetIncidents"
        block = _check_block_of(
            options["fleetIncidents"],
            where,
            issues,
            {
                "minRuns": MAX_FLEET_COUNT,
                "minAgents": MAX_FLEET_COUNT,
                "windowSeconds": MAX_WINDOW_SECONDS,
                "hopSeconds": MAX_WINDOW_SECONDS,
                "quietSeconds": MAX_WINDOW_SECONDS,
                "maxOpenIncidents": MAX_OPEN_INCIDENTS,
                "maxToolsPerAgentPerMinute": MAX_TOOLS_PER_AGENT,
            },
        )
        if block is not None:
            merged = {**FLEET_INCIDENT_DEFAULTS, **block}
            if merged["minAgents"] > merged["minRuns"]:
                issues.append(
                    ConfigIssue(f"{where}.minAgents", f"{where}.minAgents must not exceed minRuns.", "custom")
                )
            if merged["hopSeconds"] > merged["windowSeconds"]:
                issues.append(
                    ConfigIssue(f"{where}.hopSeconds", f"{where}.hopSeconds must not exceed windowSeconds.", "custom")
                )
    if "agentRings" in options:
        where = f"{path}.agentRings"
        block = _check_block_of(
            options["agentRings"],
            where,
            issues,
            {
                "warningThreshold": MAX_RING_ROUNDS,
                "criticalThreshold": MAX_RING_ROUNDS,
                "windowSeconds": MAX_WINDOW_SECONDS,
            },
        )
        if block is not None:
            merged = {**AGENT_RING_DEFAULTS, **block}
            if merged["warningThreshold"] >= merged["criticalThreshold"]:
                issues.append(
                    ConfigIssue(
                        f"{where}.criticalThreshold",
                        f"{where}.warningThreshold must be lower than criticalThreshold.",
                        "custom",
                    )
                )


def _check_early_warning(block: dict, path: str, issues: list[ConfigIssue]) -> None:
    before = len(issues)
    _check_strict(block, tuple(EARLY_WARNING_DEFAULTS), path, issues)
    if "window" in block:
        _check_positive_int(block["window"], f"{path}.window", issues, MAX_EARLY_WARNING_WINDOW)
        if len(issues) == before and block["window"] < 2:
            issues.append(ConfigIssue(f"{path}.window", "Too small: expected number to be >=2", "too_small"))
    if "minCalls" in block:
        _check_positive_int(block["minCalls"], f"{path}.minCalls", issues, MAX_EARLY_WARNING_MIN_CALLS)
    if "ratio" in block:
        ratio = block["ratio"]
        if not _is_number(ratio):
            issues.append(
                ConfigIssue(
                    f"{path}.ratio", f"Invalid input: expected number, received {_type_name(ratio)}", "invalid_type"
                )
            )
        elif not 0 < ratio < 1:
            issues.append(
                ConfigIssue(f"{path}.ratio", "Invalid input: expected a number above 0 and below 1", "invalid_value")
            )
    if len(issues) == before:
        merged = {**EARLY_WARNING_DEFAULTS, **block}
        if merged["minCalls"] <= merged["window"]:
            issues.append(
                ConfigIssue(
                    f"{path}.minCalls",
                    f"{path}.minCalls must exceed window (the run needs earlier windows for its baseline).",
                    "custom",
                )
            )


def _validate_options(options: Any, path: str, issues: list[ConfigIssue], *, root: bool = False) -> None:
    if not isinstance(options, dict):
        issues.append(
            ConfigIssue(path, f"Invalid input: expected object, received {_type_name(options)}", "invalid_type")
        )
        return
    if not root:
        for key in _ROOT_OPTIONS[len(_AGENT_OPTIONS) :]:
            if key in options:
                issues.append(
                    ConfigIssue(
                        f"{path}.{key}",
                        f"{key} applies to the whole fleet: set it in the root loopwatch block",
                        "root_only",
                    )
                )
    _check_strict(options, _ROOT_OPTIONS, path, issues)
    if root:
        _validate_fleet_options(options, path, issues)
    if "detectors" in options:
        detectors = options["detectors"]
        where = f"{path}.detectors"
        if isinstance(detectors, dict) and isinstance(detectors.get("earlyWarning"), dict):
            _check_early_warning(detectors["earlyWarning"], f"{where}.earlyWarning", issues)
            detectors = {k: v for k, v in detectors.items() if k != "earlyWarning"}
        _check_block_of(detectors, where, issues, {}, bools=("cycle", "earlyWarning", "nearIdentical"))
    profile = options.get("profile")
    if profile is not None and profile not in PROFILES:
        issues.append(
            ConfigIssue(
                f"{path}.profile",
                f"Invalid option: expected one of {' | '.join(repr(p) for p in PROFILES)}",
                "invalid_value",
            )
        )
    limit = options.get("abortAfterCriticalBlocks")
    if limit is not None:
        _check_positive_int(limit, f"{path}.abortAfterCriticalBlocks", issues)
    mode = options.get("mode")
    if mode is not None and mode not in MODES:
        issues.append(
            ConfigIssue(
                f"{path}.mode", f"Invalid option: expected one of {' | '.join(repr(m) for m in MODES)}", "invalid_value"
            )
        )
    warn = options.get("surfaceWarnings")
    if warn is not None and not isinstance(warn, bool):
        issues.append(
            ConfigIssue(
                f"{path}.surfaceWarnings",
                f"Invalid input: expected boolean, received {_type_name(warn)}",
                "invalid_type",
            )
        )


def _profile_of(options: Any, default: str) -> str:
    profile = options.get("profile") if isinstance(options, dict) else None
    return profile if profile in PROFILES else default


def validate(root: Any) -> list[ConfigIssue]:
    """Validate a whole config root; an empty list means valid.

    Keys of an OpenClaw config that loopwatch does not read are ignored; inside
    ``tools.loopDetection`` and ``loopwatch`` unknown keys are errors.
    """
    return check(root)[0]


def warnings(root: Any) -> list[ConfigIssue]:
    """What a valid config carries in vain: the retired keys of blocks only profile latest reads."""
    return check(root)[1]


def _check_block(block: Any, path: str, latest_only: bool, issues: list[ConfigIssue], notes: list[ConfigIssue]) -> None:
    if latest_only:
        errors, found = validate_loop_detection_latest(block, path)
        issues += errors
        notes += found
    else:
        issues += validate_loop_detection(block, path)


def _note_early_warning_in_vain(options: Any, profile: str, path: str, notes: list[ConfigIssue]) -> None:
    """The peer profiles run their own systems' rules only: an early warning there is off."""
    detectors = options.get("detectors") if isinstance(options, dict) else None
    early = detectors.get("earlyWarning") if isinstance(detectors, dict) else None
    if profile in PEER_PROFILES and (early is True or isinstance(early, dict)):
        notes.append(
            ConfigIssue(
                f"{path}.detectors.earlyWarning",
                f"profile {profile} runs its own system's rules only: the early warning is off for its agents",
                "ignored",
            )
        )
    if profile in PEER_PROFILES and isinstance(detectors, dict) and detectors.get("nearIdentical") is True:
        notes.append(
            ConfigIssue(
                f"{path}.detectors.nearIdentical",
                f"profile {profile} runs its own system's rules only: nearIdentical is off for its agents",
                "ignored",
            )
        )


def check(root: Any) -> tuple[list[ConfigIssue], list[ConfigIssue]]:
    """(errors, warnings) of a whole config root.

    A ``tools.loopDetection`` block is checked strictly (upstream's schema) when a
    configurable-final agent reads it, and with only ``enabled`` live when only latest
    agents do: the global block is read by every agent, an agent's block by that agent.
    """
    if root is None:
        return [], []
    if not isinstance(root, dict):
        return [
            ConfigIssue("(root)", f"Invalid input: expected object, received {_type_name(root)}", "invalid_type")
        ], []
    issues: list[ConfigIssue] = []
    notes: list[ConfigIssue] = []
    _check_near_misses(root, ("loopwatch",), "(root)", issues)
    root_profile = _profile_of(root.get("loopwatch"), CONFIGURABLE_FINAL)
    agents = root.get("agents")
    entries = agents.get("list") if isinstance(agents, dict) else None
    agent_profiles = [
        _profile_of(entry.get("loopwatch"), root_profile)
        for entry in (entries if isinstance(entries, list) else [])
        if isinstance(entry, dict)
    ]
    global_latest_only = root_profile == LATEST and CONFIGURABLE_FINAL not in agent_profiles
    tools = root.get("tools")
    if tools is not None:
        if not isinstance(tools, dict):
            issues.append(
                ConfigIssue("tools", f"Invalid input: expected object, received {_type_name(tools)}", "invalid_type")
            )
        else:
            _check_near_misses(tools, ("loopDetection",), "tools", issues)
            if "loopDetection" in tools:
                _check_block(tools["loopDetection"], "tools.loopDetection", global_latest_only, issues, notes)
    if "loopwatch" in root:
        _validate_options(root["loopwatch"], "loopwatch", issues, root=True)
        options = root["loopwatch"]
        block = options.get("fleetIncidents") if isinstance(options, dict) else None
        if isinstance(block, dict) and block.get("enabled") is True:
            notes.append(ConfigIssue("loopwatch.fleetIncidents", FORGEABLE_INCIDENTS, "forgeable"))
        _note_early_warning_in_vain(options, root_profile, "loopwatch", notes)
    if agents is not None:
        if not isinstance(agents, dict) or not isinstance(entries, (list, type(None))):
            issues.append(ConfigIssue("agents.list", "Invalid input: expected array", "invalid_type"))
            entries = None
        elif entries is not None and len(entries) > MAX_AGENTS:
            issues.append(
                ConfigIssue("agents.list", f"Too big: expected array to have <={MAX_AGENTS} items", "too_big")
            )
            entries = None
        seen: set[str] = set()
        for i, entry in enumerate(entries or []):
            where = f"agents.list[{i}]"
            if not isinstance(entry, dict):
                issues.append(
                    ConfigIssue(where, f"Invalid input: expected object, received {_type_name(entry)}", "invalid_type")
                )
                continue
            agent_id = entry.get("id")
            if not isinstance(agent_id, str) or not agent_id:
                issues.append(ConfigIssue(f"{where}.id", "Invalid input: expected a non-empty string", "invalid_type"))
            elif len(agent_id) > MAX_AGENT_ID_LENGTH:
                issues.append(
                    ConfigIssue(
                        f"{where}.id", f"Too big: expected string to have <={MAX_AGENT_ID_LENGTH} characters", "too_big"
                    )
                )
            elif agent_id in seen:
                issues.append(ConfigIssue(f"{where}.id", f'duplicate agent id "{agent_id}"', "custom"))
            else:
                seen.add(agent_id)
            _check_near_misses(entry, ("loopwatch",), where, issues)
            agent_tools = entry.get("tools")
            if isinstance(agent_tools, dict):
                _check_near_misses(agent_tools, ("loopDetection",), f"{where}.tools", issues)
            if isinstance(agent_tools, dict) and "loopDetection" in agent_tools:
                latest_only = _profile_of(entry.get("loopwatch"), root_profile) == LATEST
                _check_block(agent_tools["loopDetection"], f"{where}.tools.loopDetection", latest_only, issues, notes)
            if "loopwatch" in entry:
                _validate_options(entry["loopwatch"], f"{where}.loopwatch", issues)
                profile = _profile_of(entry.get("loopwatch"), root_profile)
                _note_early_warning_in_vain(entry["loopwatch"], profile, f"{where}.loopwatch", notes)
    return issues, notes


class ConfigError(LoopwatchError, ValueError):
    """A config file that cannot be read or parsed, or that fails validation."""

    def __init__(self, message: str, issues: list[ConfigIssue] | None = None) -> None:
        super().__init__(message)
        self.issues = issues or []


def parse_config_text(text: str, suffix: str) -> Any:
    """Parse JSON5 (the upstream docs' format; plain JSON is JSON5) or YAML by file suffix."""
    suffix = suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            import yaml

            return yaml.safe_load(text)
        if suffix == ".json":
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                pass  # JSON5 is a superset; fall through for comments or trailing commas
        import json5

        return json5.loads(text)
    except Exception as exc:  # the parsers raise many types; all mean "unparsable"
        raise ConfigError(f"cannot parse {suffix or 'config'}: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    """A parser's message on one line (YAML's span several, with a caret under the error)."""
    return " ".join(str(exc).split()) or type(exc).__name__


EMPTY_REFUSED = (
    "holds no configuration (empty, only comments, or null): refused, because an empty config "
    "would turn loop detection off; start from examples/getting-started.yaml (detection on, warnings "
    "shown to the model, the run ended after repeated blocks) or write `tools: {loopDetection: {enabled: true}}`"
)


def read_config_file(path: str | Path) -> bytes:
    """A config file's bytes; ``ConfigError`` when it cannot be read or is too large."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes, the limit for a config file")
    return data


def load_config_bytes(data: bytes, path: str | Path, *, strict: bool = True) -> Any:
    """Parse a config file's bytes (``path`` names it and its suffix picks the parser).

    An empty document (nothing, only comments, or ``null``) is refused: it is what a
    half-written file or a mistaken deploy looks like, and accepting it would silently turn
    detection off.  With ``strict`` any validation issue is refused too.
    """
    path = Path(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    if not text.strip():  # JSON and JSON5 parsers call this a syntax error; it is no document
        raise ConfigError(f"{path} {EMPTY_REFUSED}")
    try:
        root = parse_config_text(text, path.suffix)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if root is None:
        raise ConfigError(f"{path} {EMPTY_REFUSED}")
    if strict:
        issues = validate(root)
        if issues:
            raise ConfigError(f"{path}: invalid configuration: {issues[0]}", issues)
    return root


def load_config_file(path: str | Path, *, strict: bool = True) -> Any:
    """Read and parse a config file (see ``load_config_bytes``).  Raises ``ConfigError``."""
    return load_config_bytes(read_config_file(path), path, strict=strict)
