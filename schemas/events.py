"""Events runners publish on ``tool-calls`` (key: run id, or session key without one).

Events carry hashes, never raw arguments or results: the runner hashes at the edge with
``streams.edge.hashing`` (byte-compatible with upstream OpenClaw).  Every event has an
``event_id`` that is unique per event and reused on retries; verdict ids derive from it.
"""

from __future__ import annotations

from binascii import a2b_hex
from typing import Annotated, Literal

import msgspec

from . import names
from .errors import LoopwatchError

MAX_EVENT_BYTES = 64 * 1024
"""Records larger than this are rejected (and dead-lettered by the worker)."""

SCHEMA_VERSION = 1
"""The ``v`` of every event and verdict this version of loopwatch writes."""
SUPPORTED_VERSIONS = (SCHEMA_VERSION,)
"""The values of ``v`` this decoder accepts; any other is dead-lettered ``unsupported_version``."""

# Bounds of every field.  Integers stay within JavaScript's safe range (2^53 - 1): a runner in
# any language can represent them exactly, and they fit the signed 64-bit fields of the state
# codec and the worker's state envelope with room to spare.  String lengths are counted in
# characters (code points), as JSON Schema's maxLength is.
MAX_SAFE_INT = 2**53 - 1
MAX_ID_LENGTH = 512
"""event_id, run_id, session_key, session_id, agent_id, tool_call_id."""
MAX_TOOL_NAME_LENGTH = 256
"""tool_name, unknown_tool_name; also run.ended's reason."""
HASH_LENGTH = 64
MAX_RESULT_HASH_LENGTH = len("error:") + HASH_LENGTH

Version = Annotated[
    int,
    msgspec.Meta(ge=min(SUPPORTED_VERSIONS), le=max(SUPPORTED_VERSIONS), description="schema version"),
]
Id = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_LENGTH)]
OptionalKey = Annotated[str, msgspec.Meta(max_length=MAX_ID_LENGTH)] | None
ToolName = Annotated[str, msgspec.Meta(max_length=MAX_TOOL_NAME_LENGTH)]
ArgsHash = Annotated[
    str,
    msgspec.Meta(max_length=MAX_TOOL_NAME_LENGTH + 1 + HASH_LENGTH, description="<tool>:<64 lowercase hex>"),
]
RESULT_HASH_PATTERN = r"^(error:)?[0-9a-f]{64}$"
DIGEST_PATTERN = r"^[0-9a-f]{64}$"
# The two hash patterns are in the JSON Schema for runners, and checked by ``check_event``
# rather than by msgspec, which runs a ``re`` search per field: on every completed event, the
# most expensive part of decoding it.
ResultHash = Annotated[
    str,
    msgspec.Meta(
        max_length=MAX_RESULT_HASH_LENGTH,
        description="64 hex, or error: + 64 hex",
        extra_json_schema={"pattern": RESULT_HASH_PATTERN},
    ),
]
TimestampMs = Annotated[
    int, msgspec.Meta(ge=0, le=MAX_SAFE_INT, description="event time, epoch milliseconds (at most 2^53 - 1)")
]
Digest = Annotated[
    str,
    msgspec.Meta(
        max_length=HASH_LENGTH, description="64 lowercase hex (SHA-256)", extra_json_schema={"pattern": DIGEST_PATTERN}
    ),
]
CheckedDigest = Annotated[
    str,
    msgspec.Meta(
        min_length=HASH_LENGTH, max_length=HASH_LENGTH, pattern=DIGEST_PATTERN, description="64 lowercase hex (SHA-256)"
    ),
]
"""A digest msgspec checks itself while decoding: for optional fields that are rarely present
(the peer profiles'), where its ``re`` search costs nothing on the events without them and
``check_event`` needs no branch on the hot path."""
NearDigest = Annotated[
    str,
    msgspec.Meta(
        min_length=HASH_LENGTH,
        max_length=HASH_LENGTH,
        description="64 lowercase hex (SHA-256)",
        extra_json_schema={"pattern": DIGEST_PATTERN},
    ),
]
"""A digest on most events when present (``near_args_hash``): its pattern is checked by
``check_event`` with ``a2b_hex``, not by msgspec's ``re`` search on every event."""
OutcomeKind = Literal["terminal-exec-failure", "write-mutation"]
Unset = msgspec.UnsetType
UNSET = msgspec.UNSET
TraceId = Annotated[
    str, msgspec.Meta(min_length=1, max_length=MAX_ID_LENGTH, description="a conversation or task shared by agents")
]
Seq = Annotated[
    int,
    msgspec.Meta(
        ge=0,
        le=MAX_SAFE_INT,
        description="the publisher's sequence number: strictly increasing within a run (at most 2^53 - 1)",
    ),
]
"""``seq``: a runner's number for an event, strictly increasing within a run, also across a
restart of its publisher that resumes the run (``streams.edge.sequence``: microseconds since the
epoch, or one more than the last).  Part of the signed value, so with signed events a worker
refuses an event at or below the highest ``seq`` its run applied (``replayed_event``)."""
Target = Annotated[
    str,
    msgspec.Meta(min_length=1, max_length=MAX_ID_LENGTH, description="the session key or agent id a message goes to"),
]


