"""loopwatch: central tool-loop detection for fleets of AI agent runners."""

__version__ = "0.1.0"
