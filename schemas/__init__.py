"""The wire contract of loopwatch: msgspec Structs for everything that crosses Kafka.

``events``   what runners publish on ``tool-calls``;
``verdicts`` what loopwatch publishes on ``loop-verdicts``;
``config``   the ``tools.loopDetection`` configuration (global and per agent);
``keys``     which run an event belongs to: the state key and the Kafka record key;
``errors``   ``LoopwatchError``, the root of every error loopwatch raises.

JSON Schema for every wire type is exported to ``schemas/jsonschema/`` (``make schemas``).
"""

from .config import ConfigError, ConfigIssue, LoopDetectionConfig, LoopwatchConfig, LoopwatchOptions
from .errors import LoopwatchError
from .events import (
    MAX_EVENT_BYTES,
    SCHEMA_VERSION,
    SUPPORTED_VERSIONS,
    AgentMessage,
    CompactionRetried,
    InvalidEvent,
    ModelText,
    RunEnded,
    ToolCallCompleted,
    ToolCallEvent,
    ToolCallRequested,
    decode_event,
    encode_event,
)
from .keys import record_key, state_key
from .verdicts import Decision, RunAborted, Verdict, decode_verdict, encode_verdict

__all__ = [
    "MAX_EVENT_BYTES",
    "SCHEMA_VERSION",
    "SUPPORTED_VERSIONS",
    "AgentMessage",
    "CompactionRetried",
    "ConfigError",
    "ConfigIssue",
    "Decision",
    "InvalidEvent",
    "LoopDetectionConfig",
    "LoopwatchConfig",
    "LoopwatchError",
    "LoopwatchOptions",
    "ModelText",
    "RunAborted",
    "RunEnded",
    "ToolCallCompleted",
    "ToolCallEvent",
    "ToolCallRequested",
    "Verdict",
    "decode_event",
    "decode_verdict",
    "encode_event",
    "encode_verdict",
    "record_key",
    "state_key",
]
