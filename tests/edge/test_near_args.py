"""The loose reading of a call's arguments (``hashing.near_args_hash``): near-identical commands
hash alike, and what changes what a command does still tells calls apart."""

import hashlib
import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.events import InvalidEvent, ToolCallRequested, check_event, decode_event
from streams.edge.canonical import TooDeep
from streams.edge.events import completed_event, requested_event
from streams.edge.hashing import args_hash, near_args_hash, near_command


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize(
    ("command", "read"),
    [
        # The planted near-identical shape's forms (streams/offline/plant.py), worked by hand.
        ("ls -l src/io", "ls src/io"),
        ("ls  -l src/io", "ls src/io"),
        ("ls -l  src/io", "ls src/io"),
        ("ls -la src/io", "ls src/io"),
        ("ls -al src/io", "ls src/io"),
        ("ls -l -a src/io", "ls src/io"),
        ("ls -a -l src/io", "ls src/io"),
        ("ls -l src/io/", "ls src/io"),
        # Whitespace inside quotes counts; the quoting is rewritten in shlex's one form.
        ('echo "a  b"', "echo 'a  b'"),
        ("echo 'a  b'", "echo 'a  b'"),
        # Operators are split off however they are spaced.
        ("cd /testbed&&ls", "cd /testbed '&&' ls"),
        ("cd /testbed && ls -la", "cd /testbed '&&' ls"),
        # Values are kept: a count, an option with its value, the root directory.
        ("git log --oneline -5", "git log -5"),
        ("grep --include=*.py -rn foo .", "grep '--include=*.py' foo ."),
        ("ls /", "ls /"),
        # After --, a token that looks like a switch is an operand.
        ("rm -- -x", "rm -x"),
        # Not read: a newline (a script, a heredoc), quotes that do not close.
        ("python - <<'EOF'\nprint(1)\nEOF", "python - <<'EOF'\nprint(1)\nEOF"),
        ("echo 'unclosed", "echo 'unclosed"),
        ("", ""),
    ],
)
def test_commands_read_by_hand(command, read):
    assert near_command(command) == read


def test_digest_is_sha256_of_the_canonical_read_arguments():
    # Worked by hand: canonical JSON of {"command": "ls src/io"} is {"command":"ls src/io"}.
    expected = sha('{"command":"ls src/io"}')
    assert near_args_hash({"command": "ls -la  src/io/"}) == expected
    # Keys, numbers and nesting are kept as they are; keys are sorted as args_hash sorts them.
    assert near_args_hash({"b": [1, "x  -v"], "a": None}) == sha('{"a":null,"b":[1,"x"]}')


def test_what_a_command_does_still_counts():
    assert near_args_hash({"command": "ls src/io"}) != near_args_hash({"command": "ls src/core"})
    assert near_args_hash({"command": "head -5 f"}) != near_args_hash({"command": "head -10 f"})
    assert near_args_hash({"command": "ls"}) != near_args_hash({"cmd": "ls"})
    # A script's whitespace counts (Python indentation).
    assert near_args_hash({"code": "if x:\n  y()"}) != near_args_hash({"code": "if x:\n    y()"})


def test_too_deep_arguments_are_refused_as_args_hash_refuses_them():
    deep: object = "x"
    for _ in range(200):
        deep = [deep]
    with pytest.raises(TooDeep):
        near_args_hash(deep)


words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_./", min_size=1, max_size=8).filter(
    lambda w: not w.startswith("-") and w.strip("/") != ""
)
letters = st.lists(st.sampled_from("abcdefhlnrv"), min_size=1, max_size=4, unique=True)


@given(st.lists(words, min_size=1, max_size=5), st.lists(st.sampled_from([" ", "  ", "\t", " \t "]), min_size=6))
def test_whitespace_between_tokens_does_not_count(tokens, gaps):
    plain = " ".join(tokens)
    spaced = gaps[0].join(tokens[:1]) + "".join(g + t for g, t in zip(gaps[1:], tokens[1:])) + gaps[-1]
    assert near_args_hash({"command": spaced}) == near_args_hash({"command": plain})


