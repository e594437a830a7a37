"""Profile latest (openclaw-latest.md) on the engine, case by case.  Expected values are the
spec's own worked statements (quoted in the docstrings) or hand-worked from its rules; the
golden traces cover the rest (test_conformance_latest_traces.py)."""

import hashlib

import pytest

from schemas.config import check
from streams.edge.events import blocked_result, compaction_event, completed_event, requested_event
from streams.engine import LoopEngine, encode_state, engine_for
from streams.engine.config import ConfigSet, resolve_latest

LATEST = {"tools": {"loopDetection": {"enabled": True}}, "loopwatch": {"profile": "latest"}}
FINAL = {"tools": {"loopDetection": {"enabled": True}}}
SAME = {"content": [{"type": "text", "text": "same"}], "details": {"ok": True}}


def error_once(text):
    return {"error": text}


class Runner:
    """An obedient runner: a blocked call is completed with the blocked result, as the client does."""

    def __init__(self, config, run_id="r1"):
        self.engine = engine_for(config)
        self.state = None
        self.fields = dict(run_id=run_id, session_key="agent:main:r1", agent_id="main")
        self.n = 0

    def request(self, tool, args, call_id=None):
        self.n += 1
        call_id = call_id or f"c{self.n}"
        step = self.engine.handle(
            self.state, requested_event(f"q{self.n}", tool, args, tool_call_id=call_id, **self.fields)
        )
        self.state = step.state
        if step.vetoed:
            veto = completed_event(
                f"v{self.n}",
                tool,
                args,
                result=blocked_result(step.detection.message),
                tool_call_id=call_id,
                **self.fields,
            )
            self.state = self.engine.handle(self.state, veto).state
        return step, call_id

    def complete(self, tool, args, call_id, **outcome):
        step = self.engine.handle(
            self.state, completed_event(f"d{call_id}", tool, args, tool_call_id=call_id, **self.fields, **outcome)
        )
        self.state = step.state
        return step

    def call(self, tool, args, **outcome):
        step, call_id = self.request(tool, args)
        if not step.vetoed:
            self.complete(tool, args, call_id, **outcome)
        return step

    def arm(self):
        self.n += 1
        step = self.engine.handle(self.state, compaction_event(f"a{self.n}", **self.fields))
        self.state = step.state
        return step


def decision(step):
    d = step.decision
    return d.action, d.detector, d.count


def test_vetoes_count_so_the_global_breaker_is_reached():
    """§5.3: "After 20 identical outcomes, calls 21–30 are vetoed as generic_repeat with
    counts 20…29 and call 31 hits the global breaker with 30.  Because the window holds 30
    records, the count then stays at 30." (#127701)"""
    runner = Runner(LATEST)
    steps = [runner.call("read", {"path": "/x"}, result=SAME) for _ in range(33)]
    assert [decision(s) for s in steps[20:30]] == [("block", "generic_repeat", n) for n in range(20, 30)]
    assert [decision(s) for s in steps[30:]] == [("block", "global_circuit_breaker", 30)] * 3
    assert steps[20].decision.message == (
        "CRITICAL: Called read with identical outcomes 20 times. Session execution blocked to prevent runaway loops."
    )
    assert steps[30].decision.message == (
        "CRITICAL: read repeated identical no-progress outcomes 30 times. "
        "Session execution blocked by global circuit breaker to prevent runaway loops."
    )
    kinds = [r.outcome_kind for r in runner.state.records()]
    assert len(kinds) == 30 and kinds[-13:] == ["tool-loop-veto"] * 13


def test_configurable_final_still_freezes_at_the_critical_count():
    """The default profile is unchanged: a vetoed call leaves no trace (#127701)."""
    runner = Runner(FINAL)
    steps = [runner.call("read", {"path": "/x"}, result=SAME) for _ in range(33)]
    assert [decision(s) for s in steps[20:]] == [("block", "generic_repeat", 20)] * 13
    assert steps[20].decision.message.startswith(
        "CRITICAL: Called read with identical arguments and identical outcomes"
    )


