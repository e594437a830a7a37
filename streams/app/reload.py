"""Hot reload of the loop-detection config file.

The worker polls the file (``stat`` every ``LOOPWATCH_CONFIG_POLL_S``, 2 s by default) rather
than using inotify: polling works the same on every filesystem, including the symlink swaps
of a Kubernetes ConfigMap volume, and costs one ``stat`` per poll.  A change is detected by
(mtime, size, inode) and confirmed by the content's hash, so touching the file or an
editor's rename-into-place without a real change does not rebuild anything.

A new file that fails to parse or validate is rejected with an error log and the running
config stays in force; the rejection is logged once per distinct bad content.  A valid file
becomes a new ``LoopEngine`` that the processor picks up at its next batch: the swap is one
attribute assignment between batches, so a batch always runs on a single config.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any, Callable

from schemas.config import ConfigError, load_config_file, warnings
from streams.engine import LoopEngine

__all__ = ["ConfigWatcher", "load_engine"]

log = logging.getLogger("loopwatch.config")


def load_engine(path: Path | None) -> LoopEngine:
    """The engine for a config file (None: upstream defaults).  Raises ``ConfigError``."""
    if path is None:
        return LoopEngine(None)
    root = load_config_file(path)
    for note in warnings(root):
        log.warning("config %s: %s", path, note)
    return LoopEngine(root)


class ConfigWatcher:
    def __init__(self, path: Path | None, on_change: Callable[[LoopEngine], Any]) -> None:
        self.path = path
        self.on_change = on_change
        self._stat: tuple[int, int, int] | None = None
        self._digest: str | None = None
        self._rejected: str | None = None
        self._missing_logged = False
        self.reloads = 0
        self.rejections = 0

    def load_initial(self) -> LoopEngine:
        """Load the file at start; a bad file is fatal here (there is no old config to keep)."""
        if self.path is None:
            return LoopEngine(None)
        self._stat = self._stat_of()
        data = self.path.read_bytes()
        engine = load_engine(self.path)
        self._digest = hashlib.sha256(data).hexdigest()
        log.info("loop-detection config loaded from %s", self.path)
        return engine

    def _stat_of(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def poll(self) -> bool:
        """Check the file once; swap in a new engine when it changed and is valid."""
        if self.path is None:
            return False
        stat = self._stat_of()
        if stat is None:
            if not self._missing_logged:
                log.warning("config file %s is gone; keeping the running configuration", self.path)
                self._missing_logged = True
            self._stat = None
            return False
        self._missing_logged = False
        if stat == self._stat:
            return False
        self._stat = stat
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            log.error("cannot read config file %s (%s); keeping the running configuration", self.path, exc)
            return False
        digest = hashlib.sha256(data).hexdigest()
        if digest == self._digest:
            return False
        try:
            engine = load_engine(self.path)
        except ConfigError as exc:
            if digest != self._rejected:
                self._rejected = digest
                self.rejections += 1
                log.error("rejected new config %s: %s; keeping the running configuration", self.path, exc)
            return False
        except Exception as exc:  # noqa: BLE001 - a reload must never take the worker down
            if digest != self._rejected:
                self._rejected = digest
                self.rejections += 1
                log.exception("rejected new config %s: %r; keeping the running configuration", self.path, exc)
            return False
        # The file may have changed again between hashing and loading; hashing what was
        # read first keeps the next poll honest (it sees a different digest and reloads).
        self._digest = digest
        self._rejected = None
        self.reloads += 1
        self.on_change(engine)
        log.info("loop-detection config reloaded from %s", self.path)
        return True
