"""Node runners for the integration tests: clients/typescript/test/e2e/runner.ts (built by
``make ts-client``) in a subprocess, driven over stdin/stdout, and what the tests check of the
events such a runner published.  The ``node`` fixture is in conftest.py."""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections import Counter

import msgspec

from harness import REPO
from schemas.events import ToolCallCompleted, ToolCallRequested
from schemas.keys import state_key
from streams.offline.scenarios import scenario_calls

PACKAGE = REPO / "clients" / "typescript"
RUNNER = PACKAGE / "dist" / "test" / "e2e" / "runner.js"
NODE_TIMEOUT_S = 180


class NodeRunner:
    """One runner process: a plan in on stdin, JSON lines out (kept in ``output``, with its
    stderr once it finished, for tests that search everything it printed)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.output: list[str] = []

    @classmethod
    async def start(cls, node: str, scenario: str, plan: dict, env: dict[str, str] | None = None) -> NodeRunner:
        """``env``: more environment variables (a password the plan names by ``passwordEnv``)."""
        proc = await asyncio.create_subprocess_exec(
            node,
            str(RUNNER),
            scenario,
            cwd=str(PACKAGE),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=64 * 1024 * 1024,  # a report is one JSON line
            env={**os.environ, **(env or {})},
        )
        runner = cls(proc)
        await runner.send(json.dumps(plan))
        return runner

    async def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    async def read(self, event: str) -> dict:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), NODE_TIMEOUT_S)
        if not line:
            stderr = (await self.proc.stderr.read()).decode() if self.proc.stderr else ""
            raise AssertionError(f"the Node runner exited ({await self.proc.wait()}) before {event!r}:\n{stderr}")
        self.output.append(line.decode())
        message = json.loads(line)
        assert message["event"] == event, message
        return message

    async def finish(self) -> None:
        code = await asyncio.wait_for(self.proc.wait(), NODE_TIMEOUT_S)
        stderr = (await self.proc.stderr.read()).decode() if self.proc.stderr else ""
        self.output.append(stderr)
        assert code == 0, stderr

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()


def assert_blocked_calls_completed_at_once(events: list, blocked: set[str]) -> int:
    """Every call blocked in gate mode (``blocked``: its request's event id) is completed with
    upstream's blocked result (``loop_veto``, no hash) right after its request, and only then:
    the runner's after-tool-call for it published nothing.  Returns how many were checked."""
    by_run: dict[str, list] = {}
    for event in events:
        by_run.setdefault(state_key(event), []).append(event)
    checked = 0
    for run_events in by_run.values():
        completions = Counter(e.tool_call_id for e in run_events if isinstance(e, ToolCallCompleted))
        for i, event in enumerate(run_events):
            if isinstance(event, ToolCallRequested) and event.event_id in blocked:
                after = run_events[i + 1] if i + 1 < len(run_events) else None
                assert isinstance(after, ToolCallCompleted) and after.tool_call_id == event.tool_call_id, (event, after)
                assert after.loop_veto and after.result_hash is None and after.normalized_result_hash is None, after
                assert completions[event.tool_call_id] == 1, (
                    f"{event.tool_call_id} completed {completions[event.tool_call_id]} times"
                )
                checked += 1
    return checked


def plain(verdict) -> dict:
    """A verdict, or the Node runner's JSON of one, as a comparable dict."""
    return verdict if isinstance(verdict, dict) else msgspec.to_builtins(verdict)


def node_calls(kind: str, seed: int, length: int = 24) -> list:
    """A scenario's tool calls (streams.offline.scenarios) as the runner's plan lists them."""
    out = []
    for call in scenario_calls(kind, random.Random(f"{seed}:{kind}"), length):
        if call == "compaction":
            out.append("compaction")
        elif call.error is not None:
            out.append({"tool": call.tool, "args": call.args, "error": call.error})
        else:
            out.append({"tool": call.tool, "args": call.args, "result": call.result})
    return out
