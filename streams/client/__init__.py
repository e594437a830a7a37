"""The runner client: what an agent runner embeds to talk to loopwatch over Kafka."""

from .errors import (
    LoopBlocked,
    LoopwatchUnavailable,
    NoDecisionError,
    PostCompactionLoopPersistedError,
    RunAbortedError,
)
from .runner import LoopwatchClient, RunHandle

__all__ = [
    "LoopBlocked",
    "LoopwatchClient",
    "LoopwatchUnavailable",
    "NoDecisionError",
    "PostCompactionLoopPersistedError",
    "RunAbortedError",
    "RunHandle",
]
