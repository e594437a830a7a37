import json
import os
import time

import pytest
from prometheus_client import CollectorRegistry

from schemas.config import ConfigError
from streams.app.metrics import Metrics
from streams.app.reload import ConfigWatcher
from streams.engine import LoopEngine


def write(path, root):
    path.write_text(json.dumps(root))
    # make the change visible to (mtime, size, inode) even within one clock tick
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def test_reload_swaps_valid_configs_and_keeps_the_old_one_on_errors(tmp_path, caplog):
    path = tmp_path / "loop.json"
    write(path, {"tools": {"loopDetection": {"enabled": True}}})
    engines: list[LoopEngine] = []
    watcher = ConfigWatcher(path, engines.append)
    first = watcher.load_initial()
    assert first.settings_for(None).detection.enabled
    assert watcher.poll() is False  # unchanged

    write(path, {"tools": {"loopDetection": {"enabled": True, "criticalThreshold": 12}}})
    assert watcher.poll() is True
    assert engines[-1].settings_for(None).detection.critical_threshold == 12

    # invalid: warning >= critical (upstream's ordering rule): rejected, logged once
    with caplog.at_level("ERROR", logger="loopwatch.config"):
        write(path, {"tools": {"loopDetection": {"enabled": True, "warningThreshold": 30, "criticalThreshold": 20}}})
        assert watcher.poll() is False
        os.utime(path, ns=(time.time_ns(), time.time_ns() + 5_000_000))
        assert watcher.poll() is False
    assert len(engines) == 1 and watcher.rejections == 1
    assert sum("refused new config" in r.message for r in caplog.records) == 1

    # unparsable, then the file disappears: still the last good config
    path.write_text("{not json5 at all")
    assert watcher.poll() is False
    path.unlink()
    assert watcher.poll() is False
    assert len(engines) == 1

    # it comes back, valid
    write(path, {"tools": {"loopDetection": {"enabled": False}}})
    assert watcher.poll() is True
    assert not engines[-1].settings_for(None).detection.enabled
    assert watcher.reloads == 2


def test_touch_without_change_does_not_rebuild(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("tools:\n  loopDetection:\n    enabled: true\n")
    swaps = []
    watcher = ConfigWatcher(path, swaps.append)
    watcher.load_initial()
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10_000_000))
    assert watcher.poll() is False and swaps == []


def test_a_bad_file_at_start_is_fatal(tmp_path):
    path = tmp_path / "loop.json"
    path.write_text('{"tools": {"loopDetection": {"historySize": -1}}}')
    with pytest.raises(ConfigError):
        ConfigWatcher(path, lambda e: None).load_initial()


def test_no_file_means_upstream_defaults():
    watcher = ConfigWatcher(None, lambda e: None)
    engine = watcher.load_initial()
    assert not engine.settings_for(None).detection.enabled
    assert watcher.poll() is False


@pytest.mark.parametrize("where", ["tools", "agent"])
def test_history_size_is_bounded_so_every_state_fits_a_changelog_record(tmp_path, where):
    # Upstream takes any historySize; with 10^9, one run's state outgrew the changelog's
    # record limit and its history was lost at the next restore.  1000 is the bound.
    from schemas.config import MAX_HISTORY_SIZE, validate

    def root(size):
        block = {"enabled": True, "historySize": size}
        if where == "tools":
            return {"tools": {"loopDetection": block}}
        return {"agents": {"list": [{"id": "a", "tools": {"loopDetection": block}}]}}

    assert MAX_HISTORY_SIZE == 1000
    assert validate(root(1000)) == []
    [issue] = validate(root(1001))
    assert issue.path.endswith("loopDetection.historySize") and issue.message == "Too big: expected number to be <=1000"
    assert issue.code == "too_big"
    assert [i.code for i in validate(root(10**9))] == ["too_big"]
    path = tmp_path / "loop.json"
    write(path, root(1000))
    engines = []
    watcher = ConfigWatcher(path, engines.append)
    watcher.load_initial()
    write(path, root(10**9))
    assert watcher.poll() is False and engines == [] and watcher.rejections == 1


@pytest.mark.parametrize(
    "name, empty",
    [
        ("loop.yaml", ""),
        ("loop.yaml", "# all commented out\n"),
        ("loop.yaml", "null\n"),
        ("loop.yaml", "~"),
        ("loop.json", ""),
        ("loop.json", " \n"),
        ("loop.json", "null"),
        ("loop.json5", "null // nothing else\n"),
    ],
)
def test_an_empty_document_is_refused_on_reload_and_the_running_config_stays(tmp_path, caplog, name, empty):
    path = tmp_path / name
    path.write_text('{"tools": {"loopDetection": {"enabled": true}}}')
    engines: list[LoopEngine] = []
    metrics = Metrics(CollectorRegistry(), process_metrics=False)
    watcher = ConfigWatcher(path, engines.append, metrics)
    running = watcher.load_initial()
    assert running.settings_for(None).detection.enabled
    with caplog.at_level("ERROR", logger="loopwatch.config"):
        write_text(path, empty)
        assert watcher.poll() is False
    assert engines == [] and watcher.rejections == 1
    assert [r.message for r in caplog.records if "refused new config" in r.message][0].count("\n") == 0
    assert "holds no configuration" in caplog.text
    sample = metrics.registry.get_sample_value
    assert sample("loopwatch_config_reloads_total", {"result": "refused", "config": "live"}) == 1
    assert sample("loopwatch_config_reloads_total", {"result": "applied", "config": "live"}) == 0
    assert sample("loopwatch_config_file_refused", {"config": "live"}) == 1


