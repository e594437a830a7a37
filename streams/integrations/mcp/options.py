"""The gateway's options, in a module of their own: the gateway, its runs and the relay all read
them, and none of those needs the others to name them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .health import UpstreamHealth
from .upstream import UpstreamSpec

__all__ = ["GatewayOptions"]


@dataclass(frozen=True)
class GatewayOptions:
    upstreams: tuple[UpstreamSpec, ...]
    bootstrap_servers: str = "127.0.0.1:19092"
    mode: str = "gate"
    timeout: float = 1.0
    """loopwatch's decision timeout: the runner client's default."""
    fail_closed: bool = False
    tool_calls_topic: str = "tool-calls"
    verdicts_topic: str = "loop-verdicts"
    agent_id: str | None = None
    """Default: the MCP client's name (``clientInfo.name``), else ``mcp``."""
    session_key: str | None = None
    """Default: ``mcp:<agent id>:<run id>``."""
    run_id: str | None = None
    """The stdio session's run id (default: a fresh one per session); over HTTP, the run of
    requests that name none."""
    upstream_timeout: float = 60.0
    """How long a forwarded call may take before the agent gets an error."""
    connect_timeout: float = 30.0
    run_idle_timeout: float = 1800.0
    relay: bool = True
    """Over stdio with one upstream command and no prefix, relay its JSON-RPC messages as they
    are (``relay.py``) instead of serving them through the SDK's server and client."""
    kafka_options: tuple[tuple[str, Any], ...] = ()
    restart_after_timeouts: int = 3
    """Restart (stdio) or reconnect (HTTP) an upstream after this many calls in a row timed out;
    0: never for this reason (``health.UpstreamHealth``)."""
    restart_after_silence: float = 120.0
    """... or when a call times out and the upstream has answered nothing for this long."""
    restart_backoff_max: float = 60.0
    """Restarts without an answer in between wait 1 s, 2 s, 4 s ... up to this long."""
    http_max_sessions: int = 1000
    """Over HTTP: at most this many open sessions; a client opening one more gets 503."""
    http_session_idle_timeout: float = 600.0
    """Over HTTP: a session without a request for this long is closed (its runs end)."""

    def upstream_health(self, name: str) -> UpstreamHealth:
        return UpstreamHealth(
            name,
            restart_after_timeouts=self.restart_after_timeouts,
            restart_after_silence=self.restart_after_silence,
            backoff_max=self.restart_backoff_max,
        )
