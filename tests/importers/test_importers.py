"""``loopwatch import`` (issue 28): every format on a real (or, for Claude Code and Codex CLI,
a published third-party) file from ``tests/data/transcripts/``, bad input, and the parsing
properties under hypothesis.

Expected values come from the source files themselves, read here with plain ``json`` and
counted independently of the importers' code (tests/data/README.md says where each file is
from), and the hashes from ``streams.edge.hashing`` on the raw values the test reads.
"""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.cli import loopwatch, one_line_error
from schemas.events import CompactionRetried, RunEnded, ToolCallCompleted, ToolCallRequested, decode_event
from streams.edge.hashing import args_hash, hash_outcome
from streams.importers import FORMATS, import_files
from streams.importers.model import ImportFailed
from streams.importers.reader import Opened

DATA = Path(__file__).resolve().parents[1] / "data" / "transcripts"


def imported(tmp_path: Path, *files: Path, extra: tuple = ()) -> tuple[list, str]:
    out = tmp_path / "events.jsonl"
    proc = loopwatch("import", *files, "-o", out, *extra)
    assert proc.returncode == 0, proc.stderr
    return [decode_event(line) for line in out.read_bytes().splitlines()], proc.stderr


def calls(events: list) -> list[ToolCallCompleted]:
    return [e for e in events if type(e) is ToolCallCompleted]


def load(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return (
            json.load(fh)
            if not path.name.endswith(".jsonl") and not path.name.endswith(".jsonl.gz")
            else [json.loads(line) for line in fh if line.strip()]
        )


def assert_well_formed(events: list, runs: int) -> None:
    """Every call is a requested then a completed event of one id pair, every run ends once,
    and every event is what the worker would accept."""
    assert sum(type(e) is RunEnded for e in events) == runs
    for req, done in zip(events, events[1:]):
        if type(req) is ToolCallRequested:
            assert type(done) is ToolCallCompleted and done.args_hash == req.args_hash
            assert done.event_id == req.event_id + "r" and done.session_key == req.run_id
    times = [e.ts_ms for e in events]
    assert all(a <= b for a, b in zip(times, times[1:])) or runs > 1


@pytest.mark.parametrize(
    "path, fmt",
    [
        ("mini-swe-agent/django__django-16255.traj.json", "mini-swe-agent"),
        ("mini-swe-agent/sympy__sympy-15976.traj.json.gz", "mini-swe-agent"),
        ("swe-agent/6e44b9__sweagenttestrepo-1c2844.traj", "swe-agent"),
        ("openhands/basic.json", "openhands"),
        ("openhands/msb_output_max_iterations.jsonl.gz", "openhands"),
        ("tau-bench/gpt-4o-airline-excerpt.json.gz", "openai-chat"),
        ("claude-code/session_with_compaction.jsonl", "claude-code"),
        ("codex/session_with_compaction.jsonl", "codex"),
    ],
)
def test_the_format_is_told_by_content(path, fmt):
    src = Opened(DATA / path)
    try:
        from streams.importers import detect

        module, _doc = detect(src)
    finally:
        src.close()
    assert module.NAME == fmt


def test_mini_swe_agent_one_call_per_single_bash_block_with_labels(tmp_path):
    path = DATA / "mini-swe-agent" / "sympy__sympy-15976.traj.json.gz"
    doc = load(path)
    messages = doc["messages"]
    expected = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant" and m["content"].count("```bash") == 1:
            command = m["content"].split("```bash", 1)[1].split("```", 1)[0].strip()
            expected.append((command, messages[i + 1]["content"]))
    events, err = imported(tmp_path, path, extra=("--labels", DATA / "mini-swe-agent" / "results_summary.json"))
    got = calls(events)
    assert len(got) == len(expected) == 42
    assert [c.args_hash for c in got] == [args_hash("bash", {"command": c}) for c, _ in expected]
    assert [c.result_hash for c in got] == [
        hash_outcome("bash", {"command": c}, result=r).result_hash
        if not r.startswith("<returncode>") or r.startswith("<returncode>0<")
        else hash_outcome("bash", {"command": c}, error=r).result_hash
        for c, r in expected
    ]
    ended = events[-1]
    assert type(ended) is RunEnded and ended.reason == "resolved" and ended.run_id == "sympy__sympy-15976"
    assert_well_formed(events, 1)
    assert "1 of 1 runs labelled" in err


def test_raw_arguments_and_results_are_never_written(tmp_path):
    path = DATA / "mini-swe-agent" / "django__django-16255.traj.json"
    out = tmp_path / "events.jsonl"
    assert loopwatch("import", path, "-o", out).returncode == 0
    written = out.read_text()
    doc = load(path)
    commands = [
        m["content"].split("```bash", 1)[1].split("```", 1)[0].strip()
        for m in doc["messages"]
        if m["role"] == "assistant" and m["content"].count("```bash") == 1
    ]
    assert commands and not any(c in written for c in commands if len(c) > 12)
    assert "THOUGHT" not in written and "<returncode>" not in written