# gc=False: events hold only scalars, so they can never be part of a reference cycle.
class _Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", forbid_unknown_fields=True, gc=False):
    v: Version = SCHEMA_VERSION
    event_id: Id
    run_id: OptionalKey = None
    session_key: OptionalKey = None
    session_id: OptionalKey = None
    agent_id: OptionalKey = None
    ts_ms: TimestampMs = 0


class ToolCallRequested(_Event, tag=names.TOOL_CALL_REQUESTED, kw_only=True, frozen=True):
    """A tool call the model asked for, published before the tool runs."""

    tool_call_id: OptionalKey = None
    tool_name: ToolName
    args_hash: ArgsHash
    known_poll: bool = False
    """``command_status``, or ``process`` with action poll/log (hashing.is_known_poll)."""
    gate: bool = False
    """The runner waits for a decision before executing; one is published even for allow."""
    target_hash: Digest | None = None
    """Tool ``write`` only: SHA-256 of ``{"path": <path>}`` (hashing.write_target_hash).
    Read by profile latest (argument churn on one target); optional."""
    # loopwatch's agent rings, both optional and left out of the record when unset
    # (so every event without them encodes exactly as before).
    trace_id: TraceId | Unset = UNSET
    """The conversation or task this call belongs to, shared by the agents that message each
    other in it (``loopwatch.agentRings``)."""
    target: Target | Unset = UNSET
    """On a send tool: the session key or agent id the message goes to (an id, never content)."""
    thought_hash: CheckedDigest | Unset = UNSET
    """SHA-256 of the text the model wrote with this call (``hashing.text_hash``), left out when
    unset.  Read by profile openhands, whose StuckDetector counts two calls as the same action
    only when their thoughts match too; the other profiles ignore it."""
    call_key: CheckedDigest | Unset = UNSET
    """Gemini CLI's key of the call, SHA-256 of ``<tool>:<JSON.stringify(args)>``
    (``hashing.gemini_call_key``: the arguments' key order counts), left out when unset.  Read
    by profile gemini-cli, which falls back to ``args_hash`` without it."""
    near_args_hash: NearDigest | Unset = UNSET
    """SHA-256 of the arguments read loosely (``hashing.near_args_hash``: one-line strings as
    shell commands, whitespace collapsed, switches dropped), left out when unset: calls that
    differ only in ways that do not change what they do hash alike.  Read in place of
    ``args_hash`` by ``loopwatch.detectors.nearIdentical``; ignored otherwise."""
    seq: Seq | Unset = UNSET
    """The publisher's sequence number in its run (``Seq``), left out when unset: with signed
    events a replay at or below the run's highest applied ``seq`` is refused."""


