"""Random sessions of streamed model text for profile gemini-cli's content loop detector, and
Gemini CLI's own answers to them (the oracle, ``gemini_oracle.mjs``, driving
``@google/gemini-cli-core``'s LoopDetectionService in node).

    python tests/oracles/gemini_content_generate.py CORE_DIR SESSIONS EXPECTED [N] [SEED]

Each session is model turns of text cut into chunks at random places (one unit to more than 5000,
sometimes inside a surrogate pair), with tool calls and new prompts between them:

- chanting: a sentence (5 to 400 units: periods shorter and longer than the 50-unit window)
  repeated, sometimes with one repeat changed;
- near-loops: items with a long shared prefix (more than 5 distinct periods), a sentence
  repeated with more than 250 units between repeats, a sentence repeated fewer than 10 times;
- chanting broken by chunks that only a wrong reading of Gemini's patterns resets;
- periods drawn from 3 to 8 variants after one shared prefix (a loop with up to 5 distinct);
- Gemini's resets: code fences (chanting inside a code block), tables, list items, headings,
  blockquotes, dividers, and the characters where JavaScript's regular expressions differ from
  Python's (``\\s``, ``\\d``, ``.``, ``$``, the ranges ``[*-+]`` and ``[+-_]``);
- astral characters (2 UTF-16 units) and lone surrogates;
- tool-call loops (Gemini's two detectors share the prompt's count of detections).

A session ends where Gemini ends the turn (its second detection)."""

from __future__ import annotations

import gzip
import json
import random
import sys
import tempfile

from gemini_generate import answers, end_at_abort  # (run from this directory: the tool-call set's generator)

WORDS = (
    "the",
    "loop",
    "model",
    "again",
    "I",
    "will",
    "now",
    "check",
    "file",
    "error",
    "😀",
    "é",
    "日本",
    "\U0001d400",
    "plan",
    "step",
    "value",
    "\u00a0",
    "x" * 30,
    "-",
    "*",
    "+",
    "|",
    "#",
    ">",
    "1.",
    "OK",
)
# Chunks that reset (or, in JavaScript's reading, do not) and dividers.
MARKUP = (
    "```",
    "```python\n",
    "\n```\n",
    "| a | b |\n",
    "|x\u2028|",
    "\n---\n",
    "+-+-+",
    "| --- |",
    "* item\n",
    "+ item\n",
    "- item\n",
    "\n- item",
    "1. first\n",
    "\n12. twelfth",
    "\u0661. arabic digit",
    "# Heading\n",
    "\n## h",
    "#nospace",
    "> quote\n",
    "\n>\tquote",
    ">no",
    "-----",
    "=====",
    "***",
    "\u2500\u2500\u2500",
    "ABC",
    "123",
    "-----\n",
    "\x1c* not a list",
    "#\x85not a heading",
    "\n>\x1cnot a quote",
    "*\x1fnot a list",
    "\u00a0* a list",
    "\ufeff# heading",
    "\x85# not",
    "\u2028* not after newline",
    " \t+ x",
    "\n\u3000* y",
    "**bold** text",
    "1.5 is a number",
    "OK",
    "",
)

LOOKALIKES = (
    "#\x85not a heading",
    "\n>\x1cnot a quote",
    "*\x1fnot a list",
    "\x1c* not a list",
    "- not a list",
    "\u0661. not a list",
    "a\n|x\u2028| not a table",
    "HELLO\n",
    "\u2028* not after a newline",
    "#no",
    "x---",
)


