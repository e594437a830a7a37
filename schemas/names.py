"""The names on the wire, each defined once: event and verdict types, actions, levels,
detectors and dead-letter reasons.

The schemas build their tags and literal types from these, the engine names its detectors
with them, the worker's dead letters and metrics use them (every metric label value listed
here is exported at zero from the start, ``streams.app.metrics``), and docs/metrics.md
documents them.
"""

from __future__ import annotations

# -- event types (``type`` of a tool-calls event) -------------------------------------------------

TOOL_CALL_REQUESTED = "tool_call.requested"
TOOL_CALL_COMPLETED = "tool_call.completed"
COMPACTION_RETRIED = "compaction.retried"
RUN_ENDED = "run.ended"
AGENT_MESSAGE = "agent.message"
"""A message of the agent (or of its user) without tool calls, hashed at the edge: read by the
``openhands`` profile (monologue, empty responses, a user message's reset); ignored by the others."""
MODEL_TEXT = "model.text"
"""One chunk of the model's streamed text, as the window hashes of Gemini CLI's content loop
detector (computed at the edge, ``streams.edge.content_windows``): read by the ``gemini-cli``
profile; ignored by the others."""
EVENT_TYPES = (TOOL_CALL_REQUESTED, TOOL_CALL_COMPLETED, COMPACTION_RETRIED, RUN_ENDED, AGENT_MESSAGE, MODEL_TEXT)

# -- verdicts (``type`` on loop-verdicts, a decision's ``action`` and ``level``) ---------------------

DECISION = "loop.decision"
RUN_ABORTED = "loop.run_aborted"

ACTIONS = ("allow", "warn", "block")
LEVELS = ("warning", "critical")
WARNING, CRITICAL = LEVELS

# -- detectors (a decision's or an abort's ``detector``) ----------------------------------------------

GENERIC_REPEAT = "generic_repeat"
KNOWN_POLL_NO_PROGRESS = "known_poll_no_progress"
PING_PONG = "ping_pong"
GLOBAL_CIRCUIT_BREAKER = "global_circuit_breaker"
UNKNOWN_TOOL_REPEAT = "unknown_tool_repeat"
ARGUMENT_CHURN = "argument_churn"
"""Profile latest only; also the name of its liveness signal."""
COMPACTION_LOOP_PERSISTED = "compaction_loop_persisted"
"""The post-compaction guard's abort."""
CRITICAL_BLOCK_LIMIT = "critical_block_limit"
"""The abort after ``loopwatch.abortAfterCriticalBlocks`` blocks (loopwatch's option)."""
CYCLE = "cycle"
"""loopwatch's opt-in detector of cycles of 3 to 5 calls (``loopwatch.detectors.cycle``)."""
AGENT_RING = "agent_ring"
"""loopwatch's opt-in detector of agents messaging each other in a ring (``loopwatch.agentRings``)."""
EARLY_WARNING = "early_warning"
"""loopwatch's opt-in warn-only detector of a collapse of the run's action entropy, which tends to
come before a loop (``loopwatch.detectors.earlyWarning``).  It never blocks, and it warns once
per collapse, without the warning-bucket rule."""

# Profile openhands (OpenHands' StuckDetector, openhands-sdk; docs/peer-profiles.md).
OPENHANDS_ACTION_OBSERVATION = "openhands_action_observation"
"""4 identical action/observation pairs (abort)."""
OPENHANDS_ACTION_ERROR = "openhands_action_error"
"""3 identical actions ending in errors: the nudge (warn); one more: the abort."""
OPENHANDS_MONOLOGUE = "openhands_monologue"
"""3 agent messages with nothing but condensation summaries or framework nudges between them (abort)."""
OPENHANDS_ALTERNATING = "openhands_alternating"
"""An A/B alternation of actions and observations over 6 of each (abort)."""
OPENHANDS_DETECTORS = (OPENHANDS_ACTION_OBSERVATION, OPENHANDS_ACTION_ERROR, OPENHANDS_MONOLOGUE, OPENHANDS_ALTERNATING)

