"""docs/design.md states every import contract of pyproject.toml, in its order: a contract
added, renamed or dropped without the design saying so fails here."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_design_states_each_import_contract_by_name_in_order():
    with (REPO / "pyproject.toml").open("rb") as f:
        contracts = [c["name"] for c in tomllib.load(f)["tool"]["importlinter"]["contracts"]]
    design = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    section = design.split("## The import contracts", 1)[1].split("\n## ", 1)[0]
    stated = re.findall(r"^\d+\. \*\*(.+?)\*\*", section, re.M | re.S)
    assert [" ".join(s.split()) for s in stated] == [c[0].upper() + c[1:] for c in contracts]