def test_reloads_and_refusals_are_counted_and_the_refused_flag_clears(tmp_path):
    path = tmp_path / "loop.json"
    good = {"tools": {"loopDetection": {"enabled": True}}}
    write(path, good)
    metrics = Metrics(CollectorRegistry(), process_metrics=False)
    watcher = ConfigWatcher(path, lambda e: None, metrics)
    watcher.load_initial()
    sample = metrics.registry.get_sample_value
    assert sample("loopwatch_config_file_refused", {"config": "live"}) == 0

    write_text(path, "")
    watcher.poll()
    assert sample("loopwatch_config_file_refused", {"config": "live"}) == 1
    write(path, good)  # the content in force again: nothing to apply, nothing refused
    assert watcher.poll() is False
    assert sample("loopwatch_config_file_refused", {"config": "live"}) == 0

    write_text(path, "{oops")
    watcher.poll()
    write(path, {"tools": {"loopDetection": {"enabled": True, "criticalThreshold": 12}}})
    assert watcher.poll() is True
    assert sample("loopwatch_config_reloads_total", {"result": "refused", "config": "live"}) == 2
    assert sample("loopwatch_config_reloads_total", {"result": "applied", "config": "live"}) == 1
    assert sample("loopwatch_config_file_refused", {"config": "live"}) == 0


def test_an_unreadable_new_file_is_refused(tmp_path):
    path = tmp_path / "loop.json"
    write(path, {"tools": {"loopDetection": {"enabled": True}}})
    metrics = Metrics(CollectorRegistry(), process_metrics=False)
    watcher = ConfigWatcher(path, lambda e: None, metrics)
    watcher.load_initial()
    path.write_bytes(b"\xff\xfe{}")  # not UTF-8
    bump(path)
    assert watcher.poll() is False
    assert metrics.registry.get_sample_value("loopwatch_config_file_refused", {"config": "live"}) == 1


@pytest.mark.parametrize("content", [b"", b"null", b"\xff\xfe{}"])
def test_an_empty_or_undecodable_file_at_start_is_fatal(tmp_path, content):
    path = tmp_path / "loop.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError):
        ConfigWatcher(path, lambda e: None).load_initial()


def test_a_missing_file_at_start_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        ConfigWatcher(tmp_path / "nope.yaml", lambda e: None).load_initial()


def write_text(path, text):
    path.write_text(text)
    bump(path)


def bump(path):
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def test_a_candidate_config_reloads_on_its_own_and_tags_its_verdicts_with_the_new_file(tmp_path):
    # The worker wires a second ConfigWatcher (name "candidate") to BatchProcessor.use_candidate.
    from schemas.names import CANDIDATE, LIVE
    from streams.app.processor import BatchProcessor

    live_path, cand_path = tmp_path / "live.json", tmp_path / "candidate.json"
    write(live_path, {"tools": {"loopDetection": {"enabled": True}}})
    write(cand_path, {"tools": {"loopDetection": {"enabled": True, "criticalThreshold": 15}}})
    metrics = Metrics(CollectorRegistry())
    live = ConfigWatcher(live_path, lambda e: None, metrics)
    processor = BatchProcessor(live.load_initial(), metrics)
    processor.use_config(processor.engine, live.sha256)
    candidate = ConfigWatcher(
        cand_path, lambda e: processor.use_candidate(e, candidate.sha256), metrics, name=CANDIDATE
    )
    processor.use_candidate(candidate.load_initial(), candidate.sha256)
    first_tag = processor.sha256[CANDIDATE]
    assert processor.candidate.settings_for(None).detection.critical_threshold == 15

    write(cand_path, {"tools": {"loopDetection": {"enabled": True, "criticalThreshold": 12}}})
    assert live.poll() is False and candidate.poll() is True
    assert processor.candidate.settings_for(None).detection.critical_threshold == 12
    assert processor.engine.settings_for(None).detection.critical_threshold == 20  # the live one stays
    assert processor.sha256[CANDIDATE] != first_tag and processor.sha256[LIVE] == live.sha256
    sample = metrics.registry.get_sample_value
    assert sample("loopwatch_config_reloads_total", {"result": "applied", "config": "candidate"}) == 1
    assert sample("loopwatch_config_reloads_total", {"result": "applied", "config": "live"}) == 0

    write_text(cand_path, "")  # refused: the candidate in force stays, and only it is flagged
    assert candidate.poll() is False
    assert processor.candidate.settings_for(None).detection.critical_threshold == 12
    assert sample("loopwatch_config_file_refused", {"config": "candidate"}) == 1
    assert sample("loopwatch_config_file_refused", {"config": "live"}) == 0