# Profile gemini-cli (Gemini CLI's LoopDetectionService, @google/gemini-cli-core; docs/peer-profiles.md).
GEMINI_TOOL_CALL_LOOP = "gemini_tool_call_loop"
"""A cycle of 1 to 5 calls repeated 5 times: the first time the call is blocked with Gemini's
feedback, the second time the run is aborted too."""
GEMINI_LLM_LOOP = "gemini_llm_detected_loop"
"""Gemini's ``LoopType.LLM_DETECTED_LOOP``: a judge's confidence at or above 0.9 (off by default: ``streams.engine.judge``)."""
GEMINI_CONTENT_LOOP = "gemini_content_loop"
"""Gemini's ``LoopType.CONTENT_CHANTING_LOOP``: a 50-character window of the model's streamed text
10 times close together.  The prompt's first detection is a warning carrying Gemini's feedback
(the runner cuts the stream and sends it); a second detection of any kind aborts."""

WARNING_DETECTORS = (GENERIC_REPEAT, KNOWN_POLL_NO_PROGRESS, PING_PONG, ARGUMENT_CHURN, CYCLE, AGENT_RING)
"""Detectors that can warn under the warning-bucket rule.  (OpenHands' nudge, a warning of
``openhands_action_error``, is never bucketed.)"""
ABORT_DETECTORS = (
    COMPACTION_LOOP_PERSISTED,
    CRITICAL_BLOCK_LIMIT,
    *OPENHANDS_DETECTORS,
    GEMINI_TOOL_CALL_LOOP,
    GEMINI_LLM_LOOP,
    GEMINI_CONTENT_LOOP,
)
"""Detectors of ``loop.run_aborted``."""

# -- fleet incidents (``type`` on loop-incidents) ----------------------------------------------------

INCIDENT_OPENED = "fleet.incident_opened"
INCIDENT_RESOLVED = "fleet.incident_resolved"

# -- dead-letter reasons (the ``loopwatch.reason`` header on tool-calls-dlq) ------------------------

OVERSIZED = "oversized"
INVALID_JSON = "invalid_json"
INVALID_EVENT = "invalid_event"
UNSUPPORTED_VERSION = "unsupported_version"
UNKNOWN_TYPE = "unknown_type"
MISSING_KEY = "missing_key"
KEY_MISMATCH = "key_mismatch"
BAD_SIGNATURE = "bad_signature"
STALE_EVENT = "stale_event"
"""With signed events: a signed event older than ``LOOPWATCH_SIGNED_MAX_AGE_S`` (a replay)."""
REPLAYED_EVENT = "replayed_event"
"""With signed events: a signed event whose ``seq`` is not above the highest its run applied (a
replay within the max age, past the window of event ids)."""
PROCESSING_ERROR = "processing_error"
DEAD_LETTER_REASONS = (
    INVALID_JSON,
    INVALID_EVENT,
    OVERSIZED,
    MISSING_KEY,
    KEY_MISMATCH,
    UNKNOWN_TYPE,
    UNSUPPORTED_VERSION,
    BAD_SIGNATURE,
    STALE_EVENT,
    REPLAYED_EVENT,
    PROCESSING_ERROR,
)

# -- shadow mode and the candidate config (``loopwatch.mode``, ``LOOPWATCH_CANDIDATE_CONFIG``) -------

ENFORCE = "enforce"
SHADOW = "shadow"
MODES = (ENFORCE, SHADOW)
"""``loopwatch.mode``: an agent's verdicts go to ``loop-verdicts`` (enforce, the default) or only
to the shadow topic (its runners' gated calls get an ``allow``); the metrics' ``mode`` label."""
LIVE = "live"
CANDIDATE = "candidate"
CONFIGS = (LIVE, CANDIDATE)
"""Which config a verdict on the shadow topic came from (its ``loopwatch.config`` header); the
metrics' ``config`` label."""
CONFIG_HEADER = "loopwatch.config"
CONFIG_SHA256_HEADER = "loopwatch.config_sha256"
"""The shadow topic's record headers: the config (``CONFIGS``) and the first 16 hex digits of the
SHA-256 of its file's content (``defaults`` without a file)."""
WORKER_HEADER = "loopwatch.worker"
GENERATION_HEADER = "loopwatch.generation"
"""Every verdict record's headers: the worker that published it (its ``group.instance.id``) and
the consumer group generation it was decided in.  A verdict id published twice (a redelivery
after a crash or a rebalance) can be traced to its publishers; runners need not read them."""
OUTCOMES = ("none", "warn", "block", "abort")
"""A run's outcome under one config, weakest first: the strongest verdict it got (a published
warning, a block, an abort).  ``streams.engine.drive.outcome`` ranks a step by this tuple."""