def test_errors_are_no_progress_and_stable_argument_churn_warns():
    """§5.4: the same tool failing the same way while cycling 2+ argument variants, each seen
    3+ times: three variants a b c a b c a b c a (4, 3, 3 times), then b again."""
    runner = Runner(LATEST)
    variants = [{"q": "a"}, {"q": "b"}, {"q": "c"}]
    for n in range(10):
        runner.call("search", variants[n % 3], error="rate limited")
    assert all(r.no_progress for r in runner.state.records())
    step, _ = runner.request("search", variants[1])
    d = step.decision
    assert (d.action, d.detector, d.count, d.liveness_signal) == ("warn", "argument_churn", 10, "argument_churn")
    assert d.warning_key == "argument-churn:search"
    assert d.message == (
        "WARNING: search has cycled through 3 repeated argument patterns with the same stable outcome 10 times. "
        "Continued churn is treated as stalled run activity, but this tool call remains allowed."
    )
    # A variant seen fewer than 3 times breaks the pattern.
    fresh = Runner(LATEST)
    for n in range(12):
        fresh.call("search", variants[n % 3] if n != 4 else {"q": "d"}, error="rate limited")
    assert fresh.request("search", variants[0])[0].detection is None


def test_a_ping_pong_warning_carries_the_liveness_signal_of_churn():
    """Rule 6 comes before rule 8: two alternating failing variants are a ping-pong warning,
    with ``livenessSignal`` because argument churn is 10 or more."""
    runner = Runner(LATEST)
    for n in range(10):
        runner.call("search", {"q": "ab"[n % 2]}, error="rate limited")
    step, _ = runner.request("search", {"q": "a"})
    d = step.decision
    assert (d.detector, d.level, d.count, d.liveness_signal) == ("ping_pong", "warning", 11, "argument_churn")


def write_args(n):
    return {"path": "/notes.md", "content": f"draft {n}"}


CHANGED = {"content": [{"type": "text", "text": "written"}], "details": {"changed": True}}
UNCHANGED = {"content": [{"type": "text", "text": "nothing to do"}], "details": {"changed": False}}
# Computed here independently of the engine: sha256 of the JSON text {"path":"/notes.md"}.
NOTES_TARGET = hashlib.sha256(b'{"path":"/notes.md"}').hexdigest()


def test_rewriting_one_target_warns_as_write_mutation_churn():
    """§5.4: "10+ consecutive writes that changed the same target with distinct args, none
    repeated, and the proposed args new too"."""
    runner = Runner(LATEST)
    for n in range(10):
        runner.call("write", write_args(n), result=CHANGED)
    records = runner.state.records()
    assert {r.outcome_kind for r in records} == {"write-mutation"}
    assert {r.mutation_target_hash for r in records} == {NOTES_TARGET}
    step, _ = runner.request("write", write_args(10))
    d = step.decision
    assert (d.action, d.detector, d.count, d.liveness_signal) == ("warn", "argument_churn", 10, "argument_churn")
    assert d.warning_key == f"argument-churn:write:write-mutation:{NOTES_TARGET}"
    assert d.message.startswith("WARNING: write has changed the same target with 10 distinct argument variants")
    # Repeating an earlier variant is not churn.
    assert runner.request("write", write_args(3))[0].detection is None


def test_no_op_writes_share_one_hash_and_are_no_progress():
    """§4.3: changed:false hashes as {status: "unchanged"} whatever the path and text."""
    runner = Runner(LATEST)
    runner.call("write", {"path": "/a", "content": "x"}, result=UNCHANGED)
    runner.call(
        "write",
        {"path": "/b", "content": "y"},
        result={"content": [{"type": "text", "text": "other words"}], "details": {"changed": False}},
    )
    a, b = runner.state.records()
    unchanged = hashlib.sha256(b'{"status":"unchanged"}').hexdigest()
    assert a.result_hash == b.result_hash == unchanged and a.no_progress and b.no_progress


