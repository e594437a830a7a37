"""What the gateway hashes of an MCP tool result: its canonical form (docs/mcp-gateway.md §2).

The gateway hands the edge hashing (``streams.edge.events`` through ``streams.client``) what an
OpenClaw tool would: a result ``{"content": ..., "details": ...}`` or a thrown error, so every
rule of spec §2.3 applies unchanged and no raw result leaves the gateway.

* A result with ``isError`` false becomes the result ``{"content": <content>, "details":
  <canonical form>}``; upstream's default rule then hashes ``{details, text}``.
* A result with ``isError`` true becomes a thrown error whose message is the result's text
  (its text blocks joined with a newline; the canonical form's stable serialisation when it has
  none), as OpenClaw's MCP wrapper throws a tool's error (spec §2.9): the hash is ``error:`` +
  digest, and an "Unknown tool: x" text feeds the unknown-tool detector.
* A protocol error from the upstream server (JSON-RPC ``error``) is a thrown error with its
  message; -32602 for a tool the server does not list is the unknown-tool outcome.
"""

from __future__ import annotations

from typing import Any

from streams.edge.canonical import js_trim, stable_stringify
from streams.edge.hashing import ThrownError, unknown_tool_name

__all__ = ["canonical_form", "edge_outcome", "unknown_tool_error"]


def canonical_form(result: Any) -> dict:
    """``{"content", "structuredContent", "isError"}`` of a ``CallToolResult`` (or its wire
    dict): content blocks in their wire form (camelCase, unset fields left out), a missing
    ``structuredContent`` as null, ``isError`` a boolean.  ``_meta`` and ``resultType`` are
    left out: they describe the transport, not what the tool answered."""
    if not isinstance(result, dict):
        result = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    content = result.get("content")
    return {
        "content": content if isinstance(content, list) else [],
        "structuredContent": result.get("structuredContent"),
        "isError": result.get("isError") is True,
    }


def _text(form: dict) -> str:
    return js_trim(
        "\n".join(
            block["text"]
            for block in form["content"]
            if isinstance(block, dict) and isinstance(block.get("type"), str) and isinstance(block.get("text"), str)
        )
    )


def edge_outcome(result: Any) -> dict:
    """The keyword arguments of ``RunHandle.after_tool_call`` for an MCP result:
    ``{"result": ...}`` or ``{"error": ThrownError(...)}``."""
    form = canonical_form(result)
    if form["isError"]:
        return {"error": ThrownError(_text(form) or stable_stringify(form))}
    return {"result": {"content": form["content"], "details": form}}


def unknown_tool_error(tool_name: str, message: str | None = None) -> ThrownError:
    """The unknown-tool outcome: the server's own message when the unknown-tool patterns read a
    name from it, otherwise ``Unknown tool: <name>`` (what a dispatcher throws)."""
    if message and unknown_tool_name(message):
        return ThrownError(message)
    return ThrownError(f"Unknown tool: {tool_name}")
