"""Gemini CLI's own content-loop unit tests (``packages/core/src/services/loopDetectionService.test.ts``,
describe blocks "Content Loop Detection", "... with Code Blocks", "Reset Functionality", "Divider
Content Detection") restated as sessions of profile gemini-cli, with the answers their
assertions give, worked out by hand (a count of 0 is ``allow``, a count of 1 ``feedback``).

    python tests/oracles/gemini_content_cases.py CORE_DIR CASES EXPECTED

Five tests only say that a loop is found within so many chunks ("break" on the first
detection): their sessions end at the oracle's first detection, which must be a feedback after
allows (checked here), and their expected steps are then the oracle's.  The test's random
strings (``Math.random``) are drawn here from a seeded generator."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

ORACLE = Path(__file__).with_name("gemini_oracle.mjs")
SRC = "packages/core/src/services/loopDetectionService.test.ts > "
THRESHOLD, CHUNK = 10, 50
ALLOW, FEEDBACK, ABORT = (
    ["allow", None],
    ["feedback", "chanting_identical_sentences"],
    ["abort", "chanting_identical_sentences"],
)


def repetitive(i: int, length: int) -> str:  # createRepetitiveContent
    base, out = f"This is a unique sentence, id={i}. ", ""
    while len(out) < length:
        out += base
    return out[:length]


_rng = random.Random(29)


def rand(n: int) -> str:  # generateRandomString
    return "".join(_rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789") for _ in range(n))


def t(text: str) -> dict:
    return {"k": "text", "text": text}


def cases() -> list[tuple[str, str, list[dict], list | None]]:
    rep = repetitive(1, CHUNK)
    out = []

    def add(cid, source, events, expected):
        out.append((cid, SRC + source, events, expected))

    cl = "Content Loop Detection > "
    add(
        "gc-test-random",
        cl + "should not detect a loop for random content",
        [t(rand(10)) for _ in range(1000)],
        [ALLOW] * 1000,
    )
    add(
        "gc-test-consecutive",
        cl + "should detect a loop when a chunk of content repeats consecutively",
        [t(rep)] * THRESHOLD,
        [ALLOW] * (THRESHOLD - 1) + [FEEDBACK],
    )
    prefix = "projects/my-google-cloud-project-12345/locations/us-central1/services/"
    add(
        "gc-test-shared-prefix",
        cl + "should not detect a loop for a list with a long shared prefix",
        [t("".join(f"- {prefix}{i}\n" for i in range(15)))],
        [ALLOW],
    )
    far = []
    for _ in range(THRESHOLD):
        far += [t(rep), t(rand(2000))]
    add("gc-test-far-apart", cl + "should not detect a loop if repetitions are very far apart", far, [ALLOW] * 20)
    for cid, name, pattern, n in (
        (
            "gc-test-150",
            "should detect a loop with longer repeating patterns (e.g. ~150 chars)",
            repetitive(1, 150),
            THRESHOLD + 20,
        ),
        (
            "gc-test-user-example",
            "should detect the specific user-provided loop example",
            "I will not output any text.\n  I will just end the turn.\n  I am done.\n  I will not do anything else.\n  I will wait for the user's next command.\n",
            THRESHOLD + 20,
        ),
        (
            "gc-test-user-example-2",
            "should detect the second specific user-provided loop example",
            "I have added all the requested logs and verified the test file. I will now mark the task as complete.\n  ",
            THRESHOLD + 20,
        ),
        (
            "gc-test-alternating",
            "should detect a loop of alternating short phrases",
            "Thinking... Done. ",
            THRESHOLD * 10,
        ),
        (
            "gc-test-thoughts",
            "should detect a loop of repeated complex thought processes",
            "I need to check the file. The file does not exist. I will create the file. ",
            THRESHOLD + 20,
        ),
    ):
        add(cid, cl + name + " (within the test's chunks; the session ends at the detection)", [t(pattern)] * n, None)

    cb = "Content Loop Detection with Code Blocks > "
    add(
        "gc-test-inside-block",
        cb + "should not detect a loop when repetitive content is inside a code block",
        [t("```\n"), *[t(rep)] * THRESHOLD, t("\n```")],
        [ALLOW] * 12,
    )
    add(
        "gc-test-into-block",
        cb + "should not detect loops when content transitions into a code block",
        [*[t(rep)] * (THRESHOLD - 2), t("```javascript\n"), *[t(rep)] * THRESHOLD],
        [ALLOW] * 19,
    )
    add(
        "gc-test-already-inside",
        cb + "should skip loop detection when already inside a code block",
        [t("Here is some code:\n```\n"), *[t(rep)] * (THRESHOLD + 5)],
        [ALLOW] * 16,
    )
    add(
        "gc-test-fence-transitions",
        cb + "should correctly track inCodeBlock state with multiple fence transitions",
        [t("Normal text "), t("```\n"), *[t(rep)] * 5, t("```\n"), t("```python\n")],
        [ALLOW] * 9,
    )
    add(
        "gc-test-outside-block",
        cb + "should detect a loop when repetitive content is outside a code block",
        [t("```"), t("\nsome code\n"), t("```"), *[t(rep)] * THRESHOLD],
        [ALLOW] * 12 + [FEEDBACK],
    )
    add(
        "gc-test-blocks-no-loop",
        cb + "should handle content with multiple code blocks and no loops",
        [t("```\ncode1\n```"), t("\nsome text\n"), t("```\ncode2\n```")],
        [ALLOW] * 3,
    )
    add(
        "gc-test-mixed",
        cb + "should handle content with mixed code blocks and looping text",
        [t("```"), t("\ncode1\n"), t("```"), *[t(rep)] * THRESHOLD],
        [ALLOW] * 12 + [FEEDBACK],
    )
    add(
        "gc-test-code-tokens",
        cb + "should not detect a loop for a long code block with some repeating tokens",
        [t("```\n"), *[t("for (let i = 0; i < 10; i++) { console.log(i); }")] * 20, t("\n```")],
        [ALLOW] * 22,
    )
    add(
        "gc-test-reset-fence",
        cb + "should reset tracking when a code fence is found",
        [*[t(rep)] * (THRESHOLD - 1), t("```"), *[t(rep)] * THRESHOLD],
        [ALLOW] * 20,
    )
    for cid, name, marker in (
        ("gc-test-reset-table", "a table is detected", "| Column 1 | Column 2 |"),
        ("gc-test-reset-list", "a list item is detected", "* List item"),
        ("gc-test-reset-heading", "a heading is detected", "## Heading"),
        ("gc-test-reset-quote", "a blockquote is detected", "> Quote text"),
    ):
        add(
            cid,
            cb + f"should reset tracking when {name}",
            [*[t(rep)] * (THRESHOLD - 1), t(marker), *[t(rep)] * (THRESHOLD - 1)],
            [ALLOW] * 19,
        )
    events, expected = [], []
    for index, fmt in enumerate(("* item", "- item", "+ item", "1. item", "42. item")):
        events += [
            {"k": "user", "text": "test"},
            *[t(rep)] * (THRESHOLD - 1),
            t("\n" + fmt),
            *[t(repetitive(index + 100, CHUNK))] * (THRESHOLD - 1),
        ]
        expected += [None] + [ALLOW] * (2 * THRESHOLD - 1)
    add(
        "gc-test-list-formats",
        cb + "should reset tracking for various list item formats (service.reset: a new prompt)",
        events,
        expected,
    )
    add(
        "gc-test-tool-call-resets",
        "Reset Functionality > tool call should reset content count",
        [*[t("Some content.")] * 9, {"k": "call", "id": "c1", "tool": "testTool", "args": {}}, t("Fresh content.")],
        [ALLOW] * 11,
    )
    add(
        "gc-test-divider",
        "Divider Content Detection > should not detect a loop for repeating divider-like content",
        [t("-" * CHUNK)] * (THRESHOLD + 5),
        [ALLOW] * 15,
    )
    # loopwatch's own, worked by hand: after the feedback the client keeps the tracking, and the
    # next chunk looks at the detected window again (its position recorded twice: periods of 50
    # units and one empty, 2 distinct): the second detection.
    out.append(
        (
            "gc-own-after-feedback",
            "loopwatch: the chunk after Gemini's feedback (client.ts _recoverFromLoop keeps the content tracking)",
            [t(rep)] * (THRESHOLD + 1),
            [ALLOW] * (THRESHOLD - 1) + [FEEDBACK, ABORT],
        )
    )
    return out


def main(argv: list[str]) -> int:
    core, cases_path, expected_path = argv[:3]
    made = cases()
    sessions = [{"id": cid, "source": src, "events": ev} for cid, src, ev, _ in made]
    Path(cases_path).write_text("".join(json.dumps(s, ensure_ascii=True) + "\n" for s in sessions))
    proc = subprocess.run(["node", ORACLE, core, cases_path], capture_output=True, text=True, check=True)
    oracle = {row["id"]: row["steps"] for row in map(json.loads, proc.stdout.splitlines())}
    lines = []
    for (cid, _, events, expected), session in zip(made, sessions):
        if expected is None:  # "detected within n chunks": cut at the first detection
            steps = oracle[cid]
            end = next(i for i, s in enumerate(steps) if s != ALLOW)
            assert steps[end] == FEEDBACK, (cid, steps[end])
            session["events"], expected = events[: end + 1], steps[: end + 1]
        lines.append(json.dumps({"id": cid, "steps": expected}))
    Path(cases_path).write_text("".join(json.dumps(s, ensure_ascii=True) + "\n" for s in sessions))
    Path(expected_path).write_text("".join(line + "\n" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
