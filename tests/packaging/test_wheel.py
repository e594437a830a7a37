"""The wheel a release would publish, installed as a user installs it: ``pip install`` into a
fresh venv, one venv per extra (``conftest.py``), against the real broker.

* base ``loopwatch``: the runner client publishes a looping run and reads a real worker's
  verdicts; none of the worker's packages is installed, and ``loopwatch worker`` says in one
  line which extra to install;
* ``loopwatch[worker]``: ``loopwatch worker`` starts, becomes ready and decides;
* ``loopwatch[mcp]``: ``loopwatch mcp-gateway`` serves a real MCP server (``mcp-server-time``
  from PyPI), driven by the MCP SDK's own client.

Expected decisions are hand-worked from the spec's defaults (warningThreshold 10,
criticalThreshold 20): the same call with the same result, over and over, warns at the 11th
call (10 identical calls before it) and is blocked at the 21st.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import mcp_types as types  # the gateway's extra, loopwatch[mcp]: make install installs it
import pytest
from mcp import Client, StdioServerParameters

from harness import REPO, WorkerNames, WorkerProcess, collect, delete_topics, write_config
from harness.cli import one_line_error
from schemas.events import RunEnded, ToolCallCompleted, ToolCallRequested, decode_event
from schemas.verdicts import decode_verdict
from streams.client import LoopwatchClient

CONFIG = {"tools": {"loopDetection": {"enabled": True}}}
WORKER_MODULES = ("faust", "mode", "rocksdict", "prometheus_client")
TIME_SERVER = str(Path(sys.executable).parent / "mcp-server-time")  # PyPI's, the mcp-test extra
CONVERT = {"source_timezone": "Europe/Berlin", "time": "12:00", "target_timezone": "Asia/Tokyo"}
ALLOW_10_WARN_ALLOW_9_BLOCK = ["allow"] * 10 + ["warn"] + ["allow"] * 9 + ["block"]

# Run by the base venv's python: the client alone, 21 identical reads with identical results.
LOOPING_RUNNER = """
import asyncio, json, sys
from streams.client import LoopBlocked, LoopwatchClient

SAME = {"content": [{"type": "text", "text": "same page"}]}

async def main(broker, tool_calls, verdicts, run_id):
    decisions = []
    async with LoopwatchClient(broker, tool_calls_topic=tool_calls, verdicts_topic=verdicts, timeout=10.0) as client:
        run = client.run(run_id, session_key="agent:main:wheel", agent_id="main")
        for n in range(21):
            try:
                decision = await run.before_tool_call("read", {"path": "/same"}, tool_call_id=f"c{n}")
            except LoopBlocked as blocked:
                decision = blocked.decision
                await run.after_tool_call("read", {"path": "/same"}, tool_call_id=f"c{n}")
            else:
                await run.after_tool_call("read", {"path": "/same"}, tool_call_id=f"c{n}", result=SAME)
            decisions.append([decision.action, decision.detector, decision.count])
        await run.end()
    print(json.dumps(decisions))

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def worker(kafka_broker):
    """A worker of the repository's tree (the shared venv's), on this module's own topics."""
    tmp = Path(tempfile.mkdtemp(prefix="lwpkg-"))
    names = WorkerNames(prefix="lwpkg")
    write_config(tmp / "loop-detection.json", CONFIG)
    process = WorkerProcess(kafka_broker, names, config=tmp / "loop-detection.json", data_dir=tmp / "data")
    try:
        process.start().wait_ready(90)
        yield process
    finally:
        process.stop(timeout=15)
        try:
            asyncio.run(asyncio.wait_for(delete_topics(kafka_broker, [names.app_id]), 30))
        except Exception:  # noqa: BLE001 - best effort
            pass
        shutil.rmtree(tmp, ignore_errors=True)


# -- the distribution itself -------------------------------------------------------------------------


def test_sdist_and_wheel_pass_twine_check_strict(dist):
    files = sorted(str(p) for p in dist.iterdir() if p.suffix in (".whl", ".gz"))
    assert len(files) == 2, files
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "twine"), "check", "--strict", *files], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_wheel_installs_streams_and_schemas_only_with_the_json_schemas(wheel, version):
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {name.split("/")[0] for name in names}
    assert tops == {"streams", "schemas", f"loopwatch-{version}.dist-info"}  # no generic top-level package
    assert "streams/integrations/mcp/__init__.py" in names  # the integrations live inside streams
    json_schemas = {f"schemas/jsonschema/{p.name}" for p in (REPO / "schemas" / "jsonschema").glob("*.json")}
    assert json_schemas and json_schemas <= names
    assert "streams/integrations/hooks/relay.c" in names  # hook install compiles it


