"""The fleet rules without I/O (issue 17): hopping windows as Faust computes them, incidents,
agent rings, and how the engine tells the runs.  Expected values are worked out by hand from
the scenarios (``streams.offline.scenarios.tool_outage``: run r is agent r mod 5's; ``agent_ring``:
one send per agent per round)."""

import random

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.events import ToolCallCompleted
from schemas.fleet import FleetSend, IncidentOpened, IncidentResolved, RingNotice
from schemas.names import CRITICAL, WARNING
from streams.edge.events import completed_event, requested_event
from streams.engine import RunDriver, engine_for
from streams.engine.config import AgentRingSettings, FleetIncidentSettings
from streams.engine.fleet import (
    WITHDRAWN,
    FleetSimulator,
    FleetView,
    Hop,
    TraceSends,
    admit_tool,
    count_outcome,
    earliest_start,
    find_ring,
    fleet_outcome,
    observe_send,
    outcome_fingerprint,
    qualifies,
    window_starts,
)
from streams.offline.replay import fleet_simulator
from streams.offline.scenarios import agent_ring, tool_outage

ENABLED = {"tools": {"loopDetection": {"enabled": True}}}
INCIDENTS = {**ENABLED, "loopwatch": {"fleetIncidents": {"enabled": True}}}
RINGS = {**ENABLED, "loopwatch": {"agentRings": {"enabled": True}}}


# -- windows ----------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 2e9, allow_nan=False), st.integers(1, 3600), st.integers(1, 3600))
def test_hopping_windows_are_fausts(ts, size, step):
    from faust.windows import HoppingWindow

    step = min(step, size)
    faust_window = HoppingWindow(size, step)
    assert [r[0] for r in faust_window.ranges(ts)] == [float(s) for s in window_starts(ts, size, step)]
    assert faust_window.earliest(ts)[0] == earliest_start(ts, size, step)


def test_a_windows_value_counts_distinct_runs_and_agents_up_to_the_thresholds():
    s = FleetIncidentSettings(min_runs=3, min_agents=2)
    value = None
    for run, agent in [("r1", "a"), ("r1", "a"), ("r2", "a"), ("r3", "a")]:
        value = count_outcome(value, run, agent, s)
    assert value == [["r1", "r2", "r3"], ["a"]] and not qualifies(value, s)
    value = count_outcome(value, "r4", "b", s)
    assert value == [["r1", "r2", "r3"], ["a", "b"]] and qualifies(value, s)  # capped: 3 runs kept


def test_which_outcomes_count():
    common = dict(run_id="r", session_key="s", agent_id="a")
    error = completed_event("d", "web_search", {"q": 1}, error="503", **common)
    fine = completed_event("d", "web_search", {"q": 1}, result="ok", **common)
    noop = completed_event(
        "d", "write", {"path": "/x", "content": "y"}, result={"details": {"changed": False}}, **common
    )
    assert outcome_fingerprint(error) == error.result_hash and error.result_hash.startswith("error:")
    assert outcome_fingerprint(fine) is None and fleet_outcome(fine) is None
    assert noop.no_progress and outcome_fingerprint(noop) == (noop.normalized_result_hash or noop.result_hash)
    assert fleet_outcome(error).error and not fleet_outcome(noop).error


# -- incidents ---------------------------------------------------------------------------------------


def simulate(config, events):
    engine = engine_for(config)
    runs, fleet = RunDriver(engine), fleet_simulator(engine)
    published, decisions = [], []
    for event in events:
        step = runs.handle(event)
        if step.published_decision is not None:
            decisions.append(step.published_decision)
        published += fleet.observe(event)
    return published, decisions


