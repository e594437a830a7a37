"""The loopwatch commands, run as a user would run them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from schemas.export import SCHEMAS, render

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def loopwatch(*args, check=False):
    proc = subprocess.run(
        [sys.executable, "-m", "streams.cli", *map(str, args)], capture_output=True, text=True, cwd=REPO
    )
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_conformance_on_the_upstream_cases(conformance_dir):
    proc = loopwatch("conformance", conformance_dir / "openclaw-cases.json")
    assert proc.returncode == 0, proc.stdout
    # The five PCGL-* cases target profile latest's guard and run under it.
    assert proc.stdout.strip().splitlines()[-1] == "94 passed, 0 failed, 0 skipped"
    assert not [line for line in proc.stdout.splitlines() if line.startswith("SKIP")]


def test_conformance_reports_failures_and_exits_non_zero(tmp_path):
    case = {
        "id": "BROKEN-1",
        "suite": "tool-loop-detection",
        "config": {"enabled": True},
        "steps": [{"op": "detect", "tool": "read", "args": {}, "expect": {"stuck": True, "level": "critical"}}],
    }
    path = tmp_path / "cases.json"
    path.write_text(json.dumps([case]))
    proc = loopwatch("conformance", path)
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[0].startswith("FAIL BROKEN-1:")
    assert proc.stdout.strip().splitlines()[-1] == "0 passed, 1 failed, 0 skipped"


def test_replay_examples():
    proc = loopwatch(
        "replay", EXAMPLES / "polling-loop.jsonl", "--config", EXAMPLES / "loop-detection.yaml", check=True
    )
    assert "BLOCK" in proc.stdout and "known_poll_no_progress" in proc.stdout
    proc = loopwatch("replay", EXAMPLES / "healthy-run.jsonl", "--config", EXAMPLES / "loop-detection.yaml", check=True)
    assert "BLOCK" not in proc.stdout and "WARN" not in proc.stdout
    proc = loopwatch(
        "replay",
        EXAMPLES / "post-compaction-loop.jsonl",
        "--json",
        "--config",
        EXAMPLES / "loop-detection.yaml",
        check=True,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    aborts = [line for line in lines if line.get("type") == "loop.run_aborted"]
    assert len(aborts) == 1 and aborts[0]["detector"] == "compaction_loop_persisted"
    assert lines[-1]["summary"]["aborts"] == {"compaction_loop_persisted": 1}


def test_replay_without_config_uses_upstream_default_disabled():
    proc = loopwatch("replay", EXAMPLES / "ping-pong.jsonl", "--json", check=True)
    assert json.loads(proc.stdout.splitlines()[-1])["summary"]["actions"] == {"allow": 24}


def test_replay_reports_bad_lines_and_goes_on(tmp_path):
    trace = tmp_path / "t.jsonl"
    good = (EXAMPLES / "healthy-run.jsonl").read_text().splitlines()[0]
    trace.write_text("{oops\n" + good + "\n" + '{"type":"nope","event_id":"x"}\n')
    proc = loopwatch("replay", trace, check=True)
    assert "line 1: rejected (invalid_json)" in proc.stdout
    assert "line 3: rejected (unknown_type)" in proc.stdout
    assert "1 events, 1 runs, 2 rejected" in proc.stdout


def test_config_check_prints_effective_clamped_settings(tmp_path):
    proc = loopwatch("config", "check", EXAMPLES / "loop-detection.yaml", "--json", check=True)
    effective = json.loads(proc.stdout)
    assert effective["(default)"]["criticalThreshold"] == 20
    assert effective["cron"]["warningThreshold"] == 5 and effective["cron"]["criticalThreshold"] == 12
    path = tmp_path / "c.json5"
    path.write_text("{tools: {loopDetection: {enabled: true, warningThreshold: 25}}, // JSON5\n}")
    effective = json.loads(loopwatch("config", "check", path, "--json", check=True).stdout)
    assert (
        effective["(default)"]["criticalThreshold"] == 26
        and effective["(default)"]["globalCircuitBreakerThreshold"] == 30
    )


@pytest.mark.parametrize(
    "text, message",
    [
        (
            '{"tools": {"loopDetection": {"warningThreshold": 10, "criticalThreshold": 10}}}',
            "tools.loopDetection.warningThreshold must be lower than criticalThreshold.",
        ),
        (
            '{"tools": {"loopDetection": {"criticalThreshold": 30, "globalCircuitBreakerThreshold": 30}}}',
            "tools.loopDetection.criticalThreshold must be lower than globalCircuitBreakerThreshold.",
        ),
        ('{"tools": {"loopDetection": {"repeatThreshold": 3}}}', 'Unrecognized key: "repeatThreshold"'),
        ('{"tools": {"loopDetection": {"historySize": 0}}}', "tools.loopDetection.historySize: Too small"),
        (
            '{"agents": {"list": [{"id": "a", "tools": {"loopDetection": {"detectors": {"pingpong": true}}}}]}}',
            'agents.list[0].tools.loopDetection.detectors: Unrecognized key: "pingpong"',
        ),
        ("{tools: [", "cannot parse"),
    ],
)
def test_config_check_rejects_bad_files(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    proc = loopwatch("config", "check", path)
    assert proc.returncode == 1
    assert message in proc.stderr


def test_replay_with_profile_latest():
    """Recorded events of two loops (examples/latest-loops.jsonl): under latest the vetoed
    search calls count on to the global breaker and the rewritten file is argument churn;
    the default profile sees neither."""
    config = ("--config", EXAMPLES / "loop-detection.yaml")  # enabled (its numeric keys are ignored under latest)
    latest = loopwatch("replay", EXAMPLES / "latest-loops.jsonl", "--profile", "latest", *config, "--json", check=True)
    summary = json.loads(latest.stdout.splitlines()[-1])["summary"]
    assert summary["detections"]["critical/global_circuit_breaker"] == 2
    assert summary["detections"]["warning/argument_churn"] == 3
    verdicts = [json.loads(line) for line in latest.stdout.splitlines()[:-1]]
    churn = next(v for v in verdicts if v.get("detector") == "argument_churn")
    assert (churn["action"], churn["count"], churn["liveness_signal"]) == ("warn", 10, "argument_churn")
    human = loopwatch("replay", EXAMPLES / "latest-loops.jsonl", "--profile", "latest", *config, check=True)
    assert "warning/argument_churn count=10 liveness=argument_churn" in human.stdout
    default = loopwatch("replay", EXAMPLES / "latest-loops.jsonl", *config, "--json", check=True)
    detections = json.loads(default.stdout.splitlines()[-1])["summary"]["detections"]
    assert "warning/argument_churn" not in detections and "critical/global_circuit_breaker" not in detections
    assert detections["critical/generic_repeat"] == 12  # frozen at count 20, every later call blocked
    bad = loopwatch("replay", EXAMPLES / "latest-loops.jsonl", "--profile", "newest")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_config_check_warns_about_retired_keys_under_latest(tmp_path):
    path = tmp_path / "latest.yaml"
    path.write_text(
        "loopwatch: {profile: latest}\n"
        "tools: {loopDetection: {enabled: true, historySize: 5, warningThreshold: 30, criticalThreshold: 3}}\n"
    )
    proc = loopwatch("config", "check", path, "--json", check=True)
    effective = json.loads(proc.stdout)["(default)"]
    assert (effective["profile"], effective["historySize"], effective["warningThreshold"]) == ("latest", 30, 10)
    warned = [line for line in proc.stderr.splitlines() if "warning:" in line]
    assert len(warned) == 3 and all("retired under profile latest" in line for line in warned)
    path.write_text("loopwatch: {profile: newest}\n")
    proc = loopwatch("config", "check", path)
    assert proc.returncode == 1 and "loopwatch.profile" in proc.stderr


def test_config_check_missing_file():
    proc = loopwatch("config", "check", "/nonexistent/loop.yaml")
    assert proc.returncode == 1 and "cannot read" in proc.stderr


def test_exported_json_schemas_are_current():
    for name, kind in SCHEMAS.items():
        path = REPO / "schemas" / "jsonschema" / name
        assert path.exists(), f"{path} missing: run `make schemas`"
        assert path.read_text() == render(kind), f"{path} is stale: run `make schemas`"


# -- issue 17's options ---------------------------------------------------------------------------


def replay_json(trace, *args):
    proc = loopwatch("replay", EXAMPLES / trace, *args, "--json", check=True)
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    return lines[:-1], lines[-1]["summary"]


def test_replay_a_loop_split_over_three_runs_is_caught_only_with_session_scope():
    config = ("--config", EXAMPLES / "loop-detection.yaml")
    _, by_run = replay_json("session-loop.jsonl", *config)
    assert by_run["detections"] == {} and by_run["runs"] == 3
    verdicts, by_session = replay_json("session-loop.jsonl", *config, "--scope", "session")
    assert by_session["detections"] == {"warning/generic_repeat": 10, "critical/generic_repeat": 4}
    block = next(v for v in verdicts if v.get("action") == "block")
    assert (block["run_id"], block["count"]) == ("agent:main:support-42/run-3", 20)


def test_replay_the_fleet_examples():
    config = ("--config", EXAMPLES / "fleet-options.yaml")
    _, cycle = replay_json("cycle-loop.jsonl", *config)
    assert cycle["detections"] == {"warning/cycle": 10, "critical/cycle": 5}
    records, outage = replay_json("tool-outage.jsonl", *config)
    assert outage["fleet"] == {"fleet.incident_opened": 1, "fleet.incident_resolved": 1}
    opened = next(r for r in records if r.get("type") == "fleet.incident_opened")
    assert (opened["tool_name"], opened["runs"], opened["agents"]) == ("web_search", 20, 3)
    assert any(r.get("incident_id") == opened["incident_id"] and r.get("type") == "loop.decision" for r in records)
    records, ring = replay_json("agent-ring.jsonl", *config)
    assert ring["detections"] == {"warning/agent_ring": 6, "critical/agent_ring": 3}
    assert ring["fleet"] == {"ring.warning": 2, "ring.critical": 2}
    human = loopwatch("replay", EXAMPLES / "tool-outage.jsonl", *config, check=True).stdout
    assert "INCIDENT OPENED inc-" in human and "INCIDENT RESOLVED inc-" in human
    default = loopwatch(
        "replay", EXAMPLES / "agent-ring.jsonl", "--config", EXAMPLES / "loop-detection.yaml", "--json", check=True
    )
    assert json.loads(default.stdout.splitlines()[-1])["summary"]["detections"] == {}


def test_replay_bounds_one_agents_fleet_outcomes_as_the_workers_limit_does(tmp_path):
    """The scenario of ``tests/integration/test_fleet_rate_limit_on_kafka.py``, replayed: one
    agent's runs fail once on each of 12 tools within a minute; with minRuns 1, minAgents 1
    and maxToolsPerAgentPerMinute 3, its first 3 tools open an incident and nothing else
    (worked by hand)."""
    from schemas.events import encode_event_lines
    from streams.offline.scenarios import tool_outage

    events = []
    for t in range(12):
        events += tool_outage(f"tool-{t:02d}", runs=1, agents=1, calls_per_run=1, run_prefix=f"forger-t{t}")
    trace = tmp_path / "forger.jsonl"
    trace.write_bytes(encode_event_lines(events))
    config = tmp_path / "limit.json"
    incidents = {"enabled": True, "minRuns": 1, "minAgents": 1, "quietSeconds": 600, "maxToolsPerAgentPerMinute": 3}
    config.write_text(
        json.dumps({"tools": {"loopDetection": {"enabled": True}}, "loopwatch": {"fleetIncidents": incidents}})
    )
    proc = loopwatch("replay", trace, "--config", config, "--json", check=True)
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    opened = [r["tool_name"] for r in lines[:-1] if r.get("type") == "fleet.incident_opened"]
    assert opened == ["tool-00", "tool-01", "tool-02"]
    assert lines[-1]["summary"]["fleet"] == {"fleet.incident_opened": 3}


def test_config_check_shows_the_fleet_wide_options():
    proc = loopwatch("config", "check", EXAMPLES / "fleet-options.yaml", "--json", check=True)
    effective = json.loads(proc.stdout)
    assert effective["(fleet)"] == {
        "scope": "session",
        "fleetIncidents": {
            "enabled": True,
            "minRuns": 20,
            "minAgents": 3,
            "windowSeconds": 300,
            "hopSeconds": 60,
            "quietSeconds": 300,
            "maxOpenIncidents": 50,
            "maxToolsPerAgentPerMinute": 30,
        },
        "agentRings": {"enabled": True, "warningThreshold": 3, "criticalThreshold": 5, "windowSeconds": 3600},
    }
    assert effective["(default)"]["loopwatch"]["detectors"] == {
        "cycle": True,
        "nearIdentical": False,
        "earlyWarning": False,
    }
    # Issue 26: that incidents can be forged without signed events, in one warning line.
    assert proc.stderr.strip().splitlines() == [
        "loopwatch config check: warning: loopwatch.fleetIncidents: without signed events (LOOPWATCH_SIGNING_KEYS) "
        "the runs and agents an incident counts are what events claim, so one producer can open incidents for any "
        "tool (bounded by maxOpenIncidents and maxToolsPerAgentPerMinute); with signed events only agents whose "
        "signatures verified count"
    ]
    plain = json.loads(loopwatch("config", "check", EXAMPLES / "loop-detection.yaml", "--json", check=True).stdout)
    assert plain["(fleet)"] == {"scope": "run", "fleetIncidents": {"enabled": False}, "agentRings": {"enabled": False}}


def test_config_check_says_detection_off_in_words_per_agent(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("agents:\n  list:\n    - id: main\n      tools: {loopDetection: {enabled: true}}\n    - id: cron\n")
    proc = loopwatch("config", "check", path, check=True)
    assert "detection OFF for (default), cron: tools.loopDetection.enabled is not true" in proc.stdout
    effective = json.loads(loopwatch("config", "check", path, "--json", check=True).stdout)
    assert effective["main"]["detection"] == "on"
    assert effective["cron"]["detection"].startswith("OFF: ") and effective["(default)"]["detection"].startswith("OFF")
    on = loopwatch("config", "check", EXAMPLES / "getting-started.yaml", check=True)
    assert "OFF" not in on.stdout
