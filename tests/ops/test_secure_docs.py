"""docs/security.md ("Securing Kafka") against what the tests run: the kafka-acls commands grant exactly
the ACLs the secured broker gets (scripts/kafka/secure-acls.conf, enforced in
tests/integration/test_secure_kafka.py), and the signed-event example is what the code signs."""

from __future__ import annotations

import base64
import re
import shlex

from opsutil import REPO

from schemas.signing import SigningKey

SECURITY_DOC = (REPO / "docs" / "security.md").read_text(encoding="utf-8")
ACL_FILE = REPO / "scripts" / "kafka" / "secure-acls.conf"


def documented_acls() -> set[tuple[str, str, str, str, str]]:
    """(principal, resource type, pattern type, name, operation) of every `$ACLS --add` line."""
    out = set()
    for line in SECURITY_DOC.splitlines():
        if not line.startswith("$ACLS --add"):
            continue
        args = shlex.split(line)[2:]
        principal, resource, name, pattern, operations = None, None, None, "literal", []
        i = 0
        while i < len(args):
            flag, value = args[i], args[i + 1]
            if flag == "--allow-principal":
                principal = value
            elif flag == "--operation":
                operations.append(value)
            elif flag in ("--topic", "--group"):
                resource, name = flag[2:], value
            elif flag == "--resource-pattern-type":
                pattern = value
            else:
                raise AssertionError(f"unexpected kafka-acls option {flag} in: {line}")
            i += 2
        assert principal and resource and operations, line
        out |= {(principal, resource, pattern, name, op) for op in operations}
    return out


def file_acls() -> set[tuple[str, str, str, str, str]]:
    out = set()
    for line in ACL_FILE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        principal, resource, pattern, name, operations = line.split()
        out |= {(principal, resource, pattern, name, op) for op in operations.split(",")}
    return out


def test_documented_acl_commands_grant_what_the_secured_broker_enforces():
    documented = documented_acls()
    assert len(documented) == 21
    assert documented == file_acls()


def test_documented_signature_example_is_what_the_code_signs():
    """The example's signature was computed with openssl (the command is in docs/security.md)."""
    secret = re.search(r"secret `([A-Za-z0-9+/=]+)` \(base64", SECURITY_DOC).group(1)
    value = re.search(r"value\s+`(\{[^`]+\})`", SECURITY_DOC).group(1)
    signature = re.search(r"`loopwatch\.signature: (sha256=[0-9a-f]{64})`", SECURITY_DOC).group(1)
    key = SigningKey("example", "main", base64.b64decode(secret))
    assert key.signature(value.encode()) == signature
