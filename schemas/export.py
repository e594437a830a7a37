"""Export JSON Schema for every wire type, for runners written in other languages."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from .config import LoopwatchConfig
from .events import ToolCallEvent
from .fleet import Incident
from .verdicts import Verdict

SCHEMAS = {
    "tool-calls.event.v1.json": ToolCallEvent,
    "loop-verdicts.verdict.v1.json": Verdict,
    "config.v1.json": LoopwatchConfig,
    "loop-incidents.incident.v1.json": Incident,
}


def render(kind) -> str:
    schema = msgspec.json.schema(kind)
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write_json_schemas(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, kind in SCHEMAS.items():
        path = directory / name
        path.write_text(render(kind), encoding="utf-8")
        written.append(path)
    return written
