"""Settings are checked by name: every ``LOOPWATCH_*`` variable a loopwatch process reads is in
one registry (``streams.app.settings.VARIABLES``), and the worker refuses any other, naming the
closest registered one, instead of ignoring a misspelt security setting."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from schemas.config import ConfigError, load_config_bytes
from streams.app.settings import PREFIX, VARIABLES, Settings, SettingsError

REPO = Path(__file__).resolve().parents[2]

# Spelt from parts so that the source scan below does not read the typos as names.
MISSPELT_PROTOCOL = PREFIX + "SECURITY_PROTOCOL"
MENTIONED_NOT_READ = {PREFIX + "SHARED"}
"""Named in the source without being read: tests/meta/test_ci_rules.py forbids it."""


def source_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [
        REPO / name
        for name in listed.splitlines()
        # Prose may name an operator's own shell variables; tests/data holds recorded traces.
        if not name.endswith(".md") and not name.startswith("tests/data/") and (REPO / name).is_file()
    ]


def test_every_loopwatch_name_in_the_source_is_registered():
    pattern = re.compile(r"LOOPWATCH_[A-Z0-9_]+")
    found: dict[str, str] = {}
    for path in source_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for name in pattern.findall(text):
            if not name.endswith("_"):  # a prefix (LOOPWATCH_KAFKA_...), not a name
                found.setdefault(name, str(path.relative_to(REPO)))
    assert len(found) > 40, "the scan found too few names to be scanning the tree"
    unregistered = {name: where for name, where in found.items() if name not in set(VARIABLES) | MENTIONED_NOT_READ}
    assert unregistered == {}, "read in the source but missing from streams.app.settings.VARIABLES"


def test_the_helm_chart_sets_only_registered_names():
    chart = (REPO / "helm/loopwatch/templates/statefulset.yaml").read_text()
    names = set(re.findall(r"name: (LOOPWATCH_[A-Z0-9_]+)", chart))
    assert PREFIX + "KAFKA_SECURITY_PROTOCOL" in names
    assert names <= set(VARIABLES)


def test_a_misspelt_security_protocol_is_refused_with_the_real_name():
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({MISSPELT_PROTOCOL: "SSL"})
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"unknown setting {MISSPELT_PROTOCOL}: did you mean LOOPWATCH_KAFKA_SECURITY_PROTOCOL?")


@pytest.mark.parametrize(
    "typo, meant",
    [
        ("BROKR", "LOOPWATCH_BROKER"),
        ("IDLE_TIMEOUT", "LOOPWATCH_IDLE_TIMEOUT_S"),
        ("SIGNIN_KEYS", "LOOPWATCH_SIGNING_KEYS"),
        ("KAFKA_SSL_CA_FILE", "LOOPWATCH_KAFKA_SSL_CAFILE"),
        ("settings_file", "LOOPWATCH_SETTINGS_FILE"),  # names are case-sensitive, as the worker reads them
    ],
)
def test_each_unknown_variable_names_the_closest_valid_one(typo, meant):
    with pytest.raises(SettingsError, match=f"did you mean {meant}\\?"):
        Settings.from_env({PREFIX + typo: "x"})


def test_every_unknown_variable_is_named_in_one_line():
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({PREFIX + "BROKR": "a:1", PREFIX + "WEB_PROT": "1", "OTHER_VARIABLE": "kept"})
    message = str(refused.value)
    assert "\n" not in message
    assert f"{PREFIX}BROKR: did you mean LOOPWATCH_BROKER?" in message
    assert f"{PREFIX}WEB_PROT: did you mean LOOPWATCH_WEB_PORT?" in message
    assert "OTHER_VARIABLE" not in message


def test_names_other_loopwatch_commands_read_are_accepted():
    env = {
        PREFIX + "SIGNING_KEY": "/tmp/k.json",
        PREFIX + "HOOK_SOCKET": "/tmp/s",
        PREFIX + "CACHE": "/tmp/c",
        PREFIX + "TEST_KEEP_LOGS": "1",
    }
    assert Settings.from_env(env).broker == "127.0.0.1:19092"


def test_a_misspelt_settings_file_key_is_refused_with_the_real_name(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"broker": "a:1", "security_protocl": "SSL"}))
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({PREFIX + "SETTINGS_FILE": str(path)})
    message = str(refused.value)
    assert "\n" not in message
    assert "unknown setting 'security_protocl'" in message
    assert message.endswith("did you mean 'security_protocol'?")


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            '{"tools": {"loopDetection": {"enabled": true, "warningThreshhold": 3}}}',
            'tools.loopDetection: Unrecognized key: "warningThreshhold"; did you mean "warningThreshold"?',
        ),
        (
            '{"tools": {"loopDetection": {"enabled": true, "detectors": {"pingpong": true}}}}',
            'tools.loopDetection.detectors: Unrecognized key: "pingpong"; did you mean "pingPong"?',
        ),
        # Open sections (keys loopwatch does not read are OpenClaw's): a near miss of the one
        # key loopwatch reads would leave detection off, so it is refused too.
        (
            '{"tools": {"loopDetecton": {"enabled": true}}}',
            'tools: Unrecognized key: "loopDetecton"; did you mean "loopDetection"?',
        ),
        ('{"loopWatch": {"mode": "gate"}}', '(root): Unrecognized key: "loopWatch"; did you mean "loopwatch"?'),
        (
            '{"agents": {"list": [{"id": "a", "tools": {"loop_detection": {"enabled": false}}}]}}',
            'agents.list[0].tools: Unrecognized key: "loop_detection"; did you mean "loopDetection"?',
        ),
    ],
)
def test_a_misspelt_config_key_is_refused_with_the_closest_valid_key(text, expected):
    with pytest.raises(ConfigError) as refused:
        load_config_bytes(text.encode(), "loop.json")
    message = str(refused.value)
    assert "\n" not in message
    assert expected in message


def test_other_keys_of_an_openclaw_config_are_still_ignored():
    text = '{"gateway": {"port": 1}, "tools": {"exec": {}, "loopDetection": {"enabled": true}}, "agents": {"list": [{"id": "a", "model": "m"}]}}'
    assert load_config_bytes(text.encode(), "loop.json")["gateway"] == {"port": 1}


def test_the_worker_command_refuses_a_misspelt_variable_in_one_line(tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        MISSPELT_PROTOCOL: "SSL",
        PREFIX + "DATA_DIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-m", "streams.cli", "worker"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"loopwatch worker: unknown setting {MISSPELT_PROTOCOL}: did you mean LOOPWATCH_KAFKA_SECURITY_PROTOCOL?"
        " (no loopwatch process reads it, so it is refused, not ignored)"
    ]


def test_the_worker_refuses_a_runners_signing_key_where_its_own_keys_are_not_set():
    # LOOPWATCH_SIGNING_KEY is the gateway's and the hook's (registered, so from_env takes it);
    # on a worker it is one letter from LOOPWATCH_SIGNING_KEYS and would leave signatures unchecked.
    from streams.app.settings import refuse_a_runners_signing_key

    with pytest.raises(SettingsError, match="did you mean it\\?$"):
        refuse_a_runners_signing_key({PREFIX + "SIGNING_KEY": "keys.json"})
    refuse_a_runners_signing_key({PREFIX + "SIGNING_KEY": "k.json", PREFIX + "SIGNING_KEYS": "keys.json"})
    run = subprocess.run(
        [sys.executable, "-m", "streams.cli", "worker"],
        env={**os.environ, PREFIX + "SIGNING_KEY": "keys.json"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "loopwatch worker: LOOPWATCH_SIGNING_KEY is a runner's key to sign with (the gateway's, the hook's);"
        " the worker checks signatures with LOOPWATCH_SIGNING_KEYS: did you mean it?"
    ]
