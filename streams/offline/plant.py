"""``loopwatch plant``: real recorded runs with one loop planted into a seeded fraction of them,
so loop rules can be chosen and checked on data that has loops (the recorded sets hold almost
none).

The core is sans-I/O: ``plant_run(events, rng)`` is a pure function of one run's events (as
``loopwatch import`` writes them) and a ``random.Random``; ``plant_runs`` chooses the runs to
plant from the seed.  Planted calls are built with ``streams.edge.events`` from raw arguments
and results, so they hash exactly as a runner's (or an importer's) calls do.

Where a loop goes: before the call with index ``start`` (0: before the run's first call; the
run's call count: after its last), drawn uniformly.  Its length (calls) is drawn uniformly
from ``LENGTHS`` (3 to 12) and its shape uniformly from ``SHAPES``:

* ``failing-edit``: the identical edit k times, each failing with the identical error.
* ``identical-command``: the identical command k times with the identical output.
* ``edit-test``: an edit and a test alternating, neither changing anything (ping-pong).
* ``poll``: a poll of a background process with no progress (``process`` action ``poll``,
  the known poll of spec §2.8), k times.
* ``near-identical``: one command with its arguments varied in ways that do not change what
  it does (whitespace, flag order, an added ``-la``), the identical output each time.
* ``cycle-3``: three calls repeated in a cycle, each with its identical output.

The planted run's ``run.ended`` reason becomes ``planted:<shape>:<start>:<length>`` (at most
256 characters, the reason's bound; a run with no ``run.ended`` gets one): the label travels
with the events, no schema field or side file is added, and ``loopwatch evaluate`` counts such
a run unsuccessful.  Runs not chosen (the background) are written unchanged, labels and
endings included.  Planted events take the run's ids from its events and the time of the event
before them, and event ids ``plant-<digest of the run>-<n>`` that no real event has.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from schemas.events import RunEnded, ToolCallCompleted, ToolCallRequested

from ..edge.events import completed_event, requested_event, run_ended_event

__all__ = ["LENGTHS", "PLANTED", "SHAPES", "Planted", "choose_runs", "parse_planted", "plant_run", "plant_runs"]

SHAPES = ("failing-edit", "identical-command", "edit-test", "poll", "near-identical", "cycle-3")
LENGTHS = (3, 12)
"""The loop's length in calls, drawn uniformly from this closed range."""
PLANTED = "planted:"
_REASON = re.compile(r"planted:([a-z0-9-]+):(\d{1,9}):(\d{1,4})")
_WORDS = ("parser", "config", "utils", "models", "views", "core", "io", "fields", "query", "forms")


@dataclass(frozen=True, slots=True)
class Planted:
    """Where a loop was planted: the index of its first call among the run's calls, its length
    (calls) and its shape."""

    start: int
    length: int
    shape: str

    @property
    def reason(self) -> str:
        return f"{PLANTED}{self.shape}:{self.start}:{self.length}"


def parse_planted(reason: str | None) -> Planted | None:
    """The planted loop a ``run.ended`` reason records (None: not a planted run)."""
    if reason is None or not reason.startswith(PLANTED):
        return None
    match = _REASON.fullmatch(reason)
    if match is None or match.group(1) not in SHAPES:
        return None
    return Planted(int(match.group(2)), int(match.group(3)), match.group(1))


def _calls(rng: random.Random, shape: str, length: int, tool: str) -> list[tuple[str, Any, Any, bool]]:
    """The loop's calls: ``(tool, args, result or error text, is an error)``."""
    word = rng.choice(_WORDS)
    tag = f"{rng.randrange(16**6):06x}"
    path = f"src/{word}_{tag}.py"
    shell = tool == "bash"

    def call(command: str, output: str, error: bool = False) -> tuple[str, Any, Any, bool]:
        if shell:
            code = 1 if error else 0
            return (
                tool,
                {"command": command},
                f"<returncode>{code}</returncode>\n<output>\n{output}\n</output>",
                error,
            )
        return (tool, {"request": command}, output, error)

    if shape == "failing-edit":
        edit = call(f"sed -i 's/{word}_old/{word}_new/' {path}", f"sed: can't read {path}: No such file", True)
        return [edit] * length
    if shape == "identical-command":
        return [call(f"python -m pytest tests/test_{word}.py -x -q", f"1 failed, 3 passed ({tag})")] * length
    if shape == "edit-test":
        edit = call(f"sed -i 's/return {word}/return {word}  # fix/' {path}", "")
        test = call(f"python reproduce_{word}.py", f"AssertionError: {tag}", True)
        return [(edit, test)[i % 2] for i in range(length)]
    if shape == "poll":
        args = {"action": "poll", "sessionId": f"proc-{tag}"}
        return [("process", args, {"content": [{"type": "text", "text": "still running, no new output"}]}, False)] * (
            length
        )
    if shape == "near-identical":
        forms = (
            f"ls -l src/{word}",
            f"ls  -l src/{word}",
            f"ls -l  src/{word}",
            f"ls -la src/{word}",
            f"ls -al src/{word}",
            f"ls -l -a src/{word}",
            f"ls -a -l src/{word}",
            f"ls -l src/{word}/",
        )
        listing = f"total 8\n-rw-r--r-- 1 dev dev 412 {word}_{tag}.py"
        return [call(forms[i % len(forms)], listing) for i in range(length)]
    if shape == "cycle-3":
        three = (
            call(f"cat {path}", f"def {word}():\n    return None  # {tag}"),
            call(f"python reproduce_{word}.py", f"TypeError: {tag}", True),
            call(f"grep -n {word} {path}", f"1:def {word}():"),
        )
        return [three[i % 3] for i in range(length)]
    raise ValueError(f"unknown shape {shape!r}")


