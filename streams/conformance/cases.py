"""Upstream's transcribed test cases (``openclaw-cases.json``, spec §6), run against the
engine: the detector-suite ops use the engine's history and detector functions, the
before-tool-call hook ops go through ``LoopEngine.handle`` as the Faust app does, the
guard ops use the engine's guard, the config ops its resolution and schema validation."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from schemas.config import validate_loop_detection
from schemas.errors import LoopwatchError
from schemas.events import InvalidEvent
from schemas.names import MISSING_KEY

from ..client.errors import PostCompactionLoopPersistedError, RunAbortedError
from ..edge.events import blocked_result, completed_event, requested_event
from ..edge.hashing import ThrownError, args_hash, hash_outcome, is_known_poll
from ..engine import compaction_guard as guard_mod
from ..engine import history as history_mod
from ..engine.choose import engine_for
from ..engine.config import (
    CONFIGURABLE_FINAL,
    LATEST,
    ConfigSet,
    GuardSettings,
    merge_loop_detection,
    pos_int,
    resolve_detector,
    resolve_guard,
)
from ..engine.detectors import detect
from ..engine.drive import RunDriver
from ..engine.engine import normalize_run_id
from ..engine.state import CompactionRereads, GuardWindow, RunState


class CaseFailure(LoopwatchError, AssertionError):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CaseFailure(message)


# -- template expansion ---------------------------------------------------------------------

_I_PATTERN = re.compile(r"\{i(?:\+(\d+))?\}")


def _substitute(value: Any, i: int) -> Any:
    if isinstance(value, str):
        return _I_PATTERN.sub(lambda m: str(i + int(m.group(1) or 0)), value)
    if isinstance(value, list):
        return [_substitute(v, i) for v in value]
    if isinstance(value, dict):
        if set(value) == {"$i"}:
            return i + value["$i"]
        return {k: _substitute(v, i) for k, v in value.items()}
    return value


def expand_steps(steps: list[dict]) -> list[tuple[dict, int]]:
    """Flatten ``repeat`` ops into (step, i) pairs."""
    out: list[tuple[dict, int]] = []
    for step in steps:
        if step.get("op") != "repeat":
            out.append((step, 0))
            continue
        start = step.get("start", 0)
        template = step["template"]
        for i in range(start, start + step["count"]):
            if "$pick" in template:
                chosen = template["$pick"][i % len(template["$pick"])]
                out.append((_substitute(chosen, i), i))
            elif "$seq" in template:
                out.extend((_substitute(s, i), i) for s in template["$seq"])
            else:
                out.append((_substitute(template, i), i))
    return out


def materialize(value: Any, root: Any = None) -> Any:
    """Resolve value macros: $repeat_char, $self (a cycle), $error, $send_result."""
    if isinstance(value, list):
        return [materialize(v, root) for v in value]
    if not isinstance(value, dict):
        return value
    if "$repeat_char" in value:
        return value["$repeat_char"] * value["times"]
    if value.get("$error") is True:
        return ThrownError(message=value.get("message", ""), name=value.get("name", "Error"))
    if "$send_result" in value:
        payload = materialize(value["$send_result"])
        return {
            "content": [{"type": "text", "text": json.dumps(payload, indent=2, ensure_ascii=False)}],
            "details": payload,
        }
    if value.get("$self") is True and root is not None:
        return root
    result: dict = {}
    for key, nested in value.items():
        result[key] = _SELF if isinstance(nested, dict) and nested.get("$self") is True else materialize(nested, root)
    return result


_SELF = object()


def materialize_args(args: Any) -> Any:
    """Args may reference themselves (``{"$self": true}``): build the cycle for real."""
    built = materialize(args)
    if isinstance(built, dict):
        for key, value in list(built.items()):
            if value is _SELF:
                built[key] = built
    return built


# -- results --------------------------------------------------------------------------------


@dataclass
class CaseResult:
    case_id: str
    status: str  # passed | failed | skipped
    detail: str = ""


def case_profile(case: dict) -> str:
    """The profile a case targets: its ``source.profile``, or a guard's ``variant``."""
    if (case.get("source") or {}).get("profile") == LATEST or (case.get("guard") or {}).get("variant") == LATEST:
        return LATEST
    return CONFIGURABLE_FINAL


