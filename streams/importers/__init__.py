"""``loopwatch import``: recorded transcripts of other agents in, ``tool-calls`` events out.

One module per format (``FORMATS``; the mapping of each is in its docstring and in
docs/evaluation.md's table), each turning a file into ``model.Run``s; ``model.run_events``
hashes the raw arguments and results at the edge, as a runner would, and only the events are
written.  The format is told by content (``detect``), or forced.  Labels from the benchmark
(``--labels``: which runs were resolved) travel as the runs' ``run.ended`` reason.
"""

from __future__ import annotations

import gc
import gzip
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from schemas.events import encode_event_lines
from streams.edge.canonical import TooDeep

from . import claude_code, codex, mini_swe_agent, openai_chat, openhands, swe_agent
from .model import ImportFailed, Run, label_reason, run_events
from .reader import MAX_RUN_LINE_BYTES, Opened, decode

__all__ = ["FORMATS", "ImportFailed", "ImportSummary", "detect", "import_files", "load_labels", "read_runs"]

FORMATS = {m.NAME: m for m in (swe_agent, mini_swe_agent, openhands, openai_chat, claude_code, codex)}
"""Format name -> its module, in the order detection tries them."""


def detect(src: Opened) -> tuple[Any, Any]:
    """``(module, document)`` for a file: a line format by its first line, else a document
    format by the whole document (``document`` is None for a line format)."""
    if src.first is not None:
        for module in FORMATS.values():
            if module.KIND == "lines" and module.detect(src.first):
                return module, None
        if openhands.detect(src.first) and not src.single_line:
            return openhands, None
    doc = src.document()
    for module in FORMATS.values():
        if module.KIND != "lines" and module.detect(doc):
            return module, doc
    raise ImportFailed(
        f"cannot tell the format of {src.name}: it is none of {', '.join(FORMATS)} (give --format to force one)"
    )


def read_runs(src: Opened, fmt: str | None = None) -> tuple[str, Iterator[Run]]:
    """The file's format and its runs (lazily: a run-per-line file is read a line at a time)."""
    if fmt is None:
        module, doc = detect(src)
    else:
        module, doc = FORMATS[fmt], None
        if module.KIND == "lines" and not (src.first is not None and module.detect(src.first)):
            raise ImportFailed(f"{src.name} is not a {fmt} file: its first line is not a {fmt} transcript line")
        if module.KIND == "document" and src.first is not None and not src.single_line:
            raise ImportFailed(f"{src.name} is not a {fmt} file: it holds JSON lines, not one JSON document")
    name = src.name
    if module.KIND == "lines":
        return module.NAME, module.runs(src.lines(), name)
    if doc is None and module is openhands and src.first is not None and not src.single_line:
        return module.NAME, _per_line(src, module)
    if doc is None:
        doc = src.document()
    return module.NAME, module.runs(doc, name)


def _per_line(src: Opened, module: Any) -> Iterator[Run]:
    for number, record in src.lines(MAX_RUN_LINE_BYTES):
        if not module.detect(record):
            raise ImportFailed(f"{src.name}: line {number} is not an {module.NAME} run (no history[])")
        yield from module.runs(record, f"{src.name}:{number}")


LABEL_SHAPES = (
    "mini-swe-agent's results_summary.json (instances[] with resolved)",
    "a SWE-bench report (resolved_ids, unresolved_ids)",
    "a SWE-bench results.json (resolved[] and other lists of instance ids: generated, applied, ...)",
    "an object of run id -> true/false",
)


