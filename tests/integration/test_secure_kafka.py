"""loopwatch on a broker that requires TLS, SCRAM-SHA-512 and ACLs (``scripts/kafka.sh
--secure``), with signed events, and both runner clients: Python's and the TypeScript one
(a Node runner, ``node_runner.py``).

The worker runs with the environment ``tests/ops/values-secure.yaml`` renders through the
chart (``kube.ChartPod``: Secrets and mounts made local, the bootstrap servers pointed at
the secured broker); runners use the ``runner`` principal.  Expected verdicts come from the
engine alone (``reference_verdicts``) and from a worker on the plain broker fed the same
events.  The module shares one secured worker; its topics are reset first.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random
import secrets
import shutil
import ssl
import subprocess
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError
from kube import ChartPod
from node_runner import NodeRunner, assert_blocked_calls_completed_at_once, node_calls, plain

from harness import (
    REPO,
    WorkerNames,
    WorkerProcess,
    collect,
    encode_all,
    header,
    produce,
    reference_verdicts,
    wait_http_ok,
)
from schemas import decode_event, decode_verdict, encode_event, encode_verdict
from schemas.events import RunEnded
from schemas.signing import SigningKey
from schemas.verdicts import Decision, RunAborted
from streams.app.reload import load_engine
from streams.client import BrokerAccessError, LoopBlocked, LoopwatchClient, RunAbortedError
from streams.edge.broker import redact_sasl_exchanges
from streams.edge.events import requested_event
from streams.offline.scenarios import scenario_calls

pytestmark = pytest.mark.kafka

VALUES = REPO / "tests" / "ops" / "values-secure.yaml"
TOPICS = ("tool-calls", "loop-verdicts", "tool-calls-dlq")
APP_ID = "loopwatch"  # values-secure.yaml: the chart's default app id, the one the ACLs name
SIGNING = "loopwatch-signing-keys"
# A secret nobody could mistake for anything else: the last test looks for it everywhere.
MAIN = SigningKey("main-2025-01", "main", b"recognisable-signing-key:" + secrets.token_hex(12).encode())
MAIN_NEXT = SigningKey("main-2025-02", "main", secrets.token_bytes(32))
BILLING = SigningKey("billing-2025-01", "billing", secrets.token_bytes(32))


def key_file(*keys: SigningKey) -> bytes:
    return json.dumps(
        [{"key_id": k.key_id, "agent_id": k.agent_id, "secret": base64.b64encode(k.secret).decode()} for k in keys]
    ).encode()


class Secured:
    """The module's secured broker, chart pod and worker."""

    def __init__(self, kafka, root: Path) -> None:
        self.kafka = kafka
        self.root = root
        self.tag = secrets.token_hex(4)
        self.pod = self.chart_pod(root / "pod")
        self.worker: WorkerProcess | None = None
        self.main_key = MAIN
        """Agent main's key the worker accepts now (the rotation test moves it on)."""

    def chart_pod(self, root: Path, *, password: str | None = None, ca: bytes | None = None) -> ChartPod:
        return ChartPod(
            VALUES,
            root,
            set_values=[f"kafka.bootstrapServers={self.kafka.bootstrap}"],
            secrets={
                "loopwatch-kafka-ca": {"ca.crt": ca or self.kafka.cafile.read_bytes()},
                "loopwatch-kafka-sasl": {"password": (password or self.kafka.password("loopwatch")).encode()},
                SIGNING: {"main.json": key_file(MAIN), "billing.json": key_file(BILLING)},
            },
        )

    def start_worker(self, pod: ChartPod, label: str, loglevel: str = "info") -> WorkerProcess:
        return WorkerProcess(
            self.kafka.bootstrap,
            WorkerNames(prefix="lwsec"),
            env=pod.environment(),
            log_dir=self.root / "logs",
            label=label,
            loglevel=loglevel,
        ).start()

    @property
    def admin(self) -> dict:
        return self.kafka.client_options("admin")

    def engine(self):
        return load_engine(self.pod.local("config") / "loop-detection.yaml")

    async def read(self, topic: str, until, timeout: float = 60.0) -> list:
        return await collect(self.kafka.bootstrap, topic, until=until, timeout=timeout, client_options=self.admin)


