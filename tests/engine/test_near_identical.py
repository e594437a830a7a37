"""loopwatch's opt-in ``nearIdentical`` setting: detectors count calls by ``near_args_hash``
instead of ``args_hash``.  The expected stops are worked out by hand from upstream's rule (a
call blocked once its call has ``criticalThreshold`` identical outcomes in the history); where
the setting must change nothing, the reference is the engine without it."""

import msgspec
import pytest

from schemas.config import check
from schemas.events import UNSET
from streams.edge.events import completed_event, requested_event
from streams.engine import LoopEngine, RunDriver, engine_for

TIGHT = {"tools": {"loopDetection": {"enabled": True, "historySize": 8, "warningThreshold": 3, "criticalThreshold": 4}}}
NEAR = {**TIGHT, "loopwatch": {"detectors": {"nearIdentical": True}}}
FIELDS = dict(run_id="r1", session_key="agent:main:r1", agent_id="main")
# The planted near-identical shape's forms (streams/offline/plant.py): one listing, varied.
FORMS = [
    "ls -l src/io",
    "ls  -l src/io",
    "ls -l  src/io",
    "ls -la src/io",
    "ls -al src/io",
    "ls -l -a src/io",
    "ls -a -l src/io",
    "ls -l src/io/",
]
LISTING = "total 8\n-rw-r--r-- 1 dev dev 412 io_0.py"


def drive(config, commands, *, loose=True):
    """Each command requested (gated) then completed unless blocked; the decisions, in order.
    ``loose=False``: events without ``near_args_hash``, as a runner that leaves it unset sends."""
    runs = RunDriver(engine_for(config))
    decisions = []
    for n, command in enumerate(commands):
        args = {"command": command}
        requested = requested_event(f"e{n}", "bash", args, tool_call_id=f"c{n}", gate=True, **FIELDS)
        completed = completed_event(f"d{n}", "bash", args, tool_call_id=f"c{n}", result=LISTING, **FIELDS)
        if not loose:
            requested = msgspec.structs.replace(requested, near_args_hash=UNSET)
            completed = msgspec.structs.replace(completed, near_args_hash=UNSET)
        decision = runs.handle(requested).decision
        decisions.append(decision)
        if decision.action != "block":
            runs.handle(completed)
    return decisions


def test_near_identical_commands_are_blocked_as_one_call_repeated():
    decisions = drive(NEAR, FORMS)
    # Calls 0-3 run with one output: the 5th call (index 4) has 4 identical outcomes before it.
    blocks = [(n, d.detector, d.count) for n, d in enumerate(decisions) if d.action == "block"]
    assert blocks[0] == (4, "generic_repeat", 4)
    assert all(d.action != "block" for d in decisions[:4])
    # The decision names the call by the key it was counted by.
    assert decisions[4].args_hash == f"bash:{requested_event('x', 'bash', {'command': FORMS[4]}).near_args_hash}"


def test_off_by_default_each_form_is_a_new_call():
    assert type(engine_for(TIGHT)) is LoopEngine
    assert all(d.action == "allow" and d.detector is None for d in drive(TIGHT, FORMS))


def test_events_without_the_field_are_judged_by_args_hash():
    assert [(d.action, d.detector) for d in drive(NEAR, FORMS, loose=False)] == [
        (d.action, d.detector) for d in drive(TIGHT, FORMS)
    ]


def test_identical_calls_are_judged_as_without_the_setting():
    same = [FORMS[0]] * 8
    assert [(d.action, d.detector, d.count) for d in drive(NEAR, same)] == [
        (d.action, d.detector, d.count) for d in drive(TIGHT, same)
    ]


def test_different_listings_stay_different_calls():
    commands = ["ls -l src/io", "ls -l src/core", "ls -l src/views", "ls -l src/forms"] * 2
    assert all(d.action == "allow" for d in drive(NEAR, commands))


@pytest.mark.parametrize("value", ["yes", 1])
def test_a_setting_that_is_not_a_boolean_is_refused(value):
    errors, _ = check({"loopwatch": {"detectors": {"nearIdentical": value}}})
    assert [e.path for e in errors] == ["loopwatch.detectors.nearIdentical"]


@pytest.mark.parametrize("profile", ["openhands", "gemini-cli"])
def test_a_peer_profile_is_told_the_setting_is_ignored(profile):
    errors, notes = check({"loopwatch": {"profile": profile, "detectors": {"nearIdentical": True}}})
    assert not errors
    assert [n.path for n in notes] == ["loopwatch.detectors.nearIdentical"]


def test_the_configuration_pages_snippet_turns_it_on():
    import re
    from pathlib import Path

    import yaml

    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text(encoding="utf-8")
    section = page[page.index("**Near-identical calls**") :]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None
    root = yaml.safe_load(block.group(1))
    assert check(root) == ([], [])
    config = {**TIGHT, **root}
    assert engine_for(config).config.settings_for(None).near_identical
    assert [d.action for d in drive(config, FORMS)][4] == "block"
