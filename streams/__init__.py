"""loopwatch: central tool-loop detection for fleets of AI agent runners."""

from __future__ import annotations

from typing import Any

__all__ = ["LoopwatchError", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy, so that ``import streams`` loads neither the wire contract nor the metadata.
    if name == "LoopwatchError":
        from schemas.errors import LoopwatchError

        return LoopwatchError
    if name == "__version__":
        return _distribution_version() or "0+unknown"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _distribution_version() -> str | None:
    """The installed distribution's version (pyproject.toml is its one source); None when
    loopwatch runs from a source tree that was never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("loopwatch")
    except PackageNotFoundError:
        return None