def _event_id(events: Sequence[Any], n: int) -> str:
    first = events[0] if events else None
    seed = "\0".join(str(getattr(first, f, None)) for f in ("run_id", "session_key", "session_id", "event_id"))
    return f"plant-{hashlib.sha256(seed.encode()).hexdigest()[:16]}-{n}"


def plant_run(
    events: Sequence[Any], rng: random.Random, *, shape: str | None = None, length: int | None = None
) -> tuple[list[Any], Planted]:
    """One run's events with one loop planted (module docstring), and where.  ``shape`` and
    ``length`` fix what is otherwise drawn; the draws are, in order: shape, length, position,
    then the loop's words."""
    if shape is None:
        shape = rng.choice(SHAPES)
    elif shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}")
    if length is None:
        length = rng.randint(*LENGTHS)
    requested_at = [i for i, e in enumerate(events) if type(e) is ToolCallRequested]
    start = rng.randint(0, len(requested_at))
    end_at = next((i for i, e in enumerate(events) if type(e) is RunEnded), len(events))
    at = requested_at[start] if start < len(requested_at) else end_at
    at = min(at, end_at)
    tools = [e.tool_name for e in events if type(e) is ToolCallCompleted]
    tool = max(set(tools), key=lambda t: (tools.count(t), t)) if tools else "bash"
    near = events[at - 1] if at else (events[0] if events else None)
    ids = {f: getattr(near, f, None) for f in ("run_id", "session_key", "session_id", "agent_id")}
    ts = getattr(near, "ts_ms", 0) or 0
    planted = []
    for n, (name, args, result, error) in enumerate(_calls(rng, shape, length, tool)):
        event_id = _event_id(events, n)
        planted.append(requested_event(event_id, name, args, ts_ms=ts, **ids))
        if error:
            done = completed_event(f"{event_id}r", name, args, error=result, ts_ms=ts, **ids)
        else:
            done = completed_event(f"{event_id}r", name, args, result=result, ts_ms=ts, **ids)
        planted.append(done)
    where = Planted(start, length, shape)
    out = [*events[:at], *planted]
    rest = list(events[at:])
    ending = next((e for e in rest if type(e) is RunEnded), None)
    if ending is None:
        last_ts = max([ts, *(getattr(e, "ts_ms", 0) or 0 for e in rest)])
        out.extend(rest)
        out.append(run_ended_event(_event_id(events, length), where.reason, ts_ms=last_ts, **ids))
    else:
        for e in rest:
            if e is ending:
                e = msgspec.structs.replace(e, reason=where.reason)
            out.append(e)
    return out, where


def choose_runs(count: int, fraction: float, rng: random.Random) -> list[int]:
    """The indexes (sorted) of ``round(fraction * count)`` of ``count`` runs, drawn without
    replacement."""
    return sorted(rng.sample(range(count), round(fraction * count)))


def plant_runs(
    runs: Sequence[Sequence[Any]], seed: int, fraction: float
) -> tuple[list[list[Any]], list[Planted | None]]:
    """Every run, a seeded ``fraction`` of them with a loop planted (in their order): the runs'
    events and, per run, where its loop is (None: background).  One ``random.Random(seed)``
    draws the runs, then each planted run's loop in the runs' order."""
    rng = random.Random(seed)
    chosen = set(choose_runs(len(runs), fraction, rng))
    out: list[list[Any]] = []
    where: list[Planted | None] = []
    for i, events in enumerate(runs):
        if i in chosen:
            planted, at = plant_run(events, rng)
            out.append(planted)
            where.append(at)
        else:
            out.append(list(events))
            where.append(None)
    return out, where