class ToolCallCompleted(_Event, tag=names.TOOL_CALL_COMPLETED, kw_only=True, frozen=True):
    """The outcome of a tool call, hashed at the edge (hashing.hash_outcome)."""

    tool_call_id: OptionalKey = None
    tool_name: ToolName
    args_hash: ArgsHash
    result_hash: ResultHash | None = None
    """None: the tool returned nothing, or the result was the loop's own veto."""
    is_error: bool = False
    unknown_tool_name: ToolName | None = None
    loop_veto: bool = False
    """The result was loopwatch's/the loop detector's own block (never hashed)."""
    # Profile latest's outcome fields (openclaw-latest.md §4), all optional: a runner sets
    # them whatever profile judges it (streams.edge.events does), and configurable-final ignores them.
    normalized_result_hash: ResultHash | None = None
    """The result hash under profile latest when it differs from ``result_hash``: untrusted-
    content envelope ids canonicalised, or a ``write`` that changed nothing."""
    outcome_kind: OutcomeKind | None = None
    """``terminal-exec-failure`` (an exec that ran and failed) or ``write-mutation`` (a
    ``write`` that changed its target)."""
    failure_identity_hash: Digest | None = None
    """Terminal exec failures only: a hash of the failure with timestamps, durations, pids
    and attempt counters masked, so drifting output of one failure matches."""
    no_progress: bool = False
    """The outcome made no progress: an error, or a ``write`` that changed nothing."""
    target_hash: Digest | None = None
    """As on the requested event (tool ``write``)."""
    trace_id: TraceId | Unset = UNSET
    """As on the requested event."""
    target: Target | Unset = UNSET
    """As on the requested event."""
    near_args_hash: NearDigest | Unset = UNSET
    """As on the requested event."""
    seq: Seq | Unset = UNSET
    """As on the requested event."""


class CompactionRetried(_Event, tag=names.COMPACTION_RETRIED, kw_only=True, frozen=True):
    """A context compaction followed by a retry: arms the post-compaction guard."""

    seq: Seq | Unset = UNSET
    """As on the requested event."""


class RunEnded(_Event, tag=names.RUN_ENDED, kw_only=True, frozen=True):
    """The run finished; its state is freed at once."""

    reason: Annotated[str, msgspec.Meta(max_length=MAX_TOOL_NAME_LENGTH)] | None = None
    seq: Seq | Unset = UNSET
    """As on the requested event."""


class AgentMessage(_Event, tag=names.AGENT_MESSAGE, kw_only=True, frozen=True):
    """A message without tool calls, hashed at the edge (``streams.edge.events.agent_message_event``):
    the model's reply (``source: agent``) or the user's (``source: user``).  Raw text never
    leaves the runner.  Read by profile openhands (monologue, empty responses, a user message
    ends every streak); the other profiles ignore it, and runners that never send it keep
    working."""

    source: Literal["agent", "user"] = "agent"
    text_hash: Digest
    """SHA-256 of the message's text (``hashing.text_hash``; of "" for an empty reply)."""
    empty: bool = False
    """The reply had no user-visible content (empty, or reasoning only): OpenHands' agent then
    sends the model its corrective feedback, which takes a place in its event history."""
    seq: Seq | Unset = UNSET
    """As on the requested event."""


# Gemini CLI's content loop detector (loopDetectionService.ts): 50-unit windows of the last 5000
# UTF-16 code units of the model's streamed text.
CONTENT_WINDOW = 50
"""``CONTENT_CHUNK_SIZE``: a window's length in UTF-16 code units (JavaScript string length)."""
CONTENT_HISTORY = 5000
"""``MAX_HISTORY_LENGTH``: the streamed text kept, in UTF-16 code units."""
WINDOW_HASH_BYTES = 8
"""Each window travels as the first 8 bytes of the SHA-256 of its UTF-8 (docs/peer-profiles.md:
the collision risk)."""
MAX_WINDOWS_BYTES = (CONTENT_HISTORY - CONTENT_WINDOW + 1) * WINDOW_HASH_BYTES
"""39,608: a chunk completes at most every window of the 5000 kept, 4,951 of them, so one record
always carries a chunk's windows (base64 in JSON: 52,812 characters, within ``MAX_EVENT_BYTES``)."""


