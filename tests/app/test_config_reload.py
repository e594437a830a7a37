import json
import os
import time

import pytest

from schemas.config import ConfigError
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
    assert sum("rejected new config" in r.message for r in caplog.records) == 1

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
