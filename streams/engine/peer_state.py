"""What the peer profiles (``openhands``, ``gemini-cli``) keep for a run, beside OpenClaw's
history in ``RunState`` (``RunState.peer``; None for a run no peer profile has seen)."""

from __future__ import annotations

import msgspec

from .gemini import GeminiState
from .openhands import OpenHandsWindow

__all__ = ["PeerState"]


class PeerState(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    openhands: OpenHandsWindow | None = None
    gemini: GeminiState | None = None
