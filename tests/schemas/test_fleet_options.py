"""The config of issue 17's options: validated as strictly as upstream's blocks, with
messages in upstream's words; resolved leniently at run time, as upstream resolves."""

import pytest

from schemas.config import validate
from streams.engine.config import AgentRingSettings, ConfigSet, FleetIncidentSettings


def messages(root):
    return [str(issue) for issue in validate(root)]


def test_every_option_with_its_defaults_is_valid():
    root = {
        "loopwatch": {
            "scope": "session",
            "detectors": {"cycle": True},
            "fleetIncidents": {
                "enabled": True,
                "minRuns": 20,
                "minAgents": 3,
                "windowSeconds": 300,
                "hopSeconds": 60,
                "quietSeconds": 300,
            },
            "agentRings": {"enabled": True, "warningThreshold": 3, "criticalThreshold": 5, "windowSeconds": 3600},
        },
        "agents": {"list": [{"id": "cron", "loopwatch": {"detectors": {"cycle": False}}}]},
    }
    assert messages(root) == []


@pytest.mark.parametrize(
    "options, expected",
    [
        ({"scope": "trace"}, "loopwatch.scope: Invalid option: expected one of 'run' | 'session'"),
        (
            {"detectors": {"cycle": "yes"}},
            "loopwatch.detectors.cycle: Invalid input: expected boolean, received string",
        ),
        ({"detectors": {"ring": True}}, 'loopwatch.detectors: Unrecognized key: "ring"; did you mean "earlyWarning"?'),
        (
            {"fleetIncidents": {"enabled": True, "minRuns": 0}},
            "loopwatch.fleetIncidents.minRuns: Too small: expected number to be >0",
        ),
        (
            {"fleetIncidents": {"minRuns": 1001}},
            "loopwatch.fleetIncidents.minRuns: Too big: expected number to be <=1000",
        ),
        (
            {"fleetIncidents": {"windowSeconds": 86_401}},
            "loopwatch.fleetIncidents.windowSeconds: Too big: expected number to be <=86400",
        ),
        (
            {"fleetIncidents": {"minRuns": 5}},  # minAgents 3 by default: fine
            None,
        ),
        (
            {"fleetIncidents": {"minRuns": 2}},
            "loopwatch.fleetIncidents.minAgents: loopwatch.fleetIncidents.minAgents must not exceed minRuns.",
        ),
        (
            {"fleetIncidents": {"hopSeconds": 600}},
            "loopwatch.fleetIncidents.hopSeconds: loopwatch.fleetIncidents.hopSeconds must not exceed windowSeconds.",
        ),
        (
            {"fleetIncidents": {"enabled": 1}},
            "loopwatch.fleetIncidents.enabled: Invalid input: expected boolean, received number",
        ),
        (
            {"agentRings": {"warningThreshold": 5}},
            "loopwatch.agentRings.criticalThreshold: loopwatch.agentRings.warningThreshold must be lower than criticalThreshold.",
        ),
        (
            {"agentRings": {"criticalThreshold": 2.5}},
            "loopwatch.agentRings.criticalThreshold: Invalid input: expected int, received number",
        ),
        ({"agentRings": []}, "loopwatch.agentRings: Invalid input: expected object, received array"),
    ],
)
def test_bad_values_are_refused_in_upstreams_words(options, expected):
    assert messages({"loopwatch": options}) == ([] if expected is None else [expected])


@pytest.mark.parametrize("key", ["scope", "fleetIncidents", "agentRings"])
def test_fleet_wide_options_belong_to_the_root(key):
    root = {
        "agents": {"list": [{"id": "main", "loopwatch": {key: "session" if key == "scope" else {"enabled": True}}}]}
    }
    assert messages(root) == [
        f"agents.list[0].loopwatch.{key}: {key} applies to the whole fleet: set it in the root loopwatch block"
    ]


def test_resolution():
    config = ConfigSet(
        {
            "loopwatch": {
                "scope": "session",
                "detectors": {"cycle": True},
                "fleetIncidents": {"enabled": True, "minRuns": 5},
                "agentRings": {"enabled": True, "warningThreshold": 4},
            },
            "agents": {"list": [{"id": "cron", "loopwatch": {"detectors": {"cycle": False}}}]},
        }
    )
    assert config.scope == "session"
    assert config.fleet_incidents == FleetIncidentSettings(min_runs=5, min_agents=3)
    assert config.agent_rings == AgentRingSettings(warning_rounds=4, critical_rounds=5)
    assert config.settings_for("main").cycle and not config.settings_for("cron").cycle
    assert config.uses_extensions()
    off = ConfigSet({"loopwatch": {"fleetIncidents": {"minRuns": 5}, "agentRings": {"enabled": "yes"}}})
    assert (off.scope, off.fleet_incidents, off.agent_rings, off.uses_extensions()) == ("run", None, None, False)
    # Like upstream's runtime, resolution tolerates what validation refuses, and clamps.
    lenient = ConfigSet(
        {
            "loopwatch": {
                "fleetIncidents": {"enabled": True, "minRuns": 2, "hopSeconds": 900},
                "agentRings": {"enabled": True, "warningThreshold": 6, "criticalThreshold": 2},
            }
        }
    )
    assert lenient.fleet_incidents == FleetIncidentSettings(min_runs=2, min_agents=2, hop_s=300)
    assert lenient.agent_rings == AgentRingSettings(warning_rounds=6, critical_rounds=7)