def test_an_openhands_run_line_longer_than_an_event_line_is_told_and_read(tmp_path):
    """Run-per-line files have lines far longer than event-per-line transcripts (a whole
    history): a first line of 1.5 MiB is still detected and imported."""
    record = load(DATA / "openhands" / "msb_output_max_iterations.jsonl.gz")[0]
    record["instruction"] = "x" * (3 << 19)
    path = tmp_path / "output.jsonl"
    path.write_text(json.dumps(record) + "\n" + json.dumps(record | {"instance_id": "second"}) + "\n")
    events, _ = imported(tmp_path, path)
    assert [e.run_id for e in events if type(e) is RunEnded] == [record["instance_id"], "second"]
    assert len(calls(events)) == 2 * 49


def test_swe_agent_steps_are_calls_named_by_command(tmp_path):
    path = DATA / "swe-agent" / "6e44b9__sweagenttestrepo-1c2844.traj"
    steps = load(path)["trajectory"]
    events, _ = imported(tmp_path, path)
    got = calls(events)
    assert len(got) == len(steps) == 5
    assert got[0].tool_name == "find_file" and got[-1].tool_name == "submit"
    assert got[0].args_hash == args_hash("find_file", {"command": steps[0]["action"].strip()})
    assert events[-1].reason == "submitted"


def test_openhands_event_list_and_output_jsonl(tmp_path):
    events, _ = imported(tmp_path, DATA / "openhands" / "basic.json")
    got = calls(events)
    assert [c.tool_name for c in got] == ["str_replace_editor", "finish"]
    assert got[1].result_hash is None  # finish has no observation
    assert events[-1].reason == "finished"

    path = DATA / "openhands" / "msb_output_max_iterations.jsonl.gz"
    record = load(path)[0]
    actions = [e for e in record["history"] if "action" in e and e.get("tool_call_metadata")]
    events, _ = imported(tmp_path, path)
    assert len(calls(events)) == len(actions) == 49
    assert events[-1].reason == "max-iterations" and "maximum iteration" in record["error"]
    errors = {
        str(e["cause"])
        for e in record["history"]
        if "observation" in e
        and "cause" in e
        and (
            e["observation"] == "error"
            or (e.get("extras", {}).get("metadata") or {}).get("exit_code") not in (None, 0, -1)
        )
    }
    assert sum(c.is_error for c in calls(events)) == len(errors & {str(a["id"]) for a in actions})


def test_tau_bench_tool_calls_and_rewards(tmp_path):
    path = DATA / "tau-bench" / "gpt-4o-airline-excerpt.json.gz"
    runs = load(path)
    events, _ = imported(tmp_path, path)
    assert len(calls(events)) == sum(len(m.get("tool_calls") or ()) for r in runs for m in r["traj"]) == 61
    ends = [e for e in events if type(e) is RunEnded]
    assert [e.reason for e in ends] == [f"reward:{r['reward']:g}" for r in runs]
    assert [e.run_id for e in ends] == [f"task-{r['task_id']}-trial-{r['trial']}" for r in runs]
    first = next(tc for m in runs[0]["traj"] for tc in (m.get("tool_calls") or ()))
    assert calls(events)[0].args_hash == args_hash(
        first["function"]["name"], json.loads(first["function"]["arguments"])
    )


def test_claude_code_tool_use_results_errors_and_compaction(tmp_path):
    path = DATA / "claude-code" / "session_with_compaction.jsonl"
    events, _ = imported(tmp_path, path)
    assert [type(e).__name__ for e in events if type(e) is not ToolCallRequested] == [
        "ToolCallCompleted",
        "ToolCallCompleted",
        "CompactionRetried",
        "ToolCallCompleted",
        "RunEnded",
    ]
    assert events[0].run_id == "compact-session-001"
    assert [c.tool_name for c in calls(events)] == ["Read", "Edit", "Edit"]

    path = DATA / "claude-code" / "claude_with_rejection.jsonl"
    lines = load(path)
    flagged = [
        b
        for line in lines
        for b in (line.get("message") or {}).get("content") or ()
        if isinstance(b, dict) and b.get("type") == "tool_result" and b.get("is_error")
    ]
    events, _ = imported(tmp_path, path)
    got = calls(events)
    assert sum(c.is_error for c in got) == len(flagged) == 2
    assert all(c.result_hash.startswith("error:") for c in got if c.is_error)


