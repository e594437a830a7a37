"""Which engine class a config needs, in one place above the variants: the variants import the
base (``streams.engine.engine``), and the base never imports them.

configurable-final keeps its own paths free of per-agent profile checks, so a config gets the
smallest class that covers what its agents use: profile latest (``LatestEngine``), loopwatch's
own options (``streams.engine.extensions``), and the peer profiles (``streams.engine.peers``, a
mixin over either)."""

from __future__ import annotations

from .config import ConfigSet
from .engine import LatestEngine, LoopEngine
from .extensions import engine_class
from .peers import peer_engine_class

__all__ = ["engine_for"]


def engine_for(config: ConfigSet | dict | None = None) -> LoopEngine:
    """The engine for ``config`` (a ``ConfigSet``, the config file's mapping, or None for the
    defaults)."""
    config = config if isinstance(config, ConfigSet) else ConfigSet(config)
    latest = config.uses_latest()
    cls: type[LoopEngine] = LoopEngine
    if config.uses_extensions():
        cls = engine_class(latest)
    elif latest:
        cls = LatestEngine
    if config.uses_peers():
        cls = peer_engine_class(cls)
    return cls(config)