def load_labels(path: Path) -> dict[str, str]:
    """Run id -> ``run.ended`` reason from a benchmark's results (``LABEL_SHAPES``):
    mini-swe-agent's ``results_summary.json`` (``instances[]`` of ``{instance_id, resolved}``),
    a SWE-bench report (``resolved_ids``, ``unresolved_ids``), a SWE-bench ``results.json``
    (the experiments repository's: lists of instance ids by stage, ``resolved`` among them;
    an id in any other list and not in ``resolved`` is unresolved), or an object of id ->
    true/false."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ImportFailed(f"cannot read {path}: {exc.strerror or exc}") from None
    doc = decode(data, str(path))
    labels: dict[str, str] = {}
    if isinstance(doc, dict) and isinstance(doc.get("instances"), list):
        for entry in doc["instances"]:
            if isinstance(entry, dict) and "instance_id" in entry and isinstance(entry.get("resolved"), bool):
                labels[str(entry["instance_id"])] = label_reason(resolved=entry["resolved"])
    elif isinstance(doc, dict) and isinstance(doc.get("resolved_ids"), list):
        for key, resolved in (("unresolved_ids", False), ("resolved_ids", True)):
            for run_id in doc.get(key) or ():
                labels[str(run_id)] = label_reason(resolved=resolved)
    elif isinstance(doc, dict) and isinstance(doc.get("resolved"), list):
        resolved = {str(i) for i in doc["resolved"] if isinstance(i, str)}
        for key, ids in doc.items():
            if key != "resolved" and isinstance(ids, list):
                for run_id in ids:
                    if isinstance(run_id, str) and run_id not in resolved:
                        labels[run_id] = label_reason(resolved=False)
        for run_id in resolved:
            labels[run_id] = label_reason(resolved=True)
    elif isinstance(doc, dict) and doc and all(isinstance(v, bool) for v in doc.values()):
        labels = {str(k): label_reason(resolved=v) for k, v in doc.items()}
    if not labels:
        raise ImportFailed(f"{path} holds no labels: expected one of " + "; ".join(LABEL_SHAPES))
    return labels


@dataclass
class ImportSummary:
    files: int = 0
    runs: int = 0
    calls: int = 0
    compactions: int = 0
    events: int = 0
    formats: Counter = field(default_factory=Counter)
    ends: Counter = field(default_factory=Counter)
    labelled: int = 0

    def line(self, out: str) -> str:
        ends = ", ".join(f"{k} {v:,}" for k, v in self.ends.most_common())
        return (
            f"imported {self.runs:,} runs, {self.calls:,} tool calls, {self.compactions:,} compactions from "
            f"{self.files:,} files ({', '.join(f'{k} {v:,}' for k, v in sorted(self.formats.items()))}) into "
            f"{out}: {self.events:,} events; runs ended {ends}"
        )


def import_files(
    paths: Iterable[Path],
    out: IO[bytes],
    *,
    fmt: str | None = None,
    labels: dict[str, str] | None = None,
    agent_id: str | None = None,
    progress: Callable[[ImportSummary, float | None], None] | None = None,
    total_bytes: int = 0,
) -> ImportSummary:
    """Every file's runs as events on ``out`` (JSONL).  A file that holds no tool call is an
    error (exit 1): a transcript of something else, or of a run that did nothing."""
    # The cyclic collector is off while importing: a decoded document is millions of dicts and
    # lists, and the collections their making triggers (each going over the whole young
    # document) took a quarter of a large file's import.  Nothing here makes cycles; what
    # it frees, reference counting frees.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _import_files(paths, out, fmt, labels, agent_id, progress, total_bytes)
    finally:
        if collecting:
            gc.enable()


def _import_files(
    paths: Iterable[Path],
    out: IO[bytes],
    fmt: str | None,
    labels: dict[str, str] | None,
    agent_id: str | None,
    progress: Callable[[ImportSummary, float | None], None] | None,
    total_bytes: int,
) -> ImportSummary:
    summary = ImportSummary()
    done = 0
    write = out.write
    for path in paths:
        src = Opened(path)
        try:
            name, runs = read_runs(src, fmt)
            calls_before = summary.calls
            for run in runs:
                if labels is not None and run.run_id in labels:
                    run.end = labels[run.run_id]
                    summary.labelled += 1
                summary.runs += 1
                summary.calls += run.calls
                summary.compactions += len(run.items) - run.calls
                summary.ends[run.end] += 1
                try:
                    events = list(run_events(run, agent_id=agent_id))
                except TooDeep as exc:  # a value the file holds within the bound, hashed inside a wrapper
                    raise ImportFailed(f"{path}: run {run.run_id}: {exc}") from None
                summary.events += len(events)
                write(encode_event_lines(events))
                if progress is not None:
                    progress(summary, (done + src.position()) / total_bytes if total_bytes else None)
            if summary.calls == calls_before:
                raise ImportFailed(f"{path}: no tool calls found in this {name} file", code=1)
        finally:
            src.close()
        summary.files += 1
        summary.formats[name] += 1
        done += src.size
    return summary


def open_output(path: Path) -> tuple[IO[bytes], Callable[[bool], None]]:
    """The output file, written beside its final name and renamed there on success (an
    interrupted or failed import leaves no half file); gzip when it ends in ``.gz``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        raw = open(tmp, "wb")
    except OSError as exc:
        raise ImportFailed(f"cannot write {path}: {exc.strerror or exc}") from None
    # Level 1: events are hex hashes and repeated names, which compress well at any level;
    # level 6 took a quarter of an import's time for 16 % less output (docs/benchmarks.md).
    fh: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0) if path.suffix == ".gz" else raw

    def finish(ok: bool) -> None:
        try:
            if fh is not raw:
                fh.close()
            raw.close()
            if ok:
                os.replace(tmp, path)
        except OSError as exc:
            raise ImportFailed(f"cannot write {path}: {exc.strerror or exc}") from None
        finally:
            if not ok or tmp.exists():
                tmp.unlink(missing_ok=True)

    return fh, finish
