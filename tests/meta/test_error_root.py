"""One root for loopwatch's errors: every exception class defined under ``streams`` and
``schemas`` derives from ``LoopwatchError``, the four families users meet have the specific
errors under them, and each error keeps the builtin base callers catch."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Imports every module of both packages (every integration's framework is installed in the
# venv, so nothing is skipped, but the adapters whose frameworks clash with the venv's pins and
# live in venvs of their own: their tests check their errors there) and lists each exception
# class a loopwatch module defines: its qualified name, whether it is a LoopwatchError, and the
# names of its whole MRO.
WALK = """
import importlib, inspect, json, pkgutil
import schemas, streams
from schemas.errors import LoopwatchError
OWN_VENV = {"streams.integrations.frameworks.crewai", "streams.integrations.frameworks.google_adk"}
found = {}
modules = 0
for package in (schemas, streams):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if info.name in OWN_VENV:
            continue
        module = importlib.import_module(info.name)
        modules += 1
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                found[f"{value.__module__}.{value.__qualname__}"] = {
                    "root": issubclass(value, LoopwatchError),
                    "mro": [f"{c.__module__}.{c.__qualname__}" for c in value.__mro__],
                }
print(json.dumps({"modules": modules, "classes": found}))
"""


@pytest.fixture(scope="module")
def walked() -> dict:
    """The walk, once per module: a module-scoped fixture also keeps the module's tests in one
    xdist process (tests/conftest.py), where a per-process cache walked in each."""
    run = subprocess.run([sys.executable, "-c", WALK], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr[-5000:]
    return json.loads(run.stdout)


def test_every_exception_class_in_loopwatch_derives_from_loopwatch_error(walked):
    classes = walked["classes"]
    # The walk really went through the packages: the errors of the client, the edge, the
    # worker, the offline tools and an integration are among what it found.
    for name in (
        "schemas.config.ConfigError",
        "streams.edge.broker.BrokerAccessError",
        "streams.client.errors.NoDecisionError",
        "streams.app.settings.SettingsError",
        "streams.offline.backtest.BacktestError",
        "streams.integrations.frameworks.pydantic_ai.LoopwatchRunAborted",
    ):
        assert name in classes, sorted(classes)
    assert walked["modules"] > 50
    outside = sorted(name for name, info in classes.items() if not info["root"])
    assert outside == [], f"exception classes not deriving from LoopwatchError: {outside}"


def test_the_four_families_hold_their_specific_errors(walked):
    mro = {name.rsplit(".", 1)[1]: info["mro"] for name, info in walked["classes"].items()}
    families = {
        "schemas.config.ConfigError": ["SettingsError", "SigningKeyError", "UsageError"],
        "streams.client.errors.RunAbortedError": ["PostCompactionLoopPersistedError", "LoopwatchRunAborted"],
        "streams.client.errors.NoDecisionError": [],
        "streams.edge.broker.BrokerAccessError": [],
    }
    for family, members in families.items():
        assert "schemas.errors.LoopwatchError" in mro[family.rsplit(".", 1)[1]]
        for member in members:
            assert family in mro[member], (member, mro[member])


def test_each_error_keeps_the_builtin_its_callers_catch(walked):
    # The bases each class had before the root existed (read off the previous release's code).
    builtin = {
        "ConfigError": "builtins.ValueError",
        "SettingsError": "builtins.ValueError",
        "SigningKeyError": "builtins.ValueError",
        "InvalidEvent": "builtins.ValueError",
        "TraceFileError": "builtins.ValueError",
        "BrokerAccessError": "builtins.ConnectionError",
        "LoopwatchUnavailable": "builtins.ConnectionError",
        "NoDecisionError": "builtins.TimeoutError",
        "DependencyVersionError": "builtins.ImportError",
        "NotAMember": "builtins.RuntimeError",
        "CaseFailure": "builtins.AssertionError",
        "LoopwatchRunAborted": "pydantic_ai.exceptions.AgentRunError",
    }
    mro = {name.rsplit(".", 1)[1]: info["mro"] for name, info in walked["classes"].items()}
    for name, base in builtin.items():
        assert base in mro[name], (name, mro[name])


def test_loopwatch_error_is_exported_by_the_client_and_the_package_face():
    import streams
    import streams.client
    from schemas.errors import LoopwatchError

    assert streams.client.LoopwatchError is LoopwatchError
    assert streams.LoopwatchError is LoopwatchError
    assert "LoopwatchError" in streams.client.__all__ and "LoopwatchError" in streams.__all__


def test_importing_the_package_face_loads_neither_kafka_nor_the_engine():
    code = (
        "import sys, streams\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('aiokafka', 'schemas', 'msgspec') "
        "or m.startswith('streams.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert out.strip() == "[]"


def test_the_root_module_imports_nothing_of_loopwatch():
    tree = ast.parse((REPO / "schemas" / "errors.py").read_text(encoding="utf-8"))
    imported = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            imported.append("." * node.level + (node.module or ""))
    assert imported == ["__future__"], imported