def skip_reason(case: dict) -> str | None:
    """Why a case cannot run here (None: it runs).  Every suite runs under both profiles."""
    if case_profile(case) == LATEST and case.get("suite") != "post-compaction-guard":
        return "profile latest is only transcribed for the post-compaction guard suite"
    return None


# -- detector suite -------------------------------------------------------------------------


class DetectorSession:
    """Upstream's session state for the detector unit tests: per-run histories (loopwatch's
    layout), viewed as one session buffer in recording order where a case reads it whole."""

    def __init__(self, case: dict) -> None:
        self.case = case
        self.config = case.get("config")
        self.send_tools = frozenset((case.get("environment") or {}).get("provider_send_tools") or ())
        self.runs: dict[str | None, RunState] = {}
        self.clock = _now_ms()

    def _history(self, run_id: Any) -> RunState:
        key = normalize_run_id(run_id)
        state = self.runs.get(key)
        if state is None:
            state = self.runs[key] = RunState(run_id=key)
        return state

    def _config(self, step: dict, default: Any) -> Any:
        return step["config"] if "config" in step else default

    def _tick(self) -> int:
        # A strictly increasing "now": record timestamps also order the session buffer.
        self.clock = max(self.clock + 1, _now_ms())
        return self.clock

    def buffer(self) -> list[tuple[str | None, Any]]:
        rows = [(run, r) for run, state in self.runs.items() for r in state.records()]
        rows.sort(key=lambda row: row[1].timestamp)
        return rows

    def record_call(self, step: dict, i: int) -> None:
        cfg = resolve_detector(self._config(step, None))
        args = materialize_args(step.get("args"))
        history_mod.record_call(
            self._history(step.get("run_id")),
            step["tool"],
            args_hash(step["tool"], args),
            step.get("tool_call_id"),
            self._tick(),
            cfg.history_size,
        )

    def record_outcome(self, step: dict, i: int, default_call_id: str | None = None) -> Any:
        cfg = resolve_detector(self._config(step, None))
        tool = step["tool"]
        args = materialize_args(step.get("args"))
        if "error" in step:
            outcome = hash_outcome(tool, args, error=materialize(step["error"]), provider_send_tools=self.send_tools)
        else:
            outcome = hash_outcome(
                tool,
                args,
                result=materialize(step.get("result")),
                returned="result" in step,
                provider_send_tools=self.send_tools,
            )
        if outcome.result_hash is None:
            return None
        record = history_mod.record_outcome(
            self._history(step.get("run_id")),
            tool,
            args_hash(tool, args),
            step.get("tool_call_id", default_call_id),
            outcome.result_hash,
            outcome.unknown_tool_name,
            self._tick(),
            cfg.history_size,
        )
        return record

    def call(self, step: dict, i: int) -> None:
        default_id = f"{step['tool']}-error-{i}" if "error" in step else f"{step['tool']}-{i}"
        step = {**step, "tool_call_id": step.get("tool_call_id", default_id)}
        self.record_call(step, i)
        self.record_outcome(step, i)

    def detect(self, step: dict) -> None:
        cfg = resolve_detector(self._config(step, self.config))
        tool = step["tool"]
        args = materialize_args(step.get("args"))
        found = None
        if cfg.enabled:
            found = detect(
                self._history(step.get("run_id")), tool, args_hash(tool, args), is_known_poll(tool, args), cfg
            )
        expect = step["expect"]
        if not expect.get("stuck"):
            check(
                found is None,
                f"detect {tool}: expected not stuck, got {found and (found.level, found.detector, found.count)}",
            )
            return
        check(found is not None, f"detect {tool}: expected stuck ({expect.get('level')}), got not stuck")
        for key, attr in (("level", "level"), ("detector", "detector"), ("count", "count")):
            if key in expect:
                check(
                    getattr(found, attr) == expect[key],
                    f"detect {tool}: {key} expected {expect[key]!r}, got {getattr(found, attr)!r}",
                )
        for fragment in expect.get("message_contains", []):
            check(fragment in found.message, f"detect {tool}: message lacks {fragment!r}: {found.message!r}")
        if "level_not" in expect:
            check(found.level != expect["level_not"], f"detect {tool}: level must not be {expect['level_not']!r}")

    def expect_history(self, step: dict) -> None:
        rows = self.buffer()
        if "length" in step:
            check(len(rows) == step["length"], f"history length expected {step['length']}, got {len(rows)}")
        for c in step.get("checks", []):
            if "index" in c:
                check(c["index"] < len(rows), f"history has no index {c['index']}")
                run, record = rows[c["index"]]
            else:
                matches = [row for row in rows if row[1].tool_call_id == c["tool_call_id"]]
                check(bool(matches), f"no history record with tool_call_id {c['tool_call_id']!r}")
                run, record = matches[-1]
            where = f"history[{c.get('index', c.get('tool_call_id'))}]"
            if "tool_name" in c:
                check(
                    record.tool_name == c["tool_name"], f"{where}.tool_name: {record.tool_name!r} != {c['tool_name']!r}"
                )
            if "tool_call_id" in c:
                check(record.tool_call_id == c["tool_call_id"], f"{where}.tool_call_id: {record.tool_call_id!r}")
            if "run_id" in c:
                check(run == c["run_id"], f"{where}.run_id: {run!r} != {c['run_id']!r}")
            if "result_hash" in c:
                present = c["result_hash"] == "present"
                check((record.result_hash is not None) == present, f"{where}.result_hash should be {c['result_hash']}")
            if "result_hash_regex" in c:
                check(
                    bool(record.result_hash and re.search(c["result_hash_regex"], record.result_hash)),
                    f"{where}.result_hash {record.result_hash!r} !~ {c['result_hash_regex']}",
                )
            if "args_hash_of" in c:
                want = args_hash(c["args_hash_of"]["tool"], materialize_args(c["args_hash_of"].get("args")))
                check(record.args_hash == want, f"{where}.args_hash {record.args_hash} != {want}")
            if c.get("timestamp") == "now_ms":
                check(abs(record.timestamp - _now_ms()) < 60_000, f"{where}.timestamp {record.timestamp} is not now")

    def expect_result_hashes(self, step: dict) -> None:
        tool = step["tool"]
        want_sig = args_hash(tool, materialize_args(step["args"])) if "args" in step else None
        hashes = [
            r.result_hash
            for _, r in self.buffer()
            if r.tool_name == tool and (want_sig is None or r.args_hash == want_sig) and r.result_hash
        ]
        check(len(hashes) >= 2, f"expect_result_hashes {tool}: need at least two hashes, have {len(hashes)}")
        _relation(step["relation"], hashes, f"result hashes of {tool}")

    def expect_stats(self, step: dict) -> None:
        stats = history_mod.tool_call_stats(r for _, r in self.buffer())
        most = (
            None
            if stats.most_frequent is None
            else {"toolName": stats.most_frequent[0], "count": stats.most_frequent[1]}
        )
        if "total_calls" in step:
            check(stats.total_calls == step["total_calls"], f"totalCalls {stats.total_calls} != {step['total_calls']}")
        if "unique_patterns" in step:
            check(
                stats.unique_patterns == step["unique_patterns"],
                f"uniquePatterns {stats.unique_patterns} != {step['unique_patterns']}",
            )
        if "most_frequent" in step:
            check(most == step["most_frequent"], f"mostFrequent {most} != {step['most_frequent']}")

    def run_step(self, step: dict, i: int) -> None:
        op = step["op"]
        if op == "record_call":
            self.record_call(step, i)
        elif op == "record_outcome":
            returned = self.record_outcome(step, i)
            if "expect_returned" in step:
                want = step["expect_returned"]
                if want is None:
                    check(returned is None, f"record_outcome should return nothing, returned {returned}")
                else:
                    check(returned is not None, "record_outcome returned nothing")
                    for key, value in want.items():
                        check(
                            getattr(returned, key) == value,
                            f"returned record {key}: {getattr(returned, key)!r} != {value!r}",
                        )
        elif op == "call":
            self.call(step, i)
        elif op == "detect":
            self.detect(step)
        elif op == "expect_history":
            self.expect_history(step)
        elif op == "expect_result_hashes":
            self.expect_result_hashes(step)
        elif op == "expect_args_hash":
            items = [args_hash(it["tool"], materialize_args(it.get("args"))) for it in step["items"]]
            if "format_regex" in step:
                for sig in items:
                    check(re.search(step["format_regex"], sig) is not None, f"{sig} !~ {step['format_regex']}")
            _relation(step["relation"], items, "args hashes")
        elif op == "expect_stats":
            self.expect_stats(step)
        else:
            raise CaseFailure(f"unknown op {op!r} in the detector suite")