def test_thirty_runs_failing_on_one_tool_open_one_incident_and_quiet_resolves_it():
    # Run r's call c is call n = 2r + c: requested at 100 ms x 2n, completed 100 ms later.
    events = tool_outage(runs=30, agents=5, start_ms=1_000_000)
    # The last failing outcome (n = 59) comes at 11,900 ms; a healthy call of another tool
    # 300 s (the quiet window) after it.
    late = tool_outage("read", runs=1, failing=False, run_prefix="later", start_ms=1_000_000 + 11_900 + 300_000)
    published, decisions = simulate(INCIDENTS, events + late)
    assert [type(p) for p in published] == [IncidentOpened, IncidentResolved]
    opened, resolved = published
    # Distinct runs reach 20 at the outcome of run 19's first call (n = 38, at 7,700 ms; the
    # agents reached 3 at run 2).
    assert (opened.tool_name, opened.runs, opened.agents, opened.opened_ms) == ("web_search", 20, 3, 1_000_000 + 7_700)
    assert opened.outcome_hash.startswith("error:") and opened.incident_id == resolved.incident_id
    assert opened.message.startswith(
        "WARNING: tool web_search is failing across the fleet: the same error in at least 20 runs of 3 or more agents within 300 s (incident inc-"
    )
    # Resolved by the first event 300 s after the last outcome that met the thresholds.
    assert resolved.resolved_ms == late[0].ts_ms == 1_311_900
    early = tool_outage("read", runs=1, failing=False, run_prefix="later", start_ms=1_000_000 + 11_900 + 299_999)
    assert [type(p) for p in simulate(INCIDENTS, events + early[:1])[0]] == [IncidentOpened]  # 1 ms short
    # While it was open, every call of the tool got a decision (none gated) naming it.
    assert len(decisions) == 2 * 30 - 39 and all(d.incident_id == opened.incident_id for d in decisions)
    assert all(d.message.startswith(opened.message) and d.notify_model for d in decisions)
    assert all(d.action == "allow" for d in decisions)  # the verdict itself is unchanged


def test_thirty_healthy_runs_and_runs_of_too_few_agents_open_nothing():
    assert simulate(INCIDENTS, tool_outage(runs=30, failing=False))[0] == []
    assert simulate(INCIDENTS, tool_outage(runs=30, agents=2))[0] == []  # 30 runs, but of 2 agents
    assert simulate(INCIDENTS, tool_outage(runs=19, agents=5))[0] == []  # 19 runs


def test_failures_spread_wider_than_the_window_open_nothing():
    events = []
    for r in range(30):  # one failing run every 20 s: at most 15 in any 5 minutes
        events += tool_outage(runs=1, calls_per_run=1, run_prefix=f"slow{r}", start_ms=r * 20_000)
    events = [msgspec.structs.replace(e, agent_id=f"agent-{i // 2 % 5}") for i, e in enumerate(events)]
    assert simulate(INCIDENTS, events)[0] == []


def test_incidents_only_touch_their_tool_and_only_with_the_option():
    events = tool_outage(runs=30) + tool_outage("read", runs=1, failing=False, run_prefix="other")
    _, decisions = simulate(INCIDENTS, events)
    assert {d.tool_name for d in decisions} == {"web_search"}
    assert RunDriver(engine_for(ENABLED)).verdicts(events) == []  # off: nothing published for allows


def test_the_view():
    view = FleetView()
    opened, resolved = simulate(
        INCIDENTS,
        tool_outage(runs=30)
        + tool_outage("read", runs=1, failing=False, run_prefix="later", start_ms=1_700_000_000_000 + 400_000),
    )[0]
    view.apply_incident(opened)
    assert view.incidents == {"web_search": opened}
    other = msgspec.structs.asdict(opened) | {"incident_id": "another"}
    view.apply_incident(IncidentResolved(**other, resolved_ms=1))
    assert "web_search" in view.incidents  # the resolution of another incident leaves this one
    view.apply_incident(resolved)
    assert view.incidents == {}


# -- rings ---------------------------------------------------------------------------------------------


def ring_sends(names, rounds, outcome="same"):
    return [
        FleetSend(
            "t1", names[i], f"agent-{i}", names[(i + 1) % len(names)], "0" * 64 if outcome == "same" else f"{r:064x}"
        )
        for r in range(rounds)
        for i in range(len(names))
    ]


