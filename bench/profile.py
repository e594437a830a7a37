"""Where the worker's time goes: a py-spy profile of (b) broken down by what the worker does.

``python -m bench.kafka --profile-worker FILE`` records the worker with py-spy (``--format
raw``: one line per distinct stack, ``frame;frame;... count``) from its first processed
record to its last.  This module reads such a file and puts every sample in one part of
the worker (``PARTS``), by the first rule that matches any frame of its stack: the specific
parts come first (signing, dedupe, logging...), so that a sample of ``kafka_key_problem``
called from the batch processor counts as the key check, not as the processor, and a
socket write under aiokafka's producer counts as producing, not as the event loop.

    python -m bench.profile FILE [--cpu-us 22] [--frames 40]

py-spy records with ``--idle``: the samples in which the event loop waits in ``select``
for a socket or a timer are counted apart, as the share of the event loop's time it had
nothing to do; the parts are shares of the other (busy) samples.  Samples of other threads
waiting (on a lock, a queue, or in their own ``select``, as the metrics server's) are left
out.

``--cpu-us``: the worker's CPU time per event in the same run (printed by ``make bench``);
each part is then also shown in µs per event (its share of the busy samples times that).
``--frames``: also list the frames with the largest inclusive share (to look inside a part).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

__all__ = ["PARTS", "breakdown", "part_of", "read_stacks"]

# (part, pattern on one frame as py-spy writes it: "function (file:line)"), first match wins.
PARTS: list[tuple[str, str]] = [
    ("signing (issue 20)", r"\(schemas/signing\.py"),
    ("dedupe: event-id digests (issue 13)", r"^(event_digest|seen_before|remember) \(streams/engine/intake"),
    ("Kafka key check (issue 13)", r"^(kafka_key_problem|record_key) "),
    (
        "logging",
        r"\(streams/app/logs\.py|^BatchProcessor\._log |\(logging/|^Step\.logs |^_request_logs "
        r"|^_tool_loop_line |^Detection\.message ",
    ),
    (
        "metrics",
        r"\(prometheus_client/|^BatchProcessor\._account |^BatchProcessor\.observe_latency "
        r"|\(streams/app/metrics\.py|\(socketserver\.py|\(wsgiref/",
    ),
    ("verdicts built and encoded", r"^encode_verdict |^Step\.published_decision |\(schemas/verdicts\.py"),
    ("verdicts produced (queued in record batches)", r"^Output\.send_verdicts "),
    ("state load (read, decode, copy)", r"^LiveRuns\.(load|decode) |^decode_state|^copy_state"),
    (
        "state store (encode, RocksDB, changelog)",
        r"^Checkpointer\.checkpoint |^LiveRuns\.|^encode_state|^pack_"
        r"|\(streams/app/run_store\.py|^RunStore\.|rocksdict",
    ),
    ("decode events", r"^decode_event |^check_event |\(schemas/events\.py"),
    ("engine", r"\(streams/engine/"),
    ("aiokafka producer (sender, both producers)", r"\(aiokafka/producer/"),
    (
        "consume: Faust fetch loop, aiokafka fetcher, acks",
        r"\(aiokafka/consumer/|\(faust/transport/"
        r"|\(streams/faust_adapter\.py",
    ),
    ("batch processor's own loop (group, clamp, bookkeeping)", r"\(streams/app/(processor|checkpoint)\.py"),
    ("timers, health, expiry, config reload", r"\(streams/app/(app|health|expiry|reload|topics)\.py|\(faust/app/"),
    ("asyncio, sockets (reads), aiokafka connections, the rest", r""),
]
_COMPILED = [(part, re.compile(pattern)) for part, pattern in PARTS]
SELECT = re.compile(r"^\w*Selector\.select \(selectors\.py")
EVENT_LOOP = re.compile(r"^BaseEventLoop\._run_once \(asyncio/")
"""A sample in ``select`` under the event loop is the loop's wait for sockets and timers
(idle); in ``select`` elsewhere, another thread's (the metrics server's ``serve_forever``)."""
WAITING = re.compile(r"^(wait|_wait_for_tstate_lock|get) \((threading|queue)\.py")
"""Another thread blocked on a lock or a queue (the sample's innermost frame)."""


def read_stacks(path: Path) -> Counter:
    """``{stack (tuple of frames, outermost first): samples}`` from a py-spy raw file."""
    stacks: Counter = Counter()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        stacks[tuple(stack.split(";"))] += int(count)
    return stacks


def part_of(stack: tuple[str, ...]) -> str:
    for part, pattern in _COMPILED:
        if any(pattern.search(frame) for frame in stack):
            return part
    return PARTS[-1][0]


def breakdown(stacks: Counter) -> tuple[Counter, int, int]:
    """``(busy samples by part, idle samples, other threads' waiting samples)``."""
    parts: Counter = Counter()
    idle = waiting = 0
    for stack, n in stacks.items():
        kind = _waiting(stack)
        if kind == "idle":
            idle += n
        elif kind == "waiting":
            waiting += n
        else:
            parts[part_of(stack)] += n
    return parts, idle, waiting


def _waiting(stack: tuple[str, ...]) -> str | None:
    """Whether a sample waits: "idle" (the event loop in select), "waiting" (another thread
    blocked), or None (busy)."""
    if WAITING.search(stack[-1]):
        return "waiting"
    if any(SELECT.search(frame) for frame in stack):
        return "idle" if any(EVENT_LOOP.search(frame) for frame in stack) else "waiting"
    return None


def _frame_name(frame: str) -> str:
    return re.sub(r":\d+\)$", ")", frame)  # one entry per function, not per line


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.profile", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("file", type=Path, help="py-spy --format raw output (make bench --profile-worker FILE)")
    p.add_argument("--cpu-us", type=float, help="the worker's µs CPU/event in the same run")
    p.add_argument("--frames", type=int, default=0, help="also list this many frames by inclusive share")
    args = p.parse_args(argv)
    try:
        stacks = read_stacks(args.file)
    except OSError as exc:
        print(f"bench.profile: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 1
    parts, idle, waiting = breakdown(stacks)
    total = sum(parts.values())
    if not total:
        print(
            f"bench.profile: {args.file} holds no busy samples (is it py-spy's --format raw output?)", file=sys.stderr
        )
        return 1
    print(
        f"{total + idle + waiting:,} samples in {args.file}: {total:,} busy; the event loop idle (waiting in "
        f"select) in {idle:,}, {idle / (total + idle) * 100:.0f} % of its samples; {waiting:,} of other threads waiting"
    )
    print()
    print("| part of the worker | share of busy samples |" + (" µs per event |" if args.cpu_us else ""))
    print("|---|---|" + ("---|" if args.cpu_us else ""))
    for part, _pattern in PARTS:
        n = parts.get(part, 0)
        line = f"| {part} | {n / total * 100:.1f} % |"
        if args.cpu_us:
            line += f" {n / total * args.cpu_us:.1f} |"
        print(line)
    if args.frames:
        inclusive: Counter = Counter()
        for stack, n in stacks.items():
            if _waiting(stack) is not None:
                continue
            for frame in {_frame_name(f) for f in stack}:
                inclusive[frame] += n
        print()
        for frame, n in inclusive.most_common(args.frames):
            print(f"{n / total * 100:5.1f} %  {frame}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
