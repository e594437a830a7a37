"""Golden random traces (``tests/data/conformance/*/TRACES.md``): drive the engine over every
session exactly as a runner would and compare each step with upstream's answer.

Two profiles: ``configurable-final`` (``traces/``) and ``latest`` (``latest/``, format in
openclaw-latest.md §10), whose lines carry more: the liveness signal, veto records, the
records' four latest fields, outcome-time warnings, and those fields in ``h``."""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.errors import LoopwatchError

from ..edge.canonical import UNDEFINED, TooDeep, text_exceeds_depth
from ..edge.events import blocked_result, compaction_event, completed_event, requested_event
from ..edge.hashing import ThrownError
from ..engine import LoopEngine, RunDriver, RunState, engine_for
from ..engine import compaction_guard as guard_mod
from ..engine.config import CONFIGURABLE_FINAL, LATEST, PROFILES, with_profile
from ..engine.engine import normalize_run_id
from ..offline.files import OverlongLine, read_lines

__all__ = [
    "PROFILES",
    "SessionDriver",
    "SessionResult",
    "TraceFileError",
    "compare_session",
    "history_digest",
    "numbered_jsonl",
    "open_jsonl",
    "run_traces",
]

MAX_TRACE_LINE_BYTES = 16 * 1024 * 1024
"""The longest line of a traces file: one session with all its steps (the stored traces' longest
is 0.6 MB)."""


class TraceFileError(LoopwatchError, ValueError):
    """A sessions or expected-steps file that cannot be read as one (a one-line message)."""


def open_jsonl(path: str | Path) -> Iterator[dict]:
    for _number, value in numbered_jsonl(path):
        yield value


