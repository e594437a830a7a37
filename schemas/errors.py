"""The root of every error loopwatch raises: ``except LoopwatchError`` catches them all.

It sits at the bottom of the import layers (it imports nothing of loopwatch), so every room
can derive from it.  The errors users meet come in four families, each one class the
specific errors derive from:

* configuration: ``schemas.config.ConfigError`` (a config file, the worker's settings,
  signing keys, the MCP gateway's upstreams);
* broker access: ``streams.edge.broker.BrokerAccessError`` (the broker refused this client
  for good: credentials, TLS trust, SASL mechanism);
* decision timeout: ``streams.client.NoDecisionError`` (gate mode failing closed);
* run aborted: ``streams.client.RunAbortedError`` (loopwatch ended the run).

Each error also keeps the builtin it derived from before the root existed (``ConfigError`` is
a ``ValueError``, ``BrokerAccessError`` a ``ConnectionError``, ``NoDecisionError`` a
``TimeoutError``...), so code that catches the builtin goes on catching it.
"""

from __future__ import annotations

__all__ = ["LoopwatchError"]


class LoopwatchError(Exception):
    """Base class of every error loopwatch raises."""
