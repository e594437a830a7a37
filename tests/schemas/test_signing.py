"""Signed events (schemas.signing): the HMAC against RFC 4231's vectors, verification as
properties over arbitrary records and headers, agent binding, key files and rotation."""

from __future__ import annotations

import base64
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.events import InvalidEvent
from schemas.signing import (
    KEY_ID_HEADER,
    SIGNATURE_HEADER,
    Keyring,
    SigningKey,
    SigningKeyError,
    load_keys,
    parse_keys,
)
from streams.edge.events import requested_event

# RFC 4231 §4.7 and §4.8 (HMAC-SHA-256): a 131-byte key of 0xaa (test cases 1-5 use keys
# shorter than the 32 bytes this module insists on).
RFC4231_KEY = b"\xaa" * 131
RFC4231_CASES = [
    (
        b"Test Using Larger Than Block-Size Key - Hash Key First",
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
    ),
    (
        b"This is a test using a larger than block-size key and a larger than block-size data. The key needs to be "
        b"hashed before being used by the HMAC algorithm.",
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
    ),
]

secrets_ = st.binary(min_size=32, max_size=96)
key_ids = st.from_regex(r"[A-Za-z0-9._:-]{1,40}", fullmatch=True)
agent_ids = st.text(min_size=1, max_size=40)
values = st.binary(max_size=2048)


def key(key_id="main-1", agent_id="main", secret=b"s" * 32) -> SigningKey:
    return SigningKey(key_id, agent_id, secret)


def reason(call) -> str:
    with pytest.raises(InvalidEvent) as info:
        call()
    assert info.value.reason == "bad_signature"
    return info.value.detail


@pytest.mark.parametrize("data, digest", RFC4231_CASES)
def test_signature_is_rfc4231_hmac_sha256(data, digest):
    k = SigningKey("rfc", "a", RFC4231_KEY)
    assert k.signature(data) == "sha256=" + digest
    assert k.headers(data) == [(KEY_ID_HEADER, b"rfc"), (SIGNATURE_HEADER, ("sha256=" + digest).encode())]


@settings(max_examples=300)
@given(key_ids, agent_ids, secrets_, values)
def test_a_signed_record_verifies_with_its_key(key_id, agent_id, secret, value):
    k = SigningKey(key_id, agent_id, secret)
    assert Keyring([k]).verify(k.headers(value), value) is k


@settings(max_examples=300)
@given(secrets_, values, st.data())
def test_any_change_to_the_value_is_refused(secret, value, data):
    k = key(secret=secret)
    headers = k.headers(value)
    if value:
        i = data.draw(st.integers(0, len(value) - 1))
        bit = data.draw(st.integers(0, 7))
        changed = value[:i] + bytes([value[i] ^ (1 << bit)]) + value[i + 1 :]
    else:
        changed = b"\x00"
    assert "does not match" in reason(lambda: Keyring([k]).verify(headers, changed))
    # Extending or cutting the value changes it too.
    assert "does not match" in reason(lambda: Keyring([k]).verify(headers, value + b" "))


@settings(max_examples=200)
@given(secrets_, secrets_, values)
def test_a_signature_made_with_another_secret_under_the_same_id_is_refused(secret, other, value):
    if secret == other:
        return
    forger = key(secret=other)
    assert "does not match" in reason(lambda: Keyring([key(secret=secret)]).verify(forger.headers(value), value))


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([KEY_ID_HEADER, SIGNATURE_HEADER, "other", "loopwatch.reason"]), st.binary(max_size=80)
        ),
        max_size=5,
    ),
    values,
)
def test_arbitrary_headers_never_verify_without_the_secret(headers, value):
    """Whatever headers a forger sends (without the secret), verification refuses with
    bad_signature and never raises anything else."""
    ring = Keyring([key()])
    try:
        ring.verify(headers, value)
    except InvalidEvent as exc:
        assert exc.reason == "bad_signature"
    else:
        pytest.fail(f"verified forged headers {headers!r}")


def test_refusals_say_what_is_wrong():
    k = key()
    ring = Keyring([k])
    value = b'{"x":1}'
    good = k.headers(value)
    assert reason(lambda: ring.verify(None, value)) == f"unsigned: no {SIGNATURE_HEADER} header"
    assert reason(lambda: ring.verify([good[1]], value)) == f"no {KEY_ID_HEADER} header"
    assert reason(lambda: ring.verify([(KEY_ID_HEADER, b"old-1"), good[1]], value)) == "unknown key id 'old-1'"
    assert "more than one" in reason(lambda: ring.verify(good + [good[1]], value))
    upper = (SIGNATURE_HEADER, good[1][1].upper().replace(b"SHA256=", b"sha256="))
    assert "not sha256=<64 lowercase hex>" in reason(lambda: ring.verify([good[0], upper], value))
    bare = (SIGNATURE_HEADER, good[1][1][len("sha256=") :])
    assert "not sha256=<64 lowercase hex>" in reason(lambda: ring.verify([good[0], bare], value))