def numbered_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) per non-blank line; ``TraceFileError`` for anything else."""
    path = Path(path)
    try:
        raw = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
        with raw:
            for number, line in enumerate(read_lines(raw, MAX_TRACE_LINE_BYTES), start=1):
                if line.__class__ is OverlongLine:
                    raise TraceFileError(f"{path}:{number}: {line.describe()}")
                if not line.strip():
                    continue
                if text_exceeds_depth(line):
                    raise TraceFileError(f"{path}:{number}: {TooDeep()}")
                try:
                    value = json.loads(line.decode("utf-8"))
                except UnicodeDecodeError as exc:
                    raise TraceFileError(
                        f"{path}:{number}: not UTF-8 text ({exc.reason} at byte {exc.start})"
                    ) from None
                except ValueError as exc:
                    raise TraceFileError(f"{path}:{number}: not JSON ({exc})") from None
                if not isinstance(value, dict):
                    raise TraceFileError(f"{path}:{number}: expected one JSON object per line")
                yield number, value
    except (OSError, EOFError, zlib.error) as exc:  # missing, a directory, not gzip, truncated
        raise TraceFileError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None


def _outcome_kwargs(out: dict) -> dict:
    if "none" in out:
        return {"returned": False}
    if "error" in out:
        error = out["error"]
        if isinstance(error, dict) and error.get("$error") is True:
            error = ThrownError(message=error.get("message", ""), name=error.get("name", "Error"))
        return {"error": error}
    return {"result": out.get("result")}


def history_digest(states: list[RunState], history_size: int | float, profile: str = CONFIGURABLE_FINAL) -> str:
    """``h``: upstream's session buffer, i.e. the newest ``historySize`` records of the
    session's runs in order (a successor run's records follow its predecessor's); under
    profile latest each record also shows its four latest fields."""

    def cell(value: Any) -> str:
        return "~" if value is None else value

    records = [(state.run_id, r) for state in states for r in state.records()]
    if len(records) > history_size:
        records = records[len(records) - int(history_size) :]
    lines = [
        "\t".join(
            (
                r.tool_name,
                r.args_hash,
                cell(r.tool_call_id),
                cell(run_id),
                cell(r.result_hash),
                cell(r.unknown_tool_name),
            )
        )
        for run_id, r in records
    ]
    if profile == LATEST:
        lines = [
            "\t".join(
                (
                    line,
                    cell(r.outcome_kind),
                    cell(r.failure_identity_hash),
                    "1" if r.no_progress else "~",
                    cell(r.mutation_target_hash),
                )
            )
            for line, (_, r) in zip(lines, records)
        ]
    data = "\n".join(lines).encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()[:32]


@dataclass
class _Run:
    base_id: str | None
    agent_id: str | None
    successor: int = 0
    state: RunState | None = None
    aborted: bool = False
    retired: list[RunState] = field(default_factory=list)

    @property
    def run_id(self) -> str | None:
        if self.base_id is None or self.successor == 0:
            return self.base_id
        return f"{self.base_id}-r{self.successor}"


@dataclass
class SessionDriver:
    """Replays one session through the engine (``RunDriver``) and produces upstream's step lines."""

    session: dict
    profile: str = CONFIGURABLE_FINAL
    engine: LoopEngine = field(init=False)

    def __post_init__(self) -> None:
        self.latest = self.profile == LATEST
        cfg = self.session.get("cfg")
        self.engine = engine_for(cfg if self.profile == CONFIGURABLE_FINAL else with_profile(cfg, self.profile))
        self.driver = RunDriver(self.engine)
        self.sid = self.session["id"]
        self.session_key = self.session.get("sessionKey")
        self.send_tools = frozenset((self.session.get("env") or {}).get("provider_send_tools") or ())
        self.runs = [_Run(r.get("runId"), r.get("agentId")) for r in self.session["runs"]]
        self.slots: dict[Any, tuple] = {}
        self.seq = 0

    def _ids(self, run: _Run) -> dict:
        self.seq += 1
        return {"run_id": run.run_id, "session_key": self.session_key, "agent_id": run.agent_id, "ts_ms": self.seq}

    def _handle(self, run: _Run, event) -> Any:
        step = self.driver.handle(event)
        run.state = step.state
        return step

    def _start_successor_if_aborted(self, run: _Run, out: dict) -> None:
        if run.aborted:
            run.aborted = False
            run.successor += 1
            if run.base_id is not None and run.state is not None:
                run.retired.append(run.state)
                run.state = None  # a new run id: a new scope with fresh state
            out["succ"] = run.successor

    def _begin(self, run: _Run, i: int, step_def: dict, out: dict) -> tuple[bool, str]:
        tool, args = step_def["tool"], step_def.get("args", UNDEFINED)
        if args is UNDEFINED:
            args = None
        event = requested_event(f"{self.sid}:{i}", tool, args, tool_call_id=step_def.get("id"), **self._ids(run))
        step = self._handle(run, event)
        out["ah"] = event.args_hash
        d = step.detection
        out["d"] = (
            [True, d.level, d.detector, d.count, d.message, d.warning_key, d.paired_tool_name]
            if d
            else [False, None, None, None, None, None, None]
        )
        if self.latest:
            out["d"].append(d.liveness_signal if d else None)
        out["b"] = step.vetoed
        if step.vetoed:
            # The blocked result is offered to record-outcome (as the runner client does):
            # it never hashes; under latest it records a tool-loop-veto.
            veto = completed_event(
                f"{self.sid}:{i}:veto",
                tool,
                args,
                result=blocked_result(d.message),
                provider_send_tools=self.send_tools,
                tool_call_id=step_def.get("id"),
                **self._ids(run),
            )
            veto_step = self._handle(run, veto)
            out["vr"] = self._record_row(veto_step.record, run)
        elif d is not None and d.level == "warning":
            out["w"] = bool(step.decision.warning_emitted)
        return step.vetoed, event.args_hash

    def _end(self, run: _Run, i: int, tool: str, args: Any, call_id: Any, outcome: dict, out: dict, gl: list) -> None:
        event = completed_event(
            f"{self.sid}:{i}:out",
            tool,
            args,
            provider_send_tools=self.send_tools,
            tool_call_id=call_id,
            **_outcome_kwargs(outcome),
            **self._ids(run),
        )
        step = self._handle(run, event)
        out["rec"] = self._record_row(step.record, run)
        if step.detection is not None:  # profile latest's outcome-time warning (emitted)
            w = step.detection
            out["ow"] = [[w.detector, w.count, w.message]]
        if step.guard is not None:
            g = step.guard
            out["g"] = [g.should_abort, g.armed, g.remaining_attempts, g.detector, g.count, g.tool_name, g.message]
        gl.extend(f"{line.level}:{line.message}" for line in step.logs if line.subsystem == guard_mod.SUBSYSTEM)
        if step.abort is not None:
            run.aborted = True

    def run(self) -> Iterator[dict]:
        for i, step_def in enumerate(self.session["steps"]):
            op = step_def["op"]
            out: dict[str, Any] = {"s": self.sid, "i": i, "op": op}
            gl: list[str] = []
            if op == "end":
                slot = self.slots.pop(step_def["slot"])
                run, tool, args, call_id, vetoed, generation = slot
                if vetoed or run.aborted or generation != (run.successor, run.aborted):
                    out["skip"] = True
                else:
                    self._end(run, i, tool, args, call_id, step_def["out"], out, gl)
            else:
                run = self.runs[step_def.get("run", 0)]
                self._start_successor_if_aborted(run, out)
                if op == "arm":
                    step = self._handle(run, compaction_event(f"{self.sid}:{i}", **self._ids(run)))
                    gl.extend(f"{line.level}:{line.message}" for line in step.logs)
                else:
                    tool, args = step_def["tool"], step_def.get("args")
                    vetoed, _ = self._begin(run, i, step_def, out)
                    if op == "call":
                        if not vetoed:
                            self._end(run, i, tool, args, step_def.get("id"), step_def["out"], out, gl)
                    else:
                        self.slots[step_def["slot"]] = (
                            run,
                            tool,
                            args,
                            step_def.get("id"),
                            vetoed,
                            (run.successor, run.aborted),
                        )
            out["gl"] = gl
            states = run.retired + ([run.state] if run.state else [])
            out["h"] = history_digest(
                states, self.engine.settings_for(run.agent_id).detection.history_size, self.profile
            )
            yield out

    def _record_row(self, record, run: _Run) -> list | None:
        if record is None:
            return None
        run_id = run.state.run_id if run.state else normalize_run_id(run.run_id)
        row = [record.args_hash, record.result_hash, record.unknown_tool_name, record.tool_call_id, run_id]
        if self.latest:
            row += [record.outcome_kind, record.failure_identity_hash, record.no_progress, record.mutation_target_hash]
        return row


