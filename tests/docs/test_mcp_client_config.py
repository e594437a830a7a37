"""The MCP client config of the docs, run as an MCP client runs it: every block marked
``<!-- snippet: mcp-client-config -->`` in README.md or docs/*.md, its ``command`` and ``args``
exactly as written, found on the ``PATH`` of the virtualenv loopwatch is installed in, answers
``initialize`` and lists the upstream's tools.  The snippet's broker need not be up: the
gateway serves its tools without Kafka (failing open)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKED = re.compile(r"^<!-- snippet: mcp-client-config -->\n```json\n(.*?)^```$", re.M | re.S)


def configs() -> list[tuple[str, dict]]:
    return [
        (str(doc.relative_to(REPO)), json.loads(block))
        for doc in DOCS
        for block in MARKED.findall(doc.read_text(encoding="utf-8"))
    ]


CONFIGS = configs()


def test_the_docs_mark_an_mcp_client_config():
    assert CONFIGS, "no `<!-- snippet: mcp-client-config -->` block in README.md or docs/*.md"


@pytest.mark.parametrize("config", [c for _where, c in CONFIGS], ids=[where for where, _c in CONFIGS])
def test_the_mcp_client_config_starts_a_gateway_that_answers(config):
    (name, server), *_ = config["mcpServers"].items()
    assert server["command"] == "loopwatch" and server["args"][0] == "mcp-gateway", server
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWATCH_")}
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")

    async def session() -> set[str]:
        params = StdioServerParameters(command=server["command"], args=server["args"], env=env)
        async with Client(params, read_timeout_seconds=60) as client:
            return {tool.name for tool in (await client.list_tools()).tools}

    tools = asyncio.run(asyncio.wait_for(session(), 120))
    assert tools, name
    if "mcp-server-time" in server["args"]:
        assert "convert_time" in tools, tools
