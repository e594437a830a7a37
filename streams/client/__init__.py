"""The runner client: what an agent runner embeds to talk to loopwatch over Kafka."""

from schemas.signing import SigningKey

from ..broker_access import BrokerAccessError
from .errors import LoopBlocked, PostCompactionLoopPersistedError, RunAbortedError
from .runner import LoopwatchClient, RunHandle

__all__ = [
    "BrokerAccessError", "LoopBlocked", "LoopwatchClient", "PostCompactionLoopPersistedError", "RunAbortedError",
    "RunHandle", "SigningKey",
]
