"""Every ``helm install`` command in the README, the chart's README and docs/*.md, run as written
but as ``helm template`` (same chart, namespace and flags), and the manifest it renders valid
under kubeconform -strict: a command a reader copies deploys."""

from __future__ import annotations

import re
import shlex

import pytest
from opsutil import KUBE_VERSION, REPO, run
from test_helm import kubeconform_check

DOCS = [REPO / "README.md", REPO / "helm" / "loopwatch" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SH_BLOCK = re.compile(r"^```(?:sh|bash|console)\n(.*?)^```$", re.M | re.S)


def helm_installs() -> list[tuple[str, list[str]]]:
    """(where, argv) of each ``helm install`` command in a shell block, continuation lines joined."""
    found = []
    for doc in DOCS:
        for block in SH_BLOCK.findall(doc.read_text(encoding="utf-8")):
            for command in block.replace("\\\n", " ").splitlines():
                if command.strip().startswith("helm install"):
                    found.append((f"{doc.relative_to(REPO)}: {command.strip()[:60]}", shlex.split(command)))
    return found


INSTALLS = helm_installs()


def test_the_docs_show_a_helm_install():
    # The README links the operations page for deploying; these pages show the command.
    for page in ("docs/operations.md", "docs/configuration.md", "helm/loopwatch/README.md"):
        assert any(where.startswith(page) for where, _argv in INSTALLS), page


@pytest.mark.parametrize("argv", [argv for _where, argv in INSTALLS], ids=[where for where, _argv in INSTALLS])
def test_a_documented_helm_install_renders_and_validates(argv, helm, kubeconform, k8s_schema_root):
    assert argv[:2] == ["helm", "install"]
    release, chart, *flags = argv[2:]
    assert (REPO / chart).is_dir(), chart  # the chart path, relative to a clone's root
    result = run([helm, "template", release, str(REPO / chart), "--kube-version", KUBE_VERSION, *flags])
    assert result.returncode == 0, result.stderr
    assert "kind: StatefulSet" in result.stdout
    kubeconform_check(kubeconform, k8s_schema_root, result.stdout)
    for flag, value in zip(flags, flags[1:]):
        if flag == "--set" and value.startswith("kafka.bootstrapServers="):
            servers = value.split("=", 1)[1].replace("\\,", ",")
            assert f"value: {servers!r}".replace("'", '"') in result.stdout  # the list, whole, in LOOPWATCH_BOOTSTRAP


def test_the_readme_helm_line_that_split_at_its_comma_would_fail(helm):
    """The check above is not vacuous: the unescaped list is refused by helm itself."""
    result = run(
        [helm, "template", "lw", str(REPO / "helm" / "loopwatch"), "--set", "kafka.bootstrapServers=a:9093,b:9093"]
    )
    assert result.returncode != 0 or '"a:9093,b:9093"' not in result.stdout
