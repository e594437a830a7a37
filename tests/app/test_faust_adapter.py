"""The adapter to Faust's, mode's and aiokafka's internals (``streams.app.faust_adapter``).

Every private name it uses exists, with the shape it relies on, in the installed versions;
the list of those names is complete; nothing else in the project touches a dependency's
private name; the version check fails in one line; aiokafka's log line that
``streams.edge.broker`` reads is still the one aiokafka logs.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import inspect
import re
from pathlib import Path

import pytest

from streams.app import faust_adapter
from streams.app.faust_adapter import OWN_NAMES, PRIVATE_NAMES, DependencyVersionError, check_versions

REPO = Path(__file__).resolve().parents[2]
ADAPTER = REPO / "streams" / "app" / "faust_adapter.py"
DEPENDENCIES = ("faust", "mode", "aiokafka")


def resolve(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """Live objects of each owner in PRIVATE_NAMES (their attributes are set in __init__)."""
    from streams.app.app import build_worker
    from streams.app.settings import Settings

    asyncio.set_event_loop(asyncio.new_event_loop())
    worker = build_worker(Settings(data_dir=tmp_path_factory.mktemp("state"), app_id="lw-adapter"))
    consumer = worker.app.consumer
    # What aiokafka's fetcher builds for each partition of a fetch response.
    from aiokafka.consumer.fetcher import FetchResult, PartitionRecords
    from aiokafka.record.memory_records import MemoryRecords
    from aiokafka.structs import TopicPartition

    tp = TopicPartition("tool-calls", 0)
    records = PartitionRecords(tp, MemoryRecords(b""), [], 0, None, None, True, 0)
    fetched = FetchResult(tp, assignment=None, partition_records=records, backoff=0)
    from aiokafka import AIOKafkaConsumer

    async def unstarted_consumer():  # its coordinator comes with start()
        return AIOKafkaConsumer(bootstrap_servers="127.0.0.1:9")

    unstarted = asyncio.get_event_loop().run_until_complete(unstarted_consumer())
    return [worker.app, consumer, consumer._thread, worker.table.data, worker.app.producer, fetched, records, unstarted]


@pytest.mark.parametrize("private", PRIVATE_NAMES, ids=lambda p: f"{p.owner.split(':')[1]}.{p.name}")
def test_every_private_name_still_has_its_shape(private, live):
    owner = resolve(private.owner)
    if private.kind == "attribute":
        objects = [obj for obj in live if isinstance(obj, owner)]
        assert objects, f"no live {private.owner} to check {private.name} on"
        for obj in objects:
            assert isinstance(getattr(obj, private.name), resolve(private.type_name)), private
        return
    member = inspect.getattr_static(owner, private.name)
    assert inspect.isfunction(member), f"{private.owner}.{private.name} is not a method any more"
    assert inspect.iscoroutinefunction(member) == (private.kind == "async method"), private
    assert tuple(inspect.signature(member).parameters) == private.params, private


def _adapter_names() -> tuple[set[str], set[str]]:
    """(private names the adapter uses on any object or overrides in its mixins, private
    attributes its own helper classes set on themselves)."""
    tree = ast.parse(ADAPTER.read_text())
    used: set[str] = set()
    helpers: set[str] = set()
    for cls in [node for node in tree.body if isinstance(node, ast.ClassDef)]:
        mixin = cls.name.startswith("_")
        for node in ast.walk(cls):
            if mixin and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(node.name):
                used.add(node.name)
            if not mixin and isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and _is_self(target.value) and _private(target.attr):
                        helpers.add(target.attr)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            used.add(node.attr)
    return used, helpers


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def test_the_list_of_private_names_is_complete_and_current():
    used, helpers = _adapter_names()
    listed = {p.name for p in PRIVATE_NAMES}
    assert used - listed - OWN_NAMES - helpers == set(), "private names used but not in PRIVATE_NAMES or OWN_NAMES"
    assert listed - used == set(), "PRIVATE_NAMES lists names the adapter no longer uses"
    assert OWN_NAMES - used == set(), "OWN_NAMES lists names the adapter no longer uses"


def test_the_adapters_own_names_are_not_fausts():
    # A private name of Faust's, mode's or aiokafka's with the same name as one the adapter
    # adds to their objects would be silently replaced: none of their sources may use one.
    used = {name: [] for name in OWN_NAMES}
    for package in ("faust", "mode", "aiokafka"):
        root = Path(importlib.import_module(package).__file__).parent
        for path in root.rglob("*.py"):
            text = path.read_text(errors="replace")
            for name in OWN_NAMES:
                if re.search(rf"\b{name}\b", text):
                    used[name].append(str(path))
    assert {name: paths for name, paths in used.items() if paths} == {}


def test_a_version_it_was_not_written_for_fails_in_one_line():
    check_versions()  # the installed ones
    installed = {"faust-streaming": "0.15.3", "mode-streaming": "0.7.1", "aiokafka": "0.15.0"}
    with pytest.raises(DependencyVersionError) as error:
        check_versions(installed.__getitem__)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("aiokafka 0.15.0 is installed, but streams/app/faust_adapter.py was written for 0.14.0")


def test_pyproject_pins_the_versions_the_adapter_was_written_for():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    dependencies = project["dependencies"] + project["optional-dependencies"]["worker"]
    for package, versions in faust_adapter.WRITTEN_FOR.items():
        pinned = [d for d in dependencies if re.match(rf"{re.escape(package)}\s*==", d)]
        assert pinned == [f"{package}=={versions[0]}"], (package, pinned)


# -- nothing else touches a dependency's private name ------------------------------------------

PROJECT_CODE = ("streams", "schemas", "harness", "bench")


def _project_modules():
    for top in PROJECT_CODE:
        for path in sorted((REPO / top).rglob("*.py")):
            if path != ADAPTER:
                yield path


def _own_private_names(tree: ast.Module) -> set[str]:
    """Private names a module defines itself: functions, classes, class attributes, and
    attributes it sets on its own objects."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            own.add(node.target.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_self(node.value):
            own.add(node.attr)
    return {name for name in own if _private(name)}


