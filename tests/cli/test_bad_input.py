"""Bad input on the command line: one clear line on stderr and a non-zero exit, never a
traceback (issue 13)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from harness.cli import loopwatch, one_line_error

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
TRACES = REPO / "tests" / "data" / "conformance" / "traces"
NOT_UTF8 = "tools:\n  loopDetection:\n    enabled: true  # caf\xe9\n".encode("latin-1")


def worker_at_no_broker(config: Path, tmp_path: Path):
    """``loopwatch worker`` with ``config``, a broker address nothing listens on, and its own
    state directory: what it says before (or instead of) its first connection."""
    return loopwatch(
        "worker",
        "--config",
        config,
        "--bootstrap",
        "127.0.0.1:9",
        "--data-dir",
        tmp_path / "state",
        "--metrics-port",
        "0",
    )


# -- config files: not UTF-8, empty ----------------------------------------------------------


@pytest.fixture
def latin1_config(tmp_path: Path) -> Path:
    path = tmp_path / "loop.yaml"
    path.write_bytes(NOT_UTF8)
    return path


def test_config_check_of_a_non_utf8_file(latin1_config):
    one_line_error(loopwatch("config", "check", latin1_config), 1, "not UTF-8 text (byte 0xe9 at offset 48)")


def test_replay_with_a_non_utf8_config(latin1_config):
    one_line_error(loopwatch("replay", EXAMPLES / "healthy-run.jsonl", "--config", latin1_config), 2, "not UTF-8")


def test_worker_with_a_non_utf8_config_exits_before_connecting(latin1_config, tmp_path):
    proc = worker_at_no_broker(latin1_config, tmp_path)
    one_line_error(proc, 2, "loopwatch worker:", "not UTF-8")


@pytest.mark.parametrize(
    "name, text",
    [
        ("e.yaml", ""),
        ("c.yaml", "# nothing here yet\n"),
        ("n.yaml", "null\n"),
        ("e.json", ""),
        ("n.json", "null"),
        ("w.json5", "  \n"),
    ],
)
def test_config_check_refuses_an_empty_document(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    one_line_error(
        loopwatch("config", "check", path),
        1,
        "holds no configuration",
        "refused",
        "start from examples/getting-started.yaml (detection on",
        "loopDetection: {enabled: true}",
    )
    assert "{} for" not in proc_text(path)  # {} is detection off too: never the advice


def proc_text(path) -> str:
    return loopwatch("config", "check", path).stderr


def test_worker_refuses_an_empty_config_at_start(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("")
    proc = worker_at_no_broker(path, tmp_path)
    one_line_error(proc, 2, "holds no configuration")


def test_an_explicit_empty_mapping_is_a_valid_config(tmp_path):
    path = tmp_path / "loop.json"
    path.write_text("{}")
    proc = loopwatch("config", "check", path, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["(default)"]["enabled"] is False


def test_config_check_of_a_yaml_syntax_error_is_one_line(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("tools:\n  loopDetection: [\n")
    one_line_error(loopwatch("config", "check", path), 1, "cannot parse .yaml")


# -- conformance --traces/--expected ------------------------------------------------------------


def _gz(path: Path, text: str) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write(text)
    return path


SESSIONS = TRACES / "one-run-sessions.jsonl.gz"
EXPECTED = TRACES / "expected.jsonl.gz"


@pytest.mark.parametrize(
    "make_args, needle",
    [
        (lambda d: ("--traces", d / "missing.jsonl.gz", "--expected", EXPECTED), "cannot read"),
        (lambda d: ("--traces", SESSIONS, "--expected", d / "missing.jsonl.gz"), "cannot read"),
        (lambda d: ("--traces", d, "--expected", EXPECTED), "cannot read"),
        (lambda d: ("--traces", SESSIONS, "--expected", _write(d / "plain.jsonl.gz", b'{"s": "x"}\n')), "cannot read"),
        (
            lambda d: (
                "--traces",
                SESSIONS,
                "--expected",
                _write(d / "cut.jsonl.gz", gzip.compress(b'{"s": "a", "i": 0}\n' * 500)[:40]),
            ),
            "cannot read",
        ),
        (
            lambda d: ("--traces", SESSIONS, "--expected", _write(d / "bad.jsonl", b'{"s": "a", "i": 0}\n{oops\n')),
            "bad.jsonl:2: not JSON",
        ),
        (
            lambda d: ("--traces", SESSIONS, "--expected", _write(d / "list.jsonl", b"[1, 2]\n")),
            "list.jsonl:1: expected one JSON object per line",
        ),
        (lambda d: ("--traces", SESSIONS, "--expected", _write(d / "latin.jsonl", b'{"s": "caf\xe9"}\n')), "not UTF-8"),
        (lambda d: ("--traces", EXPECTED, "--expected", SESSIONS), "is it the sessions file?"),
        (
            lambda d: (
                "--traces",
                _gz(d / "x.jsonl.gz", '{"s": "a", "i": 0}\n'),
                "--expected",
                _gz(d / "y.jsonl.gz", ""),
            ),
            "is it the expected-steps file?",
        ),
        (
            lambda d: ("--traces", _gz(d / "empty.jsonl.gz", "\n"), "--expected", _gz(d / "y.jsonl.gz", "")),
            "no sessions in the file",
        ),
        (lambda d: ("--traces", SESSIONS), "--traces and --expected go together"),
        (lambda d: ("--expected", EXPECTED, EXAMPLES / "healthy-run.jsonl"), "--traces and --expected go together"),
    ],
    ids=[
        "missing-traces",
        "missing-expected",
        "directory",
        "not-gzip",
        "truncated-gzip",
        "not-json",
        "not-an-object",
        "not-utf8",
        "swapped",
        "expected-as-sessions",
        "no-sessions",
        "traces-alone",
        "expected-with-files",
    ],
)
def test_conformance_traces_bad_arguments(tmp_path, make_args, needle):
    one_line_error(loopwatch("conformance", *make_args(tmp_path)), 2, "loopwatch conformance:", needle)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_a_malformed_session_is_a_failure_not_a_crash(tmp_path):
    sessions = _gz(tmp_path / "s.jsonl.gz", json.dumps({"id": "S1", "steps": [], "runs": "nope"}) + "\n")
    expected = _gz(tmp_path / "e.jsonl.gz", json.dumps({"s": "S1", "i": 0, "op": "call"}) + "\n")
    proc = loopwatch("conformance", "--traces", sessions, "--expected", expected)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.splitlines()[0].startswith("FAIL S1:")
    assert proc.stdout.strip().splitlines()[-1] == "0 passed, 1 failed, 0 skipped"


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"{oops", "Expecting"),
        (b'{"a": 1}', "JSON array of case objects"),
        (b"[1, 2]", "JSON array of case objects"),
        (b"\xff[]", "utf-8"),
    ],
)
def test_conformance_bad_case_files(tmp_path, content, needle):
    path = _write(tmp_path / "cases.json", content)
    one_line_error(loopwatch("conformance", path), 2, needle)


# -- replay --------------------------------------------------------------------------------------


def test_replay_fails_when_every_line_was_rejected(tmp_path):
    trace = _write(tmp_path / "t.jsonl", b'{oops\n{"type": "nope", "event_id": "x"}\n')
    proc = loopwatch("replay", trace)
    assert proc.returncode == 1
    assert "line 1: rejected (invalid_json)" in proc.stdout and "0 events, 0 runs, 2 rejected" in proc.stdout
    assert "all 2 lines were rejected" in proc.stderr and "Traceback" not in proc.stderr


def test_replay_fails_on_a_file_without_events(tmp_path):
    proc = loopwatch("replay", _write(tmp_path / "t.jsonl", b"\n\n"), "--json")
    assert proc.returncode == 1 and "holds no events" in proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["summary"]["events"] == 0


def test_replay_of_a_directory(tmp_path):
    one_line_error(loopwatch("replay", tmp_path), 2, "cannot read")


# -- worker --help -------------------------------------------------------------------------------


def test_worker_help_shows_every_option_and_setting():
    import dataclasses

    from streams.app.settings import Settings, env_name
    from streams.app.worker import build_parser

    proc = loopwatch("worker", "--help")
    assert proc.returncode == 0, proc.stderr
    import argparse

    actions = [a for a in build_parser()._actions if a.help is not argparse.SUPPRESS]  # --broker: deprecated
    options = [s for action in actions for s in action.option_strings]
    assert len(options) > 10 and "--bootstrap" in options
    for option in options:
        assert option in proc.stdout
    for f in dataclasses.fields(Settings):
        assert env_name(f.name) in proc.stdout


@pytest.mark.parametrize(
    "content, reason",
    [
        # A candidate judges the live config's run states, so it must group events as the live
        # config does (issue 16 with issue 17's session scope).
        (
            "tools:\n  loopDetection:\n    enabled: true\nloopwatch:\n  scope: session\n",
            "loopwatch.scope (session) is not the live config's (run)",
        ),
        ("tools: [unclosed\n", "candidate.yaml"),
        ("", "candidate.yaml"),
    ],
    ids=["another-scope", "unparsable", "empty"],
)
def test_worker_refuses_a_bad_candidate_config_at_start_in_one_line_and_goes_on(tmp_path, monkeypatch, content, reason):
    # Issue 26: a shadow-only file must not keep the worker on its live config from starting.
    # The candidate is refused in one line, and the worker goes on to its next step: the
    # broker, which does not answer here (test_shadow.py starts one on a real broker).
    live, candidate = tmp_path / "live.yaml", tmp_path / "candidate.yaml"
    live.write_text("tools:\n  loopDetection:\n    enabled: true\n")
    candidate.write_text(content)
    monkeypatch.setenv("LOOPWATCH_CANDIDATE_CONFIG", str(candidate))
    proc = worker_at_no_broker(live, tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    refusals = [line for line in lines if "refused new config" in line]
    assert len(refusals) == 1, proc.stderr
    assert reason in refusals[0] and "running without a candidate config until the file is fixed" in refusals[0]
    assert lines[-1].startswith("loopwatch worker: cannot use the Kafka cluster: 127.0.0.1:9: no broker answers"), lines


def test_worker_with_no_broker_answering_is_one_line(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("tools:\n  loopDetection:\n    enabled: true\n")
    proc = worker_at_no_broker(path, tmp_path)
    one_line_error(proc, 2, "cannot use the Kafka cluster: 127.0.0.1:9: no broker answers")