def test_codex_function_calls_outputs_and_compaction(tmp_path):
    path = DATA / "codex" / "session_with_compaction.jsonl"
    lines = load(path)
    expected = [
        line["payload"]
        for line in lines
        if line["type"] == "response_item" and line["payload"]["type"] == "function_call"
    ]
    events, _ = imported(tmp_path, path)
    got = calls(events)
    assert [c.args_hash for c in got] == [args_hash(p["name"], json.loads(p["arguments"])) for p in expected]
    assert sum(type(e) is CompactionRetried for e in events) == 1
    assert events[0].run_id == "compact-codex-001"
    events, _ = imported(tmp_path, DATA / "codex" / "codex_with_escalation.jsonl")
    assert len(calls(events)) == 4


# -- bad input: one line, an exit code, nothing written ---------------------------------------------


def test_bad_input_is_one_line_and_leaves_no_output(tmp_path):
    out = tmp_path / "events.jsonl.gz"
    whole = (DATA / "mini-swe-agent" / "sympy__sympy-15976.traj.json.gz").read_bytes()
    cut = tmp_path / "cut.traj.json.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    one_line_error(loopwatch("import", cut, "-o", out), 2, "truncated")

    lines = (DATA / "claude-code" / "session_with_compaction.jsonl").read_bytes()
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(lines[: lines.index(b"\n", 2000) + 40])
    one_line_error(loopwatch("import", cut, "-o", out), 2, "truncated")

    one_line_error(
        loopwatch("import", "codex", DATA / "mini-swe-agent" / "django__django-16255.traj.json", "-o", out),
        2,
        "is not a codex file",
    )
    one_line_error(
        loopwatch("import", "--format", "mini-swe-agent", DATA / "codex" / "codex_with_escalation.jsonl", "-o", out),
        2,
        "is not a mini-swe-agent file: it holds JSON lines",
    )
    other = tmp_path / "other.json"
    other.write_text('{"hello": "world"}')
    one_line_error(loopwatch("import", other, "-o", out), 2, "cannot tell the format")

    quiet = tmp_path / "quiet.jsonl"
    quiet.write_text(
        json.dumps({"type": "user", "sessionId": "s", "uuid": "u", "message": {"role": "user", "content": "hello"}})
        + "\n"
    )
    one_line_error(loopwatch("import", quiet, "-o", out), 1, "no tool calls")

    long = tmp_path / "long.jsonl"
    long.write_text(
        json.dumps({"type": "user", "sessionId": "s", "uuid": "u"})
        + "\n"
        + json.dumps({"type": "user", "message": {"content": "x" * (2 << 20)}})
        + "\n"
    )
    one_line_error(loopwatch("import", long, "-o", out), 2, "line 2 is longer than 1 MiB")
    one_line_error(loopwatch("import", tmp_path / "missing.json", "-o", out), 2, "cannot read")
    assert not out.exists() and list(tmp_path.glob(".events*")) == []


def test_progress_is_reported_on_long_imports():
    from streams.cli import _ImportProgress

    out = io.StringIO()
    progress = _ImportProgress(out, after_s=0)
    total = (DATA / "tau-bench" / "gpt-4o-airline-excerpt.json.gz").stat().st_size
    import_files(
        [DATA / "tau-bench" / "gpt-4o-airline-excerpt.json.gz"], io.BytesIO(), progress=progress, total_bytes=total
    )
    assert out.getvalue().startswith("import: ") and "tool calls" in out.getvalue()


# -- parsing properties ----------------------------------------------------------------------------

