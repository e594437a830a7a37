import dataclasses
import json
import ssl
from pathlib import Path

import faust
import pytest

from streams.app.faust_options import broker_credentials
from streams.app.settings import Settings, SettingsError


def test_defaults():
    s = Settings.from_env({})
    assert s.broker == "127.0.0.1:19092"
    assert s.broker_url == "kafka://127.0.0.1:19092"
    assert s.app_id == "loopwatch"
    assert s.config is None
    assert s.data_dir == Path(".loopwatch-state")
    assert (s.web_host, s.web_port, s.metrics_port) == ("127.0.0.1", 6066, 9108)
    assert (s.tool_calls_topic, s.verdicts_topic, s.dead_letter_topic) == (
        "tool-calls",
        "loop-verdicts",
        "tool-calls-dlq",
    )
    assert (s.partitions, s.replication) == (4, 1)
    assert s.idle_timeout_s == 1800
    assert (s.max_runs_per_agent, s.signed_max_age_s) == (20_000, 300.0)
    assert s.security_protocol == "PLAINTEXT"
    assert broker_credentials(s) is None
    assert s.kafka_client_options() == {"security_protocol": "PLAINTEXT"}


def test_environment_overrides_everything():
    env = {
        "LOOPWATCH_BOOTSTRAP": "kafka://a:1, b:2",
        "LOOPWATCH_APP_ID": "lw-test",
        "LOOPWATCH_CONFIG": "/etc/loop.yaml",
        "LOOPWATCH_DATA_DIR": "/var/lib/lw",
        "LOOPWATCH_WEB_HOST": "0.0.0.0",
        "LOOPWATCH_WEB_PORT": "7000",
        "LOOPWATCH_METRICS_PORT": "0",
        "LOOPWATCH_TOOL_CALLS_TOPIC": "tc",
        "LOOPWATCH_VERDICTS_TOPIC": "vd",
        "LOOPWATCH_DEAD_LETTER_TOPIC": "dl",
        "LOOPWATCH_PARTITIONS": "12",
        "LOOPWATCH_REPLICATION": "3",
        "LOOPWATCH_IDLE_TIMEOUT_S": "90.5",
        "LOOPWATCH_SESSION_TIMEOUT_S": "6",
    }
    s = Settings.from_env(env)
    assert s.broker_hosts == ["a:1", "b:2"]
    assert s.broker_url == "kafka://a:1;kafka://b:2"
    assert s.app_id == "lw-test"
    assert s.config == Path("/etc/loop.yaml")
    assert s.data_dir == Path("/var/lib/lw")
    assert (s.web_host, s.web_port, s.metrics_port) == ("0.0.0.0", 7000, 0)
    assert (s.tool_calls_topic, s.verdicts_topic, s.dead_letter_topic) == ("tc", "vd", "dl")
    assert (s.partitions, s.replication) == (12, 3)
    assert s.idle_timeout_s == 90.5
    assert s.session_timeout_s == 6.0


def test_empty_values_mean_default():
    assert Settings.from_env({"LOOPWATCH_CONFIG": "", "LOOPWATCH_PARTITIONS": ""}) == Settings()


@pytest.mark.parametrize(
    "name, value",
    [
        ("LOOPWATCH_PARTITIONS", "zero"),
        ("LOOPWATCH_PARTITIONS", "0"),
        ("LOOPWATCH_WEB_PORT", "70000"),
        ("LOOPWATCH_WEB_PORT", "0"),
        ("LOOPWATCH_METRICS_PORT", "-1"),
        ("LOOPWATCH_IDLE_TIMEOUT_S", "0"),
        ("LOOPWATCH_IDLE_TIMEOUT_S", "nan"),
        ("LOOPWATCH_IDLE_TIMEOUT_S", "soon"),
        ("LOOPWATCH_BOOTSTRAP", "no-port"),
        ("LOOPWATCH_KAFKA_SECURITY_PROTOCOL", "TLS"),
        ("LOOPWATCH_VERDICTS_TOPIC", "tool-calls"),
        ("LOOPWATCH_MAX_RUNS_PER_AGENT", "0"),
        ("LOOPWATCH_SIGNED_MAX_AGE_S", "0"),
        ("LOOPWATCH_SIGNED_MAX_AGE_S", "-5"),
    ],
)
def test_bad_values_name_the_variable(name, value):
    with pytest.raises(SettingsError) as info:
        Settings.from_env({name: value})
    assert name.removeprefix("LOOPWATCH_").split("_")[0] in str(info.value) or "topics" in str(info.value)


def test_overrides_win_over_environment():
    s = Settings.from_env({"LOOPWATCH_WEB_PORT": "7000"}, web_port=7001, config=None)
    assert s.web_port == 7001
    with pytest.raises(SettingsError):
        Settings.from_env({}, no_such_setting=1)


def test_settings_file_is_below_environment(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"LOOPWATCH_APP_ID": "from-file", "partitions": 8, "web_port": 7100}))
    s = Settings.from_env({"LOOPWATCH_SETTINGS_FILE": str(path), "LOOPWATCH_WEB_PORT": "7200"})
    assert (s.app_id, s.partitions, s.web_port) == ("from-file", 8, 7200)


