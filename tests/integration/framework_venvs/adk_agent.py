"""The Google ADK side of tests/integration/test_framework_google_adk.py, run in ADK's own venv
(make frameworks): a real ``LlmAgent`` on ADK's ``InMemoryRunner``, whose model is a ``BaseLlm``
subclass that answers from a script (one function call per model call, then a final answer),
guarded by loopwatch's plugin against the broker and topics given on the command line.  It
prints one JSON line: what the model was given back for each call, the final text, the abort."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncGenerator
from typing import Any

os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from google.adk.agents import LlmAgent  # noqa: E402
from google.adk.models.base_llm import BaseLlm  # noqa: E402
from google.adk.models.llm_request import LlmRequest  # noqa: E402
from google.adk.models.llm_response import LlmResponse  # noqa: E402
from google.adk.runners import InMemoryRunner  # noqa: E402
from google.genai import types  # noqa: E402
from venv_side import loopwatch_client, snippet_main  # noqa: E402

from streams.integrations.frameworks.google_adk import LoopwatchPlugin  # noqa: E402

SAME_RESULT = "same page, nothing new"
TICKS = iter(range(1, 1000))


class ScriptedLlm(BaseLlm):
    """A model that calls the scripted tools in order, then answers "done"; it keeps every
    request's contents (what the model was given)."""

    script: list = []
    seen: list = []

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse]:
        self.seen.append(list(llm_request.contents))
        turn = len(self.seen) - 1
        if turn < len(self.script):
            name, args = self.script[turn]
            part = types.Part(function_call=types.FunctionCall(name=name, args=args, id=f"call-{turn}"))
        else:
            part = types.Part(text="done")
        yield LlmResponse(content=types.Content(role="model", parts=[part]))


async def lookup(q: str) -> str:
    """Look a page up."""
    return SAME_RESULT if q == "same" else f"page about {q}"


async def tick(q: str) -> str:
    """A new value every call."""
    return f"tick {next(TICKS)}"


async def flaky(q: str) -> str:
    """Fails every time, the same way."""
    raise RuntimeError(f"backend down for {q}")


def agent(llm: ScriptedLlm, tools: list | None = None) -> LlmAgent:
    return LlmAgent(name="main", model=llm, instruction="Find it.", tools=tools or [lookup, tick])


def seen(contents: list) -> dict[str, Any]:
    """Per call: the function response the model was given."""
    return {
        p.function_response.id: p.function_response.response
        for c in contents
        for p in (c.parts or ())
        if p.function_response is not None
    }


async def drive(runner: InMemoryRunner, text: str) -> list:
    session = await runner.session_service.create_session(app_name=runner.app_name, user_id="u")
    message = types.Content(role="user", parts=[types.Part(text=text)])
    return [e async for e in runner.run_async(user_id="u", session_id=session.id, new_message=message)]


async def main(
    broker: str, tool_calls: str, verdicts: str, calls: list, agent_id: str = "main", session_key: str | None = None,
    snippet: str | None = None, with_flaky: bool = False,
) -> dict:  # fmt: skip
    llm = ScriptedLlm(model="scripted")
    llm.script = [(name, args) for name, args in calls]
    tools = [lookup, tick, flaky] if with_flaky else None
    out: dict[str, Any] = {}
    if snippet is not None:
        events = await snippet_main(snippet, "google-adk")(agent(llm, tools))
    else:
        async with loopwatch_client(broker, tool_calls, verdicts) as client:
            plugin = LoopwatchPlugin(client, agent_id=agent_id, session_key=session_key)
            runner = InMemoryRunner(agent=agent(llm, tools), app_name="loopwatch-test", plugins=[plugin])
            try:
                events = await drive(runner, "Find it.")
            except RuntimeError as error:  # a tool's exception ends an ADK run
                out["error"] = str(error)
                events = []
            if plugin.aborted is not None:
                out["aborted"] = {"message": plugin.aborted.message, "detector": plugin.aborted.detector,
                                  "count": plugin.aborted.count}  # fmt: skip
    texts = [p.text for e in events for p in ((e.content.parts if e.content else None) or ()) if p.text]
    out["final"] = texts[-1] if texts else None
    out["invocation_id"] = events[-1].invocation_id if events else None
    out["model_calls"] = len(llm.seen)
    out["seen"] = seen(llm.seen[-1]) if llm.seen else {}
    out["last_event"] = seen([events[-1].content]) if events and events[-1].content else {}
    return out


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    print(json.dumps(asyncio.run(main(**spec)), default=str))