def _relation(relation: str, values: list, what: str) -> None:
    if relation == "all_equal":
        check(len(set(values)) == 1, f"{what} are not all equal: {values}")
    elif relation == "all_distinct":
        check(len(set(values)) == len(values), f"{what} are not all distinct: {values}")
    elif relation != "any":
        raise CaseFailure(f"unknown relation {relation!r}")


def _now_ms() -> int:
    return int(time.time() * 1000)


# -- before-tool-call hook suite ----------------------------------------------------------


class HookSession:
    """The before-tool-call wrapper, driven through the engine (``RunDriver``) with events
    built at the edge, exactly as a runner and the worker would."""

    def __init__(self, case: dict) -> None:
        ctx = case["context"]
        self.ctx = ctx
        self.engine = engine_for({"tools": {"loopDetection": ctx.get("loop_detection")}})
        self.send_tools = frozenset((case.get("environment") or {}).get("provider_send_tools") or ())
        self.runs = RunDriver(self.engine)
        self.loop_events: list[dict] = []
        self.observations = 0
        self.seq = 0

    def execute(self, step: dict) -> None:
        self.seq += 1
        run_id = step.get("run_id", self.ctx.get("run_id"))
        fields = dict(
            run_id=run_id, session_key=self.ctx.get("session_key"), agent_id=self.ctx.get("agent_id"), ts_ms=_now_ms()
        )
        tool, args = step["tool"], materialize_args(step.get("args"))
        request = requested_event(f"e{self.seq}", tool, args, tool_call_id=step.get("tool_call_id"), **fields)
        try:
            outcome = self.runs.handle(request)
        except InvalidEvent as exc:
            # A runner with no run id or session key cannot be routed; it fails open.
            check(exc.reason == MISSING_KEY, f"execute {tool}: event rejected: {exc}")
            blocked = False
        else:
            blocked = outcome.decision.action == "block"
            if outcome.decision.action in ("warn", "block"):
                d = outcome.decision
                self.loop_events.append(
                    {
                        "type": "tool.loop",
                        "sessionKey": d.session_key,
                        "sessionId": None,
                        "toolName": d.tool_name,
                        "level": d.level,
                        "action": d.action,
                        "detector": d.detector,
                        "count": d.count,
                        "message": d.message,
                        "pairedToolName": d.paired_tool_name,
                    }
                )
            if not blocked:
                kwargs = (
                    {"error": materialize(step["error"])}
                    if "error" in step
                    else {"result": materialize(step.get("result")), "returned": "result" in step}
                )
                done = completed_event(
                    f"e{self.seq}:done",
                    tool,
                    args,
                    provider_send_tools=self.send_tools,
                    tool_call_id=step.get("tool_call_id"),
                    **kwargs,
                    **fields,
                )
                after = self.runs.handle(done)
                if after.record is not None:
                    self.observations += 1
        expect = step.get("expect")
        if not expect:
            return
        if "blocked" in expect:
            check(
                blocked == expect["blocked"],
                f"execute {tool} ({step.get('tool_call_id')}): blocked={blocked}, expected {expect['blocked']}",
            )
        if "executed" in expect:
            check(
                (not blocked) == expect["executed"],
                f"execute {tool}: executed={not blocked}, expected {expect['executed']}",
            )
        if blocked:
            d = outcome.decision
            details = blocked_result(d.message)["details"]
            if "reason_contains" in expect:
                check(expect["reason_contains"] in d.message, f"block reason lacks {expect['reason_contains']!r}")
            for k, v in (expect.get("result_details") or {}).items():
                check(details.get(k) == v, f"blocked result details.{k}: {details.get(k)!r} != {v!r}")

    def expect_loop_events(self, step: dict) -> None:
        events = self.loop_events
        if "last" in step:
            check(bool(events), "no tool.loop events")
            _partial(step["last"], events[-1], "last tool.loop event")
            return
        flt = step.get("filter") or {}
        chosen = [e for e in events if all(e.get(k) == v for k, v in flt.items())]
        if "equals" in step:
            got = [[e["level"], e["count"]] for e in chosen]
            check(got == step["equals"], f"tool.loop events {got} != {step['equals']}")
        if "equals_full" in step:
            check(
                len(chosen) == len(step["equals_full"]),
                f"{len(chosen)} tool.loop events, expected {len(step['equals_full'])}",
            )
            for want, got in zip(step["equals_full"], chosen):
                _partial(want, got, "tool.loop event")
        if "min_count" in step:
            check(len(chosen) >= step["min_count"], f"{len(chosen)} tool.loop events < {step['min_count']}")

    def run_step(self, step: dict, i: int) -> None:
        op = step["op"]
        if op == "execute":
            self.execute(step)
        elif op == "expect_loop_events":
            self.expect_loop_events(step)
        elif op == "expect_history":
            length = sum(len(s) for s in self.runs.states.values())
            check(length == step["length"], f"history length {length} != {step['length']}")
        elif op == "expect_observations":
            check(self.observations == step["count"], f"observations {self.observations} != {step['count']}")
        else:
            raise CaseFailure(f"unknown op {op!r} in the hook suite")


