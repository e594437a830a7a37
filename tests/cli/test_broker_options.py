"""One way to name the broker and its security on every command: ``--bootstrap``
(``LOOPWATCH_BOOTSTRAP``) and the worker's TLS/SASL flags reach each command's settings, and
the old ``--broker`` / ``LOOPWATCH_BROKER`` still work with one deprecation line.

Each command is run for real; the value given is one the settings refuse, so the command
stops at once with the settings' own line, which proves the flag reached them (no broker is
needed)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness import REPO
from harness.cli import one_line_error


def run(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWATCH_")}
    return subprocess.run(
        [sys.executable, "-m", "streams.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**clean, **(env or {})},
        timeout=120,
    )


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "loop.json"
    path.write_text('{"tools": {"loopDetection": {"enabled": true}}}')
    return path


def commands(config) -> dict[str, list[object]]:
    """Each command that talks to Kafka, with everything but the broker flags."""
    return {
        "worker": ["worker", "--config", config, "--metrics-port", "0"],
        "mcp-gateway": ["mcp-gateway", "--upstream", "mcp-server-time"],
        "backtest": ["backtest", "--topic", "tool-calls", "--baseline", config, "--candidate", config],
        "hook": ["hook", "--serve", "--socket", config.parent / "hook.sock"],
        "demo": ["demo", "--config", config],
        "otlp": ["otlp", "--port", "0"],
    }


COMMANDS = ("worker", "mcp-gateway", "backtest", "hook", "demo", "otlp")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_takes_bootstrap(command, config):
    proc = run(*commands(config)[command], "--bootstrap", "kafka-without-a-port")
    one_line_error(proc, 2, "LOOPWATCH_BOOTSTRAP", "'kafka-without-a-port' is not host:port")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_reads_loopwatch_bootstrap(command, config):
    proc = run(*commands(config)[command], env={"LOOPWATCH_BOOTSTRAP": "kafka-without-a-port"})
    one_line_error(proc, 2, "'kafka-without-a-port' is not host:port")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_takes_the_workers_security_flags(command, config, tmp_path):
    proc = run(
        *commands(config)[command],
        "--bootstrap",
        "127.0.0.1:9",
        "--security-protocol",
        "SASL_SSL",
        "--ssl-cafile",
        tmp_path / "no-ca.pem",
    )
    one_line_error(proc, 2, "LOOPWATCH_KAFKA_SASL_MECHANISM must be one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512")


@pytest.mark.parametrize("command", COMMANDS)
def test_the_old_flag_works_with_a_deprecation_line(command, config):
    proc = run(*commands(config)[command], "--broker", "kafka-without-a-port")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].endswith("--broker is deprecated, use --bootstrap")
    assert "'kafka-without-a-port' is not host:port" in lines[1]


@pytest.mark.parametrize("command", COMMANDS)
def test_the_old_variable_works_with_a_deprecation_line(command, config):
    proc = run(*commands(config)[command], env={"LOOPWATCH_BROKER": "kafka-without-a-port"})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].endswith("LOOPWATCH_BROKER is deprecated, use LOOPWATCH_BOOTSTRAP")
    assert "'kafka-without-a-port' is not host:port" in lines[1]


def test_the_new_variable_wins_over_the_old_without_a_word(config):
    proc = run(
        *commands(config)["worker"],
        env={"LOOPWATCH_BROKER": "old:1", "LOOPWATCH_BOOTSTRAP": "kafka-without-a-port"},
    )
    one_line_error(proc, 2, "'kafka-without-a-port' is not host:port")


@pytest.mark.parametrize("command", ("mcp-gateway", "hook", "otlp"))
def test_publishers_take_a_signing_key_file(command, config, tmp_path):
    proc = run(*commands(config)[command], "--bootstrap", "127.0.0.1:9", "--signing-key", tmp_path / "absent.json")
    one_line_error(proc, 2, "absent.json: cannot read")


@pytest.mark.parametrize("command", ("worker", "backtest"))
def test_the_worker_and_the_backtest_take_the_workers_signing_keys(command, config, tmp_path):
    proc = run(*commands(config)[command], "--bootstrap", "127.0.0.1:9", "--signing-keys", tmp_path / "absent")
    one_line_error(proc, 2, "LOOPWATCH_SIGNING_KEYS", "does not exist")
