"""The bytes ``loopwatch import`` writes do not move when the import is made faster (issue 28).

The SHA-256 of the events written for every transcript of ``tests/data/transcripts/`` (and of
bench.evaluate's generated chat runs and Claude Code sessions) were taken from the code as it
stood at commit 968e5d1, before the import's speed work: any change to an event's bytes,
its fields' order or the lines between them fails here.  A gzip output decompresses to the
same bytes at whatever level it is compressed.

``near_args_hash`` (the arguments read loosely) was added to every call event later, on
purpose: it is taken out of the bytes before they are compared with the pins (a byte-exact cut
of the field, which ``msgspec`` writes last), and checked apart: on every call event, and
the same on a call's two events.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
from pathlib import Path

import pytest

from bench.evaluate import chat_runs, claude_session
from streams.importers import import_files, open_output

DATA = Path(__file__).resolve().parents[1] / "data" / "transcripts"

# path under tests/data/transcripts -> (sha256 of the events file, events), at 968e5d1
PINNED = {
    "claude-code/claude_with_rejection.jsonl": ("526ab6f638d3b53f7058ea3d56603e5a5aa4e6b2dc2bf960a6114f629750152a", 9),
    "claude-code/session_with_compaction.jsonl": (
        "4235994c68bc105543504eaa5ae7e548fc0f9a3473e51cef7df66d6b1cf5fe1d",
        8,
    ),
    "codex/codex_with_escalation.jsonl": ("5c9bd70d439a1b02bdbf7f7b625146cba422f80ff871b68852bda84088832342", 9),
    "codex/session_with_compaction.jsonl": ("fe4264b398c44059f411fc905f77507cad2b89fd8380e1038b148f1e360c5323", 6),
    "hand-made/loops.json": ("e15074f62a46064ef6738ac391ac38dfe2a0e09fb8cf88b41226fab69a93d101", 72),
    # added with the v2 tool-calling import, pinned from then on
    "hand-made/mini-swe-agent-toolcall.traj.json": (
        "485a80cd281f4dc3ab4fd875487dc342dba22adda7a632d4bb057268809084fe",
        11,
    ),
    "mini-swe-agent/django__django-16255.traj.json": (
        "af3c429d3429bd750cf16cc958dbacaa653e5e79be1af60495adb97666d946bb",
        35,
    ),
    "mini-swe-agent/sympy__sympy-15976.traj.json.gz": (
        "38f2d5d5367a11a100f90f59913d7fdfc692a8244e9c3ef91e6d9577cf975de0",
        85,
    ),
    "openhands/basic.json": ("cd38bc3a295a214f003f84316687535c9c58fd713fb2b0871a19e1f9353a953b", 5),
    "openhands/msb_output_max_iterations.jsonl.gz": (
        "64f411ec420eeea4caa19dc9e53cd5eaeda8a631be7e6f4892dc32907a790efd",
        99,
    ),
    "swe-agent/6e44b9__sweagenttestrepo-1c2844.traj": (
        "ad79480d9bb743aac101339b2edede5511c868e84f48189154cc43c3bf563cc4",
        11,
    ),
    "tau-bench/gpt-4o-airline-excerpt.json.gz": (
        "8fa682101f6b8b473e1477c25f4f75245697086de7dd582cdb551b8b4f09c00e",
        131,
    ),
}
# bench.evaluate.chat_runs(40, 60) as one openai-chat file and as Claude Code sessions
GENERATED = {
    "chat": ("fbe322bef48be3ca9b524b2f09bc2d9dbd0030af5579933e59a13253a5e7624d", 4840),
    "sessions": ("686c390f1c61aa8faa920ee3229d16d9ad9af29f47798adcceabab3c1c2fe6ac", 4840),
}


def transcripts() -> list[str]:
    return sorted(
        str(p.relative_to(DATA))
        for p in DATA.rglob("*")
        if p.is_file()
        and not p.name.startswith("LICENSE")
        and p.name not in ("results_summary.json", "swe-bench-results.json")
    )


def test_every_transcript_is_pinned():
    assert transcripts() == sorted(PINNED)


_NEAR = re.compile(rb',"near_args_hash":"([0-9a-f]{64})"')


def without_near(data: bytes) -> bytes:
    """The bytes with ``near_args_hash`` cut out, after checking that every call event carries
    it and that a call's completion carries its request's."""
    lines = data.splitlines()
    calls = [line for line in lines if line.startswith(b'{"type":"tool_call.')]
    nears = [_NEAR.findall(line) for line in calls]
    assert all(len(found) == 1 for found in nears)
    requested = {}
    for line, (near,) in zip(calls, nears):
        event = json.loads(line)
        if event["type"] == "tool_call.requested":
            requested[event["event_id"]] = near
        elif event["event_id"].endswith("r") and event["event_id"][:-1] in requested:
            assert requested[event["event_id"][:-1]] == near
    return _NEAR.sub(b"", data)


def written(files: list[Path]) -> tuple[str, int]:
    out = io.BytesIO()
    summary = import_files(files, out)
    return hashlib.sha256(without_near(out.getvalue())).hexdigest(), summary.events


@pytest.mark.parametrize("name", sorted(PINNED))
def test_the_events_of_each_transcript_are_the_bytes_written_before(name):
    assert written([DATA / name]) == PINNED[name]


def generated(tmp_path: Path) -> dict[str, list[Path]]:
    doc = chat_runs(40, 60)
    (tmp_path / "chat.json").write_text(json.dumps(doc))
    (tmp_path / "s").mkdir()
    claude_session(doc, tmp_path / "s")
    return {"chat": [tmp_path / "chat.json"], "sessions": sorted((tmp_path / "s").glob("*.jsonl"))}


def test_the_events_of_generated_runs_are_the_bytes_written_before(tmp_path):
    for name, files in generated(tmp_path).items():
        assert written(files) == GENERATED[name], name


def test_a_gzip_output_holds_the_same_bytes(tmp_path):
    files = generated(tmp_path)["chat"]
    fh, finish = open_output(tmp_path / "events.jsonl.gz")
    import_files(files, fh)
    finish(True)
    data = without_near(gzip.decompress((tmp_path / "events.jsonl.gz").read_bytes()))
    assert (hashlib.sha256(data).hexdigest(), data.count(b"\n")) == GENERATED["chat"]
