"""The Helm chart: helm lint, helm template (default and tests/ops/values-custom.yaml), and
kubeconform -strict against JSON schemas generated offline (scripts/ops/gen-k8s-schemas.sh):
Kubernetes kinds from k8s.io/api's Go types, ServiceMonitor and PrometheusRule from the
Prometheus Operator's Go types. Nothing is skipped."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from opsutil import CHART, KUBE_VERSION, REPO, run

CUSTOM_VALUES = Path(__file__).with_name("values-custom.yaml")
SECURE_VALUES = Path(__file__).with_name("values-secure.yaml")
RELEASE, NAMESPACE = "lw", "agents"


def template(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run([helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION, *args])


def render(helm: str, *args: str) -> str:
    result = template(helm, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def docs(manifest: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(manifest) if d]


def by_kind(manifest: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for d in docs(manifest):
        out.setdefault(d["kind"], []).append(d)
    return out


def kubeconform_run(kubeconform: str, schema_root: Path, manifest: str) -> subprocess.CompletedProcess[str]:
    location = (
        str(schema_root)
        + "/{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json"
    )
    return run(
        [kubeconform, "-strict", "-summary", "-kubernetes-version", KUBE_VERSION, "-schema-location", location],
        input=manifest,
    )


def kubeconform_check(kubeconform: str, schema_root: Path, manifest: str) -> str:
    result = kubeconform_run(kubeconform, schema_root, manifest)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def default_manifest(helm: str) -> str:
    return render(helm)


@pytest.fixture(scope="module")
def custom_manifest(helm: str) -> str:
    return render(helm, "-f", str(CUSTOM_VALUES))


def container(manifest: str) -> dict:
    (sts,) = by_kind(manifest)["StatefulSet"]
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    return c


def env(manifest: str) -> dict[str, dict]:
    return {e["name"]: e for e in container(manifest)["env"]}


# ------------------------------------------------------------------ lint and schema validation


@pytest.mark.parametrize(
    "values", [[], ["-f", str(CUSTOM_VALUES)], ["-f", str(SECURE_VALUES)]], ids=["default", "custom", "secure"]
)
def test_helm_lint_strict(helm: str, values: list[str]) -> None:
    result = run([helm, "lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION, *values])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_kubeconform_default(kubeconform: str, k8s_schema_root: Path, default_manifest: str) -> None:
    summary = kubeconform_check(kubeconform, k8s_schema_root, default_manifest)
    n = len(docs(default_manifest))
    assert f"Valid: {n}, Invalid: 0, Errors: 0, Skipped: 0" in summary, summary


def test_kubeconform_custom(kubeconform: str, k8s_schema_root: Path, custom_manifest: str) -> None:
    summary = kubeconform_check(kubeconform, k8s_schema_root, custom_manifest)
    n = len(docs(custom_manifest))
    assert {"ServiceMonitor", "PrometheusRule"} <= set(by_kind(custom_manifest))
    assert f"Valid: {n}, Invalid: 0, Errors: 0, Skipped: 0" in summary, summary


@pytest.mark.parametrize(
    "old, new",
    [
        ("readOnlyRootFilesystem: true", "readOnlyRootFileSystem: true"),  # StatefulSet: unknown field
        ("replicas: 3", "replicas: three"),  # StatefulSet: wrong type
        ("clusterIP: None", "clusterIP: [None]"),  # Service: wrong type
        ("scrapeTimeout: 10s", "scrapeTimout: 10s"),  # ServiceMonitor: unknown field
        ("for: 10m", "for: ten minutes"),  # PrometheusRule: bad duration
    ],
    ids=["sts-field", "sts-type", "service", "servicemonitor", "prometheusrule"],
)
def test_kubeconform_schemas_really_validate(
    kubeconform: str, k8s_schema_root: Path, custom_manifest: str, old: str, new: str
) -> None:
    """Guard against a vacuous pass: each kind's schema rejects a broken manifest."""
    broken = custom_manifest.replace(old, new, 1)
    assert broken != custom_manifest
    result = kubeconform_run(kubeconform, k8s_schema_root, broken)
    assert result.returncode != 0
    assert "Invalid: 1," in result.stdout, result.stdout