def test_a_bad_candidate_at_start_is_refused_like_a_reload_and_applied_once_fixed(tmp_path, caplog):
    # Issue 26: at start a refused candidate must not stop the worker (its live config is
    # fine): the same line, counter and gauge as a refused reload, and no candidate in force
    # until a valid file appears.
    from schemas.names import CANDIDATE
    from streams.app.processor import BatchProcessor

    live_path, cand_path = tmp_path / "live.json", tmp_path / "candidate.json"
    write(live_path, {"tools": {"loopDetection": {"enabled": True}}})
    write(cand_path, {"tools": {"loopDetection": {"enabled": True, "warningThreshold": 30, "criticalThreshold": 20}}})
    metrics = Metrics(CollectorRegistry())
    processor = BatchProcessor(ConfigWatcher(live_path, lambda e: None, metrics).load_initial(), metrics)
    candidate = ConfigWatcher(
        cand_path, lambda e: processor.use_candidate(e, candidate.sha256), metrics, name=CANDIDATE
    )
    with caplog.at_level("ERROR", logger="loopwatch.config"):
        assert candidate.load_or_refuse() is None
        assert candidate.poll() is False  # the same file: not refused (nor logged) again
    refusals = [r.getMessage() for r in caplog.records if "refused new config" in r.getMessage()]
    assert len(refusals) == 1 and "\n" not in refusals[0]
    assert str(cand_path) in refusals[0] and "running without a candidate config until the file is fixed" in refusals[0]
    sample = metrics.registry.get_sample_value
    assert sample("loopwatch_config_file_refused", {"config": "candidate"}) == 1
    assert sample("loopwatch_config_reloads_total", {"result": "refused", "config": "candidate"}) == 1
    assert processor.candidate is None and candidate.sha256 == "defaults"

    write(cand_path, {"tools": {"loopDetection": {"enabled": True, "criticalThreshold": 15}}})
    assert candidate.poll() is True
    assert processor.candidate.settings_for(None).detection.critical_threshold == 15
    assert processor.runs.with_candidate and processor.sha256[CANDIDATE] == candidate.sha256 != "defaults"
    assert sample("loopwatch_config_file_refused", {"config": "candidate"}) == 0
    assert sample("loopwatch_config_reloads_total", {"result": "applied", "config": "candidate"}) == 1


def detection_gauge(registry) -> dict[str, float]:
    return {
        s.labels["agent"]: s.value
        for m in registry.collect()
        if m.name == "loopwatch_detection_enabled"
        for s in m.samples
    }


def detection_lines(caplog) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if "detection o" in r.getMessage().lower()]


@pytest.mark.parametrize("content", [None, "{}"])
def test_a_worker_with_detection_off_says_so_in_its_log_and_gauge(tmp_path, caplog, content):
    """No --config, or ``{}``: upstream's defaults, under which nothing is detected."""
    path = None
    if content is not None:
        path = tmp_path / "loop.yaml"
        path.write_text(content)
    registry = CollectorRegistry()
    with caplog.at_level("INFO", logger="loopwatch.config"):
        ConfigWatcher(path, lambda engine: None, Metrics(registry, process_metrics=False)).load_initial()
    assert detection_lines(caplog) == [
        (
            "WARNING",
            "live config: detection OFF for agent * (profile configurable-final): tools.loopDetection.enabled is "
            "not true; every call is allowed unchecked (turn it on: start the worker with --config "
            "examples/getting-started.yaml, docs/configuration.md)",
        )
    ]
    assert detection_gauge(registry) == {"*": 0.0}


def test_detection_is_reported_per_agent_at_start_and_on_each_reload(tmp_path, caplog):
    path = tmp_path / "loop.json"
    write(path, {"agents": {"list": [{"id": "main", "tools": {"loopDetection": {"enabled": True}}}, {"id": "cron"}]}})
    registry = CollectorRegistry()
    watcher = ConfigWatcher(path, lambda engine: None, Metrics(registry, process_metrics=False))
    with caplog.at_level("INFO", logger="loopwatch.config"):
        watcher.load_initial()
    lines = detection_lines(caplog)
    assert [(level, msg.split(" (")[0]) for level, msg in lines] == [
        ("WARNING", "live config: detection OFF for agent *"),
        ("INFO", "live config: detection on for agent main"),
        ("WARNING", "live config: detection OFF for agent cron"),
    ]
    assert detection_gauge(registry) == {"*": 0.0, "main": 1.0, "cron": 0.0}

    # a reload turns it on everywhere, and agents no longer listed leave the gauge
    caplog.clear()
    write(path, {"tools": {"loopDetection": {"enabled": True}}, "agents": {"list": [{"id": "main"}]}})
    with caplog.at_level("INFO", logger="loopwatch.config"):
        assert watcher.poll() is True
    assert detection_lines(caplog) == [
        ("INFO", "live config: detection on for agent * (profile configurable-final)"),
        ("INFO", "live config: detection on for agent main (profile configurable-final)"),
    ]
    assert detection_gauge(registry) == {"*": 1.0, "main": 1.0}
