"""``loopwatch mcp-gateway``'s bad input: one line on stderr, exit code 2, no traceback; and the
one line that names the extra when the ``mcp`` SDK is not installed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness import REPO
from harness.cli import loopwatch, one_line_error


def test_without_upstreams():
    one_line_error(loopwatch("mcp-gateway"), 2, "loopwatch mcp-gateway:", "--upstream")


@pytest.mark.parametrize(
    "text, needles",
    [
        ("upstreams: [", ["not YAML"]),
        ("upstreams: {}", ["non-empty list under 'upstreams'"]),
        ("upstreams:\n  - {name: a}", ["upstreams[0]", "command or a url"]),
        ("upstreams:\n  - {command: x, url: 'http://h/mcp'}", ["upstreams[0]", "not both"]),
        ("upstreams:\n  - {command: x, port: 3}", ["upstreams[0]", "unknown key(s) port"]),
        ("upstreams:\n  - {command: [x, 3]}", ["'command' is a string or a list of strings"]),
        ("upstreams:\n  - {command: x, env: {A: 1}}", ["'env' maps names to strings"]),
    ],
)
def test_bad_upstreams_file(tmp_path, text, needles):
    path = tmp_path / "upstreams.yaml"
    path.write_text(text)
    one_line_error(loopwatch("mcp-gateway", "--upstreams-file", path), 2, str(path), *needles)


def test_missing_upstreams_file(tmp_path):
    one_line_error(loopwatch("mcp-gateway", "--upstreams-file", tmp_path / "nope.yaml"), 2, "nope.yaml")


def test_prefix_for_an_unknown_upstream():
    one_line_error(
        loopwatch("mcp-gateway", "--upstream", "time=mcp-server-time", "--prefix", "other=x_"),
        2,
        "--prefix for unknown upstream(s): other",
        "upstreams: time",
    )


def test_two_upstreams_of_one_name():
    one_line_error(loopwatch("mcp-gateway", "--upstream", "a=cmd1", "--upstream", "a=cmd2"), 2, "same name")


def test_non_positive_timeout():
    one_line_error(loopwatch("mcp-gateway", "--upstream", "x", "--timeout", "0"), 2, "--timeout must be positive")


def test_without_the_extra_one_line_names_it():
    # the mcp SDK made unimportable in a child interpreter, as on an install without the extra
    code = "import sys; sys.modules['mcp'] = None; from streams.cli import main; sys.exit(main(['mcp-gateway']))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    one_line_error(proc, 2, "pip install 'loopwatch[mcp]'")