class Gen:
    def __init__(self, rng: random.Random, sid: str) -> None:
        self.rng = rng
        self.sid = sid
        self.events: list[dict] = []

    def sentence(self, lo: int, hi: int) -> str:
        r = self.rng
        target = r.randint(lo, hi)
        out = ""
        while len(out) < target:
            out += r.choice(WORDS) + r.choice((" ", " ", ", ", ". ", "\n"))
        return out[:target] if r.random() < 0.5 else out

    def emit(self, text: str) -> None:
        """The text as stream chunks cut at random places (in UTF-16 units: a pair may split)."""
        r = self.rng
        units = text.encode("utf-16-le", "surrogatepass")
        i, n = 0, len(units) // 2
        while i < n:
            x = r.random()
            size = r.randint(1, 8) if x < 0.2 else r.randint(5000, 6500) if x < 0.03 + 0.2 else r.randint(8, 400)
            chunk = units[2 * i : 2 * (i + size)]
            self.events.append({"k": "text", "text": chunk.decode("utf-16-le", "surrogatepass")})
            i += size

    def call(self, path: str | None = None) -> None:
        r = self.rng
        self.events.append(
            {
                "k": "call",
                "id": f"c{len(self.events)}",
                "tool": "read_file" if path else r.choice(("read_file", "glob")),
                "args": {"path": path or r.choice("abcdefgh")},
            }
        )

    def motif(self) -> None:
        r = self.rng
        x = r.random()
        if x < 0.32:  # chanting
            s = self.sentence(5, 400) if r.random() < 0.7 else self.sentence(5, 60)
            reps = r.randint(6, 30)
            text = "".join(s if r.random() > 0.05 else self.sentence(5, 80) for _ in range(reps))
            self.emit(self.sentence(0, 120) + text)
        elif x < 0.42:  # a shared prefix, distinct items
            prefix = self.sentence(50, 120)
            self.emit("".join(f"{prefix}{r.randint(0, 10**6)} {self.sentence(1, 30)}" for _ in range(r.randint(8, 20))))
        elif x < 0.5:  # repeats too far apart
            if r.random() < 0.4:  # a period of exactly 250 units (an average distance of 250: a loop) or 251
                period = "".join(r.choice("abcdefgh ") for _ in range(r.choice((250, 251))))
                self.emit(period * r.randint(10, 13))
                return
            s = self.sentence(50, 90)
            self.emit("".join(s + self.sentence(200, 400) for _ in range(r.randint(10, 14))))
        elif x < 0.55:  # fewer than 10 repeats of a short period
            s = self.sentence(5, 40)
            self.emit(s * r.randint(3, 9))
        elif x < 0.62:  # chanting with a chunk between that only a wrong reading of the patterns resets
            s = self.sentence(5, 60)
            for _ in range(r.randint(2, 4)):
                self.emit(s * r.randint(3, 8))
                self.events.append({"k": "text", "text": r.choice(LOOKALIKES)})
        elif x < 0.72:  # markup between or inside repeats
            s = self.sentence(5, 120)
            for _ in range(r.randint(2, 12)):
                self.emit(s * r.randint(1, 4))
                self.events.append({"k": "text", "text": r.choice(MARKUP)})
        elif x < 0.8:  # a long chunk at once
            s = self.sentence(5, 300)
            self.events.append({"k": "text", "text": self.sentence(0, 5200) + s * r.randint(1, 40)})
        elif x < 0.86:  # a lone surrogate, an emoji split in two
            s = self.sentence(10, 70)
            self.events.append({"k": "text", "text": "\ud83d" + s})
            self.events.append({"k": "text", "text": "\ude00" * r.randint(1, 3) + s * r.randint(1, 12)})
        elif x < 0.89:  # periods from k variants after one prefix: a loop up to 5 distinct, none from 6
            prefix, k = self.sentence(50, 110), r.randint(3, 8)
            variants = [f"{v} {self.sentence(1, 40)}" for v in range(k)]
            cyclic = r.random() < 0.6
            self.emit(
                "".join(prefix + (variants[i % k] if cyclic else r.choice(variants)) for i in range(r.randint(10, 24)))
            )
        elif x < 0.91:  # one short line per chunk: letters and digits are "dividers" without their newline
            line = r.choice(("HELLO", "OK", "ABC123", "DONE.", "=>", "..."))
            for _ in range(r.randint(5, 40)):
                self.events.append({"k": "text", "text": line + r.choice(("\n", "\n", "", " "))})
        elif x < 0.95:
            if r.random() < 0.3:  # a tool-call loop: its detection and the content's share one count
                for _ in range(5):
                    self.call("same")
            for _ in range(r.randint(1, 3)):
                self.call()
        else:
            self.events.append({"k": "user", "text": r.choice(("continue", "try again"))})


def sessions(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for s in range(n):
        g = Gen(rng, f"gc-{s:05d}")
        target = rng.randint(5, 60)
        while len(g.events) < target:
            g.motif()
        out.append({"id": g.sid, "events": g.events})
    return out


def _dumps(value) -> str:
    # ASCII escapes: a lone surrogate is \\udXXX in the file, which JSON.parse and json.loads both read back.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True)


def main(argv: list[str]) -> int:
    core, sessions_path, expected_path = argv[:3]
    n = int(argv[3]) if len(argv) > 3 else 600
    seed = int(argv[4]) if len(argv) > 4 else 2929
    made = sessions(n, seed)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as tmp:
        tmp.write("".join(_dumps(s) + "\n" for s in made))
    got = answers(core, tmp.name)
    end_at_abort(made, got)
    with gzip.GzipFile(sessions_path, "wb", mtime=0) as f:
        f.write("".join(_dumps(s) + "\n" for s in made).encode())
    with gzip.GzipFile(expected_path, "wb", mtime=0) as f:
        f.write("".join(_dumps({"id": s["id"], "steps": got[s["id"]]}) + "\n" for s in made).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
