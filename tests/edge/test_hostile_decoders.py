"""Every decoder an outsider can reach, fed what hypothesis makes of JSON, YAML and bytes (deep
brackets, cut and spliced documents, other types where objects belong): each answers, or
refuses with its documented error type in one line, and nothing else escapes it (never a
``RecursionError``, a ``KeyError``, a ``TypeError``).

The decoders: the MCP gateway's reading of a line both ways (``jsonrpc.parse``, ``envelope``,
``oversize_id``, ``healed_error``; the SDK proxy's ``upstream._server_message``), the detection
config (JSON, JSON5, YAML), the worker's settings file, the hook server's request bodies and the
per-call hook's stdin, transcripts for ``loopwatch import``, golden-trace files, signing key files
and the gateway's file of upstreams."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from schemas.config import ConfigError, load_config_bytes
from schemas.signing import SigningKeyError, parse_keys
from streams.app.settings import PREFIX, Settings, SettingsError
from streams.conformance.traces import TraceFileError, open_jsonl
from streams.edge.canonical import exceeds_depth
from streams.importers.model import ImportFailed
from streams.importers.reader import decode, decode_embedded
from streams.integrations.hooks import call as hook_call
from streams.integrations.hooks.serve import HookServer
from streams.integrations.mcp.cli import UsageError, load_upstreams_file
from streams.integrations.mcp.health import UpstreamHealth
from streams.integrations.mcp.jsonrpc import Oversize, envelope, healed_error, oversize_id, parse
from streams.integrations.mcp.upstream import UpstreamSpec, _server_message

SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)
KEYS = st.sampled_from(
    ["jsonrpc", "id", "method", "params", "result", "error", "code", "message", "tools", "loopDetection"]
)
MESSAGES = st.dictionaries(KEYS | st.text(max_size=6), VALUES, max_size=6)


@st.composite
def deep(draw) -> str:
    """Brackets far past any bound, around a value, inside a message, or cut short."""
    depth = draw(st.integers(min_value=100, max_value=20_000))
    opening = draw(st.sampled_from(["[", '{"a":', "[{", '{"jsonrpc":"2.0","id":1,"result":[']))
    closing = {"[": "]", '{"a":': "}", "[{": "}]", '{"jsonrpc":"2.0","id":1,"result":[': "]}"}[opening]
    text = opening * depth + "0" + closing * depth
    if draw(st.booleans()):
        text = text[: draw(st.integers(min_value=0, max_value=len(text)))]
    return text


@st.composite
def mangled(draw, documents) -> str:
    """A document as text, maybe cut, spliced with another or with stray bytes."""
    text = draw(documents)
    action = draw(st.sampled_from(["as is", "cut", "splice", "prefix"]))
    if action == "cut":
        text = text[: draw(st.integers(min_value=0, max_value=len(text)))]
    elif action == "splice":
        at = draw(st.integers(min_value=0, max_value=len(text)))
        text = text[:at] + draw(st.text(alphabet='[]{}",:\\0a \n', max_size=20)) + text[at:]
    elif action == "prefix":
        text = draw(st.sampled_from(["[", "{", '"', "\ufeff", "null", "- "])) + text
    return text


JSON_TEXT = mangled(st.one_of(VALUES.map(json.dumps), MESSAGES.map(json.dumps), deep()))
YAML_TEXT = mangled(st.one_of(VALUES.map(yaml.safe_dump), MESSAGES.map(yaml.safe_dump), deep()))
ANY_TEXT = st.one_of(JSON_TEXT, YAML_TEXT, st.text(max_size=200))

FUZZ = settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def one_line(exc: BaseException) -> None:
    assert "\n" not in str(exc), repr(str(exc))
    assert str(exc)


# -- MCP messages, both ways --------------------------------------------------------------------------


@FUZZ
@given(JSON_TEXT)
@example("[" * 100_000 + "]" * 100_000)
@example('{"jsonrpc":"2.0","id":7,"method":"tools/call","params":' + "[" * 5000)
def test_a_line_of_the_agent_or_the_upstream_is_parsed_or_faulted_never_raised(text):
    line = text.encode("utf-8", "surrogatepass")
    message, fault = parse(line)
    assert fault in (None, "deep", "not JSON")
    if fault is None:
        assert not exceeds_depth(message)
    else:
        assert message is None
        outer = envelope(line)  # what the relay reads of a faulted line to answer it
        assert not exceeds_depth(outer)


@FUZZ
@given(st.binary(max_size=300), st.binary(max_size=300), JSON_TEXT)
@example(b'{"jsonrpc":"2.0","id":"a\\"b","method":"x","params":{"a":[', b"", "")
def test_the_id_of_an_oversize_line_is_found_or_not_never_raised(head, tail, text):
    for line in (Oversize(head, tail, 1 << 27), Oversize(text.encode()[:200], text.encode()[-200:], 1 << 27)):
        request_id, request = oversize_id(line)
        assert request_id is None or isinstance(request_id, (str, int, float))
        assert isinstance(request, bool)


@FUZZ
@given(MESSAGES)
@example({"id": 1, "error": "just a string"})
@example({"id": 1, "error": {"code": "x", "message": "m"}})
@example({"id": 1, "error": {"code": True, "message": 3}})
def test_an_upstream_answer_with_any_error_leaves_as_a_valid_json_rpc_error(message):
    healed = healed_error(message, "upstream MCP server 'u' failed: invalid JSON-RPC error")
    if healed is None:
        error = message.get("error")
        assert (
            "error" not in message
            or "method" in message
            or (
                isinstance(error, dict)
                and isinstance(error.get("code"), int)
                and not isinstance(error["code"], bool)
                and isinstance(error.get("message"), str)
            )
        )
    else:
        error = healed["error"]
        assert type(error["code"]) is int and isinstance(error["message"], str)
        assert "\n" not in error["message"]
        json.dumps(healed)  # writable as it is


@FUZZ
@given(JSON_TEXT)
@example('{"jsonrpc":"2.0","id":3,"error":{"code":"x","message":"m"}}')
@example('{"jsonrpc":"2.0","id":3,"result":' + "[" * 3000)
def test_the_sdk_proxy_reads_any_upstream_line_into_a_message_or_a_reported_error(text):
    spec = UpstreamSpec(name="u", command=("u",))
    item = _server_message(spec, UpstreamHealth("u"), text.encode("utf-8", "surrogatepass"))
    assert item is None or isinstance(item, Exception) or hasattr(item, "message")


# -- config files ------------------------------------------------------------------------------------


@FUZZ
@given(ANY_TEXT, st.sampled_from(["loop.json", "loop.json5", "loop.yaml"]))
@example("[" * 50_000, "loop.yaml")
@example("[" * 50_000, "loop.json5")
@example('{"tools": {"loopDetecton": {"enabled": true}}}', "loop.json")
def test_a_detection_config_is_loaded_or_refused_with_one_config_error(text, name):
    try:
        load_config_bytes(text.encode("utf-8", "surrogatepass"), name)
    except ConfigError as exc:
        one_line(exc)


@FUZZ
@given(ANY_TEXT, st.sampled_from(["settings.json", "settings.yaml"]))
@example("[" * 50_000, "settings.yaml")
@example("[" * 50_000, "settings.json")
@example('{"brokr": "a:1"}', "settings.json")
def test_a_settings_file_is_read_or_refused_with_one_settings_error(text, name):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        try:
            Settings.from_env({PREFIX + "SETTINGS_FILE": str(path)})
        except SettingsError as exc:
            one_line(exc)


@FUZZ
@given(ANY_TEXT)
@example("upstreams:\n  - " + "[" * 50_000)
def test_a_file_of_upstreams_is_read_or_refused_with_one_usage_error(text):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "upstreams.yaml"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        try:
            load_upstreams_file(str(path))
        except UsageError as exc:
            one_line(exc)


@FUZZ
@given(JSON_TEXT)
@example("[" * 50_000)
def test_a_signing_key_file_is_read_or_refused_with_one_signing_key_error(text):
    try:
        parse_keys(text.encode("utf-8", "surrogatepass"), "keys.json")
    except SigningKeyError as exc:
        one_line(exc)


# -- hook bodies ------------------------------------------------------------------------------------


@FUZZ
@given(st.one_of(JSON_TEXT, MESSAGES.map(lambda p: json.dumps({"cli": "claude-code", "payload": p}))))
@example('{"cli":"claude-code","payload":' + "[" * 50_000)
@example('{"cli":"claude-code","payload":{"hook_event_name":' + "[" * 50_000)
def test_the_hook_server_answers_any_body_with_an_output_or_a_one_line_error(text):
    server = HookServer(None, "/nonexistent/hook.sock")  # a body is read before any client is used
    answer = asyncio.run(server.answer(text.encode("utf-8", "surrogatepass")))
    assert set(answer) == {"error"}, answer
    assert isinstance(answer["error"], str) and "\n" not in answer["error"]


@FUZZ
@given(JSON_TEXT)
@example("[" * 50_000)
@example('{"hook_event_name":"PreToolUse","tool_input":' + "[" * 50_000 + "]" * 50_000 + "}")
def test_the_per_call_hook_reads_any_stdin_or_says_why_not_in_one_line(text):
    stdin = io.TextIOWrapper(io.BytesIO(text.encode("utf-8", "surrogatepass")))
    stderr, stdout = io.StringIO(), io.StringIO()
    saved = sys.stdin
    try:
        sys.stdin = stdin
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
            code = hook_call.main(["claude-code", "--socket", "/nonexistent/hook.sock", "--timeout", "0.01"])
    finally:
        sys.stdin = saved
    assert code in (0, 1), stderr.getvalue()
    assert len(stderr.getvalue().splitlines()) <= 1, stderr.getvalue()


# -- transcripts and traces -------------------------------------------------------------------------


@FUZZ
@given(JSON_TEXT)
@example("[" * 100_000 + "]" * 100_000)
def test_a_transcript_document_or_embedded_arguments_decode_or_fail_the_import_in_one_line(text):
    for reader in (lambda: decode(text.encode("utf-8", "surrogatepass"), "t.json"), lambda: decode_embedded(text, "t")):
        try:
            reader()
        except ImportFailed as exc:
            one_line(exc)


@FUZZ
@given(st.lists(JSON_TEXT, min_size=1, max_size=4))
@example(["[" * 50_000])
def test_a_golden_trace_file_is_read_or_refused_with_one_trace_file_error(lines):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        path.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass"))
        try:
            list(open_jsonl(path))
        except TraceFileError as exc:
            one_line(exc)
