"""What the three framework adapters share: one agent run's calls, turned into loopwatch's
events and its verdicts into "run it", "refuse it with this message" or "end the run".

Everything goes through ``streams.client`` (``RunHandle``): it hashes arguments and results at
the edge (``streams.edge.events``), waits for the gate's decision within its timeout, fails open or
closed, and completes a blocked call with upstream's blocked result.  This module only
translates framework values into the JSON-like values the hashing takes, and the client's
answers into the three outcomes an adapter maps onto its framework.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass
from typing import Any

from schemas.verdicts import Decision
from streams.client import LoopBlocked, LoopwatchClient, NoDecisionError, RunAbortedError, RunHandle
from streams.edge.canonical import UNDEFINED
from streams.edge.hashing import ThrownError

__all__ = ["Admitted", "Refused", "RunGuard", "json_args", "open_run", "plain", "thrown", "unknown_tool_error"]

# The detectors whose block is the refusal of a late call of a run loopwatch has aborted
# (streams.engine.engine.refused_after_abort names the abort's detector).
_ABORT_DETECTORS = frozenset({"compaction_loop_persisted", "critical_block_limit"})


@dataclass(frozen=True)
class Admitted:
    """Run the call; ``notices`` are loopwatch warnings for the model (``notify_model``)."""

    notices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Refused:
    """Do not run the call: give ``message`` to the model as the tool's refusal.  With
    ``aborted`` set, loopwatch has ended the run: the adapter ends it the framework's way."""

    message: str
    aborted: RunAbortedError | None = None
    decision: Decision | None = None


def open_run(
    client: LoopwatchClient,
    run_id: str | None = None,
    *,
    session_key: str | None = None,
    agent_id: str | None = None,
    trace_id: str | None = None,
) -> RunGuard:
    """A guard for one run.  Upstream detects only with a session key, so a run without one
    gets ``agent:<agent id or main>:<run id>``; the trace id defaults to the active
    OpenTelemetry trace's, when there is one (it only matters for ``loopwatch.agentRings``)."""
    run_id = run_id or uuid.uuid4().hex
    handle = client.run(
        run_id,
        session_key=session_key or f"agent:{agent_id or 'main'}:{run_id}",
        agent_id=agent_id,
        trace_id=trace_id or _active_trace_id(),
    )
    return RunGuard(handle)


def _active_trace_id() -> str | None:
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


class RunGuard:
    """One run's side of an adapter, on the client's ``RunHandle``."""

    def __init__(self, run: RunHandle) -> None:
        self.run = run
        self._noticed = 0  # how many of run.warnings the model has been shown (or skipped)

    @property
    def aborted(self) -> RunAbortedError | None:
        return None if self.run.aborted is None else RunAbortedError.from_verdict(self.run.aborted)

    async def before(self, tool: str, args: Any, call_id: str | None) -> Admitted | Refused:
        """Publish the request (gate mode: and wait for its decision)."""
        try:
            decision = await self.run.before_tool_call(tool, args, tool_call_id=call_id)
        except RunAbortedError as aborted:
            return Refused(aborted.message, aborted=aborted)
        except LoopBlocked as blocked:
            return self._refused(blocked.decision)
        except NoDecisionError as missing:  # gate mode, fail_closed=True
            return Refused(f"Tool call blocked: loopwatch loop protection is unavailable ({missing}).")
        if decision is not None and decision.action == "block":  # a client with raise_on_block=False
            return self._refused(decision)
        return Admitted(self.notices())

    def _refused(self, decision: Decision) -> Refused:
        self.notices()  # a block's own message says it all; earlier warnings are moot
        # The abort verdict follows its block on the same partition, usually in the same fetch;
        # a late call's block names the abort's detector when the abort has not arrived yet.
        aborted = self.aborted
        if aborted is None and decision.detector in _ABORT_DETECTORS:
            aborted = RunAbortedError(
                decision.message or "",
                detector=decision.detector,
                count=decision.count or 0,
                tool_name=decision.tool_name,
            )
        return Refused(decision.message or "Tool call blocked by loopwatch.", aborted=aborted, decision=decision)

    def notices(self) -> tuple[str, ...]:
        """Warnings the model has not been shown yet and that loopwatch asks to show
        (``notify_model``, i.e. ``loopwatch.surfaceWarnings``): gate warnings of this call,
        advisory warnings as they arrived."""
        fresh = self.run.warnings[self._noticed :]
        self._noticed = len(self.run.warnings)
        return tuple(d.message for d in fresh if d.notify_model and d.message)

    async def after(
        self,
        tool: str,
        args: Any,
        call_id: str | None,
        *,
        result: Any = None,
        error: Any = UNDEFINED,
        returned: bool = True,
    ) -> None:
        """Publish the outcome (a no-op for a call loopwatch blocked: the client completed it)."""
        await self.run.after_tool_call(tool, args, tool_call_id=call_id, result=result, error=error, returned=returned)

    async def unknown_tool(self, tool: str, args: Any, call_id: str | None) -> Admitted | Refused:
        """A call of a tool the agent does not have: requested, then completed with the
        unknown-tool error upstream's unknown-tool detector reads (spec §2.9)."""
        verdict = await self.before(tool, args, call_id)
        if isinstance(verdict, Admitted):
            await self.after(tool, args, call_id, error=unknown_tool_error(tool))
        return verdict

    async def end(self, reason: str | None = None) -> None:
        await self.run.end(reason)


def unknown_tool_error(tool: str) -> ThrownError:
    return ThrownError(message=f"Unknown tool: {tool}")


def thrown(error: BaseException | str) -> ThrownError:
    """A Python exception (or a framework's error text) as the thrown ``Error`` upstream
    hashes: its message."""
    if isinstance(error, str):
        return ThrownError(message=error)
    return ThrownError(message=str(error), name=type(error).__name__)


def plain(value: Any, _depth: int = 0) -> Any:
    """``value`` as the JSON-like value the edge hashing takes: pydantic models and dataclasses
    by their fields, mappings and sequences item by item, JSON text as what it encodes for
    arguments (``json_args``), anything else by its ``str``."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if _depth > 64:
        return str(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return plain(dump(mode="json"), _depth + 1)
        except Exception:  # noqa: BLE001 - not every model_dump takes mode=
            return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name), _depth + 1) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, _depth + 1) for v in value]
    return str(value)


def json_args(text: Any) -> Any:
    """Arguments a framework hands over as JSON text (the model's own encoding): decoded, so
    that ``{"a":1}`` and ``{"a": 1}`` are the same call; text that is not JSON stays text."""
    if not isinstance(text, str):
        return plain(text)
    try:
        return json.loads(text)
    except ValueError:
        return text
