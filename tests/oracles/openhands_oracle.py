"""OpenHands' own run loop (the ``openhands-sdk`` package) as the oracle of profile openhands.

Runs in the oracle's venv (``make oracle-openhands``: openhands-sdk needs Python >= 3.12), never
in loopwatch's.  Two commands:

    python openhands_oracle.py generate SESSIONS EXPECTED [N] [SEED]
        random sessions (loops and near-loops) and the oracle's answer at every event;
    python openhands_oracle.py answer SESSIONS
        the oracle's answers for the sessions, one JSON line per session, on stdout.

A session is a list of events with their raw text (the golden traces' format,
tests/data/conformance/openhands/TRACES.md).  Each session is played through the SDK's own
``Conversation.run()``: a scripted ``TestLLM`` (the SDK's) answers each agent step with the
session's next tool calls, reply or empty reply; the session's tools run through real SDK tools
whose executor returns the scripted result or raises the scripted error; a user event is
``send_message()`` then ``run()``.  So OpenHands' own loop decides where the stuck detector is
asked (``_check_stuck_or_nudge``, at the top of each iteration), what an empty reply adds (the
corrective nudge) and that a reply with text finishes the agent (status FINISHED: the loop
exits before its next check).  The answer of a check is recorded on the session event that
completed the step before it.  Two things the session holds that no scripted LLM can say are
done in the agent's step as the SDK's own ``Agent.step`` does them: a condensation is emitted
as the condenser's output is (``on_event(condensation); return``), and a user message that
arrives while the agent still works pauses the run at that step, before the message is sent.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import shutil
import sys
import tempfile
from collections import deque
from collections.abc import Sequence

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")

import logging  # noqa: E402

from openhands.sdk import Conversation  # noqa: E402
from openhands.sdk.agent import Agent  # noqa: E402
from openhands.sdk.conversation.state import ConversationExecutionStatus  # noqa: E402
from openhands.sdk.event.condenser import Condensation  # noqa: E402
from openhands.sdk.llm import Message, MessageToolCall, TextContent  # noqa: E402
from openhands.sdk.testing import TestLLM  # noqa: E402
from openhands.sdk.tool import Action, Observation, Tool, ToolDefinition, ToolExecutor, register_tool  # noqa: E402

logging.disable(logging.CRITICAL)

PATTERNS = {
    "_is_stuck_repeating_action_observation": "openhands_action_observation",
    "_is_stuck_repeating_action_error": "openhands_action_error",
    "_is_stuck_monologue": "openhands_monologue",
    "_is_stuck_alternating_action_observation": "openhands_alternating",
    "_is_stuck_context_window_error": "openhands_context_window",
}


class ToolArgs(Action):
    """A tool call's arguments, compared as OpenHands compares actions (model equality)."""

    args: dict


class ToolResult(Observation):
    """A tool's text result."""


class ScriptedExecutor(ToolExecutor):
    """Returns the scripted outcomes of the step's calls, in call order (the SDK runs a step's
    calls one after another by default); an error is raised, as a failing tool raises."""

    def __init__(self) -> None:
        self.outcomes: deque[dict] = deque()

    def __call__(self, action: ToolArgs, conversation=None) -> ToolResult:  # noqa: ARG002
        outcome = self.outcomes.popleft()
        if outcome["k"] == "error":
            raise ValueError(outcome["text"])
        return ToolResult.from_text(text=outcome["text"])


EXECUTOR = ScriptedExecutor()


def _tool_class(name: str) -> type[ToolDefinition]:
    def create(cls, conv_state=None, **params) -> Sequence[ToolDefinition]:  # noqa: ARG001
        return [
            cls(
                description=f"the session's {name}",
                action_type=ToolArgs,
                observation_type=ToolResult,
                executor=EXECUTOR,
            )
        ]

    cls = type(f"{name.title().replace('_', '')}Tool", (ToolDefinition,), {"create": classmethod(create)})
    cls.name = name
    return cls


TOOLS = ("terminal", "editor", "browser", "grep")  # none that the SDK rewrites (it rewrites file_editor calls)
for _name in TOOLS:
    register_tool(_name, _tool_class(_name))


def _text(text: str) -> list:
    return [TextContent(text=text)] if text else []


def _items(events: list[dict]) -> list[dict]:
    """The session as the agent's steps: one LLM response (its calls and their outcomes, a reply),
    a condensation, or a user message; ``last`` is the index of the step's last event."""
    items: list[dict] = []
    i = 0
    while i < len(events):
        e = events[i]
        if e["k"] == "call":
            calls = []
            while i < len(events) and events[i]["k"] == "call":
                calls.append(events[i])
                i += 1
            outcomes = {}
            while len(outcomes) < len(calls) and i < len(events) and events[i]["k"] in ("result", "error"):
                outcomes[events[i]["id"]] = events[i]
                i += 1
            items.append({"k": "calls", "calls": calls, "outcomes": [outcomes[c["id"]] for c in calls], "last": i - 1})
            continue
        if e["k"] not in ("reply", "user", "condense"):
            raise ValueError(f"unknown or misplaced event kind {e['k']!r}")
        items.append({**e, "last": i})
        i += 1
    return items


