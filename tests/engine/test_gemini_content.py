"""Profile gemini-cli's content loop detector (issue 29): Gemini CLI's "chanting" rule on the
model's streamed text, split between the runner's edge (``streams.edge.content_windows``:
resets, code blocks, truncation, window hashes, in UTF-16 units) and the engine
(``streams.engine.gemini_content``), against the peer's own published code
(``@google/gemini-cli-core`` 0.61.0's LoopDetectionService driven in node by
``tests/oracles/gemini_oracle.mjs``; ``make oracle-gemini``)."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from schemas.events import MAX_EVENT_BYTES, MAX_WINDOWS_BYTES, InvalidEvent, ModelText, decode_event, encode_event
from schemas.names import GEMINI_CONTENT_LOOP
from schemas.verdicts import RunAborted
from streams.conformance import peers
from streams.conformance.traces import open_jsonl
from streams.edge import content_windows as ce
from streams.edge.content_windows import ContentEdge, utf16_length, window_hash
from streams.edge.events import agent_message_event, model_text_event, requested_event
from streams.engine import RunDriver, decode_state, encode_state, engine_for, published
from streams.engine import gemini_content as gc

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "conformance" / "gemini-cli-content"
GEMINI = {"loopwatch": {"profile": "gemini-cli"}}
IDS = {"run_id": "r1", "session_key": "agent:main:s1"}


def _node(script: str, data) -> object:
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    proc = subprocess.run(["node", "-e", script], input=json.dumps(data), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _steps(path: Path) -> dict[str, list]:
    return {line["id"]: line["steps"] for line in open_jsonl(path)}


# -- the golden sessions and Gemini's own cases ---------------------------------------------------


# (the golden sessions' and the cases' agreement with the oracle, and their recomputation from
# it, are test_gemini_profile.py's, for both golden sets)


def test_the_content_set_matches_its_sha256sums():
    for line in (DATA / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize(
    "module, name, value",
    [
        (gc, "THRESHOLD", 9),
        (gc, "THRESHOLD", 11),
        (gc, "MAX_AVERAGE_DISTANCE", 249),
        (gc, "MAX_AVERAGE_DISTANCE", 260),
        (gc, "MAX_PERIODS", 4),
        (gc, "MAX_PERIODS", 6),
        # Python's own readings of Gemini's patterns: \d, '-' in [*-+], $ before a final newline, lone surrogates
        (ce, "_LIST", ce.re.compile(rf"(?:\A|\n){ce._WS}*(?:[*+\-]|[0-9]+\.){ce._WS}")),
        (ce, "_LIST", ce.re.compile(rf"(?:\A|\n){ce._WS}*(?:[*+]|\d+\.){ce._WS}")),
        (ce, "_DIVIDER", ce.re.compile("\\A[+-_=*\u2500-\u257f]+$")),
        (ce, "_DIVIDER", ce.re.compile("\\A[\\-+_=*\u2500-\u257f]+\\Z")),
        (ce, "_TABLE", ce.re.compile(rf"(?:\A|\n){ce._WS}*(?:\|.*\||[|+\-]{{3,}})")),
        (ce, "_HEADING", ce.re.compile(r"(?:\A|\n)#+\s")),
        (ce, "_LONE", ce.re.compile("[\ud800-\udbff]")),
    ],
)
def test_the_content_traces_tell_another_rule_apart(module, name, value):
    with mock.patch.object(module, name, value):
        # stops at the first session that disagrees: one is enough to tell the rules apart
        results = peers.iter_peer_traces(DATA / "sessions.jsonl.gz", DATA / "expected.jsonl.gz", "gemini-cli")
        assert any(r.failure for r in results)


def test_a_state_stored_and_restored_at_every_event_decides_the_same():
    engine = engine_for(GEMINI)
    expected = _steps(DATA / "expected.jsonl.gz")
    for session in list(open_jsonl(DATA / "sessions.jsonl.gz"))[:120]:
        state, got = None, []
        for event in peers.gemini_events(session):
            step = engine.handle(state, decode_event(encode_event(event)), validated=True)
            if step.abort is not None:
                got.append("abort")
            elif published(step) and published(step)[0].action != "allow":
                got.append("feedback")
            else:
                got.append(None if type(event).__name__ == "AgentMessage" else "allow")
            state = decode_state(encode_state(step.state))
        assert got == [w and w[0] for w in expected[session["id"]]], session["id"]


# -- hand-worked ------------------------------------------------------------------------------------


def _drive(chunks, engine=None):
    driver, edge = RunDriver(engine or engine_for(GEMINI)), ContentEdge()
    out = []
    for i, chunk in enumerate(chunks):
        if chunk is None:
            edge.tool_call()
            out.append(published(driver.handle(requested_event(f"c{i}", "glob", {"p": i}, gemini_key=True, **IDS))))
        else:
            out.append(published(driver.handle(model_text_event(f"e{i}", edge, chunk, **IDS))))
    return out


def test_ten_repeats_of_a_50_unit_sentence_warn_with_feedback_then_the_next_chunk_aborts():
    # Windows at 0, 50, ..., 450 are the same text; the 10th chunk completes the one at 450:
    # 10 occurrences 50 apart, one period.  The 11th re-reads 450 (periods 50 and ""): abort.
    sentence = ("This is a unique sentence, id=1. " * 2)[:50]
    out = _drive([sentence] * 11)
    assert all(v == [] for v in out[:9])
    [warn] = out[9]
    assert (warn.action, warn.detector, warn.notify_model) == ("warn", GEMINI_CONTENT_LOOP, True)
    assert warn.message.startswith("System: Potential loop detected. Details: Repeating content detected.")
    [abort] = out[10]
    assert isinstance(abort, RunAborted) and (abort.detector, abort.count) == (GEMINI_CONTENT_LOOP, 2)


def test_a_tool_call_before_the_tenth_repeat_starts_over():
    sentence = ("This is a unique sentence, id=1. " * 2)[:50]
    assert all(v == [] for v in _drive([sentence] * 9 + [None] + [sentence] * 9))


def test_an_astral_character_counts_two_units():
    # An emoji and 48 characters: 50 UTF-16 units a chunk, so the window at 0 comes back every
    # 50 units, and the 10th chunk completes its 10th occurrence (at 450).  (Counted in code
    # points the period would be 49.)
    chunk = "\U0001f600" + ("This is a unique sentence, id=1. " * 2)[:48]
    assert utf16_length(chunk) == 50
    out = _drive([chunk] * 10)
    assert out[9] and out[9][0].detector == GEMINI_CONTENT_LOOP and all(v == [] for v in out[:9])
    e = ContentEdge()
    assert len(e.feed("\U0001f600" * 25).windows) == 8
    assert len(e.feed("\U0001f600").windows) == 16  # two more units: windows at 1 and 2


def test_js_pattern_semantics_by_hand():
    def reset(chunk):
        return ce.is_reset(chunk)[2]

    assert reset("* item") and reset("+ item") and reset("1. x") and reset("\n42. x")
    assert not reset("- item")  # [*-+] is the range * to +: '-' is not in it
    assert reset("---")  # but a table rule [|+-]{3,}
    assert not reset("\u0661. x")  # \d is ASCII only
    assert reset("\u00a0* x") and reset("\ufeff* h") and not reset("\x1c* x") and not reset("#\x85h")
    assert not reset(" # h")  # a heading has no leading space
    assert reset("a\n|x|") and not reset("a\n|x\u2028|")  # . stops at U+2028
    assert ce.is_reset("HELLO")[1] and not ce.is_reset("HELLO\n")[1]  # [+-_] spans A-Z; $ is the very end
    assert ce.is_reset("```x```") == (2, False, True)


# -- the edge, by property ---------------------------------------------------------------------------

_plain = st.text(st.sampled_from("abc xyz.,\U0001f600é"), max_size=400)


@settings(max_examples=80, deadline=None)
@given(_plain, st.lists(st.integers(1, 60), max_size=20))
def test_chunking_the_same_text_differently_gives_the_same_windows(text, cuts):
    """Without resets or truncation, the concatenated windows depend only on the text (cut in
    UTF-16 units, so an emoji may be split between two chunks)."""
    units = text.encode("utf-16-le")
    whole = ContentEdge().feed(text).windows
    edge, got, i = ContentEdge(), b"", 0
    for n in [*cuts, len(units)]:
        part = units[2 * i : 2 * (i + n)].decode("utf-16-le", "surrogatepass")
        got += edge.feed(part).windows
        i += n
    assert got == whole
    assert len(whole) == 8 * max(0, utf16_length(text) - 49)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(st.sampled_from("ab \U0001f600"), min_size=0, max_size=2000), max_size=8))
def test_the_kept_text_is_the_last_5000_units_and_the_windows_add_up(chunks):
    edge, count = ContentEdge(), 0
    text = ""
    for chunk in chunks:
        r = edge.feed(chunk)
        text += chunk
        kept = text.encode("utf-16-le")[-10000:]
        assert r.length == len(kept) // 2 == edge.length
        count = max(0, count - r.truncated) + len(r.windows) // 8
        assert count == max(0, r.length - 49)
        assert len(r.windows) <= MAX_WINDOWS_BYTES
        if r.windows:
            assert r.windows[-8:] == window_hash(kept[-100:])


@settings(max_examples=6, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(
    st.lists(
        st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF), min_size=0, max_size=60),
        min_size=30,
        max_size=30,
    )
)
def test_the_window_hash_is_the_one_node_computes_even_for_lone_surrogates(texts):
    """Windows cut at every unit of random text (so also inside surrogate pairs) hashed by node's
    ``createHash().update(string)``."""
    units = [t.encode("utf-16-le", "surrogatepass") for t in texts]
    pieces = [u[2 * i : 2 * (i + 50)] for u in units for i in range(0, max(1, len(u) // 2), 7)]
    arrays = [list(memoryview(p).cast("H")) for p in pieces]
    script = (
        "const {createHash}=require('node:crypto');const a=JSON.parse(require('node:fs').readFileSync(0,'utf8'));"
        "process.stdout.write(JSON.stringify(a.map(u=>createHash('sha256').update(String.fromCharCode(...u)).digest('hex').slice(0,16))));"
    )
    assert _node(script, arrays) == [window_hash(p).hex() for p in pieces]


@settings(max_examples=4, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(
    st.lists(
        st.text(st.sampled_from("|*+-#>.1 \t\n\xa0\u2028\x1c\x85\ufeffaAZ=_\u2500`"), max_size=8),
        min_size=60,
        max_size=60,
    )
)
def test_the_reset_patterns_are_the_ones_node_runs(chunks):
    script = (
        "const a=JSON.parse(require('node:fs').readFileSync(0,'utf8'));process.stdout.write(JSON.stringify(a.map(c=>{"
        "const f=(c.match(/```/g)??[]).length;const d=/^[+-_=*\\u2500-\\u257F]+$/.test(c);"
        "return [f,d,!!(f||/(^|\\n)\\s*(\\|.*\\||[|+-]{3,})/.test(c)||/(^|\\n)\\s*[*-+]\\s/.test(c)||/(^|\\n)\\s*\\d+\\.\\s/.test(c)"
        "||/(^|\\n)#+\\s/.test(c)||/(^|\\n)>\\s/.test(c)||d)]})));"
    )
    assert _node(script, chunks) == [list(ce.is_reset(c)) for c in chunks]


def test_js_whitespace_is_the_set_node_uses():
    got = _node(
        "process.stdout.write(JSON.stringify([...Array(65536).keys()].filter(c=>/\\s/.test(String.fromCharCode(c)))))",
        0,
    )
    assert got == [c for c in range(65536) if ce.re.fullmatch(ce._WS, chr(c))]


# -- the record ---------------------------------------------------------------------------------------


def test_the_largest_model_text_record_fits_the_record_limit():
    event = ModelText(
        event_id="e" * 512,
        run_id="\U0001f600" * 512,
        session_key="\U0001f600" * 512,
        session_id="\U0001f600" * 512,
        agent_id="\U0001f600" * 512,
        ts_ms=2**53 - 1,
        reset=True,
        truncated=2**53 - 1,
        length=5000,
        windows=b"\xff" * MAX_WINDOWS_BYTES,
    )
    data = encode_event(event)
    assert len(data) <= MAX_EVENT_BYTES
    assert decode_event(data) == event
    edge = ContentEdge()
    r = edge.feed("x" * 7000)  # a chunk alone longer than the history: the most windows one chunk completes
    assert len(r.windows) == MAX_WINDOWS_BYTES == 4951 * 8


def test_a_malformed_model_text_is_rejected():
    def dumped(**fields):
        return json.dumps({"type": "model.text", "event_id": "e", "run_id": "r", **fields}).encode()

    for fields in (
        {"windows": base64.b64encode(b"x" * 7).decode(), "length": 60},
        {"windows": base64.b64encode(b"x" * 16).decode(), "length": 50},
        {"windows": base64.b64encode(b"x" * (MAX_WINDOWS_BYTES + 8)).decode(), "length": 5000},
        {"length": 5001},
        {"truncated": -1},
    ):
        with pytest.raises(InvalidEvent) as exc:
            decode_event(dumped(**fields))
        assert exc.value.reason == "invalid_event"


def test_other_profiles_ignore_model_text():
    for config in ({}, {"loopwatch": {"profile": "latest"}}, {"loopwatch": {"profile": "openhands"}}):
        sentence = ("This is a unique sentence, id=1. " * 2)[:50]
        assert all(v == [] for v in _drive([sentence] * 12, engine_for(config)))


def test_a_lost_chunk_resets_the_mirror_instead_of_guessing():
    edge = ContentEdge()
    c = gc.ContentState()
    first = edge.feed("".join(chr(0x61 + i % 26) + str(i) for i in range(30)))
    assert len(first.windows) == 8 * 31
    edge.feed("never arrives, this chunk is lost")
    third = edge.feed("and this one comes after the lost one")
    assert not gc.content_loop(c, *first)
    assert not gc.content_loop(c, *third)
    assert c.windows == bytearray() and c.index == 0


def test_a_user_prompt_resets_the_content_tracking_and_agent_messages_do_not():
    sentence = ("This is a unique sentence, id=1. " * 2)[:50]
    for between, loops in (
        (agent_message_event("u", "again", source="user", **IDS), False),
        (agent_message_event("m", "thinking", **IDS), True),
    ):
        driver, edge = RunDriver(engine_for(GEMINI)), ContentEdge()
        for i in range(5):
            driver.handle(model_text_event(f"a{i}", edge, sentence, **IDS))
        driver.handle(between)
        if between.source == "user":
            edge.user_prompt()
        steps = [published(driver.handle(model_text_event(f"b{i}", edge, sentence, **IDS))) for i in range(5)]
        assert bool(steps[-1]) is loops
