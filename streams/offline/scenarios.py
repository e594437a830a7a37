"""Simulated agent runs: healthy work and each kind of loop, as runner-side tool calls.

The example traces, ``loopwatch demo``'s fleet and the benchmarks all draw from here, and
every event is built by ``streams.edge.events`` exactly as a runner would build it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from schemas.events import ToolCallEvent

from ..edge.events import compaction_event, completed_event, requested_event, run_ended_event

SCENARIOS = (
    "healthy",
    "polling_loop",
    "ping_pong",
    "generic_repeat",
    "unknown_tool",
    "post_compaction",
    "send_loop",
    "cycle_loop",
)


@dataclass(frozen=True)
class Call:
    tool: str
    args: object
    result: object = None
    error: object = None


def _text(text: str, **details) -> dict:
    return {"content": [{"type": "text", "text": text}], "details": details}


def scenario_calls(kind: str, rng: random.Random, length: int) -> Iterator[Call | str]:
    """Tool calls of one run; the string "compaction" marks a compaction-then-retry."""
    if kind == "healthy":
        for i in range(length):
            tool = rng.choice(("read", "write", "list", "web_search", "exec"))
            if tool == "exec":
                yield Call(
                    "exec",
                    {"command": f"pytest -k case_{i}"},
                    _text(
                        "ok", status="completed", exitCode=0, aggregated=f"{i} passed", durationMs=rng.randint(5, 900)
                    ),
                )
            else:
                yield Call(tool, {"path": f"/src/file_{i}.py"}, _text(f"content {i} {rng.random():.6f}", ok=True))
    elif kind == "polling_loop":
        yield Call(
            "exec",
            {"command": "npm run build", "background": True},
            _text("Command still running (session s1, pid 4242)", status="running", sessionId="s1", pid=4242, tail=""),
        )
        for _ in range(length - 1):
            yield Call(
                "process",
                {"action": "poll", "sessionId": "s1"},
                _text("(no new output)\n\nProcess still running.", status="running", aggregated="steady"),
            )
    elif kind == "ping_pong":
        for i in range(length):
            if i % 2 == 0:
                yield Call("read", {"path": "/etc/app.conf"}, _text("port=8080", ok=True))
            else:
                yield Call("list", {"dir": "/etc"}, _text("app.conf", ok=True))
    elif kind == "generic_repeat":
        for _ in range(length):
            yield Call("web_search", {"query": "latest release notes"}, _text("no results", ok=True))
    elif kind == "unknown_tool":
        for i in range(length):
            yield Call("browser", {"url": f"https://example.invalid/{i}"}, error="Unknown tool: browser")
    elif kind == "post_compaction":
        for i in range(length // 2):
            yield Call("read", {"path": f"/docs/part_{i}.md"}, _text(f"part {i}", ok=True))
        yield "compaction"
        for _ in range(length - length // 2):
            yield Call("gateway", {"action": "lookup", "path": "cron.maxConcurrentRuns"}, _text("same schema", ok=True))
    elif kind == "send_loop":
        for i in range(length):
            yield Call(
                "message",
                {"action": "send", "target": "slack:#ops", "text": "deploy finished?"},
                _text(f"sent {i}", ok=True, channel="slack", messageId=f"m{i}", ts=1700000000 + i),
            )
    elif kind == "cycle_loop":  # read, edit, test, read, ... and the test keeps failing the same way
        cycle = (
            Call("read", {"path": "/src/app.py"}, _text("def main(): ...", ok=True)),
            Call("edit", {"path": "/src/app.py", "old": "x = 1", "new": "x = 2"}, _text("no change", ok=True)),
            Call(
                "exec",
                {"command": "pytest tests/test_app.py"},
                _text("1 failed", status="completed", exitCode=1, aggregated="1 failed"),
            ),
        )
        for i in range(length):
            yield cycle[i % 3]
    else:
        raise ValueError(f"unknown scenario {kind!r}")


def run_events(
    kind: str,
    run_id: str,
    *,
    seed: int = 0,
    length: int = 30,
    agent_id: str | None = "main",
    session_key: str | None = None,
    gate: bool = False,
    end: bool = True,
    start_ms: int = 1_700_000_000_000,
) -> Iterator[ToolCallEvent]:
    """The events a runner publishes for one simulated run (requested, completed, …)."""
    rng = random.Random(f"{seed}:{run_id}")
    session_key = session_key or f"agent:{agent_id}:{run_id}"
    common = {"run_id": run_id, "session_key": session_key, "agent_id": agent_id}
    ts = start_ms
    for n, call in enumerate(scenario_calls(kind, rng, length)):
        ts += rng.randint(50, 2000)
        if call == "compaction":
            yield compaction_event(f"{run_id}:{n}:compaction", ts_ms=ts, **common)
            continue
        call_id = f"call_{n}"
        yield requested_event(
            f"{run_id}:{n}:req", call.tool, call.args, tool_call_id=call_id, gate=gate, ts_ms=ts, **common
        )
        outcome = {"error": call.error} if call.error is not None else {"result": call.result}
        yield completed_event(
            f"{run_id}:{n}:done", call.tool, call.args, tool_call_id=call_id, ts_ms=ts + 1, **outcome, **common
        )
    if end:
        yield run_ended_event(f"{run_id}:end", reason="completed", ts_ms=ts + 2, **common)


def obey(events: Iterator[ToolCallEvent], engine) -> Iterator[ToolCallEvent]:
    """What a runner that follows loopwatch's verdicts publishes: a blocked call is not run
    (its completion is the loop's own veto, which never hashes), and an aborted run stops
    with ``run.ended``.  ``engine`` is a ``LoopEngine`` answering as the worker would."""
    from schemas.events import ToolCallCompleted, ToolCallRequested

    from ..engine import RunDriver, state_key

    runs = RunDriver(engine)
    blocked: set[tuple[str, str | None]] = set()
    ended: set[str] = set()
    for event in events:
        key = state_key(event)  # the run's (under session scope the driver keys its state by session)
        if key in ended:
            continue
        if isinstance(event, ToolCallCompleted) and (key, event.tool_call_id) in blocked:
            event = ToolCallCompleted(
                event_id=event.event_id,
                run_id=event.run_id,
                session_key=event.session_key,
                session_id=event.session_id,
                agent_id=event.agent_id,
                ts_ms=event.ts_ms,
                tool_call_id=event.tool_call_id,
                tool_name=event.tool_name,
                args_hash=event.args_hash,
                near_args_hash=event.near_args_hash,
                loop_veto=True,
            )
        step = runs.handle(event)
        yield event
        if isinstance(event, ToolCallRequested) and step.decision is not None and step.decision.action == "block":
            blocked.add((key, event.tool_call_id))
        if step.abort is not None:
            ended.add(key)
            yield run_ended_event(
                f"{event.event_id}:ended",
                reason="aborted",
                run_id=event.run_id,
                session_key=event.session_key,
                agent_id=event.agent_id,
                ts_ms=event.ts_ms + 1,
            )


FLEET_MIX = {
    "healthy": 0.50,
    "polling_loop": 0.12,
    "generic_repeat": 0.10,
    "ping_pong": 0.10,
    "send_loop": 0.08,
    "unknown_tool": 0.05,
    "post_compaction": 0.05,
}
"""The benchmarks' fleet: half the runs are healthy, the rest loop in every way upstream knows."""


def fleet_trace(
    runs: int,
    calls_per_run: int,
    *,
    seed: int = 7,
    mix: dict[str, float] | None = None,
    run_prefix: str = "run",
    gate: bool = False,
    start_ms: int = 1_700_000_000_000,
    end: bool = False,
    engine=None,
) -> tuple[list[ToolCallEvent], dict[str, str]]:
    """Interleaved runs as obedient runners publish them (``obey`` with ``engine``), and the
    scenario of each run by state key.  Runs progress concurrently: each event comes from
    a random live run."""
    from ..engine import engine_for

    rng = random.Random(seed)
    mix = mix or FLEET_MIX
    kinds = rng.choices(list(mix), weights=list(mix.values()), k=runs)
    names = [f"{run_prefix}-{n:05d}" for n in range(runs)]
    streams = [
        iter(
            run_events(
                kind, name, seed=seed, length=calls_per_run, agent_id="main", gate=gate, end=end, start_ms=start_ms
            )
        )
        for name, kind in zip(names, kinds)
    ]

    def interleaved() -> Iterator[ToolCallEvent]:
        live = list(range(runs))
        while live:
            i = rng.randrange(len(live))
            event = next(streams[live[i]], None)
            if event is None:
                live[i] = live[-1]
                live.pop()
            else:
                yield event

    engine = engine or engine_for({"tools": {"loopDetection": {"enabled": True}}})
    kind_of = {f"run:{name}": kind for name, kind in zip(names, kinds)}
    return list(obey(interleaved(), engine)), kind_of


# -- fleet-wide scenarios: what no single run shows ---------------------------------------


def _at(event_ms: int, i: int) -> int:
    return event_ms + 100 * i


def session_loop(
    session_key: str = "agent:main:support-42",
    *,
    runs: int = 3,
    calls_per_run: int = 8,
    gate: bool = False,
    start_ms: int = 1_700_000_000_000,
) -> list[ToolCallEvent]:
    """One session whose loop outlives its runs: the same read with the same result,
    ``calls_per_run`` times in each of ``runs`` runs (a compaction or a restart starts the
    next run, OpenClaw issue #126545).  No run loops long enough on its own."""
    events: list[ToolCallEvent] = []
    n = 0
    for r in range(runs):
        common = {"run_id": f"{session_key}/run-{r + 1}", "session_key": session_key, "agent_id": "main"}
        for _ in range(calls_per_run):
            call = f"call_{n}"
            args = {"path": "/var/log/app/errors.log"}
            events.append(
                requested_event(
                    f"sess-{n}:req", "read", args, tool_call_id=call, gate=gate, ts_ms=_at(start_ms, 2 * n), **common
                )
            )
            events.append(
                completed_event(
                    f"sess-{n}:done",
                    "read",
                    args,
                    tool_call_id=call,
                    result=_text("ERROR connection refused", ok=True),
                    ts_ms=_at(start_ms, 2 * n + 1),
                    **common,
                )
            )
            n += 1
        events.append(
            run_ended_event(f"sess-run-{r + 1}:end", reason="compacted", ts_ms=_at(start_ms, 2 * n), **common)
        )
    return events


def agent_ring(
    trace_id: str = "trace-standup",
    *,
    agents: int = 3,
    rounds: int = 6,
    gate: bool = False,
    start_ms: int = 1_700_000_000_000,
) -> list[ToolCallEvent]:
    """Agents messaging each other in a ring (OpenClaw issue #37842): agent i sends agent i+1 the
    same message and gets the same answer, round after round, each in its own run."""
    events: list[ToolCallEvent] = []
    names = [f"agent:ring-{i}:{trace_id}" for i in range(agents)]
    n = 0
    for _rnd in range(rounds):
        for i in range(agents):
            target = names[(i + 1) % agents]
            common = {
                "run_id": f"{names[i]}/run",
                "session_key": names[i],
                "agent_id": f"ring-{i}",
                "trace_id": trace_id,
            }
            args = {"sessionKey": target, "message": "Any update on the stand-up notes?"}
            result = _text("Not yet, I will ask the next agent.", status="ok")
            call = f"call_{n}"
            events.append(
                requested_event(
                    f"{trace_id}-{n}:req",
                    "sessions_send",
                    args,
                    tool_call_id=call,
                    gate=gate,
                    target=target,
                    ts_ms=_at(start_ms, 2 * n),
                    **common,
                )
            )
            events.append(
                completed_event(
                    f"{trace_id}-{n}:done",
                    "sessions_send",
                    args,
                    tool_call_id=call,
                    result=result,
                    target=target,
                    ts_ms=_at(start_ms, 2 * n + 1),
                    **common,
                )
            )
            n += 1
    return events


def tool_outage(
    tool: str = "web_search",
    *,
    runs: int = 30,
    agents: int = 5,
    calls_per_run: int = 2,
    failing: bool = True,
    gate: bool = False,
    run_prefix: str = "outage",
    start_ms: int = 1_700_000_000_000,
) -> list[ToolCallEvent]:
    """``runs`` runs of ``agents`` agents calling one tool within a minute; with ``failing``
    every call returns the same error (the tool's backend is down), else a result of its own."""
    events: list[ToolCallEvent] = []
    n = 0
    for r in range(runs):
        agent = f"agent-{r % agents}"
        common = {
            "run_id": f"{run_prefix}-{r:03d}",
            "session_key": f"agent:{agent}:{run_prefix}-{r:03d}",
            "agent_id": agent,
        }
        for c in range(calls_per_run):
            args = {"query": f"question {r}.{c}"}
            outcome = (
                {"error": "503 Service Unavailable: upstream search backend down"}
                if failing
                else {"result": _text(f"results for {r}.{c}", ok=True)}
            )
            call = f"call_{c}"
            events.append(
                requested_event(
                    f"{common['run_id']}:{c}:req",
                    tool,
                    args,
                    tool_call_id=call,
                    gate=gate,
                    ts_ms=_at(start_ms, 2 * n),
                    **common,
                )
            )
            events.append(
                completed_event(
                    f"{common['run_id']}:{c}:done",
                    tool,
                    args,
                    tool_call_id=call,
                    ts_ms=_at(start_ms, 2 * n + 1),
                    **outcome,
                    **common,
                )
            )
            n += 1
    return events


def overlapping_runs(
    session_key: str = "agent:main:parallel",
    *,
    run_ids: list[str] | None = None,
    runs: int = 4,
    calls_per_run: int = 50,
    gate: bool = False,
    start_ms: int = 1_700_000_000_000,
) -> list[ToolCallEvent]:
    """One session whose runs overlap in time (a session's runs working at once): one call of
    each run in turn, every call the same read with the same result, so under session scope the
    session's history counts them all together (the forwarding crash case).  The runner does not
    obey blocks (each call completes): every call adds to the count."""
    ids = run_ids or [f"{session_key}/run-{r + 1}" for r in range(runs)]
    events: list[ToolCallEvent] = []
    args = {"path": "/var/log/app/errors.log"}
    for _k in range(calls_per_run):
        for run_id in ids:
            n = len(events) // 2
            common = {"run_id": run_id, "session_key": session_key, "agent_id": "main", "tool_call_id": f"call_{n}"}
            events.append(
                requested_event(f"{session_key}:{n}:req", "read", args, gate=gate, ts_ms=_at(start_ms, 2 * n), **common)
            )
            events.append(
                completed_event(
                    f"{session_key}:{n}:done",
                    "read",
                    args,
                    result=_text("ERROR connection refused", ok=True),
                    ts_ms=_at(start_ms, 2 * n + 1),
                    **common,
                )
            )
    return events