def _dependency_bases(tree: ast.Module) -> list[str]:
    """Classes of the module derived from a class of Faust, mode or aiokafka."""
    imported: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                imported[alias.asname or alias.name] = node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                imported[alias.asname or alias.name.split(".")[0]] = alias.name
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                root = base
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and imported.get(root.id, "").split(".")[0] in DEPENDENCIES:
                    found.append(f"{node.name}({ast.unparse(base)})")
    return found


def test_no_other_module_touches_a_dependencys_private_name():
    offenders = []
    for path in _project_modules():
        tree = ast.parse(path.read_text())
        own = _own_private_names(tree)
        where = path.relative_to(REPO)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
                offenders.append(f"{where}:{node.lineno}: .{node.attr}")
        offenders += [f"{where}: class {base}" for base in _dependency_bases(tree)]
    assert offenders == []


def test_the_checks_above_see_a_private_name_and_a_subclass():
    tree = ast.parse("import faust\nclass A(faust.App):\n    pass\ndef f(store):\n    return store._dbs\n")
    assert _dependency_bases(tree) == ["A(faust.App)"]
    assert "_dbs" not in _own_private_names(tree)


def test_the_workers_consumer_asks_again_for_a_topic_its_metadata_lacks(live):
    """The consumer Faust makes for the worker carries the listener (its behaviour on the real
    broker: ``tests/integration/test_topic_metadata.py``)."""
    from streams.app.faust_adapter import AskAgainForMissingTopics

    thread = live[2]

    async def make():  # aiokafka makes its client on a running loop
        return thread._create_worker_consumer(thread.transport)

    consumer = asyncio.get_event_loop().run_until_complete(make())
    listeners = [x for x in consumer._client.cluster._listeners if isinstance(x, AskAgainForMissingTopics)]
    assert len(listeners) == 1 and listeners[0].client is consumer._client


def _fleet_sources_table(tmp_path):
    """The fleet limiter's table in a worker built with the fleet options, and the topic its
    events come from."""
    import json

    from streams.app.app import build_worker
    from streams.app.settings import Settings

    config = tmp_path / "fleet.json"
    config.write_text(
        json.dumps({"tools": {"loopDetection": {"enabled": True}}, "loopwatch": {"fleetIncidents": {"enabled": True}}})
    )
    asyncio.set_event_loop(asyncio.new_event_loop())
    worker = build_worker(Settings(data_dir=tmp_path / "state", partitions=4, app_id="lw-wait", config=config))
    return worker.app, worker.fleet.sources.table, "lw-wait-fleet-agents"


def _with_metadata(app, monkeypatch, changelog_partitions):
    """The consumer's metadata as Faust reads it: the source topic with 4 partitions, the
    changelog with what ``changelog_partitions`` yields at each check."""
    counts = iter(changelog_partitions)
    checks = []

    def topic_partitions(topic):
        if topic.endswith("-changelog"):
            checks.append(topic)
            return next(counts)
        return 4

    monkeypatch.setattr(app.consumer, "topic_partitions", topic_partitions)
    return checks


def _in_an_event_of(topic, coro):
    """Run ``coro`` as Faust runs an agent's code: with an event of ``topic`` current."""
    import weakref
    from types import SimpleNamespace

    from faust.streams import _current_event

    class Event(SimpleNamespace):  # (weakly referenced, as Faust refers to its events)
        pass

    event = Event(message=SimpleNamespace(topic=topic, partition=1))

    async def run():
        _current_event.set(weakref.ref(event))
        return await coro

    return asyncio.get_event_loop().run_until_complete(run())


def test_a_table_write_faust_would_refuse_is_waited_for_until_the_metadata_shows_the_changelog(tmp_path, monkeypatch):
    from streams.app.faust_adapter import until_table_accepts_writes

    app, table, topic = _fleet_sources_table(tmp_path)
    checks = _with_metadata(app, monkeypatch, [0, 0, 4])
    _in_an_event_of(topic, until_table_accepts_writes(table, timeout_s=10))
    assert checks == ["lw-wait-fleet-sources-changelog"] * 3
    _in_an_event_of(topic, until_table_accepts_writes(table, timeout_s=10))
    assert len(checks) == 3  # Faust remembers a topic that passed


def test_a_table_write_faust_keeps_refusing_raises_its_error_after_the_timeout(tmp_path, monkeypatch):
    from faust.exceptions import PartitionsMismatch

    from streams.app.faust_adapter import until_table_accepts_writes

    app, table, topic = _fleet_sources_table(tmp_path)
    _with_metadata(app, monkeypatch, iter(lambda: 0, 1))  # 0 for ever
    with pytest.raises(PartitionsMismatch, match="has 0 partitions"):
        _in_an_event_of(topic, until_table_accepts_writes(table, timeout_s=0.6))
