"""What every agent CLI's hooks share: its sessions as loopwatch runs, bounded, and the
warnings of a run still to be shown to its model."""

from __future__ import annotations

from collections import OrderedDict

from schemas.errors import LoopwatchError
from schemas.verdicts import Decision
from streams.client import LoopwatchClient, RunHandle

MAX_ID = 256
MAX_SESSIONS = 10_000
# The detectors whose block refuses a late call of a run loopwatch has aborted
# (streams.engine.engine.refused_after_abort names the abort's detector).
ABORT_DETECTORS = frozenset({"compaction_loop_persisted", "critical_block_limit"})


class PayloadError(LoopwatchError, ValueError):
    """A hook payload loopwatch cannot read: one line for the per-call command's stderr."""


def ident(payload: dict, name: str) -> str:
    value = payload.get(name)
    if not isinstance(value, str) or not value or len(value) > MAX_ID:
        raise PayloadError(f"{name} must be a non-empty string of at most {MAX_ID} characters")
    return value


def optional_ident(payload: dict, name: str) -> str | None:
    return None if payload.get(name) is None else ident(payload, name)


def event_name(payload: dict, events: tuple[str, ...]) -> str:
    event = payload.get("hook_event_name")
    if event not in events:
        raise PayloadError(f"hook_event_name must be one of {', '.join(events)}, not {str(event)[:40]!r}")
    return event


class Session:
    def __init__(self, run: RunHandle) -> None:
        self.run = run
        self.noticed = 0  # how many of run.warnings were given to the model (or skipped)
        self.stopped: str | None = None  # the message of a deny that ended the run

    def notices(self) -> list[str]:
        fresh = self.run.warnings[self.noticed :]
        self.noticed = len(self.run.warnings)
        return [d.message for d in fresh if d.notify_model and d.message]

    def stop_message(self, decision: Decision) -> str | None:
        """The message that ends the session after ``decision``'s block, or None when the
        session goes on (the model is told and may change course)."""
        aborted = self.run.aborted
        if aborted is not None:
            return aborted.message or decision.message or "loopwatch ended the run."
        if decision.detector in ABORT_DETECTORS:
            return decision.message or "loopwatch ended the run."
        return None


class Sessions:
    """A serve process's sessions of one CLI, each a run of ``client`` (the oldest forgotten
    past ``MAX_SESSIONS``)."""

    def __init__(self, client: LoopwatchClient, *, agent_id: str, key_prefix: str) -> None:
        self.client = client
        self.agent_id = agent_id
        self.key_prefix = key_prefix
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def get(self, session_id: str, make: type[Session] = Session) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            run = self.client.run(session_id, session_key=f"{self.key_prefix}:{session_id}", agent_id=self.agent_id)
            session = self._sessions[session_id] = make(run)
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(session_id)
        return session

    def peek(self, session_id: str) -> Session | None:
        """The session, if this process has seen it (no run is started for it)."""
        return self._sessions.get(session_id)

    def pop(self, session_id: str) -> Session | None:
        return self._sessions.pop(session_id, None)