@given(words, letters, st.randoms(use_true_random=False), st.lists(words, min_size=1, max_size=3))
def test_switch_order_clusters_and_an_added_switch_do_not_count(program, flags, rng, operands):
    split = [f"-{f}" for f in flags]
    shuffled = split[:]
    rng.shuffle(shuffled)
    clustered = "-" + "".join(flags)
    tail = " ".join(operands)
    forms = [
        f"{program} {' '.join(split)} {tail}",
        f"{program} {' '.join(shuffled)} {tail}",
        f"{program} {clustered} {tail}",
        f"{program} {tail}",
        f"{program} {clustered} --all {tail}",
    ]
    assert len({near_args_hash({"command": form}) for form in forms}) == 1


@given(st.lists(words, min_size=1, max_size=4), st.lists(words, min_size=1, max_size=4))
def test_different_operands_hash_apart(a, b):
    def canon(tokens):
        return [t.rstrip("/") or "/" for t in tokens]

    same = canon(a) == canon(b)
    assert (near_args_hash({"command": " ".join(a)}) == near_args_hash({"command": " ".join(b)})) == same


def test_edge_events_carry_it_and_it_round_trips():
    requested = requested_event("e1", "bash", {"command": "ls -la src/io"}, run_id="r")
    completed = completed_event("e2", "bash", {"command": "ls  -l src/io/"}, result="x", run_id="r")
    assert requested.near_args_hash == completed.near_args_hash == sha('{"command":"ls src/io"}')
    assert requested.args_hash != completed.args_hash
    for event in (requested, completed):
        assert decode_event(msgspec.json.encode(event)) == event


def test_an_event_without_it_encodes_as_before():
    event = ToolCallRequested(event_id="e", run_id="r", tool_name="t", args_hash="t:" + "0" * 64)
    assert "near_args_hash" not in json.loads(msgspec.json.encode(event))


@pytest.mark.parametrize("bad", ["A" * 64, "g" * 64])
def test_a_near_args_hash_that_is_not_lowercase_hex_is_refused(bad):
    event = ToolCallRequested(event_id="e", run_id="r", tool_name="t", args_hash="t:" + "0" * 64, near_args_hash=bad)
    with pytest.raises(InvalidEvent, match="near_args_hash"):
        check_event(event)


def test_cycles_and_depth_are_met_as_args_hash_meets_them():
    cyclic: list = ["ls  -l"]
    cyclic.append(cyclic)
    assert near_args_hash(cyclic) == sha('["ls","[Circular]"]')
    for depth in (127, 128, 129):
        deep: object = "x"
        for _ in range(depth):
            deep = [deep]
        try:
            args_hash("t", deep)
        except TooDeep:
            with pytest.raises(TooDeep):
                near_args_hash(deep)
        else:
            near_args_hash(deep)


def _by_shlex(text: str) -> str:
    """near_command's reading with shlex's lexer on every string (no shortcut)."""
    import re
    import shlex

    if "\n" in text or "\r" in text:
        return text
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:
        return text
    kept, operands_only = [], False
    for token in tokens:
        if not operands_only:
            if token == "--":
                operands_only = True
                continue
            if re.fullmatch(r"-[A-Za-z]+|--[A-Za-z][A-Za-z-]*", token):
                continue
        if len(token) > 1 and token.endswith("/"):
            token = token.rstrip("/") or "/"
        kept.append(token)
    return shlex.join(kept)


@given(st.text(alphabet=st.sampled_from(list("ab-/ \t.=_1'\"\\#;|&<>()é\u00a0")), max_size=20))
def test_the_shortcuts_read_as_shlex_reads(text):
    assert near_command(text) == _by_shlex(text)


def test_arguments_that_read_as_they_are_hash_as_args_hash():
    args = {"reservation_id": "ABC123", "n": 2}
    assert near_args_hash(args) == args_hash("t", args)[2:]
    assert near_args_hash(args, "f" * 64) == "f" * 64  # the caller's digest of args, reused


WORDS = st.text(alphabet=st.sampled_from(list("ab-/ .=_1'\n")), max_size=12)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | WORDS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(WORDS, inner, max_size=4),
    max_leaves=12,
)


@given(JSON_VALUES)
def test_the_hash_is_the_digest_of_every_string_read_as_a_command(value):
    """By its definition, written out here with ``near_command`` on each string (the
    implementation first checks whether any string reads otherwise, and copies nothing when
    none does)."""

    def read(v):
        if isinstance(v, str):
            return near_command(v)
        if isinstance(v, dict):
            return {k: read(x) for k, x in v.items()}
        if isinstance(v, list):
            return [read(x) for x in v]
        return v

    assert near_args_hash(value) == args_hash("t", read(value))[2:]