json_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | json_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(json_text, inner, max_size=3),
    max_leaves=8,
)
raw_calls = st.lists(
    st.tuples(
        st.sampled_from(["search", "book", "get_user"]), st.dictionaries(json_text, json_values, max_size=3), json_text
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(raw_calls, st.sampled_from([0.0, 1.0, 0.5])), min_size=1, max_size=4))
def test_openai_chat_calls_round_trip_through_the_edge_hashing(runs):
    doc = []
    for task, (run_calls, reward) in enumerate(runs):
        traj = [{"role": "user", "content": "go"}]
        for i, (name, args, result) in enumerate(run_calls):
            traj.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": f"t{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                    ],
                }
            )
            traj.append({"role": "tool", "tool_call_id": f"t{i}", "content": result})
        doc.append({"task_id": task, "trial": 0, "reward": reward, "traj": traj})
    from streams.importers import openai_chat
    from streams.importers.model import run_events

    events = [e for run in openai_chat.runs(doc, "gen.json") for e in run_events(run)]
    done = calls(events)
    flat = [c for c, _ in runs for c in c]
    assert [c.args_hash for c in done] == [args_hash(n, a) for n, a, _ in flat]
    assert [c.result_hash for c in done] == [
        hash_outcome(n, a, error=r).result_hash if r.startswith("Error") else hash_outcome(n, a, result=r).result_hash
        for n, a, r in flat
    ]
    assert [e.reason for e in events if type(e) is RunEnded] == [f"reward:{r:g}" for _, r in runs]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["Read", "Bash"]), json_text, json_text, st.booleans()), max_size=8),
    st.randoms(),
)
def test_claude_code_results_pair_with_their_tool_use_in_any_order(uses, rnd):
    """Results matched by ``tool_use_id``, whatever order the result lines come in."""
    from streams.importers import claude_code

    lines = [{"type": "user", "sessionId": "s1", "uuid": "u0", "message": {"role": "user", "content": "go"}}]
    lines.append(
        {
            "type": "assistant",
            "sessionId": "s1",
            "uuid": "a",
            "message": {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": f"tu{i}", "name": n, "input": {"q": q}}
                    for i, (n, q, _r, _e) in enumerate(uses)
                ],
            },
        }
    )
    results = [
        {
            "type": "user",
            "sessionId": "s1",
            "uuid": f"r{i}",
            "message": {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"tu{i}", "content": r, "is_error": e}],
            },
        }
        for i, (_n, _q, r, e) in enumerate(uses)
    ]
    rnd.shuffle(results)
    run = next(claude_code.runs(iter(enumerate(lines + results, 1)), "s.jsonl"))
    assert run.run_id == "s1"
    assert [(c.name, c.args, c.result, c.error) for c in run.items] == [(n, {"q": q}, r, e) for n, q, r, e in uses]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.binary(max_size=300).map(lambda b: b.replace(b"\n", b"")), max_size=8), st.integers(20, 200))
def test_the_line_reader_never_reads_more_than_its_limit(tmp_path_factory, chunks, limit):
    """Every line of up to ``limit`` bytes (its newline aside) comes back (decoded when JSON); the first longer one
    is refused, as a line, without the ones after it being read."""
    path = tmp_path_factory.mktemp("lines") / "f.jsonl"
    lines = [json.dumps({"n": i, "b": c.hex()[: len(c)]}).encode() for i, c in enumerate(chunks)]
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    src = Opened(path)
    got = []
    try:
        for number, value in src.lines(limit):
            got.append((number, value))
    except ImportFailed as exc:
        first_long = next(i for i, line in enumerate(lines) if len(line) > limit)
        assert f"line {first_long + 1} is longer than" in str(exc)
        assert len(got) == first_long
    else:
        assert all(len(line) <= limit for line in lines)
        assert got == [(i + 1, json.loads(line)) for i, line in enumerate(lines)]
    finally:
        src.close()


def test_every_format_is_documented_in_the_mapping_table():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "evaluation.md").read_text()
    for name in FORMATS:
        assert f"| `{name}` |" in doc


def test_mini_swe_agent_v2_tool_calling_trajectory_is_imported(tmp_path):
    """tests/data/transcripts/hand-made/mini-swe-agent-toolcall.traj.json, counted by hand: 5
    calls in 4 assistant messages (the second has 2); call_2 exits 1 and call_3 was not executed
    (return code -1): both errors; call_4's result has no extra.returncode and reads
    <returncode>0</returncode>: not an error.  Exit status Submitted: the run ends submitted,
    or resolved with the SWE-bench results.json that lists it as resolved."""
    path = DATA / "hand-made" / "mini-swe-agent-toolcall.traj.json"
    events, err = imported(tmp_path, path, extra=("--labels", DATA / "hand-made" / "swe-bench-results.json"))
    commands = [
        "cat calc.py",
        "python -c 'import calc; assert calc.add(1, 2) == 3'",
        "grep -n add calc.py",
        "sed -i 's/a - b/a + b/' calc.py",
        "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff",
    ]
    results = [
        ("result", "<returncode>0</returncode>\n<output>\ndef add(a, b):\n    return a - b\n</output>"),
        ("error", "<returncode>1</returncode>\n<output>\nAssertionError\n</output>"),
        ("error", "<returncode>-1</returncode>\n<output>\n</output>"),
        ("result", "<returncode>0</returncode>\n<output>\n</output>"),
        (None, None),
    ]
    got = calls(events)
    assert [c.args_hash for c in got] == [args_hash("bash", {"command": c}) for c in commands]
    assert [c.is_error for c in got] == [False, True, True, False, False]
    for done, command, (kind, text) in zip(got, commands, results):
        if kind is None:  # the run's last call has no result message: no result is recorded
            assert done.result_hash is None
            continue
        assert done.result_hash == hash_outcome("bash", {"command": command}, **{kind: text}).result_hash, command
    ended = events[-1]
    assert type(ended) is RunEnded and ended.reason == "resolved" and ended.run_id == "demo__demo-1"
    assert_well_formed(events, 1)
    assert "1 of 1 runs labelled" in err
    proc = loopwatch("import", path, "-o", tmp_path / "plain.jsonl")
    assert proc.returncode == 0 and b'"submitted"' in (tmp_path / "plain.jsonl").read_bytes()


