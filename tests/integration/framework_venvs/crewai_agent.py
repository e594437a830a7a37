"""The CrewAI side of tests/integration/test_framework_crewai.py, run in CrewAI's own venv
(make frameworks): a real ``Crew`` whose one agent's model is a ``BaseLLM`` subclass that
answers from a script (one tool call per model call, then a final answer), guarded by
loopwatch's adapter against the broker and topics given on the command line.  The model calls
tools natively (OpenAI-style tool calls) or, with ``react``, as a model without function
calling does: in text ("Action:" / "Action Input:"), which CrewAI parses and runs on a path of
its own.  It prints one JSON line: what the model was given back for each call, the final
output or the abort."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from typing import Any

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from crewai import Agent, Crew, Task  # noqa: E402
from crewai.llms.base_llm import BaseLLM  # noqa: E402
from crewai.tools import tool  # noqa: E402
from venv_side import loopwatch_client, snippet_main  # noqa: E402

from schemas.errors import LoopwatchError  # noqa: E402
from streams.integrations.frameworks.crewai import Loopwatch, LoopwatchRunAborted  # noqa: E402

SAME_RESULT = "same page, nothing new"


class ScriptedLLM(BaseLLM):
    """A model that calls the scripted tools in order (OpenAI-style tool calls, CrewAI's
    native function calling; with ``react``, ReAct text), then answers "done"; it keeps every
    message list it was given."""

    script: list[tuple[str, dict]] = []
    seen: list[list[dict]] = []
    react: bool = False

    def call(self, messages: Any, tools=None, callbacks=None, available_functions=None, from_task=None,
             from_agent=None, response_model=None) -> Any:  # fmt: skip
        self.seen.append([dict(m) for m in messages] if isinstance(messages, list) else [{"content": messages}])
        turn = len(self.seen) - 1
        if turn < len(self.script):
            name, args = self.script[turn]
            if self.react:
                return f"Thought: I should look it up.\nAction: {name}\nAction Input: {json.dumps(args)}"
            return [{"id": f"call-{turn}", "type": "function",
                     "function": {"name": name, "arguments": json.dumps(args)}}]  # fmt: skip
        return "Thought: I now know the final answer\nFinal Answer: done" if self.react else "done"

    def supports_function_calling(self) -> bool:
        return not self.react


@tool("lookup")
def lookup(q: str) -> str:
    """Look a page up."""
    return SAME_RESULT if q == "same" else f"page about {q}"


TICKS = iter(range(1, 1000))


@tool("tick")
def tick(q: str) -> str:
    """A new value every call."""
    return f"tick {next(TICKS)}"


@tool("flaky")
def flaky(q: str) -> str:
    """Fails every time, the same way."""
    raise RuntimeError(f"backend down for {q}")


def tool_results(messages: list[dict]) -> dict[str, str]:
    return {m["tool_call_id"]: str(m.get("content")) for m in messages if m.get("role") == "tool"}


# Every third tool use, CrewAI's ReAct path appends its format reminder (the "tools" slice of
# its translations) to the observation; it is CrewAI's text, not the call's answer.
REMINDER = re.compile(r"\n\nYou ONLY have access to the following tools.*?original input question\n```", re.S)


def observations(messages: list[dict]) -> dict[str, str]:
    """Per call, in order (ReAct calls have no id: ``call-<n>``): the observation the model
    was given, CrewAI's format reminder left out."""
    found = [
        str(m.get("content")).split("\nObservation: ", 1)[1]
        for m in messages
        if m.get("role") == "assistant" and "\nObservation: " in str(m.get("content"))
    ]
    return {f"call-{n}": REMINDER.sub("", text).strip() for n, text in enumerate(found)}


def crew(llm: ScriptedLLM) -> Crew:
    agent = Agent(role="researcher", goal="find it", backstory="a test", llm=llm, tools=[lookup, tick, flaky],
                  max_iter=100, verbose=False)  # fmt: skip
    task = Task(description="Find it.", expected_output="an answer", agent=agent)
    return Crew(agents=[agent], tasks=[task], verbose=False)


async def main(
    broker: str, tool_calls: str, verdicts: str, calls: list, agent_id: str = "main", session_key: str | None = None,
    snippet: str | None = None, react: bool = False,
) -> dict:  # fmt: skip
    llm = ScriptedLLM(model="scripted")
    llm.script = [(name, args) for name, args in calls]
    llm.react = react
    out: dict[str, Any] = {}
    try:
        if snippet is not None:
            result = await snippet_main(snippet, "crewai")(crew(llm))
        else:
            async with loopwatch_client(broker, tool_calls, verdicts) as client:
                result = await Loopwatch(client, agent_id=agent_id, session_key=session_key).kickoff(crew(llm))
        out["output"] = str(result.raw)
    except LoopwatchRunAborted as aborted:
        out["aborted"] = {"message": aborted.message, "detector": aborted.detector, "count": aborted.count,
                          "loopwatch_error": isinstance(aborted, LoopwatchError)}  # fmt: skip
    out["model_calls"] = len(llm.seen)
    out["seen"] = ((observations if react else tool_results)(llm.seen[-1])) if llm.seen else {}
    return out


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    print(json.dumps(asyncio.run(main(**spec))))
