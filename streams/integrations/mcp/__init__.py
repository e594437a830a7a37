"""``loopwatch mcp-gateway``: loopwatch in front of any MCP client's tool servers.

An MCP server towards the agent (stdio, or streamable HTTP), an MCP client towards each
upstream server, and loopwatch's runner client on every ``tools/call``.  Needs the optional
extra ``loopwatch[mcp]`` (the official ``mcp`` SDK, 2.x); nothing outside this package imports
it.  The canonical form a result is hashed from: ``outcome.py`` and docs/mcp-gateway.md.
"""

from .gateway import RUN_ID_HEADER, RUN_ID_META, Gateway, GatewayOptions
from .outcome import canonical_form, edge_outcome
from .upstream import UpstreamSpec, UpstreamUnavailable

__all__ = [
    "Gateway",
    "GatewayOptions",
    "RUN_ID_HEADER",
    "RUN_ID_META",
    "UpstreamSpec",
    "UpstreamUnavailable",
    "canonical_form",
    "edge_outcome",
]