def test_settings_file_yaml_and_errors(tmp_path):
    path = tmp_path / "settings.yaml"
    path.write_text(
        "kafka_security_protocol: sasl_plaintext\nkafka_sasl_mechanism: plain\nkafka_sasl_username: u\nkafka_sasl_password: p\n"
    )
    s = Settings.from_env({"LOOPWATCH_SETTINGS_FILE": str(path)})
    assert s.security_protocol == "SASL_PLAINTEXT" and s.sasl_mechanism == "PLAIN"
    path.write_text("bogus_key: 1\n")
    with pytest.raises(SettingsError, match="unknown setting"):
        Settings.from_env({"LOOPWATCH_SETTINGS_FILE": str(path)})
    with pytest.raises(SettingsError, match="cannot read"):
        Settings.from_env({"LOOPWATCH_SETTINGS_FILE": str(tmp_path / "missing.json")})


def test_sasl_plaintext_credentials():
    s = Settings.from_env(
        {
            "LOOPWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "LOOPWATCH_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "LOOPWATCH_KAFKA_SASL_USERNAME": "loopwatch",
            "LOOPWATCH_KAFKA_SASL_PASSWORD": "secret",
        }
    )
    creds = broker_credentials(s)
    assert isinstance(creds, faust.SASLCredentials)
    assert creds.protocol.value == "SASL_PLAINTEXT"
    assert creds.mechanism.value == "SCRAM-SHA-512"
    assert (creds.username, creds.password) == ("loopwatch", "secret")
    assert "secret" not in repr(s)
    opts = s.kafka_client_options()
    assert opts["sasl_mechanism"] == "SCRAM-SHA-512" and opts["sasl_plain_password"] == "secret"


def test_sasl_needs_mechanism_and_user():
    with pytest.raises(SettingsError, match="MECHANISM"):
        Settings.from_env({"LOOPWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"})
    with pytest.raises(SettingsError, match="USERNAME"):
        Settings.from_env({"LOOPWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "LOOPWATCH_KAFKA_SASL_MECHANISM": "PLAIN"})


def test_ssl_credentials_use_the_ca_file():
    ca = ssl.get_default_verify_paths().cafile
    if not ca or not Path(ca).exists():
        pytest.skip("no system CA bundle")
    s = Settings.from_env({"LOOPWATCH_KAFKA_SECURITY_PROTOCOL": "ssl", "LOOPWATCH_KAFKA_SSL_CAFILE": ca})
    creds = broker_credentials(s)
    assert isinstance(creds, faust.SSLCredentials)
    assert creds.protocol.value == "SSL"
    assert creds.context.verify_mode == ssl.CERT_REQUIRED
    assert creds.context.check_hostname


def test_sasl_ssl_credentials_carry_a_context():
    s = Settings.from_env(
        {
            "LOOPWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "LOOPWATCH_KAFKA_SASL_MECHANISM": "PLAIN",
            "LOOPWATCH_KAFKA_SASL_USERNAME": "u",
            "LOOPWATCH_KAFKA_SASL_PASSWORD": "p",
        }
    )
    creds = broker_credentials(s)
    assert creds.protocol.value == "SASL_SSL"
    assert isinstance(creds.ssl_context, ssl.SSLContext)


def test_keyfile_needs_certfile():
    with pytest.raises(SettingsError, match="CERTFILE"):
        Settings.from_env({"LOOPWATCH_KAFKA_SECURITY_PROTOCOL": "SSL", "LOOPWATCH_KAFKA_SSL_KEYFILE": "/k.pem"})


def test_sweep_interval_is_bounded():
    assert Settings(idle_timeout_s=1800).sweep_interval_s == 60
    assert Settings(idle_timeout_s=100).sweep_interval_s == 10
    assert Settings(idle_timeout_s=2).sweep_interval_s == 1


def test_static_group_membership_id():
    import socket

    s = Settings.from_env({})
    assert s.instance_id == socket.gethostname()
    pod = Settings.from_env({"LOOPWATCH_INSTANCE_ID": "loopwatch-2", "LOOPWATCH_WEB_PORT": "6066"})
    # Stable across restarts with the same settings ...
    assert pod.group_instance_id == Settings.from_env({"LOOPWATCH_INSTANCE_ID": "loopwatch-2"}).group_instance_id
    assert pod.group_instance_id.startswith("loopwatch-2-") and len(pod.group_instance_id) == len("loopwatch-2-") + 8
    # ... and another id when the worker's URL changes (Faust refuses an assignment made for
    # another URL, and a static member is handed its old assignment).
    assert dataclasses.replace(pod, web_port=7000).group_instance_id != pod.group_instance_id
    assert dataclasses.replace(pod, web_host="0.0.0.0").group_instance_id != pod.group_instance_id
    for bad in ("", "pod 1", "pod/1", "ü", "x" * 241):
        with pytest.raises(SettingsError, match="LOOPWATCH_INSTANCE_ID"):
            Settings(instance_id=bad).checked()
    assert Settings(instance_id="a.b_c-1" + "x" * 233).checked()


def test_broker_and_clock_settings():
    s = Settings.from_env({"LOOPWATCH_BROKER_UNREACHABLE_S": "3", "LOOPWATCH_CLOCK_SKEW_S": "60"})
    assert (s.broker_unreachable_s, s.clock_skew_s) == (3.0, 60.0)
    assert (Settings().broker_unreachable_s, Settings().clock_skew_s) == (15.0, 300.0)
    for name in ("LOOPWATCH_BROKER_UNREACHABLE_S", "LOOPWATCH_CLOCK_SKEW_S"):
        with pytest.raises(SettingsError, match=name):
            Settings.from_env({name: "0"})