def _partial(want: dict, got: dict, what: str) -> None:
    for key, value in want.items():
        check(got.get(key) == value, f"{what}: {key} = {got.get(key)!r}, expected {value!r}")


# -- post-compaction guard suite ------------------------------------------------------------


class GuardSession:
    """The guard alone, as upstream's guard tests drive it; profile latest's fixed window
    and re-read instrumentation for the ``latest`` variant."""

    def __init__(self, case: dict) -> None:
        spec = case.get("guard") or {}
        config = spec.get("config")
        options = spec.get("options")
        enabled = not (isinstance(options, dict) and options.get("enabled") is False)
        self.latest = case_profile(case) == LATEST
        window = 3 if self.latest else pos_int((config or {}).get("windowSize"), 3)
        self.settings = GuardSettings(enabled=enabled, window_size=window)
        self.window = GuardWindow()
        self.rereads = CompactionRereads()
        self.recent: list[str] = []  # the observations (the engine keeps them in the history)
        self.logs: list[tuple[str, str]] = []
        self.last_abort = None

    def _observe(self, tool: str, args_hash: str, result_hash: str) -> guard_mod.GuardVerdict:
        if not self.latest:
            verdict, line = guard_mod.observe(self.window, self.settings.enabled, tool, args_hash, result_hash)
            if line:
                self.logs.append(("error", line))
            return verdict
        # The engine keys observations by signature, which begins with the tool's name; the
        # cases give upstream's bare args hashes, so the tool is prefixed here.
        key = f"{tool}:{args_hash}"
        verdict, error_line, info_line = guard_mod.observe_latest(
            self.window, self.rereads, self.settings.enabled, tool, key, result_hash
        )
        if self.settings.enabled:
            self.recent.append(key)
        if error_line:
            self.logs.append(("error", error_line))
        if info_line:
            self.logs.append(("info", info_line))
        return verdict

    def run_step(self, step: dict, i: int) -> None:
        op = step["op"]
        if op == "arm":
            if self.latest:
                line = guard_mod.arm_latest(self.window, self.rereads, self.settings, self.recent[-16:])
            else:
                line = guard_mod.arm(self.window, self.settings)
            if line:
                self.logs.append(("info", line))
        elif op == "observe":
            verdict = self._observe(step["tool"], step["args_hash"], step["result_hash"])
            if verdict.should_abort:
                self.last_abort = verdict
            got = {
                "shouldAbort": verdict.should_abort,
                "armed": verdict.armed,
                "remainingAttempts": verdict.remaining_attempts,
                "detector": verdict.detector,
                "count": verdict.count,
                "toolName": verdict.tool_name,
                "message": verdict.message,
            }
            _partial({k: v for k, v in (step.get("expect") or {}).items() if k != "derived"}, got, "guard verdict")
        elif op == "expect_snapshot":
            snap = {"armed": self.window.remaining > 0, "remainingAttempts": self.window.remaining}
            _partial({k: v for k, v in step.items() if k != "op"}, snap, "guard snapshot")
        elif op == "expect_log":
            check(
                (step["level"], step["equals"]) in self.logs,
                f"no {step['level']} log {step['equals']!r}; logs: {self.logs}",
            )
        elif op == "expect_no_logs":
            check(not self.logs, f"unexpected guard logs: {self.logs}")
        elif op == "expect_no_error_logs":
            check(not [l for l in self.logs if l[0] == "error"], f"unexpected error logs: {self.logs}")
        elif op == "expect_error_shape":
            c = step["construct"]
            err = PostCompactionLoopPersistedError(
                c["message"], detector=c["detector"], count=c["count"], tool_name=c["toolName"]
            )
            _partial(step["expect"], _error_fields(err), "PostCompactionLoopPersistedError")
        elif op == "expect_error_from_last_verdict":
            check(self.last_abort is not None, "no abort verdict to build the error from")
            v = self.last_abort
            err = PostCompactionLoopPersistedError(v.message, detector=v.detector, count=v.count, tool_name=v.tool_name)
            _partial(step["expect"], _error_fields(err), "PostCompactionLoopPersistedError")
        else:
            raise CaseFailure(f"unknown op {op!r} in the guard suite")


