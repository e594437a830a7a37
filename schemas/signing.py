"""Signed events: a runner proves which agent it speaks for (optional, off by default).

A runner signs every record it publishes on ``tool-calls`` with a key of its agent; a
worker given a keyring (``LOOPWATCH_SIGNING_KEYS``) dead-letters, with reason
``bad_signature``, every record that is unsigned, signed with an unknown key, signed
wrongly, or whose ``agent_id`` is not the agent the key belongs to.  So a runner holding
agent A's key cannot publish events in the name of agent B.  Nor can it name a run id of
B's: a run belongs to the agent of its first event, and the worker dead-letters (also
``bad_signature``) a signed event of another agent for it (``streams.app.processor``).

The format, for runners in any language:

* header ``loopwatch.key_id``: the key's id (UTF-8);
* header ``loopwatch.signature``: ``sha256=`` followed by the lowercase hex HMAC-SHA-256
  of the record value (the exact bytes published, the JSON event), keyed with the key's
  secret (the raw bytes, not their base64);
* the event's ``agent_id`` is the key's agent.

Nothing else is signed: the record key must equal the event's run id anyway, and a
replayed record repeats its ``event_id`` and its ``ts_ms``.  Since ``ts_ms`` is signed, the
worker refuses (``stale_event``) a signed event stamped more than ``LOOPWATCH_SIGNED_MAX_AGE_S``
before its record's Kafka timestamp or before the newest event its run applied
(``streams.app.processor``): a runner stamps ``ts_ms`` when it makes an event and publishes it
at once.
Since ``seq`` is signed too (the clients number every event, ``streams.edge.sequence``), the
worker refuses (``replayed_event``) a signed event whose ``seq`` is not above the highest its
run applied: a replay within the max age, past the 64 ids a run remembers.

Key files (``load_keys``): JSON, one object or a list of them, each
``{"key_id": "...", "agent_id": "...", "secret": "<base64 of at least 32 bytes>"}``; a
directory holds any number of such files (a Kubernetes Secret mounted as a volume: one
file per Secret key, hidden entries ignored).  Several keys of one agent may be valid at
once, which is how keys are rotated.

No engine imports: the runner client uses this module too.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .config import ConfigError
from .events import InvalidEvent, ToolCallEvent
from .names import BAD_SIGNATURE

__all__ = [
    "KEY_ID_HEADER",
    "MIN_SECRET_BYTES",
    "SIGNATURE_HEADER",
    "Keyring",
    "SigningKey",
    "SigningKeyError",
    "keys_of",
    "load_keys",
    "parse_keys",
    "read_key_files",
]

KEY_ID_HEADER = "loopwatch.key_id"
SIGNATURE_HEADER = "loopwatch.signature"
SCHEME = "sha256="
MIN_SECRET_BYTES = 32
"""HMAC-SHA-256 keys shorter than its output (32 bytes) weaken it (RFC 2104 §3)."""
_KEY_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}\Z")
_SIGNATURE = re.compile(r"sha256=[0-9a-f]{64}\Z")


class SigningKeyError(ConfigError):
    """Key material that cannot be used (the message names the file and the problem)."""


@dataclass(frozen=True)
class SigningKey:
    """One agent's key.  ``secret`` never appears in ``repr``."""

    key_id: str
    agent_id: str
    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.key_id, str) or not _KEY_ID.match(self.key_id):
            raise SigningKeyError(f"key id {self.key_id!r}: 1 to 128 characters of A-Z a-z 0-9 . _ : -")
        if not isinstance(self.agent_id, str) or not 0 < len(self.agent_id) <= 512:
            raise SigningKeyError(f"key {self.key_id}: agent_id must be a non-empty string (at most 512 characters)")
        if not isinstance(self.secret, bytes) or len(self.secret) < MIN_SECRET_BYTES:
            raise SigningKeyError(f"key {self.key_id}: the secret must be at least {MIN_SECRET_BYTES} bytes")

    def signature(self, value: bytes) -> str:
        return SCHEME + hmac.new(self.secret, value, hashlib.sha256).hexdigest()

    def headers(self, value: bytes) -> list[tuple[str, bytes]]:
        """The record headers that sign ``value``."""
        return [(KEY_ID_HEADER, self.key_id.encode()), (SIGNATURE_HEADER, self.signature(value).encode())]

    def check_agent(self, event: ToolCallEvent) -> None:
        """Raise ``InvalidEvent("bad_signature")`` unless the event names this key's agent."""
        if event.agent_id != self.agent_id:
            raise InvalidEvent(
                BAD_SIGNATURE,
                f"key {self.key_id} belongs to agent {self.agent_id!r}, the event names agent {event.agent_id!r}",
            )