# ------------------------------------------------------------------ default values


def test_default_objects(default_manifest: str) -> None:
    kinds = by_kind(default_manifest)
    assert sorted((k, len(v)) for k, v in kinds.items()) == [
        ("ConfigMap", 3),  # loop-detection config + 2 dashboards
        ("PodDisruptionBudget", 1),
        ("Service", 2),
        ("ServiceAccount", 1),
        ("StatefulSet", 1),
    ]
    for d in docs(default_manifest):
        labels = d["metadata"]["labels"]
        for key in (
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by",
            "helm.sh/chart",
            "app.kubernetes.io/component",
        ):
            assert key in labels, (d["kind"], d["metadata"]["name"], key)
        assert d["metadata"]["namespace"] == NAMESPACE


def test_statefulset_defaults(default_manifest: str) -> None:
    (sts,) = by_kind(default_manifest)["StatefulSet"]
    spec = sts["spec"]
    assert spec["replicas"] == 2
    assert spec["serviceName"] == f"{RELEASE}-loopwatch-headless"
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    pod = spec["template"]
    # Live reload instead of a checksum-triggered restart.
    assert not any(k.startswith("checksum/") for k in (pod["metadata"].get("annotations") or {}))
    c = container(default_manifest)
    assert c["image"] == "ghcr.io/loopwatch/loopwatch:0.1.0"
    assert c["args"] == ["worker"]
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["resources"]["requests"] and c["resources"]["limits"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["seccompProfile"]["type"] == "RuntimeDefault"
    psc = pod["spec"]["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 10001
    assert psc["seccompProfile"]["type"] == "RuntimeDefault"
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert mounts["/var/lib/loopwatch"] == "data"
    # The ConfigMap is mounted as a directory (no subPath) where LOOPWATCH_CONFIG points.
    e = env(default_manifest)
    config_path = Path(e["LOOPWATCH_CONFIG"]["value"])
    config_mount = next(m for m in c["volumeMounts"] if m["mountPath"] == str(config_path.parent))
    assert "subPath" not in config_mount
    assert volumes[config_mount["name"]]["configMap"]["items"] == [{"key": config_path.name, "path": config_path.name}]


def test_worker_env_contract(default_manifest: str) -> None:
    """Every variable the chart sets is one the worker reads (streams/app/settings.py)."""
    e = env(default_manifest)
    assert {k: v.get("value") for k, v in e.items()} == {
        "LOOPWATCH_BOOTSTRAP": "kafka:9092",
        "LOOPWATCH_CONFIG": "/etc/loopwatch/loop-detection.yaml",
        "LOOPWATCH_DATA_DIR": "/var/lib/loopwatch",
        "LOOPWATCH_APP_ID": "loopwatch",
        "LOOPWATCH_INSTANCE_ID": None,  # from the pod's name, below
        "LOOPWATCH_WEB_HOST": "0.0.0.0",  # the worker's default (127.0.0.1) is unreachable for probes
        "LOOPWATCH_WEB_PORT": "6066",
        "LOOPWATCH_METRICS_PORT": "9108",
        "LOOPWATCH_TOOL_CALLS_TOPIC": "tool-calls",
        "LOOPWATCH_VERDICTS_TOPIC": "loop-verdicts",
        "LOOPWATCH_DEAD_LETTER_TOPIC": "tool-calls-dlq",
        "LOOPWATCH_INCIDENTS_TOPIC": "loop-incidents",
        "LOOPWATCH_SHADOW_VERDICTS_TOPIC": "loop-verdicts-shadow",
        "LOOPWATCH_PARTITIONS": "6",
        "LOOPWATCH_REPLICATION": "3",
        "LOOPWATCH_IDLE_TIMEOUT_S": "1800",
        "LOOPWATCH_MAX_RUNS_PER_AGENT": "20000",
        "LOOPWATCH_CHECKPOINT_S": "5",
        "LOOPWATCH_STANDBY_REPLICAS": "1",
        "LOOPWATCH_CONFIG_POLL_S": "2",
        "LOOPWATCH_BROKER_UNREACHABLE_S": "15",
        "LOOPWATCH_CLOCK_SKEW_S": "300",
        "LOOPWATCH_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT",
    }
    # Static group membership: the StatefulSet's pod name is stable across restarts.
    assert e["LOOPWATCH_INSTANCE_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    from streams.app.settings import Settings

    pod_env = {k: v.get("value", f"{RELEASE}-loopwatch-0") for k, v in e.items()}
    assert Settings.from_env(pod_env).instance_id == f"{RELEASE}-loopwatch-0"


def test_the_member_watchdog_is_the_workers_default_unless_set(helm: str, default_manifest: str) -> None:
    """Unset, the worker derives the bound from its session and rebalance timeouts (so a
    session timeout raised through extraEnv raises it too); set, it reaches the worker as is."""
    assert "LOOPWATCH_MEMBER_WATCHDOG_S" not in env(default_manifest)
    from streams.app.settings import Settings

    assert Settings.from_env({}).member_watchdog_bound_s == 180.0  # the comment in values.yaml
    manifest = render(helm, "--set", "worker.memberWatchdogSeconds=240")
    assert env(manifest)["LOOPWATCH_MEMBER_WATCHDOG_S"] == {"name": "LOOPWATCH_MEMBER_WATCHDOG_S", "value": "240"}
    assert Settings.from_env({"LOOPWATCH_MEMBER_WATCHDOG_S": "240"}).member_watchdog_bound_s == 240.0


def test_liveness_restarts_a_hung_stop_before_the_watchdog_would(default_manifest: str) -> None:
    """/healthz answers 503 from the moment a worker stops: the kubelet restarts a stop that
    hangs after periodSeconds x failureThreshold, which must stay under the watchdog's bound."""
    from streams.app.settings import Settings

    live = container(default_manifest)["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] < Settings.from_env({}).member_watchdog_bound_s


def test_loop_detection_configmap_default(default_manifest: str) -> None:
    cm = next(d for d in by_kind(default_manifest)["ConfigMap"] if d["metadata"]["name"].endswith("-config"))
    config = yaml.safe_load(cm["data"]["loop-detection.yaml"])
    assert config == {
        "tools": {
            "loopDetection": {
                "enabled": True,
                "historySize": 30,
                "warningThreshold": 10,
                "criticalThreshold": 20,
                "globalCircuitBreakerThreshold": 30,
                "detectors": {"genericRepeat": True, "knownPollNoProgress": True, "pingPong": True},
            }
        },
        "agents": {"list": []},
        "loopwatch": {
            "profile": "configurable-final",
            "abortAfterCriticalBlocks": None,
            "surfaceWarnings": False,
            "scope": "run",
            "detectors": {"cycle": False},
            "fleetIncidents": {
                "enabled": False,
                "minRuns": 20,
                "minAgents": 3,
                "windowSeconds": 300,
                "hopSeconds": 60,
                "quietSeconds": 300,
            },
            "agentRings": {"enabled": False, "warningThreshold": 3, "criticalThreshold": 5, "windowSeconds": 3600},
        },
    }
    # The chart's defaults are upstream's behaviour: none of issue 17's options is on.
    from streams.engine import ConfigSet

    assert not ConfigSet(config).uses_extensions()


def test_services_and_pdb(default_manifest: str) -> None:
    services = {s["metadata"]["name"]: s for s in by_kind(default_manifest)["Service"]}
    headless = services[f"{RELEASE}-loopwatch-headless"]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    metrics = services[f"{RELEASE}-loopwatch"]["spec"]
    assert {p["name"]: p["port"] for p in metrics["ports"]} == {"http-metrics": 9108, "http-web": 6066}
    (pdb,) = by_kind(default_manifest)["PodDisruptionBudget"]
    assert pdb["spec"]["maxUnavailable"] == 1
    (sts,) = by_kind(default_manifest)["StatefulSet"]
    assert pdb["spec"]["selector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]


def test_dashboard_configmaps(default_manifest: str) -> None:
    maps = [d for d in by_kind(default_manifest)["ConfigMap"] if "dashboard" in d["metadata"]["name"]]
    files = sorted(p.name for p in (CHART / "dashboards").glob("*.json"))
    assert sorted(k for m in maps for k in m["data"]) == files
    for m in maps:
        assert m["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert m["metadata"]["annotations"]["grafana_folder"] == "Loopwatch"
        ((name, text),) = m["data"].items()
        assert json.loads(text) == json.loads((CHART / "dashboards" / name).read_text())
        assert len(text.encode()) < 512 * 1024, "ConfigMaps are limited to 1 MiB; keep well below"


# ------------------------------------------------------------------ custom values


def test_custom_statefulset(custom_manifest: str) -> None:
    (sts,) = by_kind(custom_manifest)["StatefulSet"]
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Delete", "whenScaled": "Retain"}
    claim = sts["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["storageClassName"] == "fast-ssd" and claim["resources"]["requests"]["storage"] == "20Gi"
    c = container(custom_manifest)
    assert c["image"] == "ghcr.io/loopwatch/loopwatch:0.1.0-rc1"
    assert c["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}}
    assert sts["spec"]["template"]["spec"]["priorityClassName"] == "loopwatch-critical"
    (pdb,) = by_kind(custom_manifest)["PodDisruptionBudget"]
    assert pdb["spec"]["minAvailable"] == 2 and "maxUnavailable" not in pdb["spec"]


def test_custom_kafka_tls_and_sasl_from_secrets(custom_manifest: str) -> None:
    e = env(custom_manifest)
    assert e["LOOPWATCH_KAFKA_SECURITY_PROTOCOL"]["value"] == "SASL_SSL"
    assert e["LOOPWATCH_PARTITIONS"]["value"] == "12"
    assert e["LOOPWATCH_KAFKA_SASL_MECHANISM"]["value"] == "SCRAM-SHA-512"
    assert e["LOOPWATCH_KAFKA_SASL_USERNAME"]["value"] == "loopwatch"
    assert e["LOOPWATCH_KAFKA_SASL_PASSWORD"]["valueFrom"] == {
        "secretKeyRef": {"name": "loopwatch-kafka-sasl", "key": "password"}
    }
    assert "value" not in e["LOOPWATCH_KAFKA_SASL_PASSWORD"]
    c = container(custom_manifest)
    (sts,) = by_kind(custom_manifest)["StatefulSet"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    tls_mount = next(m for m in c["volumeMounts"] if m["name"] == "kafka-tls")
    assert tls_mount["readOnly"] is True
    assert volumes["kafka-tls"]["secret"]["secretName"] == "loopwatch-kafka-tls"
    for var in ("LOOPWATCH_KAFKA_SSL_CAFILE", "LOOPWATCH_KAFKA_SSL_CERTFILE", "LOOPWATCH_KAFKA_SSL_KEYFILE"):
        path = Path(e[var]["value"])
        assert str(path.parent) == tls_mount["mountPath"]
        assert path.name in {i["path"] for i in volumes["kafka-tls"]["secret"]["items"]}
    # No secret material is rendered into the manifests.
    assert "kind: Secret" not in custom_manifest


@pytest.fixture(scope="module")
def secure_manifest(helm: str) -> str:
    return render(helm, "-f", str(SECURE_VALUES))


def test_kubeconform_secure(kubeconform: str, k8s_schema_root: Path, secure_manifest: str) -> None:
    summary = kubeconform_check(kubeconform, k8s_schema_root, secure_manifest)
    assert f"Valid: {len(docs(secure_manifest))}, Invalid: 0, Errors: 0, Skipped: 0" in summary, summary


def test_secure_values_server_tls_scram_and_signing_keys(secure_manifest: str) -> None:
    """values-secure.yaml, the setup the secured-broker tests run: SASL_SSL + SCRAM-SHA-512, a CA
    only (no client certificate), the password and the signing keys from Secrets."""
    e = env(secure_manifest)
    assert e["LOOPWATCH_KAFKA_SECURITY_PROTOCOL"]["value"] == "SASL_SSL"
    assert e["LOOPWATCH_KAFKA_SASL_MECHANISM"]["value"] == "SCRAM-SHA-512"
    assert e["LOOPWATCH_KAFKA_SASL_USERNAME"]["value"] == "loopwatch"
    assert e["LOOPWATCH_KAFKA_SASL_PASSWORD"] == {
        "name": "LOOPWATCH_KAFKA_SASL_PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "loopwatch-kafka-sasl", "key": "password"}},
    }
    assert "LOOPWATCH_KAFKA_SSL_CERTFILE" not in e and "LOOPWATCH_KAFKA_SSL_KEYFILE" not in e
    c = container(secure_manifest)
    (sts,) = by_kind(secure_manifest)["StatefulSet"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    ca = Path(e["LOOPWATCH_KAFKA_SSL_CAFILE"]["value"])
    assert mounts["kafka-tls"]["mountPath"] == str(ca.parent) and mounts["kafka-tls"]["readOnly"] is True
    assert volumes["kafka-tls"]["secret"] == {
        "secretName": "loopwatch-kafka-ca",
        "defaultMode": 0o440,
        "items": [{"key": "ca.crt", "path": ca.name}],
    }
    # The keys: the whole Secret as a directory, no subPath and no items, so that rotated keys
    # (a new Secret key, a removed one) reach the running worker.
    keys = e["LOOPWATCH_SIGNING_KEYS"]["value"]
    assert mounts["signing-keys"] == {"name": "signing-keys", "mountPath": keys, "readOnly": True}
    assert volumes["signing-keys"]["secret"] == {"secretName": "loopwatch-signing-keys", "defaultMode": 0o440}


def test_signing_is_off_by_default(default_manifest: str) -> None:
    assert "LOOPWATCH_SIGNING_KEYS" not in env(default_manifest)
    (sts,) = by_kind(default_manifest)["StatefulSet"]
    assert "signing-keys" not in {v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]}


def test_custom_loop_detection_config(custom_manifest: str) -> None:
    cm = next(d for d in by_kind(custom_manifest)["ConfigMap"] if d["metadata"]["name"].endswith("-config"))
    config = yaml.safe_load(cm["data"]["loop-detection.yaml"])
    assert config["tools"]["loopDetection"]["warningThreshold"] == 8
    assert config["tools"]["loopDetection"]["postCompactionGuard"] == {"windowSize": 12}
    assert [a["id"] for a in config["agents"]["list"]] == ["safe-runner", "research-bot"]
    assert config["agents"]["list"][0]["tools"]["loopDetection"] == {"warningThreshold": 5, "criticalThreshold": 10}
    options = config["loopwatch"]
    assert {k: options[k] for k in ("profile", "abortAfterCriticalBlocks", "surfaceWarnings")} == {
        "profile": "configurable-final",
        "abortAfterCriticalBlocks": 3,
        "surfaceWarnings": True,
    }
    assert (
        options["scope"],
        options["detectors"],
        options["fleetIncidents"]["enabled"],
        options["fleetIncidents"]["minRuns"],
    ) == ("session", {"cycle": True}, True, 10)


def test_custom_monitoring_objects(custom_manifest: str) -> None:
    kinds = by_kind(custom_manifest)
    (sm,) = kinds["ServiceMonitor"]
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["namespace"] == "monitoring"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["endpoints"][0]["port"] == "http-metrics"
    assert sm["spec"]["endpoints"][0]["interval"] == "15s"
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    metrics_service = next(s for s in kinds["Service"] if not s["metadata"]["name"].endswith("-headless"))
    for key, value in sm["spec"]["selector"]["matchLabels"].items():
        assert metrics_service["metadata"]["labels"][key] == value
    headless = next(s for s in kinds["Service"] if s["metadata"]["name"].endswith("-headless"))
    assert not all(headless["metadata"]["labels"].get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())

    (rule,) = kinds["PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    source = yaml.safe_load((CHART / "files" / "alerts.rules.yml").read_text())
    rendered = rule["spec"]["groups"]
    assert [g["name"] for g in rendered] == [g["name"] for g in source["groups"]]
    for got, want in zip(rendered, source["groups"]):
        for r_got, r_want in zip(got["rules"], want["rules"], strict=True):
            assert r_got["expr"] == r_want["expr"]
            assert r_got["annotations"] == r_want["annotations"]
            assert r_got["labels"] == {**r_want["labels"], "team": "agents-platform"}

    maps = [d for d in kinds["ConfigMap"] if "dashboard" in d["metadata"]["name"]]
    assert all(m["metadata"]["namespace"] == "monitoring" for m in maps)
    assert all(m["metadata"]["annotations"]["grafana_folder"] == "Agents / Loopwatch" for m in maps)


def test_dashboard_label_is_configurable(helm: str) -> None:
    manifest = render(
        helm,
        "--set",
        "dashboards.label=grafana_dashboard_loopwatch",
        "--set",
        "dashboards.labelValue=yes",
        "--set",
        "dashboards.folderAnnotation=k8s-sidecar-target-directory",
        "--set",
        "dashboards.folder=/tmp/dashboards/loopwatch",
    )
    maps = [d for d in by_kind(manifest)["ConfigMap"] if "dashboard" in d["metadata"]["name"]]
    assert len(maps) == 2
    for m in maps:
        assert m["metadata"]["labels"]["grafana_dashboard_loopwatch"] == "yes"
        assert "grafana_dashboard" not in m["metadata"]["labels"]
        assert m["metadata"]["annotations"]["k8s-sidecar-target-directory"] == "/tmp/dashboards/loopwatch"


# ------------------------------------------------------------------ invalid values are refused


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "kafka.securityProtocol=SASL_SSH"], "securityProtocol"),
        (["--set", "replicaCount=-1"], "replicaCount"),
        (["--set", "kafka.bootstrapServers=kafka"], "bootstrapServers"),
        (["--set", "resources.limits.memory=lots"], "memory"),
        (["--set", "unknownKey=1"], "unknownKey"),
        (["--set", "worker.memberWatchdogSeconds=0"], "memberWatchdogSeconds"),
        (["--set", "kafka.securityProtocol=SSL"], "kafka.tls.existingSecret"),
        (["--set", "kafka.securityProtocol=SASL_PLAINTEXT"], "kafka.sasl.existingSecret"),
        (
            ["--set", "kafka.securityProtocol=SASL_PLAINTEXT", "--set", "kafka.sasl.existingSecret=s"],
            "kafka.sasl.username",
        ),
        (["--set", "kafka.sasl.mechanism=GSSAPI"], "mechanism"),
        (
            ["--set", "kafka.securityProtocol=SSL", "--set", "kafka.tls.existingSecret=s", "--set", "kafka.tls.caKey="],
            "caKey",
        ),
        (
            [
                "--set",
                "kafka.securityProtocol=SSL",
                "--set",
                "kafka.tls.existingSecret=s",
                "--set",
                "kafka.tls.keyKey=",
            ],
            "kafka.tls.certKey and kafka.tls.keyKey go together",
        ),
        (["--set", "signing.enabled=true"], "signing.enabled needs signing.existingSecret"),
        (["--set", "signing.enable=true"], "enable"),
        (["--set", "detectionConfig.tools.loopDetection.warningThreshold=25"], "warningThreshold"),
        (
            [
                "--set",
                "detectionConfig.agents.list[0].id=a",
                "--set",
                "detectionConfig.agents.list[0].tools.loopDetection.criticalThreshold=40",
            ],
            "agent a",
        ),
        (["--set", "detectionConfig.loopwatch.profile=newest"], "profile"),
        (
            [
                "--set",
                "detectionConfig.loopwatch.profile=latest",
                "--set",
                "detectionConfig.agents.list[0].id=a",
                "--set",
                "detectionConfig.agents.list[0].loopwatch.profile=configurable-final",
                "--set",
                "detectionConfig.tools.loopDetection.warningThreshold=25",
            ],
            "warningThreshold",
        ),
        (["--set", "detectionConfig.loopwatch.scope=trace"], "scope"),
        (
            [
                "--set",
                "detectionConfig.agents.list[0].id=a",
                "--set",
                "detectionConfig.agents.list[0].loopwatch.scope=session",
            ],
            "scope",
        ),
        (
            ["--set", "detectionConfig.loopwatch.fleetIncidents.minAgents=30"],
            "minAgents (30) must not exceed minRuns (20)",
        ),
        (["--set", "detectionConfig.loopwatch.fleetIncidents.hopSeconds=600"], "hopSeconds (600) must not exceed"),
        (
            ["--set", "detectionConfig.loopwatch.agentRings.warningThreshold=5"],
            "agentRings: warningThreshold (5) must be lower than criticalThreshold (5)",
        ),
    ],
    ids=[
        "protocol",
        "replicas",
        "bootstrap",
        "quantity",
        "unknown-key",
        "member-watchdog-zero",
        "tls-secret",
        "sasl-secret",
        "sasl-username",
        "sasl-mechanism",
        "tls-no-ca",
        "tls-half-mtls",
        "signing-secret",
        "signing-typo",
        "thresholds",
        "agent-thresholds",
        "profile",
        "thresholds-read-by-a-final-agent",
        "scope",
        "agent-scope",
        "fleet-agents",
        "fleet-hop",
        "ring-thresholds",
    ],
)
def test_invalid_values_are_refused(helm: str, args: list[str], message: str) -> None:
    result = template(helm, *args)
    assert result.returncode != 0, f"accepted: {args}"
    assert message in result.stderr, result.stderr


def test_profile_latest_ignores_thresholds(helm: str, tmp_path: Path) -> None:
    """Profile latest reads only `enabled`: misordered (retired) thresholds are accepted, and the
    rendered config is one `loopwatch config check` accepts, warning about the retired keys."""
    manifest = render(
        helm,
        "--set",
        "detectionConfig.loopwatch.profile=latest",
        "--set",
        "detectionConfig.tools.loopDetection.warningThreshold=25",
        "--set",
        "detectionConfig.agents.list[0].id=a",
        "--set",
        "detectionConfig.agents.list[0].loopwatch.profile=latest",
        "--set",
        "detectionConfig.agents.list[0].tools.loopDetection.criticalThreshold=3",
    )
    cm = next(d for d in by_kind(manifest)["ConfigMap"] if d["metadata"]["name"].endswith("-config"))
    path = tmp_path / "loop-detection.yaml"
    path.write_text(cm["data"]["loop-detection.yaml"])
    check = subprocess.run(
        [sys.executable, "-m", "streams.cli", "config", "check", str(path), "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["a"]["profile"] == "latest"
    assert "tools.loopDetection.warningThreshold: retired under profile latest" in check.stderr


def test_existing_configmap(helm: str) -> None:
    manifest = render(helm, "--set", "detectionConfig.existingConfigMap=team-thresholds")
    assert not any(d["metadata"]["name"].endswith("-config") for d in by_kind(manifest)["ConfigMap"])
    (sts,) = by_kind(manifest)["StatefulSet"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "team-thresholds"


def test_no_candidate_config_by_default(default_manifest: str) -> None:
    assert "LOOPWATCH_CANDIDATE_CONFIG" not in env(default_manifest)
    (sts,) = by_kind(default_manifest)["StatefulSet"]
    assert "candidate-config" not in {v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]}


def test_candidate_config_from_a_configmap(helm: str, kubeconform: str, k8s_schema_root: Path) -> None:
    manifest = render(
        helm,
        "--set",
        "detectionConfig.candidateConfigMap=try-stricter",
        "--set",
        "kafka.topics.shadowVerdicts=lv-shadow",
    )
    kubeconform_check(kubeconform, k8s_schema_root, manifest)
    e = env(manifest)
    assert e["LOOPWATCH_CANDIDATE_CONFIG"]["value"] == "/etc/loopwatch-candidate/candidate.yaml"
    assert e["LOOPWATCH_SHADOW_VERDICTS_TOPIC"]["value"] == "lv-shadow"
    (sts,) = by_kind(manifest)["StatefulSet"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["candidate-config"]["configMap"] == {
        "name": "try-stricter",
        "items": [{"key": "candidate.yaml", "path": "candidate.yaml"}],
    }
    mounts = {m["name"]: m for m in container(manifest)["volumeMounts"]}
    assert mounts["candidate-config"] == {
        "name": "candidate-config",
        "mountPath": "/etc/loopwatch-candidate",
        "readOnly": True,
    }
    # The worker takes the file as its candidate, beside the live config.
    from streams.app.settings import Settings

    pod_env = {k: v.get("value", f"{RELEASE}-loopwatch-0") for k, v in e.items()}
    settings = Settings.from_env(pod_env)
    assert str(settings.candidate_config) == "/etc/loopwatch-candidate/candidate.yaml"
    assert settings.shadow_verdicts_topic == "lv-shadow"


def test_persistence_disabled_uses_emptydir(helm: str, kubeconform: str, k8s_schema_root: Path) -> None:
    manifest = render(helm, "--set", "persistence.enabled=false")
    (sts,) = by_kind(manifest)["StatefulSet"]
    assert "volumeClaimTemplates" not in sts["spec"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes["data"]
    kubeconform_check(kubeconform, k8s_schema_root, manifest)


# ------------------------------------------------------------------ NOTES.txt


def render_notes(helm: str, tmp_path: Path, *args: str) -> str:
    """helm template cannot render NOTES.txt, so render it through `tpl` in a copy of the chart."""
    chart = tmp_path / "loopwatch"
    shutil.copytree(CHART, chart)
    (chart / "files" / "NOTES.txt").write_text((CHART / "templates" / "NOTES.txt").read_text())
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n"
        'data:\n  notes: {{ tpl (.Files.Get "files/NOTES.txt") . | quote }}\n'
    )
    result = run(
        [
            helm,
            "template",
            RELEASE,
            str(chart),
            "--namespace",
            NAMESPACE,
            "--kube-version",
            KUBE_VERSION,
            "--show-only",
            "templates/zz-notes.yaml",
            *args,
        ]
    )
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["data"]["notes"]


def test_notes(helm: str, tmp_path: Path) -> None:
    notes = render_notes(helm, tmp_path)
    assert "Parallelism: min(replicas=2, partitions=6) = 2" in notes
    assert "WARNING" not in notes
    notes = render_notes(helm, tmp_path / "more", "--set", "replicaCount=8")
    assert "= 6 worker(s)" in notes and "2 worker(s) will hold no partition" in notes


def test_env_names_are_read_by_the_worker(default_manifest: str, custom_manifest: str, secure_manifest: str) -> None:
    """The chart sets only variables streams.app.settings.Settings knows."""
    try:
        import dataclasses

        from streams.app.settings import PREFIX, Settings, env_name
    except ImportError as exc:  # the worker's settings module is not importable here
        pytest.skip(f"streams.app.settings not importable: {exc}")
    known = {env_name(f.name) for f in dataclasses.fields(Settings)}
    rendered = set(env(default_manifest)) | set(env(custom_manifest)) | set(env(secure_manifest))
    ours = {name for name in rendered if name.startswith(PREFIX)}
    assert ours - known == set()