def _error_fields(err: RunAbortedError) -> dict:
    return {
        "name": err.name,
        "message": err.message,
        "detector": err.detector,
        "count": err.count,
        "toolName": err.tool_name,
    }


# -- config suite ---------------------------------------------------------------------------


class ConfigSession:
    def __init__(self, case: dict) -> None:
        pass

    def run_step(self, step: dict, i: int) -> None:
        op = step["op"]
        expect = step.get("expect") or {}
        if op == "resolve_detector_config":
            got = resolve_detector(step.get("config")).as_dict()
            for key, value in expect.items():
                if key == "detectors":
                    _partial(value, got["detectors"], "detectors")
                else:
                    check(got[key] == value, f"{key}: resolved {got[key]!r}, expected {value!r}")
        elif op == "merge":
            merged = ConfigSet(
                {
                    "tools": {"loopDetection": step.get("global")},
                    "agents": {"list": [{"id": "agent", "tools": {"loopDetection": step.get("agent")}}]},
                }
            ).loop_detection_block("agent")
            for key, value in expect.items():
                if isinstance(value, dict):
                    _partial(value, merged.get(key) or {}, key)
                else:
                    check(merged.get(key) == value, f"merged {key}: {merged.get(key)!r} != {value!r}")
            check(merged == merge_loop_detection(step.get("global"), step.get("agent")), "merge is not deterministic")
        elif op == "guard_gate":
            gate = resolve_guard(step.get("config"))
            check(gate.enabled == expect["guard_enabled"], f"guard enabled {gate.enabled} != {expect['guard_enabled']}")
            check(gate.window_size == expect["window_size"], f"window {gate.window_size} != {expect['window_size']}")
        elif op == "validate":
            issues = validate_loop_detection(step.get("config"), path="")
            valid = not issues
            check(valid == expect["valid"], f"valid={valid}, expected {expect['valid']} ({[str(x) for x in issues]})")
            if not valid:
                first = issues[0]
                if "path" in expect:
                    check(first.path.lstrip(".") == expect["path"], f"issue path {first.path!r} != {expect['path']!r}")
                if "message" in expect:
                    check(
                        first.message == expect["message"], f"issue message {first.message!r} != {expect['message']!r}"
                    )
                if "reason" in expect:
                    want = _REASON_CODES.get(expect["reason"])
                    check(
                        want is not None and first.code in want,
                        f"issue {first.code} ({first.message}) is not {expect['reason']!r}",
                    )
        else:
            raise CaseFailure(f"unknown op {op!r} in the config suite")


