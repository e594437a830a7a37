"""The documentation site: ``mkdocs build --strict`` (what ``make docs`` runs) builds it with no
warning, so a link to a missing page or anchor, in the docs or in the README that is the site's
front page, fails the suite."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )


def test_site_builds_strict_and_its_front_page_is_the_readme(tmp_path: Path) -> None:
    done = build(REPO / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr
    front = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    # Headings of the README, rendered: the hook put it there, with its links made site-relative.
    assert 'id="protect-an-agent"' in front and 'id="start-a-worker-with-detection-on"' in front
    assert '<a href="configuration/">Configuration</a>' in front and 'src="img/demo-metrics.png"' in front
    runbooks = (tmp_path / "site" / "operations" / "index.html").read_text(encoding="utf-8")
    assert 'id="alert-loopwatchloopstorm"' in runbooks


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    """The strictness the first test relies on: a copy of the site with one bad anchor in a page
    and one missing page linked from the README does not build."""
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    (tmp_path / "README.md").write_text(readme + "\n[gone](docs/no-such-page.md)\n", encoding="utf-8")
    with (tmp_path / "docs" / "commands.md").open("a", encoding="utf-8") as page:
        page.write("\n[nowhere](configuration.md#no-such-anchor)\n")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "'no-such-page.md'" in done.stderr and "'#no-such-anchor'" in done.stderr


def test_readme_is_a_front_door() -> None:
    """At most 300 lines: the rest lives on the site's pages."""
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 300