async def reset_topics(kafka) -> None:
    """Delete the module's topics (and the worker's changelog) as admin, wait until they are
    gone, and let kafka.sh create the three shared ones again."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap, **kafka.client_options("admin"))
    await admin.start()
    try:
        doomed = [t for t in await admin.list_topics() if t in TOPICS or t.startswith(APP_ID + "-")]
        if doomed:
            await admin.delete_topics(doomed)
        deadline = time.monotonic() + 60
        while set(await admin.list_topics()) & set(doomed):
            if time.monotonic() > deadline:
                raise TimeoutError(f"topics {doomed} still exist 60 s after deletion")
            await asyncio.sleep(0.2)
    finally:
        await admin.close()
    kafka.start()


@pytest.fixture(scope="module")
def secured(secure_kafka, tmp_path_factory, request):
    asyncio.run(reset_topics(secure_kafka))
    state = Secured(secure_kafka, tmp_path_factory.mktemp("secured"))
    failed_before = request.session.testsfailed
    # DEBUG: the last test looks for secrets in everything the worker logs.
    state.worker = state.start_worker(state.pod, "secure-worker", loglevel="debug")
    try:
        state.worker.wait_ready(timeout=90)
        yield state
    finally:
        state.worker.stop(timeout=15)
        if request.session.testsfailed > failed_before:
            print(f"\nsecured worker log kept in {state.root / 'logs'}\n{state.worker.log_tail(80)}")


async def drive(client: LoopwatchClient, kind: str, run_id: str, *, length: int = 30, end: bool = True):
    """A runner following loopwatch in gate mode: a blocked call is not run, an aborted run
    stops.  Returns the decisions the client got, the run handle and how many events it
    published."""
    run = client.run(run_id, session_key=f"agent:main:{run_id}", agent_id="main")
    decisions = []
    published = 0
    for n, call in enumerate(scenario_calls(kind, random.Random(run_id), length)):
        if call == "compaction":
            await run.compaction_retried()
            published += 1
            continue
        try:
            decision = await run.before_tool_call(call.tool, call.args, tool_call_id=f"call_{n}")
        except LoopBlocked as blocked:
            decision = blocked.decision
        except RunAbortedError:  # raised before anything is published
            break
        assert decision is not None, f"{run_id}: no decision for call {n} within the gate timeout"
        decisions.append(decision)
        outcome = {"error": call.error} if call.error is not None else {"result": call.result}
        await run.after_tool_call(call.tool, call.args, tool_call_id=f"call_{n}", **outcome)
        published += 2
    if end and run.aborted is None:
        await run.end("completed")
        published += 1
    return decisions, run, published


def by_id(records) -> dict:
    out = {}
    for record in records:
        verdict = decode_verdict(record.value)
        out.setdefault(verdict.verdict_id, verdict)
    return out


# -- the worker and the client over TLS + SCRAM ---------------------------------------------------


async def test_worker_and_client_over_tls_and_scram_decide_as_on_the_plain_broker(secured, lw):
    kafka = secured.kafka
    runs = {
        f"sec-{kind}-{secured.tag}": kind
        for kind in ("generic_repeat", "ping_pong", "polling_loop", "post_compaction", "healthy")
    }
    received, handles, published_n = {}, {}, 0
    async with LoopwatchClient(
        kafka.bootstrap, mode="gate", timeout=15, signing_key=MAIN, **kafka.client_options("runner")
    ) as client:
        for run_id, kind in runs.items():
            decisions, handles[run_id], n = await drive(client, kind, run_id)
            received.update((d.verdict_id, d) for d in decisions)
            published_n += n

    # Exactly the events the client published, read back as admin, and the engine's answers.
    def all_in(records):
        return sum(r.key.decode() in runs for r in records) >= published_n

    published = [decode_event(r.value) for r in await secured.read("tool-calls", all_in) if r.key.decode() in runs]
    events = [e for run_id in runs for e in published if e.run_id == run_id]  # publication order per run
    expected = reference_verdicts(events, secured.engine())
    expected_ids = {v.verdict_id for v in expected}
    assert expected, "the scenarios produced no verdicts"

    # 1. What the gate-mode client got is the engine's decision for every call it made.
    assert received == {v.verdict_id: v for v in expected if isinstance(v, Decision)}
    assert {"block"} <= {d.action for d in received.values()}
    aborted = {run_id for run_id, handle in handles.items() if handle.aborted is not None}
    assert (
        aborted == {v.run_id for v in expected if isinstance(v, RunAborted)} == {f"sec-post_compaction-{secured.tag}"}
    )

    # 2. The secured worker's verdicts on the topic are the plain broker's for the same events.
    secure = by_id(await secured.read("loop-verdicts", lambda rs: expected_ids <= set(by_id(rs))))
    plain_worker = lw.worker(config=secured.pod.local("config") / "loop-detection.yaml").start()
    plain_worker.wait_ready()
    await produce(lw.broker, lw.names.tool_calls, encode_all(events))
    plain = by_id(await collect(lw.broker, lw.names.verdicts, until=lambda rs: expected_ids <= set(by_id(rs))))
    mine = {vid: v for vid, v in secure.items() if v.run_id in runs}
    assert mine == plain == {v.verdict_id: v for v in expected}


# -- only loopwatch speaks for loopwatch ------------------------------------------------------------


async def refused(options, topic: str, value: bytes) -> BaseException | None:
    producer = AIOKafkaProducer(bootstrap_servers=options.pop("bootstrap"), request_timeout_ms=10000, **options)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=b"run:victim")
    except Exception as exc:  # noqa: BLE001 - returned for the assertion
        return exc
    finally:
        await producer.stop()
    return None


async def test_a_runner_cannot_forge_verdicts_and_nobody_but_runners_writes_history(secured):
    kafka = secured.kafka

    def as_user(user):
        return {"bootstrap": kafka.bootstrap, **kafka.client_options(user)}

    forged = Decision(
        verdict_id=f"forged-{secured.tag}/decision",
        cause_event_id=f"forged-{secured.tag}",
        run_id="victim",
        tool_name="read",
        args_hash="read:" + "0" * 64,
        action="block",
        level="critical",
        detector="generic_repeat",
        count=99,
        message="forged",
        notify_model=True,
    )
    for user, topic in [
        ("runner", "loop-verdicts"),
        ("runner", "tool-calls-dlq"),
        ("outsider", "loop-verdicts"),
        ("outsider", "tool-calls"),
        ("loopwatch", "tool-calls"),
    ]:
        error = await refused(as_user(user), topic, encode_verdict(forged))
        assert isinstance(error, TopicAuthorizationFailedError), f"{user} writing {topic}: {error!r}"

    # A runner may not read other runs' history, nor join the worker's group.
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka.bootstrap, enable_auto_commit=False, **kafka.client_options("runner")
    )
    await consumer.start()
    try:
        tp = TopicPartition("tool-calls", 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        with pytest.raises(TopicAuthorizationFailedError):
            await asyncio.wait_for(consumer.getmany(timeout_ms=2000), 30)
    finally:
        await consumer.stop()
    consumer = AIOKafkaConsumer(
        "loop-verdicts", group_id=APP_ID, bootstrap_servers=kafka.bootstrap, **kafka.client_options("runner")
    )
    try:
        with pytest.raises(GroupAuthorizationFailedError):
            await consumer.start()
            await asyncio.wait_for(consumer.getmany(timeout_ms=2000), 30)
    finally:
        await consumer.stop()

    # The runner's own reads and writes still work, and the forged verdict is nowhere.
    assert await refused(as_user("runner"), "tool-calls", b"not an event") is None
    dead = await secured.read("tool-calls-dlq", lambda rs: any(r.value == b"not an event" for r in rs))
    assert any(r.value == b"not an event" for r in dead)
    verdicts = await secured.read("loop-verdicts", lambda rs: False, timeout=2)
    assert forged.verdict_id not in by_id(verdicts)


# -- signed events --------------------------------------------------------------------------------


async def test_only_events_signed_by_their_agent_are_processed_and_keys_rotate(secured):
    kafka = secured.kafka
    run_id = f"signed-{secured.tag}"
    key = run_id.encode()
    n = iter(range(1000))

    def event(agent_id="main"):
        return encode_event(
            requested_event(
                f"{run_id}:{next(n)}",
                "read",
                {"p": 1},
                run_id=run_id,
                agent_id=agent_id,
                session_key=f"agent:{agent_id}:{run_id}",
                gate=True,
                ts_ms=int(time.time() * 1000),  # signed events are refused once older than the max age
            )
        )

    def forged_headers(value):  # main's key id, billing's secret
        return [MAIN.headers(value)[0], ("loopwatch.signature", BILLING.signature(value).encode())]

    async def publish(items):
        await produce(
            kafka.bootstrap,
            "tool-calls",
            [(key, v, h) for v, h in items],
            client_options=kafka.client_options("runner"),
        )

    values = [event() for _ in range(2)] + [event("billing"), event(), event()]
    await publish(
        [
            (values[0], MAIN.headers(values[0])),  # good
            (values[1], None),  # unsigned
            (values[2], MAIN.headers(values[2])),  # main's key, billing's event
            (values[3], forged_headers(values[3])),  # a signature made without main's secret
            (values[4], MAIN.headers(values[4])),  # good: once its verdict is in, so is everything before
        ]
    )
    ids = [decode_event(v).event_id for v in values]
    verdicts = by_id(await secured.read("loop-verdicts", lambda rs: f"{ids[4]}/decision" in by_id(rs)))
    assert {vid for vid in verdicts if vid.startswith(run_id)} == {f"{ids[0]}/decision", f"{ids[4]}/decision"}
    dead = await secured.read("tool-calls-dlq", lambda rs: sum(r.key == key for r in rs) >= 3)
    assert [
        (decode_event(r.value).event_id, header(r, "loopwatch.reason"), header(r, "loopwatch.detail"))
        for r in dead
        if r.key == key
    ] == [
        (ids[1], "bad_signature", "unsigned: no loopwatch.signature header"),
        (ids[2], "bad_signature", "key main-2025-01 belongs to agent 'main', the event names agent 'billing'"),
        (ids[3], "bad_signature", "the signature does not match the record (key main-2025-01)"),
    ]
    assert secured.worker.metric("loopwatch_dead_letters_total", reason="bad_signature") >= 3

    # Rotation through the mounted Secret, no restart: first both keys, then only the new one.
    log = secured.worker.log_path

    async def reloaded(key_ids):
        want = f"signing keys reloaded from {secured.pod.local('signing-keys')}: agent 'billing': billing-2025-01; agent 'main': {key_ids}"
        deadline = time.monotonic() + 60
        while want not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, f"the worker never logged: {want}"
            await asyncio.sleep(0.2)

    secured.pod.update_secret(SIGNING, {"main.json": key_file(MAIN, MAIN_NEXT), "billing.json": key_file(BILLING)})
    await reloaded("main-2025-01, main-2025-02")
    rotated = [event(), event()]
    await publish([(rotated[0], MAIN_NEXT.headers(rotated[0])), (rotated[1], MAIN.headers(rotated[1]))])
    ids = [decode_event(v).event_id for v in rotated]
    await secured.read("loop-verdicts", lambda rs: {f"{i}/decision" for i in ids} <= set(by_id(rs)))  # both keys valid
    secured.pod.update_secret(SIGNING, {"main.json": key_file(MAIN_NEXT), "billing.json": key_file(BILLING)})
    await reloaded("main-2025-02")
    retired = [event(), event()]
    await publish([(retired[0], MAIN.headers(retired[0])), (retired[1], MAIN_NEXT.headers(retired[1]))])
    secured.main_key = MAIN_NEXT
    ids = [decode_event(v).event_id for v in retired]
    verdicts = by_id(await secured.read("loop-verdicts", lambda rs: f"{ids[1]}/decision" in by_id(rs)))
    assert f"{ids[0]}/decision" not in verdicts
    dead = await secured.read(
        "tool-calls-dlq", lambda rs: any(decode_event(r.value).event_id == ids[0] for r in rs if r.key == key)
    )
    (letter,) = [r for r in dead if r.key == key and decode_event(r.value).event_id == ids[0]]
    assert header(letter, "loopwatch.detail") == "unknown key id 'main-2025-01'"


# -- refusals fail fast, with one line --------------------------------------------------------------


def other_ca(directory: Path) -> bytes:
    """A CA certificate that did not sign the broker's (made with the JDK's keytool)."""
    keytool = shutil.which("keytool") or "keytool"
    store = directory / "other-ca.p12"
    common = [keytool, "-storetype", "PKCS12", "-storepass", "changeit", "-keystore", str(store)]
    subprocess.run(
        common
        + [
            "-genkeypair",
            "-alias",
            "ca",
            "-keyalg",
            "EC",
            "-groupname",
            "secp256r1",
            "-dname",
            "CN=some other CA",
            "-ext",
            "bc:c",
            "-validity",
            "30",
        ],
        check=True,
        capture_output=True,
    )
    out = subprocess.run(common + ["-exportcert", "-alias", "ca", "-rfc"], check=True, capture_output=True)
    return out.stdout


def assert_stops_with_one_line(worker: WorkerProcess, line: str) -> None:
    """The worker exits with status 2, having logged ``line`` and nothing else (besides the
    announcement of the config it loaded, which comes before it reaches Kafka: "live config:
    ...", here detection off, as these workers are started without a config)."""
    try:
        code = worker.proc.wait(timeout=120)  # a guard against a hang, not a speed requirement
    finally:
        worker.kill()
    lines = [
        text
        for text in worker.log_text().splitlines()
        if text and not text.startswith("=====") and not text.startswith("live config:")
    ]
    assert code == 2
    assert lines == [line]


@pytest.mark.parametrize("case", ["wrong-password", "untrusted-certificate"])
async def test_refused_credentials_and_untrusted_certificates_stop_worker_and_client_with_one_line(
    secured, tmp_path, case
):
    kafka = secured.kafka
    if case == "wrong-password":
        pod = secured.chart_pod(tmp_path / "pod", password="not-the-password")
        reason = "SASL SCRAM-SHA-512 authentication as '{user}' refused: wrong username or password"
        options = kafka.client_options("runner", password="not-the-password")
    else:
        ca = other_ca(tmp_path)
        pod = secured.chart_pod(tmp_path / "pod", ca=ca)
        (tmp_path / "other-ca.crt").write_bytes(ca)
        reason = (
            "TLS: the broker's certificate is not trusted (self-signed certificate in certificate chain);"
            " is the CA file the one that signed the brokers' certificates?"
        )
        options = kafka.client_options("runner", cafile=tmp_path / "other-ca.crt")

    assert_stops_with_one_line(
        secured.start_worker(pod, f"worker-{case}"),
        f"loopwatch worker: cannot use the Kafka cluster: {kafka.bootstrap}: {reason.format(user='loopwatch')}",
    )

    with pytest.raises(BrokerAccessError) as info:
        async with LoopwatchClient(kafka.bootstrap, **options):
            pass
    assert str(info.value) == f"{kafka.bootstrap}: {reason.format(user='runner')}"


async def test_aiokafka_debug_logs_of_a_sasl_plain_exchange_carry_no_password(secured, caplog):
    """aiokafka logs each request at DEBUG, and SASL PLAIN's carries the password in clear;
    the redaction the worker and the client install removes it.  The secured broker offers
    PLAIN on its controller listener (KAFKA_SECURE_CONTROLLER_PORT), so this is real aiokafka
    talking to a real PLAIN listener; the broker then refuses anything but controller requests."""
    kafka = secured.kafka
    host, port = kafka.bootstrap.rsplit(":", 1)
    controller = f"{host}:{int(port) + 1}"
    options = kafka.client_options("admin")
    options["sasl_mechanism"] = "PLAIN"
    redact_sasl_exchanges()
    with caplog.at_level(logging.DEBUG, logger="aiokafka"):
        admin = AIOKafkaAdminClient(bootstrap_servers=controller, request_timeout_ms=5000, **options)
        try:
            await asyncio.wait_for(admin.start(), 30)
        except Exception:  # noqa: BLE001 - a controller answers no Metadata request
            pass
        finally:
            await admin.close()
    text = caplog.text
    assert "SaslAuthenticateRequest" in text and "sasl_auth_bytes=<redacted>" in text
    assert kafka.password("admin") not in text


# -- the Node runner (clients/typescript) over TLS + SCRAM, signing its events ----------------------


def node_kafka(
    kafka,
    directory: Path,
    key: SigningKey | None = None,
    *,
    user: str = "runner",
    password: str | None = None,
    cafile: Path | None = None,
) -> tuple[dict, dict]:
    """The plugin config a Node runner of ``user`` uses on the secured broker (the CA file,
    SCRAM-SHA-512, the password from the environment, ``key`` in a key file of the workers'
    format), and that environment."""
    config: dict = {
        "brokers": [kafka.bootstrap],
        "tls": {"caFile": str(cafile or kafka.cafile)},
        "sasl": {"mechanism": "SCRAM-SHA-512", "username": user, "passwordEnv": "LW_KAFKA_PASSWORD"},
    }
    if key is not None:
        path = directory / f"{key.key_id}.json"
        path.write_bytes(key_file(key))
        config["signing"] = {"keyFile": str(path)}
    return config, {"LW_KAFKA_PASSWORD": kafka.password(user) if password is None else password}


async def run_node(
    node: str, scenario: str, plan: dict, env: dict, *, expect: int | None = None
) -> tuple[list, NodeRunner]:
    """Drive a Node runner's client scenario to its end; ``expect``: the advisory verdicts to wait for."""
    runner = await NodeRunner.start(node, scenario, plan, env=env)
    try:
        await runner.read("ready")
        if expect is not None:
            await runner.read("published")
            await runner.send(f"expect {expect}")
        reports = (await runner.read("runs"))["runs"]
        await runner.send("dups 0")
        await runner.read("dups")
        await runner.finish()
    finally:
        runner.kill()
    return reports, runner


async def test_node_runner_over_tls_and_scram_signing_its_events_is_blocked_by_loopwatch(secured, node, tmp_path):
    kafka = secured.kafka
    key = secured.main_key
    config, env = node_kafka(kafka, tmp_path, key)
    tag = f"node-{secured.tag}"
    runs = [
        {
            "runId": f"{tag}-{kind}",
            "sessionKey": f"agent:main:{tag}-{kind}",
            "sessionId": None,
            "mode": "gate",
            "calls": node_calls(kind, 3),
        }
        for kind in ("generic_repeat", "post_compaction")
    ]
    reports, runner = await run_node(node, "client", {"kafka": config, "runs": runs}, env)
    loop, compacted = reports

    run_ids = {r["runId"] for r in runs}

    def ended(records):  # the runner ends both runs last
        return sum(r.key.decode() in run_ids and isinstance(decode_event(r.value), RunEnded) for r in records) == len(
            run_ids
        )

    records = [r for r in await secured.read("tool-calls", ended) if r.key.decode() in run_ids]
    # Every record carries the Node client's signature, the one schemas.signing makes of its bytes.
    assert records and all(header(r, "loopwatch.key_id") == key.key_id for r in records)
    assert all(header(r, "loopwatch.signature") == key.signature(r.value) for r in records)
    events = [decode_event(r.value) for r in records]
    expected = reference_verdicts(events, secured.engine())
    # The worker accepted them all and decided as the engine does: the loop is blocked, the loop
    # surviving the compaction aborts its run, and the blocked calls were completed at once.
    got = {d["verdict_id"]: d for report in reports for d in report["decisions"]}
    assert got == {v.verdict_id: plain(v) for v in expected if isinstance(v, Decision)}
    assert loop["blockedCalls"] and {d["detector"] for d in loop["decisions"] if d["action"] == "block"} == {
        "generic_repeat"
    }
    assert compacted["abortError"]["name"] == "PostCompactionLoopPersistedError"
    assert compacted["aborted"] == plain(next(v for v in expected if isinstance(v, RunAborted)))
    blocked = {d["cause_event_id"] for d in got.values() if d["action"] == "block"}
    assert assert_blocked_calls_completed_at_once(events, blocked) == len(blocked) > 0
    dead = await secured.read("tool-calls-dlq", lambda rs: False, timeout=2)
    assert not [r for r in dead if r.key and r.key.decode() in run_ids]
    # Nothing the runner printed shows its password or its key.
    printed = "".join(runner.output).encode()
    for form in encodings(kafka.password("runner").encode()) | encodings(key.secret):
        assert form not in printed


async def test_node_runner_signing_with_another_agents_key_is_dead_lettered(secured, node, tmp_path):
    """A runner holding billing's key and speaking for agent main (a key file that says so):
    the worker knows whose key it is and dead-letters every event, none reaches a run."""
    kafka = secured.kafka
    forged = SigningKey(BILLING.key_id, "main", BILLING.secret)
    config, env = node_kafka(kafka, tmp_path, forged)
    run_id = f"node-forged-{secured.tag}"
    runs = [
        {
            "runId": run_id,
            "sessionKey": f"agent:main:{run_id}",
            "sessionId": None,
            "mode": "advisory",
            "calls": node_calls("generic_repeat", 4, length=6),
        }
    ]
    await run_node(node, "client", {"kafka": config, "runs": runs}, env, expect=0)

    published = 6 * 2 + 1  # six calls, each requested and completed, and the run's end
    dead = await secured.read("tool-calls-dlq", lambda rs: sum(r.key == run_id.encode() for r in rs) >= published)
    letters = [r for r in dead if r.key == run_id.encode()]
    assert len(letters) == published
    # (the signature matched: the worker named the key's agent, which only its secret proves)
    assert {(header(r, "loopwatch.reason"), header(r, "loopwatch.detail")) for r in letters} == {
        ("bad_signature", f"key {BILLING.key_id} belongs to agent 'billing', the event names agent 'main'")
    }
    verdicts = await secured.read("loop-verdicts", lambda rs: False, timeout=2)
    assert not [v for v in by_id(verdicts).values() if v.run_id == run_id]


@pytest.mark.parametrize("case", ["wrong-password", "untrusted-certificate", "no-acls"])
async def test_node_client_refused_by_the_broker_fails_at_once_with_one_line(secured, node, tmp_path, case):
    kafka = secured.kafka
    if case == "wrong-password":
        config, env = node_kafka(kafka, tmp_path, password="not-the-password")
        reason = "SASL SCRAM-SHA-512 authentication as 'runner' refused: wrong username or password"
    elif case == "untrusted-certificate":
        (tmp_path / "other-ca.crt").write_bytes(other_ca(tmp_path))
        config, env = node_kafka(kafka, tmp_path, cafile=tmp_path / "other-ca.crt")
        reason = (
            "TLS: the broker's certificate is not trusted (self-signed certificate in certificate chain);"
            " is the CA file the one that signed the brokers' certificates?"
        )
    else:
        config, env = node_kafka(kafka, tmp_path, user="outsider")
        reason = (
            "not authorized (TOPIC_AUTHORIZATION_FAILED); the runner's principal needs the ACLs of README"
            ' "Securing Kafka" (groupIdPrefix names the consumer group)'
        )
    runner = await NodeRunner.start(node, "start", {"kafka": config}, env=env)
    try:
        report = await runner.read("start")
        await runner.finish()
    finally:
        runner.kill()
    # the same line as the Python client's BrokerAccessError (test above): the reason, not the
    # deadline's "could not reach Kafka" after retrying for 30 s
    assert (report["ok"], report["name"], report["message"]) == (
        False,
        "BrokerAccessError",
        f"{kafka.bootstrap}: {reason}",
    )


# -- no secret anywhere --------------------------------------------------------------------------


def encodings(secret: bytes) -> set[bytes]:
    return {
        secret,
        secret.hex().encode(),
        base64.b64encode(secret),
        base64.urlsafe_b64encode(secret),
        base64.b64encode(secret).rstrip(b"="),
    }


async def test_no_password_or_signing_key_in_logs_metrics_topics_or_state(secured, caplog):
    """The whole path once more (secured broker, chart-configured worker at DEBUG, the runner
    client signing its events), then every log line, metric, record and state file is
    searched for every password and signing key, in clear, hex and base64."""
    kafka = secured.kafka
    run_id = f"secrets-{secured.tag}"
    with caplog.at_level(logging.DEBUG):
        async with LoopwatchClient(
            kafka.bootstrap, mode="gate", timeout=15, signing_key=secured.main_key, **kafka.client_options("runner")
        ) as client:
            decisions, _, _ = await drive(client, "generic_repeat", run_id, length=24, end=False)
    assert "block" in {d.action for d in decisions}
    # The run's state reaches the changelog (it is kept: the run did not end).
    changelog = await secured.read(
        f"{APP_ID}-runs-changelog", lambda rs: any(r.key == f"run:{run_id}".encode() for r in rs)
    )
    assert any(r.key == f"run:{run_id}".encode() for r in changelog)
    wait_http_ok(
        f"http://127.0.0.1:{secured.worker.metrics_port}/metrics", secured.worker.proc, what="metrics", timeout=30
    )

    needles = {
        f"{user} password": encodings(kafka.password(user).encode())
        for user in ("admin", "loopwatch", "runner", "outsider")
    }
    needles.update({f"signing key {k.key_id}": encodings(k.secret) for k in (MAIN, MAIN_NEXT, BILLING)})
    haystacks: dict[str, bytes] = {
        "worker log": secured.worker.log_path.read_bytes(),
        "client log": caplog.text.encode(),
        "metrics": secured.worker.http("/metrics", secured.worker.metrics_port)[1].encode(),
    }
    assert b"loopwatch_dead_letters_total" in haystacks["metrics"] and len(haystacks["worker log"]) > 10_000
    for topic in (*TOPICS, f"{APP_ID}-runs-changelog"):
        for i, r in enumerate(await secured.read(topic, lambda rs: False, timeout=3)):
            parts = [r.key or b"", r.value or b""] + [k.encode() + v for k, v in r.headers or ()]
            haystacks[f"{topic} record {i}"] = b"\0".join(parts)
    state_files = [p for p in secured.pod.local("data").rglob("*") if p.is_file()]
    assert state_files, "the worker wrote no state"
    haystacks.update({f"state file {p}": p.read_bytes() for p in state_files})
    broker_state = kafka.secrets_dir.parent
    haystacks.update(
        {
            f"broker {name}": (broker_state / name).read_bytes()
            for name in ("broker.log", "broker.out")
            if (broker_state / name).exists()
        }
    )

    leaks = [
        f"{what} in {where}"
        for what, forms in needles.items()
        for where, text in haystacks.items()
        if any(form in text for form in forms)
    ]
    assert leaks == []


async def test_a_tls_worker_or_client_at_a_plaintext_listener_is_told_it_does_not_speak_tls(kafka_broker, tmp_path):
    # Issue 26: before, "no broker answers ()".  The plain broker's listener reads the TLS
    # ClientHello as a Kafka request and drops the connection during the handshake.
    reason = (
        "the listener did not speak TLS: it closed the connection during the TLS handshake; is it a PLAINTEXT "
        "listener (check the port and the security protocol)?"
    )
    worker = WorkerProcess(
        kafka_broker,
        WorkerNames(prefix="lwtls"),
        config=REPO / "examples" / "getting-started.yaml",  # detection on: the one line is the broker's
        env={"LOOPWATCH_KAFKA_SECURITY_PROTOCOL": "SSL"},
        log_dir=tmp_path,
        label="tls-at-plaintext",
    ).start()
    assert_stops_with_one_line(worker, f"loopwatch worker: cannot use the Kafka cluster: {kafka_broker}: {reason}")
    with pytest.raises(BrokerAccessError) as info:
        async with LoopwatchClient(
            kafka_broker, security_protocol="SSL", ssl_context=ssl.create_default_context(), timeout=10
        ):
            pass
    assert str(info.value) == f"{kafka_broker}: {reason}"
