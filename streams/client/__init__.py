"""The runner client: what an agent runner embeds to talk to loopwatch over Kafka."""

from .errors import LoopBlocked, PostCompactionLoopPersistedError, RunAbortedError
from .runner import LoopwatchClient, RunHandle

__all__ = ["LoopBlocked", "LoopwatchClient", "PostCompactionLoopPersistedError", "RunAbortedError", "RunHandle"]