def test_a_parallel_batch_of_writes_raises_the_outcome_time_warning():
    """§6.3: eleven writes to one target admitted while their siblings are pending (no
    pre-execution churn), then completed in order: the eleventh outcome finds ten distinct
    mutations of its target and warns, once (the bucket rule)."""
    runner = Runner(LATEST)
    calls = []
    for n in range(11):
        step, call_id = runner.request("write", write_args(n))
        assert step.detection is None
        calls.append(call_id)
    steps = [runner.complete("write", write_args(n), call_id, result=CHANGED) for n, call_id in enumerate(calls)]
    assert all(s.decision is None for s in steps[:10])
    d = steps[10].decision
    assert (d.action, d.detector, d.count, d.notify_model, d.cause_event_id) == (
        "warn",
        "argument_churn",
        10,
        True,
        f"d{calls[10]}",
    )
    assert d.warning_key == f"argument-churn:write:write-mutation:{NOTES_TARGET}"
    assert any(line.message.startswith("Loop warning for write: WARNING: write has changed") for line in steps[10].logs)


def test_only_enabled_true_runs_the_outcome_time_warning():
    """§2: detection needs a truthy ``enabled``, the outcome-time warning ``enabled === true``."""
    runner = Runner({"tools": {"loopDetection": {"enabled": "yes"}}, "loopwatch": {"profile": "latest"}})
    calls = [runner.request("write", write_args(n))[1] for n in range(11)]
    steps = [runner.complete("write", write_args(n), c, result=CHANGED) for n, c in enumerate(calls)]
    assert all(s.decision is None for s in steps)


def exec_failure(output, exit_code=1):
    return {
        "content": [{"type": "text", "text": output}],
        "details": {"status": "failed", "exitCode": exit_code, "aggregated": output},
    }


def test_a_failing_command_with_drifting_output_is_one_failure():
    """§4.2/§5.3: timestamps, pids and durations drift; the failure identity does not, so the
    terminal walk counts the tail (the signature walk alone would stop at once)."""
    runner = Runner(LATEST)
    for n in range(20):
        runner.call(
            "exec",
            {"command": "make"},
            result=exec_failure(f"error at 2026-08-10T00:00:{n:02d}Z pid {4000 + n} after {n}ms"),
        )
    step, _ = runner.request("exec", {"command": "make"})
    assert decision(step) == ("block", "generic_repeat", 20)
    final = Runner(FINAL)
    for n in range(20):
        final.call(
            "exec",
            {"command": "make"},
            result=exec_failure(f"error at 2026-08-10T00:00:{n:02d}Z pid {4000 + n} after {n}ms"),
        )
    assert final.request("exec", {"command": "make"})[0].decision.action != "block"


def test_window_closed_log_counts_re_reads_of_the_baseline():
    """§7 (and PCGL-003): after arming, three observations; one repeats a call from before."""
    runner = Runner(LATEST)
    runner.call("read", {"path": "/report.md"}, result=SAME)
    runner.call("exec", {"command": "ls"}, result=SAME)
    arm = runner.arm()
    assert [line.message for line in arm.logs] == ["post-compaction guard armed for 3 attempts"]
    runner.call("read", {"path": "/report.md"}, result={"content": [{"type": "text", "text": "v2"}]})
    runner.call("read", {"path": "/other.md"}, result=SAME)
    step, call_id = runner.request("gateway", {"action": "probe"})
    done = runner.complete("gateway", {"action": "probe"}, call_id, result=SAME)
    assert [(line.level, line.message) for line in done.logs] == [
        ("info", "post-compaction window closed: toolCalls=3 preCompactionRepeats=1 tools=read")
    ]
    assert done.abort is None