class ModelText(_Event, tag=names.MODEL_TEXT, kw_only=True, frozen=True):
    """One chunk of the model's streamed text, as what Gemini CLI's content loop detector reads
    of it, computed at the edge (``streams.edge.content_windows.ContentEdge``): raw text never
    leaves the runner.  Read by profile gemini-cli; the other profiles ignore it, and runners
    that never send it keep working (without content loop detection)."""

    reset: bool = False
    """The chunk held a code fence, table, list item, heading, blockquote or divider: Gemini
    reset its content tracking before it."""
    skipped: bool = False
    """The chunk was not appended (inside or entering a code block, or a divider): nothing is analysed."""
    truncated: Annotated[int, msgspec.Meta(ge=0, le=MAX_SAFE_INT)] = 0
    """UTF-16 units dropped from the start of the kept text to keep its last 5000."""
    length: Annotated[int, msgspec.Meta(ge=0, le=CONTENT_HISTORY)] = 0
    """The kept text's length after this chunk, in UTF-16 units (a consistency check)."""
    windows: Annotated[bytes, msgspec.Meta(max_length=MAX_WINDOWS_BYTES)] = b""
    """The windows this chunk completed, in order of position (the kept text's last ones), 8
    bytes each: the first 8 bytes of SHA-256 of the window's UTF-8 (a lone surrogate as
    U+FFFD, as node's hash of a JavaScript string)."""
    seq: Seq | Unset = UNSET
    """As on the requested event."""


ToolCallEvent = ToolCallRequested | ToolCallCompleted | CompactionRetried | RunEnded | AgentMessage | ModelText

EVENT_TYPE_OF = {
    cls: cls.__struct_config__.tag
    for cls in (ToolCallRequested, ToolCallCompleted, CompactionRetried, RunEnded, AgentMessage, ModelText)
}
"""Event class -> its ``type`` (``schemas.names.EVENT_TYPES``)."""


MAX_DETAIL_LENGTH = 300
"""A dead letter's detail is one line of at most this many characters."""


class InvalidEvent(LoopwatchError, ValueError):
    """A record that is not a valid event; ``reason`` is a short machine-readable code and
    ``detail`` one line saying what is wrong and where (``- at `$.field```)."""

    def __init__(self, reason: str, detail: str) -> None:
        # One printable line, whatever a message or a quoted value held.
        detail = "".join(c if c.isprintable() else "?" for c in " ".join(detail.split()))
        if len(detail) > MAX_DETAIL_LENGTH:
            detail = detail[: MAX_DETAIL_LENGTH - 1] + "…"
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# The hex fields are checked by decoding them (binascii.a2b_hex: hex digits only, either case)
# and encoding them back (bytes.hex writes lowercase): two C loops, far fewer instructions than
# a regular expression's match, on every requested and completed event.
_decoder = msgspec.json.Decoder(ToolCallEvent)
_encoder = msgspec.json.Encoder()


class _VersionProbe(msgspec.Struct):
    v: msgspec.Raw = msgspec.Raw()  # empty: no ``v``


_probe = msgspec.json.Decoder(_VersionProbe)


