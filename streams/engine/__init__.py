"""The sans-I/O detection core (think h11): events in, decisions and log lines out.

``engine_for(config)`` builds the engine a config needs and ``LoopEngine.handle(state, event) ->
Step`` is the entry point; ``RunDriver`` keeps many runs'
states over a stream of events, and ``published(step)`` is what loopwatch publishes for a
step.  The edge hashing the engine shares with runners is ``streams.edge.hashing`` and
``streams.edge.canonical``, outside this package, so that runners do not load the engine."""

from .choose import engine_for
from .config import ConfigSet, DetectorSettings, GuardSettings, Settings
from .drive import RunDriver, outcome, published, shadow_answer
from .engine import LogLine, LoopEngine, Step, allow_decision, normalize_run_id, state_key
from .state import CallRecord, RunState, copy_state, decode_state, encode_state

__all__ = [
    "CallRecord",
    "ConfigSet",
    "DetectorSettings",
    "GuardSettings",
    "LogLine",
    "LoopEngine",
    "RunDriver",
    "RunState",
    "Settings",
    "Step",
    "allow_decision",
    "copy_state",
    "decode_state",
    "encode_state",
    "engine_for",
    "normalize_run_id",
    "outcome",
    "published",
    "shadow_answer",
    "state_key",
]
