"""``loopwatch import`` on hostile input: JSON nested past loopwatch's bound (``JSON_DEPTH_LIMIT``,
128) in a document, a line or a call's ``arguments`` string, a JSONL file whose records are not
objects, and random JSON under hypothesis.  Each is refused with the importers' one-line error
(``ImportFailed``, exit 2), never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.cli import loopwatch, one_line_error
from streams.importers import FORMATS, read_runs
from streams.importers.model import ImportFailed, run_events
from streams.importers.reader import Opened

DEEP = "[" * 100_000 + "]" * 100_000
JUST_PAST = "[" * 129 + "]" * 129  # one level past the bound: msgspec alone decodes it
TOO_DEEP = "nested deeper than 128 levels"


def chat(arguments: str) -> list:
    """A bare list of OpenAI chat messages: one call with ``arguments``, and its result."""
    return [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]


def codex(arguments: str) -> list:
    """A Codex CLI rollout: its session line and one function call with ``arguments``."""
    return [
        {"type": "session_meta", "payload": {"id": "s"}},
        {
            "type": "response_item",
            "payload": {"type": "function_call", "name": "f", "arguments": arguments, "call_id": "c"},
        },
    ]


def write_lines(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize("arguments", [DEEP, JUST_PAST], ids=["100000-deep", "129-deep"])
def test_deep_arguments_of_an_openai_chat_call_are_one_line(tmp_path, arguments):
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(chat(arguments)))
    one_line_error(loopwatch("import", path, "-o", tmp_path / "out.jsonl"), 2, "the arguments of call 'c1'", TOO_DEEP)
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("arguments", [DEEP, JUST_PAST], ids=["100000-deep", "129-deep"])
def test_deep_arguments_of_a_codex_call_are_one_line(tmp_path, arguments):
    path = write_lines(tmp_path / "rollout.jsonl", codex(arguments))
    one_line_error(loopwatch("import", path, "-o", tmp_path / "out.jsonl"), 2, "line 2: the call's arguments", TOO_DEEP)


def test_arguments_at_the_bound_are_imported(tmp_path):
    at = "[" * 128 + "]" * 128
    path = write_lines(tmp_path / "rollout.jsonl", codex(at))
    proc = loopwatch("import", path, "-o", tmp_path / "out.jsonl")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("body", [DEEP, JUST_PAST], ids=["100000-deep", "129-deep"])
def test_a_deep_line_or_document_is_one_line(tmp_path, body):
    lines = tmp_path / "rollout.jsonl"
    lines.write_text(json.dumps(codex("{}")[0]) + "\n" + '{"type": "event_msg", "payload": ' + body + "}\n")
    one_line_error(loopwatch("import", lines, "-o", tmp_path / "out.jsonl"), 2, "line 2:", TOO_DEEP)
    document = tmp_path / "doc.json"
    document.write_text("[" + json.dumps(chat("{}"))[1:-1] + ", " + body + "]")
    one_line_error(loopwatch("import", document, "-o", tmp_path / "out.jsonl"), 2, TOO_DEEP)


@pytest.mark.parametrize(
    ("first", "kind"),
    [("[1, 2]", "an array"), ("7", "a number"), ('"x"', "a string"), ("null", "null"), ("true", "a boolean")],
)
def test_a_jsonl_file_whose_first_line_is_no_object_says_so(tmp_path, first, kind):
    path = tmp_path / "rollout.jsonl"
    path.write_text(first + "\n" + json.dumps(codex("{}")[0]) + "\n")
    err = one_line_error(loopwatch("import", path, "-o", tmp_path / "out.jsonl"), 2)
    assert err == f"loopwatch import: {path}: line 1: expected a JSON object, got {kind}"


def test_a_later_line_that_is_no_object_is_named_by_its_line(tmp_path):
    path = tmp_path / "rollout.jsonl"
    path.write_text(json.dumps(codex("{}")[0]) + "\n[1]\n")
    one_line_error(loopwatch("import", path, "-o", tmp_path / "out.jsonl"), 2, "line 2 is not a codex rollout line")


# -- random JSON under hypothesis -------------------------------------------------------------------

# Keys the importers read, so that random documents get past detection into the parsers.
KEYS = st.sampled_from(
    [
        "role", "content", "tool_calls", "function", "name", "arguments", "id", "tool_call_id", "traj",
        "messages", "task_id", "trial", "reward", "type", "payload", "call_id", "output", "input",
        "action", "timestamp", "instructions", "history", "trajectory", "message", "tool_use_id",
        "sessionId", "uuid", "observation", "source", "args", "tool", "text", "is_error", "metadata",
    ]
)  # fmt: skip
SCALARS = st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=8) | KEYS
JSON = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=5), max_leaves=30
)
# A call's arguments: a string that may hold JSON, deep JSON, or not JSON at all.
ARGUMENTS = st.one_of(JSON.map(json.dumps), st.integers(1, 400).map(lambda n: "[" * n + "]" * n), st.text(max_size=10))


def deep_in(value, depth: int):
    for _ in range(depth):
        value = [value] if depth % 2 else {"content": value}
    return value


def import_all(path: Path, fmt: str | None) -> None:
    src = Opened(path)
    try:
        _name, runs = read_runs(src, fmt)
        for run in runs:
            list(run_events(run))
    finally:
        src.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    records=st.lists(JSON | st.builds(deep_in, JSON, st.integers(100, 300)), min_size=1, max_size=5),
    arguments=ARGUMENTS,
    as_lines=st.booleans(),
    fmt=st.none() | st.sampled_from(sorted(FORMATS)),
)
def test_random_json_fails_only_with_the_importers_error(tmp_path, records, arguments, as_lines, fmt):
    # Each kind of file a format reads, its records random, one call's arguments a hostile string.
    records = [*records, *chat(arguments), *codex(arguments)]
    path = tmp_path / ("f.jsonl" if as_lines else "f.json")
    if as_lines:
        write_lines(path, records)
    else:
        path.write_text(json.dumps(records))
    try:
        import_all(path, fmt)
    except ImportFailed as exc:
        assert "\n" not in str(exc)