def decode_event(data: bytes) -> ToolCallEvent:
    """Decode one ``tool-calls`` record, raising ``InvalidEvent`` naming the bad field.

    Reasons: ``oversized``, ``invalid_json`` (not JSON, or nested deeper than the decoder
    goes), ``unsupported_version`` (``v`` is not in SUPPORTED_VERSIONS), ``unknown_type``,
    ``invalid_event`` (a field is missing, unknown, of the wrong type or out of its bounds),
    ``missing_key`` (no run id, session key or session id).  Nothing else is ever raised.
    """
    if len(data) > MAX_EVENT_BYTES:
        raise InvalidEvent(names.OVERSIZED, f"record is {len(data)} bytes, the limit is {MAX_EVENT_BYTES}")
    try:
        event = _decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise _invalid(data, str(exc)) from None
    except msgspec.DecodeError as exc:
        raise InvalidEvent(names.INVALID_JSON, str(exc)) from None
    except RecursionError:
        # msgspec looks ahead for the ``type`` tag when it is not the first key, skipping the
        # values before it; skipping nests recursively and hits Python's recursion limit
        # (about 1,000 levels) long before the 64 KB size limit (30,000 levels fit).
        raise InvalidEvent(names.INVALID_JSON, "JSON nested too deeply (maximum recursion depth exceeded)") from None
    check_event(event)
    return event


def _invalid(data: bytes, text: str) -> InvalidEvent:
    """The reason for a record msgspec rejected: its version first, since an unknown version
    may well fail on fields or types this version does not know."""
    version = _version_of(data)
    if version is not None and not _is_supported(version):
        shown = version.decode("utf-8", "replace")
        return InvalidEvent(
            names.UNSUPPORTED_VERSION,
            f"schema version {shown[:40]} is not supported (supported: {', '.join(map(str, SUPPORTED_VERSIONS))}) - at `$.v`",
        )
    if "missing required field `type`" in text or ("Invalid value" in text and "`$.type`" in text):
        return InvalidEvent(names.UNKNOWN_TYPE, text)
    return InvalidEvent(names.INVALID_EVENT, text)


def _version_of(data: bytes) -> bytes | None:
    """The raw JSON of ``v``, if the record is an object that has one."""
    try:
        raw = _probe.decode(data).v
    except (msgspec.MsgspecError, RecursionError):
        return None
    return bytes(raw) or None


def _is_supported(version: bytes) -> bool:
    try:
        value = msgspec.json.decode(version)
    except (msgspec.MsgspecError, RecursionError):
        return False
    return type(value) is int and value in SUPPORTED_VERSIONS


def check_event(event: ToolCallEvent) -> None:
    """Rules msgspec cannot express: consistency between fields, and the hash fields' patterns."""
    # Each branch rebinds the event under the type ``kind`` proved: mypy narrows on
    # ``type(event) is C`` but not through ``kind``, and a cast is a call on every event.
    kind = type(event)
    if kind is ToolCallRequested or kind is ToolCallCompleted:
        call: ToolCallRequested | ToolCallCompleted = event  # type: ignore[assignment]  # (kind)
        tool, args_hash = call.tool_name, call.args_hash
        n = len(tool)
        hexes = args_hash[n + 1 :]
        try:  # _is_hex, written out: a call costs as much as the check, on every event
            valid = (
                len(hexes) == HASH_LENGTH
                and args_hash[n] == ":"
                and args_hash.startswith(tool)
                and a2b_hex(hexes).hex() == hexes
            )
        except ValueError:
            valid = False
        if not valid:
            raise InvalidEvent(
                names.INVALID_EVENT,
                f"args_hash must be '<tool_name>:<64 lowercase hex>' for tool {call.tool_name!r} - at `$.args_hash`",
            )
        target_hash = call.target_hash
        if target_hash is not None:
            if tool != "write":
                raise InvalidEvent(names.INVALID_EVENT, "target_hash is for tool 'write' only - at `$.target_hash`")
            _check_digest(target_hash, "target_hash", DIGEST_PATTERN)
        near = call.near_args_hash
        if near is not UNSET and not _is_hex(near):
            raise InvalidEvent(names.INVALID_EVENT, "near_args_hash must be 64 lowercase hex - at `$.near_args_hash`")
        if kind is ToolCallCompleted:
            done: ToolCallCompleted = event  # type: ignore[assignment]  # (kind)
            result_hash = done.result_hash
            if result_hash is not None:
                try:
                    valid = len(result_hash) == HASH_LENGTH and a2b_hex(result_hash).hex() == result_hash
                except ValueError:
                    valid = False
                if not valid:  # an error: hash, or not a hash
                    _check_digest(result_hash, "result_hash", RESULT_HASH_PATTERN)
            if done.outcome_kind or done.failure_identity_hash or done.normalized_result_hash:
                _check_latest_outcome(done)
    elif kind is AgentMessage:
        message: AgentMessage = event  # type: ignore[assignment]  # (kind)
        _check_digest(message.text_hash, "text_hash", DIGEST_PATTERN)
    elif kind is ModelText:
        text: ModelText = event  # type: ignore[assignment]  # (kind)
        count, rest = divmod(len(text.windows), WINDOW_HASH_BYTES)
        if rest:
            raise InvalidEvent(names.INVALID_EVENT, "windows must be 8 bytes per window - at `$.windows`")
        if count > max(0, text.length - CONTENT_WINDOW + 1):
            raise InvalidEvent(names.INVALID_EVENT, "more windows than the kept text has - at `$.windows`")
    if not (event.run_id or event.session_key or event.session_id):
        raise InvalidEvent(names.MISSING_KEY, "one of run_id, session_key or session_id is required - at `$.run_id`")