def test_a_ring_of_three_warns_from_round_three_and_turns_critical_at_five():
    settings_ = AgentRingSettings(warning_rounds=3, critical_rounds=5)
    trace = TraceSends()
    notices = []
    for n, send in enumerate(ring_sends(["a", "b", "c"], 6)):
        found = observe_send(trace, send, n, settings_)
        if found is not None:
            notices.append((n, found.level, found.rounds))
    # A ring's rounds: its hops' smallest streak; round k completes at send 3k - 1.
    assert notices == [(8, WARNING, 3), (11, WARNING, 4), (14, CRITICAL, 5), (17, CRITICAL, 6)]


def test_a_ring_is_found_whatever_the_order_of_a_rounds_sends():
    names = [f"s{i}" for i in range(5)]
    sends = ring_sends(names, 4)
    rng = random.Random(3)
    shuffled = []
    for r in range(4):
        chunk = sends[5 * r : 5 * r + 5]
        rng.shuffle(chunk)
        shuffled += chunk
    trace, last = TraceSends(), None
    for n, send in enumerate(shuffled):
        last = observe_send(trace, send, n, AgentRingSettings()) or last
    assert isinstance(last, RingNotice) and last.rounds == 4 and len(last.hops) == 5


def test_what_is_not_a_ring():
    trace = TraceSends()
    for send in ring_sends(["a", "b"], 10):  # two agents: ping-pong, not a ring
        assert observe_send(trace, send, 0, AgentRingSettings()) is None
    chain = TraceSends()
    for _r in range(10):  # a -> b -> c, never back to a
        for _i, (src, dst) in enumerate([("a", "b"), ("b", "c")]):
            assert observe_send(chain, FleetSend("t", src, None, dst, "0" * 64), 0, AgentRingSettings()) is None
    moving = TraceSends()
    for send in ring_sends(["a", "b", "c"], 10, outcome="changes"):  # new answers every round: progress
        assert observe_send(moving, send, 0, AgentRingSettings()) is None


def test_a_ring_whose_answers_change_is_withdrawn():
    trace = TraceSends()
    for send in ring_sends(["a", "b", "c"], 3):
        observe_send(trace, send, 0, AgentRingSettings())
    changed = FleetSend("t1", "a", "agent-0", "b", "1" * 64)
    assert observe_send(trace, changed, 0, AgentRingSettings()) is WITHDRAWN
    assert observe_send(trace, changed, 0, AgentRingSettings()) is None  # nothing in force any more


def test_targets_name_senders_by_session_key_or_agent_id():
    trace = TraceSends()
    for _r in range(3):
        for src, agent, dst in [("sk-a", "a", "b"), ("sk-b", "b", "sk-c"), ("sk-c", "c", "a")]:
            found = observe_send(trace, FleetSend("t", src, agent, dst, "0" * 64), 0, AgentRingSettings())
    assert isinstance(found, RingNotice) and [h.target for h in found.hops] == ["b", "sk-c", "a"]
    assert find_ring(trace, Hop("sk-a", "a", "b"))[1] == 3


def test_every_run_of_the_ring_is_told():
    events = agent_ring(agents=3, rounds=7, gate=True)
    published, decisions = simulate(RINGS, events)
    assert [(p.level, p.rounds) for p in published] == [
        (WARNING, 3),
        (WARNING, 4),
        (CRITICAL, 5),
        (CRITICAL, 6),
        (CRITICAL, 7),
    ]
    ring = [(d.run_id, d.action, d.count) for d in decisions if d.detector == "agent_ring"]
    # Round 4 (sends 9-11): each agent's run warned, at its own first ring warning; rounds 6
    # and 7 (sends 15-20): every send blocked.
    members = {f"agent:ring-{i}:trace-standup/run" for i in range(3)}
    assert {(run, action, count) for run, action, count in ring[:3]} == {(m, "warn", 3) for m in members}
    assert {run for run, action, _ in ring if action == "block"} == members
    block = next(d for d in decisions if d.action == "block")
    assert block.message.startswith(
        "CRITICAL: agents agent:ring-0:trace-standup → agent:ring-1:trace-standup → "
        "agent:ring-2:trace-standup → agent:ring-0:trace-standup have sent each other"
    )
    assert not any(d.detector == "agent_ring" for d in RunDriver(engine_for(ENABLED)).verdicts(events))


