"""The runner client: what an agent runner embeds to talk to loopwatch over Kafka."""

from schemas.errors import LoopwatchError
from schemas.signing import SigningKey

from ..edge.broker import BrokerAccessError
from .errors import (
    LoopBlocked,
    LoopwatchUnavailable,
    NoDecisionError,
    PostCompactionLoopPersistedError,
    RunAbortedError,
)
from .runner import LoopwatchClient, RunHandle

__all__ = [
    "BrokerAccessError",
    "LoopBlocked",
    "LoopwatchClient",
    "LoopwatchError",
    "LoopwatchUnavailable",
    "NoDecisionError",
    "PostCompactionLoopPersistedError",
    "RunAbortedError",
    "RunHandle",
    "SigningKey",
]