def _is_hex(text: str) -> bool:
    """``text`` is lowercase hex digits only."""
    try:
        return a2b_hex(text).hex() == text  # hex() writes lowercase: a capital differs
    except ValueError:  # not hex, an odd length, a character beyond ASCII
        return False


def _check_digest(value: str, field: str, pattern: str) -> None:
    """``value`` is 64 lowercase hex, or also ``error:`` and 64 lowercase hex for
    ``RESULT_HASH_PATTERN``: what the exported schema's ``pattern`` accepts."""
    hexes = value[6:] if pattern is RESULT_HASH_PATTERN and value.startswith("error:") else value
    if len(hexes) != HASH_LENGTH or not _is_hex(hexes):
        raise InvalidEvent(names.INVALID_EVENT, f"Expected `str` matching regex {pattern!r} - at `$.{field}`")


def _check_latest_outcome(event: ToolCallCompleted) -> None:
    if event.result_hash is None:
        field = (
            "outcome_kind"
            if event.outcome_kind
            else "normalized_result_hash"
            if event.normalized_result_hash
            else "failure_identity_hash"
        )
        raise InvalidEvent(names.INVALID_EVENT, f"{field} needs a result_hash - at `$.{field}`")
    if event.normalized_result_hash is not None:
        _check_digest(event.normalized_result_hash, "normalized_result_hash", RESULT_HASH_PATTERN)
    if event.failure_identity_hash is not None:
        _check_digest(event.failure_identity_hash, "failure_identity_hash", DIGEST_PATTERN)
    if event.failure_identity_hash is not None and event.outcome_kind != "terminal-exec-failure":
        raise InvalidEvent(
            names.INVALID_EVENT,
            "failure_identity_hash needs outcome_kind 'terminal-exec-failure' - at `$.failure_identity_hash`",
        )
    owner = _OUTCOME_KIND_TOOL.get(event.outcome_kind)
    if owner is not None and event.tool_name != owner:
        raise InvalidEvent(
            names.INVALID_EVENT, f"outcome_kind {event.outcome_kind!r} is for tool {owner!r} only - at `$.outcome_kind`"
        )


_OUTCOME_KIND_TOOL: dict[str | None, str] = {"terminal-exec-failure": "exec", "write-mutation": "write"}


def encode_event(event: ToolCallEvent) -> bytes:
    return _encoder.encode(event)


def encode_event_lines(events: list[ToolCallEvent]) -> bytes:
    """The events as JSON lines, each ended by a newline: ``encode_event`` of each, in one call."""
    return _encoder.encode_lines(events)