def test_sends_off_the_ring_are_not_touched():
    engine = engine_for(RINGS)
    simulator = fleet_simulator(engine)
    runs = RunDriver(engine)
    for event in agent_ring(rounds=6):
        runs.handle(event)
        simulator.observe(event)
    common = dict(run_id="x", session_key="agent:ring-0:trace-standup", agent_id="ring-0", trace_id="trace-standup")
    elsewhere = runs.handle(
        requested_event("other", "sessions_send", {"m": 1}, target="agent:someone-else", gate=True, **common)
    ).decision
    assert elsewhere.detector is None
    along = runs.handle(
        requested_event("along", "sessions_send", {"m": 1}, target="agent:ring-1:trace-standup", gate=True, **common)
    ).decision
    assert (along.action, along.detector) == ("block", "agent_ring")


def test_the_simulator_forgets_windows():
    simulator = FleetSimulator(FleetIncidentSettings(window_s=60, hop_s=10), None)
    for event in tool_outage(runs=10, start_ms=0) + tool_outage(runs=10, start_ms=3_600_000, run_prefix="late"):
        simulator.observe(event)
    assert all(start >= 3_600 - 60 for _tool, _fp, start in simulator._windows)


# -- forged incidents and their bounds (issue 26) ------------------------------------------------------


def forged_outcomes(tools: int, *, runs: int = 20, agents: int = 3, span_ms: int = 120_000, start_ms: int = 0):
    """One producer without signatures: for each of ``tools`` tools, ``runs`` made-up runs of
    ``agents`` made-up agent ids (the same ids for every tool) return the same error, one
    completed call each; the tools one after another, evenly over ``span_ms``."""
    step = span_ms // (tools * runs)
    out = []
    for t in range(tools):
        calls = [
            e
            for e in tool_outage(f"tool-{t:04d}", runs=runs, agents=agents, calls_per_run=1, run_prefix=f"t{t}")
            if isinstance(e, ToolCallCompleted)
        ]
        out += [msgspec.structs.replace(e, ts_ms=start_ms + (t * runs + i) * step) for i, e in enumerate(calls)]
    return out


def opened_by(simulator: FleetSimulator, events) -> list:
    return [r for e in events for r in simulator.observe(e) if isinstance(r, IncidentOpened)]


def test_one_producer_opens_an_incident_for_every_tool_without_the_bounds():
    # The finding, reproduced without Kafka: 20 runs x 3 agent ids per tool qualify
    # every tool (the counts are what the events claim).
    unbounded = FleetSimulator(FleetIncidentSettings(max_open=10_000, max_tools_per_agent=10_000), None)
    assert len(opened_by(unbounded, forged_outcomes(300))) == 300


def test_the_open_cap_and_the_per_agent_rate_limit_bound_what_one_producer_forges():
    # 1,000 tools over two minutes of event time, starting on a minute: tools 0-499 in minute
    # 0, 500-999 in minute 1 (120 ms a tool).  Worked by hand from the defaults (30 tools per
    # agent id a minute, 50 open): each of the 3 agent ids adds the first 30 tools it meets in
    # a minute, so tools 0-29 open in minute 0 and 500-529 qualify in minute 1, of which 20
    # open before the cap; the other 10 are refused at their 20th run, their only qualifying
    # outcome.  Every other outcome is limited: (470 + 470) tools x 20 runs.
    simulator = FleetSimulator(FleetIncidentSettings(), None)
    opened = opened_by(simulator, forged_outcomes(1000))
    assert [o.tool_name for o in opened] == [f"tool-{t:04d}" for t in [*range(30), *range(500, 520)]]
    assert len(simulator.view.incidents) == len(simulator._incidents) == 50
    assert simulator.capped == 10
    assert simulator.limit.limited == 940 * 20
    # The same after a restart (a fresh simulator, as a worker's limiter starts afresh): the
    # cap holds the open incidents at 50, whatever the producer sends.
    more = opened_by(simulator, forged_outcomes(1000, start_ms=180_000))
    assert more == [] and len(simulator._incidents) == 50


