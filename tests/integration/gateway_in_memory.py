"""The MCP gateway in the test's own process: ``Gateway`` on the real broker (a real
``LoopwatchClient``, the worker's real verdicts), its agent-facing ``Server`` reached by
``mcp.Client(server)`` in memory.  No gateway process; no upstream process either when an
upstream is an ``MCPServer`` the test writes (``UpstreamSpec(server=...)``).

For the tests whose subject is what the gateway does with a call, not the bytes on a pipe: the
relay, the stdio framing and the HTTP sessions stay on the wire (``test_mcp_gateway.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from mcp import Client

from streams.integrations.mcp.gateway import Gateway
from streams.integrations.mcp.options import GatewayOptions
from streams.integrations.mcp.runs import runner_client
from streams.integrations.mcp.upstream import UpstreamSpec

__all__ = ["gateway_in_memory"]


@contextlib.asynccontextmanager
async def gateway_in_memory(
    lw: Any,
    run_id: str,
    *upstreams: UpstreamSpec | str,
    agent_id: str = "mcp-test",
    own_client: bool = True,
    agent: dict | None = None,
    **options: Any,
) -> AsyncIterator[Client]:
    """The agent's ``mcp.Client`` on a started gateway in front of ``upstreams`` (specs, or the
    CLI's ``--upstream`` text), on ``lw``'s broker and topics, the run ``run_id``.

    ``options`` are ``GatewayOptions`` fields over the CLI's defaults as the wire tests give
    them (a 10 s decision timeout: a verdict takes milliseconds, 10 s rides out a loaded host).
    ``own_client``: the test makes the runner client and hands it over, as an embedding
    application would; False lets the gateway make its own (a gateway that must make a new one
    per attempt while Kafka is out of reach).  ``agent``: more ``mcp.Client`` arguments.

    Closing it is what ``loopwatch mcp-gateway`` does when its stdio session closes: the run
    ends, then the gateway stops."""
    specs = tuple(u if isinstance(u, UpstreamSpec) else UpstreamSpec.parse(u) for u in upstreams)
    settings: dict[str, Any] = {
        "bootstrap_servers": lw.broker,
        "tool_calls_topic": lw.names.tool_calls,
        "verdicts_topic": lw.names.verdicts,
        "run_id": run_id,
        "agent_id": agent_id,
        "timeout": 10.0,
        "relay": False,
        **options,
    }
    gateway_options = GatewayOptions(upstreams=specs, **settings)
    gateway = Gateway(gateway_options, client=runner_client(gateway_options) if own_client else None)
    server = await gateway.start()
    try:
        async with Client(server, read_timeout_seconds=60, **(agent or {})) as client:
            yield client
        await gateway.end_session_run()
    finally:
        await gateway.stop()