def test_retired_keys_are_ignored_under_latest():
    """§2: "a config carrying them behaves exactly like one without them"."""
    retired = {
        "tools": {
            "loopDetection": {
                "enabled": True,
                "historySize": 4,
                "criticalThreshold": 3,
                "warningThreshold": 2,
                "detectors": {"genericRepeat": False},
            }
        },
        "loopwatch": {"profile": "latest"},
    }
    a, b = Runner(retired), Runner(LATEST)
    for _ in range(25):
        sa, sb = a.call("read", {"path": "/x"}, result=SAME), b.call("read", {"path": "/x"}, result=SAME)
        assert (sa.decision and decision(sa)) == (sb.decision and decision(sb))
    assert encode_state(a.state) == encode_state(b.state)
    errors, warnings = check(retired)
    assert errors == []
    assert sorted(w.path for w in warnings) == [
        "tools.loopDetection.criticalThreshold",
        "tools.loopDetection.detectors",
        "tools.loopDetection.historySize",
        "tools.loopDetection.warningThreshold",
    ]


@pytest.mark.parametrize(
    "enabled, detects, records_calls, outcome_warnings, guard",
    [  # the four JS tests of §2's table
        (True, True, True, True, True),
        (False, False, False, False, False),
        (None, False, True, False, True),
        ("yes", True, True, False, True),
        (0, False, True, False, True),
        ("false", True, True, False, True),
    ],
)
def test_the_enabled_gates(enabled, detects, records_calls, outcome_warnings, guard):
    detection, guard_settings = resolve_latest({"enabled": enabled})
    assert (detection.enabled, detection.records_calls, detection.outcome_warnings, guard_settings.enabled) == (
        detects,
        records_calls,
        outcome_warnings,
        guard,
    )
    assert guard_settings.window_size == 3 and detection.history_size == 30


def test_profile_per_agent_and_the_merge_of_enabled():
    root = {
        "tools": {"loopDetection": {"enabled": True, "warningThreshold": 5}},
        "agents": {
            "list": [
                {"id": "new", "loopwatch": {"profile": "latest"}, "tools": {"loopDetection": {"enabled": None}}},
                {"id": "old"},
            ]
        },
    }
    config = ConfigSet(root)
    assert (config.profile_for("new"), config.profile_for("old"), config.profile_for(None)) == (
        "latest",
        "configurable-final",
        "configurable-final",
    )
    new = config.settings_for("new")
    assert new.latest and new.detection.enabled  # agent.enabled ?? global.enabled
    assert new.detection.warning_threshold == 10  # retired key: upstream's fixed value
    assert config.settings_for("old").detection.warning_threshold == 5
    # The global block is also read by a configurable-final agent: still validated strictly;
    # the latest agent's own block only for `enabled` (a boolean, as upstream's schema says).
    misordered = {**root, "tools": {"loopDetection": {"warningThreshold": 9, "criticalThreshold": 3}}}
    errors, _ = check(misordered)
    assert [(e.path, e.message) for e in errors] == [
        (
            "tools.loopDetection.criticalThreshold",
            "tools.loopDetection.warningThreshold must be lower than criticalThreshold.",
        ),
        ("agents.list[0].tools.loopDetection.enabled", "Invalid input: expected boolean, received null"),
    ]


def test_only_a_config_using_latest_pays_for_the_profile_check():
    """A configurable-final config gets the plain engine (no per-event profile lookup)."""
    assert type(engine_for(FINAL)) is LoopEngine
    assert type(engine_for(None)) is LoopEngine
    assert type(engine_for(LATEST)) is not LoopEngine
    mixed = {"agents": {"list": [{"id": "x", "loopwatch": {"profile": "latest"}}]}}
    assert type(engine_for(mixed)) is not LoopEngine


def test_a_mixed_engine_keeps_each_agents_profile():
    root = {
        "tools": {"loopDetection": {"enabled": True}},
        "agents": {"list": [{"id": "new", "loopwatch": {"profile": "latest"}}]},
    }
    for agent, counts in (("main", [20] * 5), ("new", [20, 21, 22, 23, 24])):
        runner = Runner(root)
        runner.fields["agent_id"] = agent
        steps = [runner.call("read", {"path": "/x"}, result=SAME) for _ in range(25)]
        assert [s.decision.count for s in steps[20:]] == counts