def _same(expected: Any, got: Any) -> bool:
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(expected) is type(got) and expected == got
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        return float(expected) == float(got)
    if isinstance(expected, list) and isinstance(got, list):
        return len(expected) == len(got) and all(_same(a, b) for a, b in zip(expected, got))
    return expected == got


@dataclass
class SessionResult:
    session_id: str
    steps: int
    failure: str | None = None


def compare_session(session: dict, expected_lines: list[dict], profile: str = CONFIGURABLE_FINAL) -> SessionResult:
    try:
        produced = SessionDriver(session, profile).run()
    except Exception as exc:  # a malformed session: report it, never crash the whole run
        return SessionResult(session["id"], 0, f"cannot drive this session: {type(exc).__name__}: {exc}")
    count = 0
    for want in expected_lines:
        try:
            got = next(produced)
        except StopIteration:
            return SessionResult(session["id"], count, f"step {want.get('i')}: engine produced no line")
        except Exception as exc:  # report, never crash the whole run
            return SessionResult(
                session["id"], count, f"step {want.get('i')}: engine raised {type(exc).__name__}: {exc}"
            )
        count += 1
        for key in sorted(set(want) | set(got)):
            if key not in want or key not in got or not _same(want[key], got[key]):
                return SessionResult(
                    session["id"],
                    count,
                    f"step {want.get('i')} ({want.get('op')}): field {key!r}: expected "
                    f"{json.dumps(want.get(key, '<absent>'), ensure_ascii=True)}, got {json.dumps(got.get(key, '<absent>'), ensure_ascii=True)}",
                )
    return SessionResult(session["id"], count)


def run_traces(
    sessions_path: str | Path, expected_path: str | Path, progress=None, profile: str = CONFIGURABLE_FINAL
) -> list[SessionResult]:
    """Compare every session with its expected lines.  ``TraceFileError`` when either file is
    not of its kind (the two swapped included); a session that disagrees is a failed result."""
    expected: dict[str, list[dict]] = {}
    for number, line in numbered_jsonl(expected_path):
        if not isinstance(line.get("s"), str) or not isinstance(line.get("i"), int):
            raise TraceFileError(
                f'{expected_path}:{number}: not an expected step (no "s" and "i"): is it the sessions file?'
            )
        expected.setdefault(line["s"], []).append(line)
    results = []
    for number, session in numbered_jsonl(sessions_path):
        if not isinstance(session.get("id"), str) or not isinstance(session.get("steps"), list):
            raise TraceFileError(
                f'{sessions_path}:{number}: not a session (no "id" and "steps"): is it the expected-steps file?'
            )
        lines = expected.pop(session["id"], None)
        if lines is None:
            results.append(SessionResult(session["id"], 0, "no expected lines for this session"))
        else:
            results.append(compare_session(session, lines, profile))
        if progress:
            progress(len(results))
    if not results:
        raise TraceFileError(f"{sessions_path}: no sessions in the file")
    for sid in expected:
        results.append(SessionResult(sid, 0, "expected lines for a session that is not in the sessions file"))
    return results