class Keyring:
    """The keys a worker accepts, by id."""

    def __init__(self, keys: Iterable[SigningKey]) -> None:
        self._keys: dict[str, SigningKey] = {}
        for key in keys:
            if key.key_id in self._keys:
                raise SigningKeyError(f"key id {key.key_id} appears twice")
            self._keys[key.key_id] = key

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"Keyring({sorted(self._keys)})"

    @property
    def agents(self) -> dict[str, list[str]]:
        """agent id -> its key ids."""
        out: dict[str, list[str]] = {}
        for key in self._keys.values():
            out.setdefault(key.agent_id, []).append(key.key_id)
        return out

    def verify(self, headers: Sequence[tuple[str, bytes]] | None, value: bytes) -> SigningKey:
        """The key that signed ``value``, or ``InvalidEvent("bad_signature")`` saying why not.

        The agent is checked once the event is decoded (``SigningKey.check_agent``).
        """
        key_id = signature = None
        for name, raw in headers or ():
            if name == KEY_ID_HEADER or name == SIGNATURE_HEADER:
                if (key_id if name == KEY_ID_HEADER else signature) is not None:
                    raise InvalidEvent(BAD_SIGNATURE, f"more than one {name} header")
                text = _text(raw)
                if name == KEY_ID_HEADER:
                    key_id = text
                else:
                    signature = text
        if signature is None:
            raise InvalidEvent(BAD_SIGNATURE, f"unsigned: no {SIGNATURE_HEADER} header")
        if key_id is None:
            raise InvalidEvent(BAD_SIGNATURE, f"no {KEY_ID_HEADER} header")
        key = self._keys.get(key_id)
        if key is None:
            raise InvalidEvent(BAD_SIGNATURE, f"unknown key id {key_id[:128]!r}")
        if not _SIGNATURE.match(signature):
            raise InvalidEvent(BAD_SIGNATURE, f"{SIGNATURE_HEADER} is not sha256=<64 lowercase hex> (key {key_id})")
        if not hmac.compare_digest(signature, key.signature(value)):
            raise InvalidEvent(BAD_SIGNATURE, f"the signature does not match the record (key {key_id})")
        return key


def _text(raw: bytes | None) -> str:
    try:
        return (raw or b"").decode("utf-8")
    except UnicodeDecodeError:
        return (raw or b"").decode("utf-8", "replace")


def parse_keys(data: bytes | str, source: str = "<keys>") -> list[SigningKey]:
    """The keys of one key file's content; ``SigningKeyError`` naming ``source``."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SigningKeyError(f"{source}: not JSON ({exc})") from None
    except RecursionError:  # json recurses once per level; a key file is two levels deep
        raise SigningKeyError(f"{source}: not a key file (JSON nested too deep)") from None
    entries = doc if isinstance(doc, list) else [doc]
    keys = []
    for i, entry in enumerate(entries):
        where = f"{source}[{i}]" if isinstance(doc, list) else source
        if not isinstance(entry, dict) or set(entry) != {"key_id", "agent_id", "secret"}:
            raise SigningKeyError(f"{where}: expected an object with exactly key_id, agent_id and secret")
        secret = entry["secret"]
        try:
            if not isinstance(secret, str):
                raise ValueError
            raw = base64.b64decode(secret, validate=True)
        except (ValueError, binascii.Error):
            raise SigningKeyError(f"{where}: secret is not base64") from None
        try:
            keys.append(SigningKey(entry["key_id"], entry["agent_id"], raw))
        except SigningKeyError as exc:
            raise SigningKeyError(f"{where}: {exc}") from None
    return keys


def read_key_files(path: Path) -> list[tuple[str, bytes]]:
    """(name, content) of the key file, or of every file of a directory (hidden names, such
    as a mounted Secret's ``..data``, skipped)."""
    try:
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if not p.name.startswith(".") and p.is_file())
            if not files:
                raise SigningKeyError(f"{path}: no key files in the directory")
        else:
            files = [path]
        return [(str(file), file.read_bytes()) for file in files]
    except OSError as exc:
        raise SigningKeyError(f"{path}: cannot read ({exc.strerror or exc})") from None


def keys_of(files: Sequence[tuple[str, bytes]]) -> list[SigningKey]:
    """The keys in ``read_key_files``' result; at least one."""
    keys = [key for name, content in files for key in parse_keys(content, name)]
    if not keys:
        raise SigningKeyError("no signing keys in " + ", ".join(name for name, _ in files))
    return keys


def load_keys(path: Path) -> list[SigningKey]:
    """Every key in a key file or a directory of key files."""
    return keys_of(read_key_files(path))
