"""``loopwatch otlp`` on the real broker and a real worker, fed by a real agent: Pydantic AI's
own agent loop (its ``FunctionModel``, offline) instrumented with its OpenTelemetry capability,
exporting through the OpenTelemetry SDK's OTLP/HTTP exporter (protobuf) to the receiver.

The model calls ``ls(path=".")`` 16 times, each returning the same listing.  What the worker
publishes, by hand from the spec's rules (§2, §3) with warningThreshold 10 and
criticalThreshold 12, for calls that are not gated (the receiver cannot gate: a span closes
after its call ran): calls 1-10 allow silently; call 11 (ten identical calls before it, warning
bucket 1) is warned; call 12 (count 11, same bucket) nothing; call 13 (count 12) is blocked,
and so is every later one (a blocked call is not recorded, so the count stays at 12).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent, InstrumentationSettings
from pydantic_ai import models as pai_models
from pydantic_ai.capabilities import Instrumentation
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import FunctionModel

from harness import REPO, free_port
from harness.kafka import collect
from schemas.verdicts import Decision, decode_verdict

pytestmark = pytest.mark.kafka
pai_models.ALLOW_MODEL_REQUESTS = False  # offline: only the FunctionModel answers

CONFIG = {"tools": {"loopDetection": {"enabled": True, "warningThreshold": 10, "criticalThreshold": 12}}}
CALLS = 16
EXPECTED = [("c11", "warn")] + [(f"c{n}", "block") for n in range(13, CALLS + 1)]


def start_receiver(lw, port: int, *flags: str) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.Popen(
        [sys.executable, "-m", "streams.cli", "otlp", "--bootstrap", lw.broker, "--port", str(port),
         "--tool-calls-topic", lw.names.tool_calls, "--verdicts-topic", lw.names.verdicts, *flags],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    line = proc.stdout.readline()
    assert "observe-only" in line and str(port) in line, (line, proc.poll() is not None and proc.stderr.read())
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def looping_agent(tracer_provider: TracerProvider) -> Agent:
    turns = {"n": 0}

    def respond(messages, info) -> ModelResponse:
        turns["n"] += 1
        if turns["n"] <= CALLS:
            return ModelResponse(parts=[ToolCallPart("ls", {"path": "."}, tool_call_id=f"c{turns['n']}")])
        return ModelResponse(parts=[TextPart("done")])

    settings = InstrumentationSettings(tracer_provider=tracer_provider, include_content=True)
    agent = Agent(FunctionModel(respond), name="lister", capabilities=[Instrumentation(settings=settings)])

    @agent.tool_plain
    def ls(path: str) -> str:
        """List a directory."""
        return "README.md\nsetup.py\nsrc\n"

    return agent


def decisions_of(lw, run_id: str, want: int) -> list[tuple[str, str]]:
    def of_run(records: list) -> list[Decision]:
        verdicts = (decode_verdict(r.value) for r in records)
        return [v for v in verdicts if isinstance(v, Decision) and v.run_id == run_id]

    records = asyncio.run(collect(lw.broker, lw.names.verdicts, until=lambda rs: len(of_run(rs)) >= want, settle=2))
    return [(d.tool_call_id, d.action) for d in of_run(records)]


def test_pydantic_ai_tool_spans_are_warned_then_blocked_through_the_receiver(lw):
    lw.configured_worker(CONFIG)
    port = free_port()
    receiver = start_receiver(lw, port, "--run-from", "attribute:gen_ai.conversation.id")
    try:
        seen = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({"service.name": "lister-service"}))
        provider.add_span_processor(SimpleSpanProcessor(seen))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")))
        assert looping_agent(provider).run_sync("list it again and again").output == "done"
        assert provider.force_flush(30_000)
        provider.shutdown()
        tool_spans = [
            s for s in seen.get_finished_spans() if s.attributes.get("gen_ai.operation.name") == "execute_tool"
        ]
        assert len(tool_spans) == CALLS
        conversation = tool_spans[0].attributes["gen_ai.conversation.id"]

        assert decisions_of(lw, conversation, len(EXPECTED)) == EXPECTED

        status = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10))
        assert status["tool_spans"] == CALLS and status["gates"] is False
        assert status["other_spans"] >= CALLS  # the model requests and the agent run
        assert status["without_arguments"] == 0 and status["undelivered"] == 0
    finally:
        stop(receiver)


def test_json_exports_go_by_trace_and_spans_without_arguments_are_counted_not_taken(lw):
    lw.configured_worker(CONFIG)
    port = free_port()
    receiver = start_receiver(lw, port)
    trace = "5b8efff798038103d269b633813fc60c"

    def span(n: int, with_args: bool = True) -> dict:
        attributes = [
            {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
            {"key": "gen_ai.tool.name", "value": {"stringValue": "search"}},
            {"key": "gen_ai.tool.call.id", "value": {"stringValue": f"j{n}"}},
            {"key": "gen_ai.tool.call.result", "value": {"stringValue": '{"hits": []}'}},
        ]
        if with_args:
            # the same arguments, their keys in another order every other call: hashed alike
            text = '{"q": "x", "page": 1}' if n % 2 else '{"page": 1, "q": "x"}'
            attributes.append({"key": "gen_ai.tool.call.arguments", "value": {"stringValue": text}})
        return {"traceId": trace, "spanId": f"{n:016x}", "name": "execute_tool search", "attributes": attributes,
                "endTimeUnixNano": str(1_700_000_000_000_000_000 + n * 1_000_000)}  # fmt: skip

    try:
        spans = [span(n) for n in range(1, CALLS + 1)] + [span(100, with_args=False)]
        body = json.dumps({"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": spans}]}]})
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/traces", data=body.encode(), headers={"Content-Type": "application/json"}
        )
        assert json.load(urllib.request.urlopen(request, timeout=10)) == {}

        expected = [(call.replace("c", "j"), action) for call, action in EXPECTED]
        assert decisions_of(lw, trace, len(expected)) == expected

        status = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10))
        assert (status["tool_spans"], status["without_arguments"]) == (CALLS, 1)

        bad = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/traces", data=b"[1, 2", headers={"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(bad, timeout=10)
        assert refused.value.code == 400 and b"not an OTLP JSON trace export" in refused.value.read()
    finally:
        stop(receiver)