def test_the_event_must_name_the_keys_agent():
    k = key(agent_id="main")
    ours = requested_event("e1", "read", {}, run_id="r", session_key="s", agent_id="main")
    k.check_agent(ours)
    theirs = requested_event("e2", "read", {}, run_id="r", session_key="s", agent_id="billing")
    assert (
        reason(lambda: k.check_agent(theirs)) == "key main-1 belongs to agent 'main', the event names agent 'billing'"
    )
    nobody = requested_event("e3", "read", {}, run_id="r", session_key="s")
    assert "names agent None" in reason(lambda: k.check_agent(nobody))


def test_two_keys_of_one_agent_are_valid_at_once():
    old, new = key("main-1", secret=b"o" * 32), key("main-2", secret=b"n" * 32)
    ring = Keyring([old, new])
    assert ring.verify(old.headers(b"v"), b"v") is old
    assert ring.verify(new.headers(b"v"), b"v") is new
    assert ring.agents == {"main": ["main-1", "main-2"]}


def test_secrets_stay_out_of_repr():
    secret = b"recognisable-secret-0123456789abcdef"
    k = key(secret=secret)
    for text in (repr(k), str(k), repr(Keyring([k]))):
        assert "recognisable" not in text and base64.b64encode(secret).decode() not in text


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: SigningKey("main-1", "main", b"x" * 31), "at least 32 bytes"),
        (lambda: SigningKey("has space", "main", b"x" * 32), "key id 'has space'"),
        (lambda: SigningKey("k", "", b"x" * 32), "agent_id must be a non-empty string"),
        (lambda: Keyring([key(), key(agent_id="other")]), "appears twice"),
    ],
)
def test_unusable_keys_are_refused(make, message):
    with pytest.raises(SigningKeyError, match=message):
        make()


def entry(key_id="main-1", agent_id="main", secret=b"k" * 32) -> dict:
    return {"key_id": key_id, "agent_id": agent_id, "secret": base64.b64encode(secret).decode()}


def test_key_files_one_object_or_a_list():
    assert parse_keys(json.dumps(entry())) == [key(secret=b"k" * 32)]
    both = parse_keys(json.dumps([entry(), entry("main-2")]))
    assert [k.key_id for k in both] == ["main-1", "main-2"]


@pytest.mark.parametrize(
    "content, message",
    [
        ("{", "keys.json: not JSON"),
        (json.dumps({"key_id": "a", "agent_id": "b"}), "exactly key_id, agent_id and secret"),
        (json.dumps({**entry(), "extra": 1}), "exactly key_id, agent_id and secret"),
        (json.dumps({**entry(), "secret": "not base64!"}), "secret is not base64"),
        (
            json.dumps([entry(), {**entry(), "secret": base64.b64encode(b"short").decode()}]),
            r"keys.json\[1\]: key main-1: the secret must be at least 32 bytes",
        ),
    ],
)
def test_bad_key_files_name_the_file_and_the_problem(content, message):
    with pytest.raises(SigningKeyError, match=message):
        parse_keys(content, "keys.json")


def test_a_secret_volume_directory(tmp_path):
    """A Kubernetes Secret volume: one file per Secret key, symlinks into a hidden ..data."""
    data = tmp_path / "..2025_01_01_00_00_00.000"
    data.mkdir()
    (data / "main.json").write_text(json.dumps(entry()))
    (data / "billing.json").write_text(json.dumps([entry("billing-1", "billing"), entry("billing-2", "billing")]))
    os.symlink(data.name, tmp_path / "..data")
    for name in ("main.json", "billing.json"):
        os.symlink(f"..data/{name}", tmp_path / name)
    keys = load_keys(tmp_path)
    assert sorted(k.key_id for k in keys) == ["billing-1", "billing-2", "main-1"]
    assert Keyring(keys).agents == {"billing": ["billing-1", "billing-2"], "main": ["main-1"]}


def test_empty_or_missing_key_paths_are_errors(tmp_path):
    with pytest.raises(SigningKeyError, match="no key files"):
        load_keys(tmp_path)
    (tmp_path / "keys.json").write_text("[]")
    with pytest.raises(SigningKeyError, match="no signing keys"):
        load_keys(tmp_path)
    with pytest.raises(SigningKeyError, match="cannot read"):
        load_keys(tmp_path / "absent.json")