def test_swe_bench_results_json_labels_by_its_resolved_list():
    from streams.importers import load_labels

    labels = load_labels(DATA / "hand-made" / "swe-bench-results.json")
    # every id of any list; resolved only demo-1 (demo-9 generated nothing, demo-3 did not apply)
    assert labels == {
        "demo__demo-1": "resolved",
        "demo__demo-2": "unresolved",
        "demo__demo-3": "unresolved",
        "demo__demo-9": "unresolved",
    }


def test_labels_of_no_known_shape_name_the_shapes_read(tmp_path):
    junk = tmp_path / "labels.json"
    junk.write_text('{"passed": 3}')
    out = tmp_path / "e.jsonl"
    proc = loopwatch("import", DATA / "hand-made" / "mini-swe-agent-toolcall.traj.json", "-o", out, "--labels", junk)
    assert proc.returncode != 0 and proc.stderr.count("\n") == 1
    for shape in ("results_summary.json", "resolved_ids", "results.json (resolved[]", "true/false"):
        assert shape in proc.stderr, shape


@settings(max_examples=60)
@given(
    stages=st.dictionaries(
        st.sampled_from(["generated", "with_logs", "applied", "no_apply", "test_errored", "no_generation"]),
        st.lists(st.sampled_from([f"repo__repo-{n}" for n in range(8)]), max_size=8),
        min_size=1,
    ),
    resolved=st.lists(st.sampled_from([f"repo__repo-{n}" for n in range(8)]), min_size=1, max_size=8),
)
def test_a_results_json_labels_every_listed_id_resolved_only_if_in_resolved(tmp_path_factory, stages, resolved):
    from streams.importers import load_labels

    path = tmp_path_factory.mktemp("labels") / "results.json"
    path.write_text(json.dumps({**stages, "resolved": resolved}))
    labels = load_labels(path)
    listed = {i for ids in stages.values() for i in ids} | set(resolved)
    assert set(labels) == listed
    for run_id in listed:
        assert labels[run_id] == ("resolved" if run_id in resolved else "unresolved"), run_id


@settings(max_examples=40)
@given(
    steps=st.lists(
        st.tuples(
            st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30),
            st.integers(-1, 3),
            st.booleans(),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_mini_swe_agent_v2_calls_are_their_commands_and_return_codes(tmp_path_factory, steps):
    """A v2 tool-calling trajectory built here: each call's command and return code, given
    in ``extra.returncode`` or only in the content's ``<returncode>``."""
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    for n, (command, code, in_extra) in enumerate(steps):
        call = {
            "id": f"c{n}",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})},
        }
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        reply = {
            "role": "tool",
            "tool_call_id": f"c{n}",
            "content": f"<returncode>{code}</returncode>\n<output>\nx\n</output>",
        }
        if in_extra:
            reply["extra"] = {"returncode": code}
        messages.append(reply)
    doc = {"trajectory_format": "mini-swe-agent-1.1", "info": {"exit_status": "Submitted"}, "messages": messages}
    path = tmp_path_factory.mktemp("v2") / "one.traj.json"
    path.write_text(json.dumps(doc))
    out = io.BytesIO()
    import_files([path], out)
    events = [decode_event(line) for line in out.getvalue().splitlines()]
    got = calls(events)
    assert [c.args_hash for c in got] == [args_hash("bash", {"command": c}) for c, _code, _e in steps]
    assert [c.is_error for c in got] == [code != 0 for _c, code, _e in steps]
    assert type(events[-1]) is RunEnded and events[-1].reason == "submitted"