_REASON_CODES = {
    "unrecognized key (strict object)": {"unrecognized_keys"},
    "must be a positive integer": {"too_small", "not_integer", "invalid_type"},
}

_SUITES: dict[str, Callable[[dict], Any]] = {
    "tool-loop-detection": DetectorSession,
    "before-tool-call-hook": HookSession,
    "post-compaction-guard": GuardSession,
    "config-resolution": ConfigSession,
}


def run_case(case: dict) -> CaseResult:
    cid = case.get("id", "<no id>")
    reason = skip_reason(case)
    if reason:
        return CaseResult(cid, "skipped", reason)
    suite = _SUITES.get(case.get("suite"))
    if suite is None:
        return CaseResult(cid, "failed", f"unknown suite {case.get('suite')!r}")
    try:
        session = suite(case)
        for n, (step, i) in enumerate(expand_steps(case["steps"])):
            try:
                session.run_step(step, i)
            except CaseFailure as exc:
                raise CaseFailure(f"step {n} ({step.get('op')}): {exc}") from None
    except CaseFailure as exc:
        return CaseResult(cid, "failed", str(exc))
    except Exception as exc:  # a broken case or engine bug is a failure, not a crash
        return CaseResult(cid, "failed", f"raised {type(exc).__name__}: {exc}")
    return CaseResult(cid, "passed")


def load_cases(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, list) or not all(isinstance(case, dict) for case in data):
        raise ValueError("a case file is a JSON array of case objects")
    return data
