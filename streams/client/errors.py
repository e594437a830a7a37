"""What the runner client raises when loopwatch ends a run, blocks a call, or cannot answer."""

from __future__ import annotations

from schemas.errors import LoopwatchError
from schemas.verdicts import Decision, RunAborted


class LoopBlocked(LoopwatchError):
    """A tool call was vetoed by a critical loop detection; ``message`` is for the model."""

    def __init__(self, decision: Decision) -> None:
        super().__init__(decision.message)
        self.decision = decision
        self.detector = decision.detector
        self.count = decision.count
        self.tool_name = decision.tool_name


class NoDecisionError(LoopwatchError, TimeoutError):
    """Gate mode with ``fail_closed=True``: no decision within the timeout (loopwatch or its
    Kafka unreachable, or too slow).  The call must not run."""


class LoopwatchUnavailable(LoopwatchError, ConnectionError):
    """The client could not start: Kafka unreachable, or the verdicts topic missing."""


class RunAbortedError(LoopwatchError):
    """loopwatch ended the run (base class of the specific abort errors)."""

    name = "RunAbortedError"

    def __init__(self, message: str, *, detector: str, count: int, tool_name: str) -> None:
        super().__init__(message)
        self.message = message
        self.detector = detector
        self.count = count
        self.tool_name = tool_name

    @classmethod
    def from_verdict(cls, verdict: RunAborted) -> RunAbortedError:
        kind = PostCompactionLoopPersistedError if verdict.detector == "compaction_loop_persisted" else cls
        return kind(verdict.message, detector=verdict.detector, count=verdict.count, tool_name=verdict.tool_name)


class PostCompactionLoopPersistedError(RunAbortedError):
    """Upstream's ``PostCompactionLoopPersistedError``: the loop survived a compaction."""

    name = "PostCompactionLoopPersistedError"
