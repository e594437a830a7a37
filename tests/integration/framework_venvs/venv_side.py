"""What the scripts run in a framework's own venv share (tests/integration/framework_venv.py
runs them): the loopwatch client on the test's broker and topics, and the docs' snippet run as
it is written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streams.client import LoopwatchClient


def loopwatch_client(broker: str, tool_calls: str, verdicts: str) -> LoopwatchClient:
    return LoopwatchClient(broker, tool_calls_topic=tool_calls, verdicts_topic=verdicts, timeout=10.0)


def snippet_main(snippet: str, marker: str) -> Callable[..., Any]:
    """The ``main`` of the docs' snippet ``marker``, as written (the test put its broker's
    address in)."""
    namespace: dict[str, Any] = {}
    exec(compile(snippet, f"docs/integrations.md ({marker})", "exec"), namespace)
    return namespace["main"]