def test_the_per_agent_limit_admits_an_agents_first_tools_of_a_minute_and_their_repeats():
    # Worked by hand, limit 3: tools a, b, c are admitted in turn; a again passes and changes
    # nothing; d is refused (3 other tools already), and refused again however often it comes.
    tools = admit_tool(None, "a", 3)
    assert tools == ["a"]
    tools = admit_tool(tools, "b", 3)
    tools = admit_tool(tools, "c", 3)
    assert tools == ["a", "b", "c"]
    assert admit_tool(tools, "a", 3) is tools
    assert admit_tool(tools, "d", 3) is None and admit_tool(tools, "d", 3) is None
    assert tools == ["a", "b", "c"]  # never changed in place: a table's value is replaced, not edited
    # A decision made again on the list as it was (a record redelivered after a crash, the
    # table restored to before it) answers as the first time: c is admitted again.
    assert admit_tool(["a", "b"], "c", 3) == ["a", "b", "c"]
    assert admit_tool([], "z", 1) == ["z"] and admit_tool(["z"], "y", 1) is None


def one_agent_many_tools(tools, *, start_ms: int = 0, run_prefix: str = "forger"):
    """One agent id (``agent-0``) with one run per tool, each failing once, 300 ms apart."""
    events = []
    for t, tool in enumerate(tools):
        events += tool_outage(
            tool, runs=1, agents=1, calls_per_run=1, run_prefix=f"{run_prefix}-t{t}", start_ms=start_ms + 300 * t
        )
    return events


def test_one_agents_outcomes_for_twelve_tools_open_incidents_for_its_first_three():
    # minRuns 1 and minAgents 1: every outcome admitted opens its tool's incident.  Worked by
    # hand, limit 3: one agent's 12 tools within one minute open tools 0-2; the other 9
    # outcomes are limited.  A minute later the agent may add 3 more.
    settings = FleetIncidentSettings(min_runs=1, min_agents=1, max_tools_per_agent=3, quiet_s=600)
    simulator = FleetSimulator(settings, None)
    tools = [f"tool-{t:02d}" for t in range(12)]
    opened = opened_by(simulator, one_agent_many_tools(tools))
    assert [o.tool_name for o in opened] == ["tool-00", "tool-01", "tool-02"]
    assert simulator.limit.limited == 9
    later = opened_by(simulator, one_agent_many_tools(tools[::-1], start_ms=60_000, run_prefix="later"))
    assert [o.tool_name for o in later] == ["tool-11", "tool-10", "tool-09"]


def test_the_fleet_tables_stay_bounded_under_a_flood_of_distinct_tools_runs_and_agents():
    # A flood the per-agent limit cannot stop: every outcome names a new tool, run and agent id
    # (20 outcomes a second, window 60 s hopping every 10 s).  The windows held stop growing
    # once the oldest expire: an outcome is in window/hop windows, and a window is dropped at
    # the first hop after it has been over for a window (as the simulator sweeps), so at most
    # (2 x window + hop) s of outcomes are held;
    # the limiter forgets its agents every minute; the open incidents stay at or under the cap
    # (none open here: one run per tool).
    settings = FleetIncidentSettings(window_s=60, hop_s=10, min_runs=2, min_agents=1)
    simulator = FleetSimulator(settings, None)
    rate, peaks = 20, []
    for minute in range(12):
        for i in range(60 * rate):
            n = minute * 60 * rate + i
            [call] = [
                e
                for e in tool_outage(f"flood-{n}", runs=1, agents=1, calls_per_run=1, run_prefix=f"f{n}")
                if isinstance(e, ToolCallCompleted)
            ]
            simulator.observe(msgspec.structs.replace(call, agent_id=f"agent-{n}", ts_ms=n * 1000 // rate))
        peaks.append(len(simulator._windows))
    bound = rate * (2 * settings.window_s + settings.hop_s) * (settings.window_s // settings.hop_s)
    assert max(peaks) <= bound, (peaks, bound)
    assert peaks[-1] == peaks[-6]  # steady: 12 minutes of flood hold what 7 did
    assert len(simulator.limit.tools) <= 60 * rate and len(simulator._incidents) == 0