# -- base: loopwatch ---------------------------------------------------------------------------------


def test_base_install_has_none_of_the_workers_packages(fresh_venv):
    venv = fresh_venv(None)
    probe = "import importlib.util, json; print(json.dumps([m for m in %r if importlib.util.find_spec(m)]))"
    found = venv.run(venv.python, "-c", probe % (WORKER_MODULES,))
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == []
    faust = venv.run(venv.python, "-c", "import faust")
    assert faust.returncode == 1 and "No module named 'faust'" in faust.stderr


def test_base_install_loopwatch_worker_names_the_extra_in_one_line(fresh_venv):
    venv = fresh_venv(None)
    line = one_line_error(venv.run(venv.bin("loopwatch"), "worker"), 2, "pip install 'loopwatch[worker]'")
    assert line.startswith("loopwatch worker: ")


def test_base_install_loopwatch_mcp_gateway_names_the_extra_in_one_line(fresh_venv):
    venv = fresh_venv(None)
    one_line_error(venv.run(venv.bin("loopwatch"), "mcp-gateway"), 2, "pip install 'loopwatch[mcp]'")


def test_base_install_hook_install_builds_the_native_relay_from_the_wheels_source(fresh_venv, tmp_path):
    """``hook install`` compiles the relay.c the wheel installed, for the venv's Python, and the
    binary answers as the installed relay.py does with the serve process away."""
    venv = fresh_venv(None)
    settings, cache = tmp_path / "settings.json", tmp_path / "cache"
    done = subprocess.run(
        [venv.bin("loopwatch"), "hook", "install", "--cli", "gemini", "--settings", str(settings), "--fail-closed"],
        cwd=venv.path, env={**venv.env, "XDG_CACHE_HOME": str(cache)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (binary,) = cache.glob("loopwatch/relay/*/loopwatch-relay")
    assert done.stdout.startswith(f"relay: native, {binary} "), done.stdout
    command = json.loads(settings.read_text())["hooks"]["BeforeTool"][0]["hooks"][0]["command"]
    assert command == f"{binary} gemini --fail-closed"
    relay = venv.run(venv.python, "-c", "import streams.integrations.hooks.relay as r; print(r.__file__)")
    args = ["gemini", "--socket", str(tmp_path / "absent.sock"), "--fail-closed"]
    stdin = json.dumps({"session_id": "s", "hook_event_name": "BeforeTool", "tool_name": "ls", "tool_input": {}})
    outs = [
        subprocess.run([*way, *args], input=stdin, capture_output=True, text=True, env=venv.env, timeout=60)
        for way in ([str(binary)], [venv.python, "-I", "-S", relay.stdout.strip()])
    ]
    native, python = ((o.returncode, o.stdout, o.stderr) for o in outs)
    assert native == python
    assert '"decision": "deny"' in outs[0].stdout and "failing closed" in outs[0].stderr


def test_base_install_runs_upstreams_conformance_cases(fresh_venv):
    """The engine as installed (no Faust) agrees with upstream on every case of the repository's
    copy of the shared conformance set."""
    venv = fresh_venv(None)
    cases = REPO / "tests" / "data" / "conformance" / "openclaw-cases.json"
    proc = venv.run(venv.bin("loopwatch"), "conformance", str(cases))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = proc.stdout.strip().splitlines()[-1]
    passed, failed, skipped = (int(n) for n in re.findall(r"(\d+) (?:passed|failed|skipped)", summary))
    assert passed > 0 and (failed, skipped) == (0, 0), summary


def test_base_install_version_is_pyprojects(fresh_venv, version):
    venv = fresh_venv(None)
    proc = venv.run(venv.bin("loopwatch"), "--version")
    assert (proc.returncode, proc.stdout) == (0, f"loopwatch {version}\n"), proc.stderr


@pytest.mark.kafka
def test_base_install_client_publishes_a_looping_run_and_reads_the_workers_verdicts(fresh_venv, worker, tmp_path):
    venv = fresh_venv(None)
    script = tmp_path / "looping_runner.py"
    script.write_text(LOOPING_RUNNER)
    run_id = f"{worker.names.tag}-base-client"
    proc = venv.run(
        venv.python, str(script), worker.broker, worker.names.tool_calls, worker.names.verdicts, run_id, timeout=180
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr + worker.log_tail()
    decisions = json.loads(proc.stdout)
    assert [action for action, _, _ in decisions] == ALLOW_10_WARN_ALLOW_9_BLOCK
    assert decisions[10][1:] == ["generic_repeat", 10]
    assert decisions[20][1:] == ["generic_repeat", 20]


# -- loopwatch[worker] -------------------------------------------------------------------------------


@pytest.mark.kafka
async def test_worker_extra_loopwatch_worker_starts_becomes_ready_and_decides(fresh_venv, kafka_broker, tmp_path):
    venv = fresh_venv("worker")
    names = WorkerNames(prefix="lwpkg")
    write_config(tmp_path / "loop-detection.json", CONFIG)
    process = WorkerProcess(
        kafka_broker,
        names,
        config=tmp_path / "loop-detection.json",
        data_dir=tmp_path / "data",
        env={"PYTHONPATH": ""},  # the venv's own streams, not the repository's (empty: unset)
        command=[venv.bin("loopwatch"), "worker"],
        label="wheel-worker",
    )
    try:
        process.start().wait_ready(120)
        assert process.http("/healthz")[0] == 200
        client = LoopwatchClient(
            kafka_broker, tool_calls_topic=names.tool_calls, verdicts_topic=names.verdicts, timeout=10.0
        )
        async with client:
            run = client.run(f"{names.tag}-wheel-worker", session_key="agent:main:wheel-worker", agent_id="main")
            actions = []
            for n in range(11):
                decision = await run.before_tool_call("read", {"path": "/same"}, tool_call_id=f"c{n}")
                await run.after_tool_call("read", {"path": "/same"}, tool_call_id=f"c{n}", result={"text": "same"})
                actions.append(decision.action)
        assert actions == ["allow"] * 10 + ["warn"], process.log_tail()
    finally:
        process.stop(timeout=15)
        try:
            await delete_topics(kafka_broker, [names.app_id])
        except Exception:  # noqa: BLE001 - best effort
            pass


# -- loopwatch[mcp] ----------------------------------------------------------------------------------


def text_of(result: types.CallToolResult) -> list[str]:
    return [block.text for block in result.content if isinstance(block, types.TextContent)]


@pytest.mark.kafka
async def test_mcp_extra_gateway_serves_pypis_time_server_to_the_sdk_client(fresh_venv, worker):
    venv = fresh_venv("mcp")
    run_id = f"{worker.names.tag}-wheel-gateway"
    gateway = StdioServerParameters(
        command=venv.bin("loopwatch"),
        args=[
            "mcp-gateway",
            "--bootstrap",
            worker.broker,
            "--tool-calls-topic",
            worker.names.tool_calls,
            "--verdicts-topic",
            worker.names.verdicts,
            "--run-id",
            run_id,
            "--agent-id",
            "wheel",
            "--timeout",
            "10",
            "--upstream",
            TIME_SERVER,
        ],
        env=venv.env,
        cwd=str(venv.path),
    )
    async with Client(gateway, read_timeout_seconds=60) as agent:
        tools = {t.name for t in (await agent.list_tools()).tools}
        through_gateway = await agent.call_tool("convert_time", CONVERT)
    async with Client(StdioServerParameters(command=TIME_SERVER), read_timeout_seconds=60) as direct:
        from_server = await direct.call_tool("convert_time", CONVERT)
    assert {"convert_time", "get_current_time"} <= tools
    assert not through_gateway.is_error and not from_server.is_error
    assert text_of(through_gateway) == text_of(from_server)  # the server's answer, passed through

    def run_events(records):
        return [e for e in (decode_event(r.value) for r in records) if e.run_id == run_id]

    records = await collect(
        worker.broker, worker.names.tool_calls, until=lambda rs: any(isinstance(e, RunEnded) for e in run_events(rs))
    )
    events = run_events(records)
    assert [type(e) for e in events] == [ToolCallRequested, ToolCallCompleted, RunEnded]
    assert events[0].tool_name == "convert_time"
    requested = events[0].event_id

    def decisions(records):
        return [
            v for v in (decode_verdict(r.value) for r in records) if getattr(v, "cause_event_id", None) == requested
        ]

    verdicts = await collect(worker.broker, worker.names.verdicts, until=lambda rs: bool(decisions(rs)))
    assert [d.action for d in decisions(verdicts)] == ["allow"]  # the worker was asked, and allowed it
