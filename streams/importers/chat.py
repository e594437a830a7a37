"""The OpenAI chat format's tool calls, as the importers that read it (``openai-chat``,
mini-swe-agent's v2 trajectories) pair them with their replies."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from .model import text_of
from .reader import decode_embedded

__all__ = ["ChatCall", "chat_tool_calls"]


class ChatCall(NamedTuple):
    call: dict
    """The ``tool_calls`` entry (its ``id``, its ``function``)."""
    name: str | None
    args: Any
    """The arguments, decoded when they are a JSON text (as the chat format sends them)."""
    reply: dict | None
    """The ``role: tool`` message answering it, if any."""
    result: object
    """That reply's text (``text_of`` its content), None without a reply."""


def chat_tool_calls(messages: list, where: str) -> Iterator[ChatCall]:
    """Every assistant message's tool calls, in order, with the ``role: tool`` reply of the
    same id; ``where`` names the run in a refusal of a call's arguments."""
    replies = {m.get("tool_call_id"): m for m in messages if isinstance(m, dict) and m.get("role") == "tool"}
    for message in messages:
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        calls = message.get("tool_calls")
        if not isinstance(calls, list):
            continue
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                continue
            args = function.get("arguments")
            if isinstance(args, str):
                args = decode_embedded(args, f"{where}: the arguments of call {call.get('id')!r}")
            reply = replies.get(call.get("id"))
            name = function.get("name")
            yield ChatCall(
                call,
                str(name) if name else None,
                args,
                reply,
                None if reply is None else text_of(reply.get("content")),
            )
