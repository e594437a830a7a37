"""The worker container as the chart deploys it, on this machine: ``helm template`` renders the
chart with a values file, and ``ChartPod`` does what the kubelet would do with the
StatefulSet's pod template: resolve ``secretKeyRef`` variables from given Secret contents,
materialise ``secret``/``configMap``/``emptyDir`` volumes in local directories (with the
kubelet's ``..data`` symlink layout, so updates are atomic swaps as in a cluster), and map
every variable that names a mounted path to the local directory.  The tests then run the
worker with that environment, so the settings they prove are the chart's.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import yaml

from harness import REPO

sys.path.insert(0, str(REPO / "tests" / "ops"))
import opsutil  # noqa: E402  (tests/ops: finds helm the way the chart tests do)

# Variables the test machine decides, not the chart: several workers share one host here, and
# each gets its own ports and static-membership instance id (the pod name, a fieldRef) from the
# harness.
HOST_SPECIFIC = ("LOOPWATCH_WEB_HOST", "LOOPWATCH_WEB_PORT", "LOOPWATCH_METRICS_PORT", "LOOPWATCH_INSTANCE_ID")


def render(values: Path, *set_values: str) -> list[dict]:
    helm = opsutil.find_tool("helm")
    args = [
        helm,
        "template",
        "lw",
        str(opsutil.CHART),
        "--namespace",
        "agents",
        "--kube-version",
        opsutil.KUBE_VERSION,
        "-f",
        str(values),
    ]
    for item in set_values:
        args += ["--set", item]
    result = opsutil.run(args)
    if result.returncode != 0:
        raise RuntimeError(f"helm template failed: {result.stderr}")
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def write_volume(directory: Path, files: Mapping[str, bytes]) -> None:
    """(Re)write a Secret/ConfigMap volume the way the kubelet does: the files go into a new
    hidden directory, ``..data`` is swapped to it in one rename, and each name is a symlink
    through ``..data``."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
    stamp.mkdir()
    for name, content in files.items():
        (stamp / name).write_bytes(content)
    old = (directory / "..data").resolve() if (directory / "..data").exists() else None
    tmp = directory / "..data_tmp"
    if tmp.is_symlink():
        tmp.unlink()
    os.symlink(stamp.name, tmp)
    os.replace(tmp, directory / "..data")
    for name in files:
        link = directory / name
        if not link.is_symlink():
            os.symlink(f"..data/{name}", link)
    for entry in directory.iterdir():
        if entry.is_symlink() and not entry.name.startswith("..") and entry.name not in files:
            entry.unlink()
    if old is not None and old != stamp.resolve():
        shutil.rmtree(old, ignore_errors=True)


class ChartPod:
    """One worker pod of the rendered chart, materialised under ``root``."""

    def __init__(self, values: Path, root: Path, *, secrets: Mapping[str, Mapping[str, bytes]], set_values=()) -> None:
        self.docs = render(values, *set_values)
        self.root = root
        self.secrets = {name: dict(data) for name, data in secrets.items()}
        (sts,) = [d for d in self.docs if d["kind"] == "StatefulSet"]
        spec = sts["spec"]["template"]["spec"]
        (self.container,) = spec["containers"]
        self.volumes = {v["name"]: v for v in spec["volumes"]}
        for claim in sts["spec"].get("volumeClaimTemplates", []):
            self.volumes[claim["metadata"]["name"]] = {"name": claim["metadata"]["name"], "emptyDir": {}}
        self.mounts = {m["name"]: m["mountPath"] for m in self.container["volumeMounts"]}
        self.configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in self.docs if d["kind"] == "ConfigMap"}
        for name in self.mounts:
            self.refresh(name)

    def local(self, volume: str) -> Path:
        return self.root / volume

    def refresh(self, volume: str) -> None:
        """Write the volume's files as its source now holds them."""
        source = self.volumes[volume]
        directory = self.local(volume)
        if "emptyDir" in source:
            directory.mkdir(parents=True, exist_ok=True)
            return
        if "secret" in source:
            data = self.secrets[source["secret"]["secretName"]]
            items = source["secret"].get("items")
        elif "configMap" in source:
            data = {k: v.encode() for k, v in self.configmaps[source["configMap"]["name"]].items()}
            items = source["configMap"].get("items")
        else:
            raise ValueError(f"volume {volume}: kind not simulated: {source}")
        files = {item["path"]: data[item["key"]] for item in items} if items else dict(data)
        write_volume(directory, files)

    def update_secret(self, name: str, data: Mapping[str, bytes]) -> None:
        """A Secret changed in the cluster: the kubelet swaps every volume made from it."""
        self.secrets[name] = dict(data)
        for volume, source in self.volumes.items():
            if volume in self.mounts and source.get("secret", {}).get("secretName") == name:
                self.refresh(volume)

    def environment(self) -> dict[str, str]:
        """The container's variables with Secrets resolved and mounted paths made local
        (without the host-specific ones: ``HOST_SPECIFIC``)."""
        env: dict[str, str] = {}
        for item in self.container["env"]:
            name = item["name"]
            if name in HOST_SPECIFIC:
                continue
            if "valueFrom" in item:
                ref = item["valueFrom"]["secretKeyRef"]
                env[name] = self.secrets[ref["name"]][ref["key"]].decode()
                continue
            value = str(item["value"])
            mounted = [
                (path, volume) for volume, path in self.mounts.items() if value == path or value.startswith(path + "/")
            ]
            if mounted:
                path, volume = max(mounted)  # the deepest mount holds the path
                value = str(self.local(volume)) + value[len(path) :]
            env[name] = value
        return env
