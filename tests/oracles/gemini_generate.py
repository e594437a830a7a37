"""Random sessions for profile gemini-cli and Gemini CLI's own answers to them (the oracle,
``gemini_oracle.mjs``, driving ``@google/gemini-cli-core``'s LoopDetectionService in node).

    python tests/oracles/gemini_generate.py CORE_DIR SESSIONS EXPECTED [N] [SEED]

Loops of 1 to 6 calls repeated 3 to 7 times, near-loops (one argument changed, the same
arguments in another key order: another call for Gemini), new prompts between them.  A session
ends where Gemini ends the turn (its second detection)."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ORACLE = Path(__file__).with_name("gemini_oracle.mjs")
TOOLS = ("read_file", "run_shell_command", "glob", "replace")
VALUES = (1, 2, 0.5, 1e21, -3, "a", "é\\n", "\u2028", None, True, [1, "x"], {"deep": 1})


class Gen:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.events: list[dict] = []

    def call_def(self) -> tuple[str, dict]:
        r = self.rng
        keys = r.sample(("path", "command", "limit", "pattern", "flags"), r.randint(0, 3))
        return r.choice(TOOLS), {k: r.choice(VALUES) for k in keys}

    def call(self, tool: str, args: dict) -> None:
        self.events.append({"k": "call", "id": f"c{len(self.events)}", "tool": tool, "args": args})

    def motif(self) -> None:
        r = self.rng
        x = r.random()
        if x < 0.55:  # a cycle, repeated, perhaps broken once
            cycle = [self.call_def() for _ in range(r.randint(1, 6))]
            repeats = r.randint(3, 7)
            for _rep in range(repeats):
                for tool, args in cycle:
                    if r.random() < 0.04 and args:  # a near-loop: the same arguments, another key order
                        args = dict(reversed(list(args.items())))
                    elif r.random() < 0.03:
                        args = {**args, "limit": r.randint(3, 9)}
                    self.call(tool, args)
        elif x < 0.65:
            self.events.append({"k": "user", "text": r.choice(("continue", "try again"))})
        else:
            for _ in range(r.randint(1, 6)):
                self.call(*self.call_def())


def sessions(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for s in range(n):
        g = Gen(rng)
        target = rng.randint(6, 70)
        while len(g.events) < target:
            g.motif()
        out.append({"id": f"gm-{s:05d}", "events": g.events})
    return out


def answers(core: str, path: str) -> dict[str, list]:
    proc = subprocess.run(["node", ORACLE, core, path], capture_output=True, text=True, check=True)
    return {row["id"]: row["steps"] for row in map(json.loads, proc.stdout.splitlines())}


def end_at_abort(made: list[dict], got: dict[str, list]) -> None:
    """Gemini ends the turn at its second detection: each session (and its answers) ends there."""
    for s in made:
        steps = got[s["id"]]
        end = next((i + 1 for i, st in enumerate(steps) if st and st[0] == "abort"), len(steps))
        s["events"], got[s["id"]] = s["events"][:end], steps[:end]


def main(argv: list[str]) -> int:
    core, sessions_path, expected_path = argv[:3]
    n = int(argv[3]) if len(argv) > 3 else 600
    seed = int(argv[4]) if len(argv) > 4 else 29
    made = sessions(n, seed)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as tmp:
        tmp.write("".join(json.dumps(s) + "\n" for s in made))
    got = answers(core, tmp.name)
    end_at_abort(made, got)
    with gzip.open(sessions_path, "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(s, separators=(",", ":"), ensure_ascii=False) + "\n" for s in made))
    with gzip.open(expected_path, "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps({"id": s["id"], "steps": got[s["id"]]}, separators=(",", ":")) + "\n" for s in made))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
