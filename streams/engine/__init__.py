"""The sans-I/O detection core (think h11): events in, decisions and log lines out."""

from .config import ConfigSet, DetectorSettings, GuardSettings, Settings
from .drive import RunDriver, published
from .engine import LogLine, LoopEngine, Step, normalize_run_id, state_key
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
    "copy_state",
    "decode_state",
    "encode_state",
    "normalize_run_id",
    "published",
    "state_key",
]