def _response(item: dict) -> Message:
    if item["k"] == "reply":
        return Message(role="assistant", content=_text(item["text"]))
    thought = item["calls"][0].get("thought")
    return Message(
        role="assistant",
        content=_text(thought) if thought else [],
        tool_calls=[
            MessageToolCall(id=c["id"], name=c["tool"], arguments=json.dumps({"args": c["args"]}), origin="completion")
            for c in item["calls"]
        ],
    )


class ScriptedAgent(Agent):
    """The SDK's agent, whose step plays the session's next item."""

    @property
    def prompt_dir(self) -> str:  # the SDK's own prompts, not a directory beside this file
        return os.path.join(os.path.dirname(sys.modules[Agent.__module__].__file__), "prompts")

    def step(self, conversation, on_event, on_token=None) -> None:
        run = RUNS[conversation.state.id]
        if run.cursor >= len(run.items) or run.items[run.cursor]["k"] == "user":
            conversation.state.execution_status = ConversationExecutionStatus.PAUSED
            return
        item = run.items[run.cursor]
        if item["k"] == "condense":
            on_event(Condensation(forgotten_event_ids=[], summary=None, llm_response_id=f"r{run.cursor}"))
        else:
            if item["k"] == "calls":
                EXECUTOR.outcomes = deque(item["outcomes"])
            super().step(conversation, on_event, on_token)
        run.done = item["last"]
        run.cursor += 1


RUNS: dict = {}


class Run:
    def __init__(self, events: list[dict]) -> None:
        self.items = _items(events)
        self.steps: list = [None] * len(events)
        self.cursor = 0
        self.done = -1
        responses = [_response(it) for it in self.items if it["k"] in ("calls", "reply")]
        llm = TestLLM.from_messages(responses, model="gpt-4o-mini", usage_id="oracle")
        agent = ScriptedAgent(llm=llm, tools=[Tool(name=name) for name in TOOLS], include_default_tools=[])
        self.workdir = tempfile.mkdtemp(prefix="oh-oracle-")
        self.conversation = Conversation(agent=agent, workspace=self.workdir, visualizer=None)
        RUNS[self.conversation.state.id] = self
        self._spy()

    def _spy(self) -> None:
        detector = self.conversation.stuck_detector
        self.fired: list[str] = []
        for name, pattern in PATTERNS.items():
            method = getattr(detector, name)

            def spy(*args, _method=method, _pattern=pattern):
                found = _method(*args)
                if found and not self.fired:
                    self.fired.append(_pattern)
                return found

            setattr(detector, name, spy)
        nudge_of, stuck_of = detector.get_action_error_nudge, detector.is_stuck

        def nudge():
            found = nudge_of()
            if found is not None and self.done >= 0:
                self.steps[self.done] = [re.match(r"You've called `(.*?)` with", found).group(1), None]
            return found

        def is_stuck():
            self.fired.clear()
            stuck = stuck_of()
            if self.done >= 0:
                self.steps[self.done] = [None, self.fired[0] if stuck else None]
            return stuck

        detector.get_action_error_nudge = nudge
        detector.is_stuck = is_stuck

    def play(self) -> list:
        try:
            while True:
                self.conversation.run()
                status = self.conversation.state.execution_status
                if status == ConversationExecutionStatus.STUCK or self.cursor >= len(self.items):
                    break
                item = self.items[self.cursor]
                if item["k"] != "user":  # a reply that finished the agent, then the agent's next step
                    raise ValueError(f"event {item['last']}: the agent finished; only a user message resumes it")
                self.cursor += 1
                self.done = item["last"]
                self.conversation.send_message(item["text"])
        finally:
            RUNS.pop(self.conversation.state.id, None)
            self.conversation.close()
            shutil.rmtree(self.workdir, ignore_errors=True)
        return self.steps


def answer(session: dict) -> list:
    return Run(session["events"]).play()


# -- the generator -------------------------------------------------------------------------------

RESULTS = ("ok", "file1.txt\nfile2.txt", "", "no match", "Permission denied", "42")
ERRORS = ("Tool 'x' not found", "invalid arguments: missing 'path'", "timeout after 30s")
THOUGHTS = ("Let me look at the files.", "I should run the tests again.", "Trying once more.")
REPLIES = ("I will continue.", "Done.", "Let me think.", "", "   ")


