"""What the tests that drive an agent CLI share: where ``make agent-clis`` installs the CLIs,
and the ``loopwatch hook --serve`` process their hooks talk to."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness import REPO

AGENT_CLIS = Path(os.environ.get("LOOPWATCH_AGENT_CLIS", Path.home() / ".cache" / "loopwatch" / "agent-clis"))


def python_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def start_serve(lw, socket: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``loopwatch hook --serve`` on the test's topics; ``extra``: more of its options (``--http 0``);
    ``env``: variables to set for it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "streams.cli", "hook", "--serve", "--socket", str(socket), "--bootstrap", lw.broker,
         "--tool-calls-topic", lw.names.tool_calls, "--verdicts-topic", lw.names.verdicts, "--timeout", "5", *extra],
        cwd=REPO, env={**python_env(), **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    line = proc.stdout.readline()
    how = "fails closed" if "--fail-closed" in extra else "fails open"
    assert how in line and str(socket) in line, (line, proc.poll() is not None and proc.stderr.read())
    proc.first_line = line  # type: ignore[attr-defined]
    return proc


def http_url_of(serve: subprocess.Popen) -> str:
    """The ``http://127.0.0.1:PORT/hooks/claude-code`` a serve started with ``--http`` announced."""
    import re

    found = re.search(r"http://\S+/hooks/claude-code", serve.first_line)  # type: ignore[attr-defined]
    assert found, serve.first_line  # type: ignore[attr-defined]
    return found.group(0)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
