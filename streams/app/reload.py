"""Hot reload of the loop-detection config file (and of the signing keys, ``KeyringWatcher``).

The worker polls the file (``stat`` every ``LOOPWATCH_CONFIG_POLL_S``, 2 s by default) rather
than using inotify: polling works the same on every filesystem, including the symlink swaps
of a Kubernetes ConfigMap volume, and costs one ``stat`` per poll.  A change is detected by
(mtime, size, inode) and confirmed by the content's hash, so touching the file or an
editor's rename-into-place without a real change does not rebuild anything.  The bytes that
are hashed are the bytes that are parsed (one read), so a file rewritten between the two
cannot pair one content's hash with another's config.

A new file that cannot be read, fails to parse or validate, or holds no configuration at all
(empty, only comments, ``null``: what a half-written file looks like) is refused with an
error log and the running config stays in force; the refusal is logged once per distinct bad
content.  Reloads and refusals are counted (``loopwatch_config_reloads_total``) and
``loopwatch_config_file_refused`` is 1 while the file on disk is one the worker refused
(docs/metrics.md; alert LoopwatchConfigRefused).  A valid file becomes a new ``LoopEngine``
that the processor picks up at its next batch: the swap is one attribute assignment between
batches, so a batch always runs on a single config.  At start there is no running live config
to keep, so a bad live file is fatal there; a bad candidate file is refused like a reload
(``load_or_refuse``) and the worker starts on its live config without a candidate.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schemas.config import ConfigError, load_config_bytes, read_config_file, warnings
from schemas.names import LIVE
from schemas.signing import Keyring, SigningKeyError, keys_of, read_key_files
from streams.engine import LoopEngine, engine_for
from streams.engine.config import detection_line

if TYPE_CHECKING:
    from .metrics import Metrics

__all__ = ["ConfigWatcher", "KeyringWatcher", "load_engine"]

log = logging.getLogger("loopwatch.config")


def load_engine(path: Path | None) -> LoopEngine:
    """The engine for a config file (None: upstream defaults).  Raises ``ConfigError``."""
    if path is None:
        return engine_for(None)
    return engine_from_bytes(read_config_file(path), path)


def engine_from_bytes(data: bytes, path: Path) -> LoopEngine:
    """The engine for a config file's content, logging what ``config check`` warns about
    (retired keys under profile latest).  Raises ``ConfigError``."""
    root = load_config_bytes(data, path)
    for note in warnings(root):
        log.warning("config %s: %s", path, note)
    return engine_for(root)


class ConfigWatcher:
    """One config file: the live one, or the candidate (``name``, the metrics' ``config`` label).
    ``check(engine)``: why a valid new config cannot be applied to the running worker (its
    fleet-wide options changed, ``streams.app.app``), or None; such a config is refused too."""

    def __init__(
        self,
        path: Path | None,
        on_change: Callable[[LoopEngine], Any],
        metrics: Metrics | None = None,
        check: Callable[[LoopEngine], str | None] | None = None,
        *,
        name: str = LIVE,
    ) -> None:
        self.path = path
        self.on_change = on_change
        self.metrics = metrics
        self.check = check
        self.name = name
        self._stat: tuple[int, int, int] | None = None
        self._digest: str | None = None
        self._rejected: str | None = None
        self._missing_logged = False
        self.reloads = 0
        self.rejections = 0
        self._set_refused(False)

    @property
    def sha256(self) -> str:
        """The first 16 hex digits of the SHA-256 of the config in force (``defaults``
        without a file): what the shadow topic tags its verdicts with."""
        return self._digest[:16] if self._digest else "defaults"

    def load_initial(self) -> LoopEngine:
        """Load the file at start; a bad file is fatal here (there is no old config to keep)."""
        if self.path is None:
            log.info("%s loop-detection config: none given (--config), upstream's defaults", self.name)
            return self.announce(engine_for(None))
        self._stat = self._stat_of()
        data = read_config_file(self.path)
        engine = engine_from_bytes(data, self.path)
        self._digest = hashlib.sha256(data).hexdigest()
        log.info("%s loop-detection config loaded from %s", self.name, self.path)
        return self.announce(engine)

    def announce(self, engine: LoopEngine) -> LoopEngine:
        """Say, per agent, whether the config in force checks anything: a worker with detection
        off allows every call, and nothing else would tell (one log line per agent; the live
        config's ``loopwatch_detection_enabled``, docs/metrics.md, alert LoopwatchDetectionOff)."""
        status = engine.config.detection_status()
        for agent, profile, on in status:
            line = detection_line(agent, profile, on)
            if on:
                log.info("%s config: %s", self.name, line)
            else:
                log.warning("%s config: %s", self.name, line)
        if self.metrics is not None and self.name == LIVE:
            gauge = self.metrics.detection_enabled
            gauge.clear()  # agents no longer listed leave the series
            for agent, _profile, on in status:
                gauge.labels(agent).set(1 if on else 0)
        return engine

    def load_or_refuse(self) -> LoopEngine | None:
        """Load the file at start, or refuse it as a reload would (None: counted, logged in one
        line, ``loopwatch_config_file_refused`` set) and apply it once a fixed file appears.
        For the candidate: a shadow-only file must never keep a worker on its live config from
        starting, or a bad candidate would turn enforcement off at the next restart."""
        if self.path is None:
            return self.announce(engine_for(None))
        self._stat = self._stat_of()
        engine = self._read_and_check()
        if engine is None:
            return None
        log.info("%s loop-detection config loaded from %s", self.name, self.path)
        return self.announce(engine)

    def _read_and_check(self) -> LoopEngine | None:
        """The engine for the file as it is now, or None when it is refused (or unchanged: the
        content in force).  A new valid content's digest becomes the one in force."""
        try:
            data = read_config_file(self.path)
        except ConfigError as exc:
            self._refuse(None, exc)
            return None
        digest = hashlib.sha256(data).hexdigest()
        if digest == self._digest:
            self._set_refused(False)  # back to the content in force
            return None
        try:
            engine = engine_from_bytes(data, self.path)
            reason = self.check(engine) if self.check is not None else None
            if reason is not None:
                raise ConfigError(f"{self.path}: {reason}")
        except Exception as exc:  # noqa: BLE001 - a reload must never take the worker down
            self._refuse(digest, exc)
            return None
        self._digest = digest
        self._rejected = None
        self._set_refused(False)
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
        engine = self._read_and_check()
        if engine is None:
            return False
        self.reloads += 1
        if self.metrics is not None:
            self.metrics.config_reloads.labels("applied", self.name).inc()
        self.on_change(engine)
        log.info("%s loop-detection config reloaded from %s", self.name, self.path)
        self.announce(engine)
        return True

    def _refuse(self, digest: str | None, exc: Exception) -> None:
        """Keep the running config; count and log a refusal once per distinct bad content
        (``digest`` None: the file could not be read, logged each time its stat changes)."""
        self._set_refused(True)
        if digest is not None and digest == self._rejected:
            return
        self._rejected = digest
        self.rejections += 1
        if self.metrics is not None:
            self.metrics.config_reloads.labels("refused", self.name).inc()
        keeping = (
            "keeping the running configuration"
            if self._digest is not None
            else f"running without a {self.name} config until the file is fixed"
        )
        if isinstance(exc, ConfigError):
            log.error("refused new config: %s; %s", exc, keeping)
        else:
            log.exception("refused new config %s: %r; %s", self.path, exc, keeping)

    def _set_refused(self, refused: bool) -> None:
        if self.metrics is not None:
            self.metrics.config_file_refused.labels(self.name).set(1 if refused else 0)


class KeyringWatcher:
    """Reloads the signing keys when their files change: rotating a key is adding the new one
    to the Secret, moving the runners over, and removing the old one, with no restart.

    The key files are small, so each poll reads them all and compares a hash of their
    content (a Secret volume swaps a ``..data`` symlink; no mtime needs to be trusted).  Keys
    that fail to load are rejected with one error line per distinct content, and the running
    keys stay in force.
    """

    def __init__(self, path: Path, on_change: Callable[[Keyring], Any]) -> None:
        self.path = path
        self.on_change = on_change
        self._digest: str | None = None
        self._rejected: str | None = None
        self.reloads = 0

    def _read(self) -> tuple[list[tuple[str, bytes]], str]:
        files = read_key_files(self.path)
        digest = hashlib.sha256()
        for name, content in files:
            digest.update(hashlib.sha256(name.encode()).digest() + hashlib.sha256(content).digest())
        return files, digest.hexdigest()

    def load_initial(self) -> Keyring:
        """The keys at start; keys that do not load are fatal here (``SigningKeyError``)."""
        files, self._digest = self._read()
        keyring = Keyring(keys_of(files))
        log.info("signing keys loaded from %s: %s", self.path, _describe(keyring))
        return keyring

    def poll(self) -> bool:
        try:
            files, digest = self._read()
        except SigningKeyError as exc:
            if self._rejected != str(exc):
                self._rejected = str(exc)
                log.error("signing keys: %s; keeping the running keys", exc)
            return False
        if digest == self._digest or digest == self._rejected:
            return False
        try:
            keyring = Keyring(keys_of(files))
        except SigningKeyError as exc:
            self._rejected = digest
            log.error("rejected new signing keys (%s); keeping the running keys", exc)
            return False
        self._digest = digest
        self._rejected = None
        self.reloads += 1
        self.on_change(keyring)
        log.info("signing keys reloaded from %s: %s", self.path, _describe(keyring))
        return True


def _describe(keyring: Keyring) -> str:
    """Key ids per agent (never a secret)."""
    return "; ".join(f"agent {agent!r}: {', '.join(ids)}" for agent, ids in sorted(keyring.agents.items()))