class Gen:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.events: list[dict] = []
        self.calls = 0

    def args(self) -> dict:
        r = self.rng
        args = {"path": r.choice(("/a", "/b", "/c")), "n": r.randint(0, 2)}
        if r.random() < 0.3:
            args["command"] = r.choice(("ls", "pytest", "cat x"))
        if r.random() < 0.5:  # the same arguments in another key order are the same action
            args = dict(reversed(list(args.items())))
        return args

    def call(self, tool=None, args=None, thought=None) -> str:
        self.calls += 1
        cid = f"c{self.calls}"
        self.events.append(
            {
                "k": "call",
                "id": cid,
                "tool": tool or self.rng.choice(TOOLS),
                "args": self.args() if args is None else args,
                "thought": thought,
            }
        )
        return cid

    def outcome(self, cid: str, error: str | None = None, text: str | None = None) -> None:
        if error is not None:
            self.events.append({"k": "error", "id": cid, "text": error})
        else:
            self.events.append({"k": "result", "id": cid, "text": self.rng.choice(RESULTS) if text is None else text})

    def pair(self, tool, args, thought, error=None, text=None) -> None:
        self.outcome(self.call(tool, dict(args), thought), error, text)

    def gap(self) -> None:
        """0 to 3 events that none of the action patterns reads: they stretch a pattern towards
        the edge of OpenHands' 20-event window."""
        for _ in range(self.rng.choice((0, 0, 1, 2, 3))):
            self.events.append(self.rng.choice(({"k": "condense"}, {"k": "reply", "text": ""})))

    def motif(self) -> None:
        r = self.rng
        choice = r.random()
        tool, args = r.choice(TOOLS), self.args()
        thought = r.choice((None, *THOUGHTS))
        if choice < 0.18:  # a repeated action with the same observation (sometimes one differs)
            text = r.choice(RESULTS)
            filler = r.random() < 0.3
            for _ in range(r.randint(2, 6)):
                if filler:
                    self.gap()
                drift = r.random() < 0.1
                self.pair(
                    tool, args, r.choice(THOUGHTS) if drift and thought else thought, text=text + ("!" if drift else "")
                )
        elif choice < 0.34:  # a repeated action that fails
            err = r.choice(ERRORS)
            for _ in range(r.randint(2, 6)):
                self.pair(tool, args, thought, error=err if r.random() < 0.85 else r.choice(ERRORS))
        elif choice < 0.46:  # two actions alternating
            tool2, args2 = r.choice(TOOLS), self.args()
            t1, t2 = r.choice(RESULTS), r.choice(RESULTS)
            filler = r.random() < 0.5
            for i in range(r.randint(2, 8)):
                if filler:
                    self.gap()
                if i % 2 == 0:
                    self.pair(tool, args, thought, text=t1)
                else:
                    self.pair(tool2, args2, None, text=t2 if r.random() < 0.9 else "changed")
        elif choice < 0.58:  # replies, empty or not, with condensations between
            for _ in range(r.randint(1, 5)):
                if r.random() < 0.15:
                    self.events.append({"k": "condense"})
                self.events.append({"k": "reply", "text": r.choice(REPLIES)})
        elif choice < 0.68:  # parallel calls, then their outcomes (sometimes out of order)
            ids = [self.call() for _ in range(r.randint(2, 3))]
            if r.random() < 0.4:
                r.shuffle(ids)
            for cid in ids:
                self.outcome(cid, r.choice(ERRORS) if r.random() < 0.2 else None)
        elif choice < 0.76:
            self.events.append({"k": "user", "text": r.choice(("continue", "try again", "stop looping"))})
        elif choice < 0.80:
            self.events.append({"k": "condense"})
        else:  # ordinary work
            for _ in range(r.randint(1, 4)):
                self.outcome(self.call(), r.choice(ERRORS) if r.random() < 0.15 else None)


def _resumed(events: list[dict]) -> list[dict]:
    """A reply with content finishes the agent: only a user message sets it working again."""
    out: list[dict] = []
    for i, e in enumerate(events):
        out.append(e)
        if e["k"] == "reply" and e["text"].strip() and i + 1 < len(events) and events[i + 1]["k"] != "user":
            out.append({"k": "user", "text": "continue"})
    return out


def generate(n: int, seed: int) -> list[tuple[dict, list]]:
    rng = random.Random(seed)
    out = []
    for s in range(n):
        g = Gen(rng)
        if rng.random() < 0.8:
            g.events.append({"k": "user", "text": "please fix the bug"})
        target = rng.randint(8, 60)
        while len(g.events) < target:
            g.motif()
        g.events = _resumed(g.events)
        session = {"id": f"oh-{s:05d}", "events": g.events}
        steps = answer(session)
        for i, st in enumerate(steps):  # OpenHands stops the agent: the session ends there
            if st is not None and st[1] is not None:
                session["events"] = g.events[: i + 1]
                steps = steps[: i + 1]
                break
        out.append((session, steps))
    return out


def _write(path: str, rows) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":"), ensure_ascii=False) + "\n")


def _read(path: str):
    with gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "generate":
        n = int(argv[3]) if len(argv) > 3 else 600
        seed = int(argv[4]) if len(argv) > 4 else 29
        pairs = generate(n, seed)
        _write(argv[1], (s for s, _ in pairs))
        _write(argv[2], ({"id": s["id"], "steps": steps} for s, steps in pairs))
        return 0
    if len(argv) == 2 and argv[0] == "answer":
        for session in _read(argv[1]):
            sys.stdout.write(json.dumps({"id": session["id"], "steps": answer(session)}, separators=(",", ":")) + "\n")
        return 0
    print("usage: openhands_oracle.py generate SESSIONS EXPECTED [N] [SEED] | answer SESSIONS", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
