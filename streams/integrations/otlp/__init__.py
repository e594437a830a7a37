"""``loopwatch otlp``: an OTLP/HTTP receiver for OpenTelemetry GenAI ``execute_tool`` spans.

Many agent platforms already emit a span per tool call (the GenAI semantic conventions:
``gen_ai.operation.name = execute_tool``, ``gen_ai.tool.name``, and, opt-in, the call's
arguments and result).  The receiver turns each such span into loopwatch's two edge events
(``tool_call.requested`` and ``tool_call.completed``), hashed here, so no raw argument or
result is stored or forwarded, and publishes them on ``tool-calls``: the worker detects loops,
publishes verdicts and aborts, and exports its metrics as for any runner.

It only observes.  A span is exported after its call has run, so nothing can be gated or
refused through it; a verdict reaches whoever reads ``loop-verdicts`` (dashboards, alerts, a
runner that also uses the client).
"""

from .receiver import OtlpReceiver, ReceiverOptions
from .spans import SpanDecodeError, ToolSpan, decode_json, decode_protobuf, tool_spans

__all__ = [
    "OtlpReceiver",
    "ReceiverOptions",
    "SpanDecodeError",
    "ToolSpan",
    "decode_json",
    "decode_protobuf",
    "tool_spans",
]
