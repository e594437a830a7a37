"""OpenHands' own StuckDetector (the ``openhands-sdk`` package) as the oracle of profile openhands.

Runs in the oracle's venv (``make oracle-openhands``: openhands-sdk needs Python >= 3.12), never
in loopwatch's.  Two commands:

    python openhands_oracle.py generate SESSIONS EXPECTED [N] [SEED]
        random sessions (loops and near-loops) and the oracle's answer at every event;
    python openhands_oracle.py answer SESSIONS
        the oracle's answers for the sessions, one JSON line per session, on stdout.

A session is a list of events with their raw text (the golden traces' format,
tests/data/conformance/openhands/TRACES.md).  Each is appended to a real ``ConversationState``
as the OpenHands event it stands for, and the detector is asked exactly where OpenHands' run
loop asks (``LocalConversation._check_stuck_or_nudge``): before the agent's next step, i.e.
after an event that leaves no call of the step without its outcome.  As the run loop does,
the nudge is asked first and, when there is one, added to the history as a framework message;
an empty reply is followed by the agent's corrective feedback (``_send_corrective_nudge``).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import sys
import uuid

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")

import logging  # noqa: E402

from openhands.sdk.agent import Agent  # noqa: E402
from openhands.sdk.conversation.state import ConversationState  # noqa: E402
from openhands.sdk.conversation.stuck_detector import StuckDetector  # noqa: E402
from openhands.sdk.event import ActionEvent, AgentErrorEvent, MessageEvent, ObservationEvent  # noqa: E402
from openhands.sdk.event.condenser import Condensation  # noqa: E402
from openhands.sdk.llm import LLM, Message, MessageToolCall, TextContent  # noqa: E402
from openhands.sdk.tool import Action, Observation  # noqa: E402
from openhands.sdk.workspace import LocalWorkspace  # noqa: E402

logging.disable(logging.WARNING)

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


_AGENT = None


def _state() -> ConversationState:
    global _AGENT
    if _AGENT is None:
        _AGENT = Agent(llm=LLM(model="gpt-4o-mini", usage_id="oracle"))
    return ConversationState.create(id=uuid.uuid4(), agent=_AGENT, workspace=LocalWorkspace(working_dir="/tmp"))


def _text(text: str) -> list:
    return [TextContent(text=text)] if text else []


class Oracle:
    def __init__(self) -> None:
        self.state = _state()
        self.detector = StuckDetector(self.state)
        self.fired: list[str] = []
        for name, pattern in PATTERNS.items():
            method = getattr(self.detector, name)

            def spy(*args, _method=method, _pattern=pattern):
                found = _method(*args)
                if found and not self.fired:
                    self.fired.append(_pattern)
                return found

            setattr(self.detector, name, spy)
        self.calls: dict[str, ActionEvent] = {}
        self.pending = 0
        self.n = 0

    def _add(self, event) -> None:
        self.state.events.append(event)

    def _framework_message(self, text: str) -> None:
        self._add(
            MessageEvent(source="environment", llm_message=Message(role="user", content=[TextContent(text=text)]))
        )

    def step(self, e: dict):
        """Append one session event; the oracle's answer where OpenHands checks, else None."""
        k = e["k"]
        self.n += 1
        if k == "call":
            thought = e.get("thought")
            action = ActionEvent(
                source="agent",
                thought=_text(thought) if thought is not None else [],
                action=ToolArgs(args=e["args"]),
                tool_name=e["tool"],
                tool_call_id=e["id"],
                tool_call=MessageToolCall(
                    id=e["id"], name=e["tool"], arguments=json.dumps(e["args"]), origin="completion"
                ),
                llm_response_id=f"r{self.n}",
            )
            self.calls[e["id"]] = action
            self.pending += 1
            self._add(action)
            return None
        if k in ("result", "error"):
            action = self.calls[e["id"]]
            self.pending = max(0, self.pending - 1)
            if k == "error":
                self._add(AgentErrorEvent(error=e["text"], tool_name=action.tool_name, tool_call_id=e["id"]))
            else:
                self._add(
                    ObservationEvent(
                        source="environment",
                        observation=ToolResult.from_text(text=e["text"]),
                        action_id=action.id,
                        tool_name=action.tool_name,
                        tool_call_id=e["id"],
                    )
                )
            if self.pending:
                return None
        elif k == "reply":
            self._add(MessageEvent(source="agent", llm_message=Message(role="assistant", content=_text(e["text"]))))
            if not e["text"].strip():  # classify_response: EMPTY; the agent's corrective feedback follows
                self._framework_message("[corrective feedback]")
            self.pending = 0
        elif k == "user":
            self._add(MessageEvent(source="user", llm_message=Message(role="user", content=_text(e["text"]))))
        elif k == "condense":
            self._add(Condensation(forgotten_event_ids=[], summary=None, llm_response_id=f"r{self.n}"))
        else:
            raise ValueError(f"unknown event kind {k!r}")
        return self.check()

    def check(self) -> list:
        """``_check_stuck_or_nudge``: [the nudged tool or None, the stuck pattern or None]."""
        nudge = self.detector.get_action_error_nudge()
        if nudge is not None:
            self._framework_message(nudge)
            return [re.match(r"You've called `(.*?)` with", nudge).group(1), None]
        self.fired.clear()
        stuck = self.detector.is_stuck()
        return [None, self.fired[0] if stuck else None]


def answer(session: dict) -> list:
    oracle = Oracle()
    return [oracle.step(e) for e in session["events"]]


# -- the generator -------------------------------------------------------------------------------

TOOLS = ("terminal", "file_editor", "browser", "grep")
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
