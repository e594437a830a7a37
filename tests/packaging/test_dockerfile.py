"""The worker image's Dockerfile, read as Docker reads it (instructions, continuation lines,
shell words): the image installs loopwatch with the worker extra from the files it copies, and
runs ``loopwatch worker``.  No Docker daemon is needed."""

from __future__ import annotations

import json
import shlex
import tomllib

from harness import REPO

DOCKERFILE = REPO / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def pip_installs() -> list[list[str]]:
    """The targets of every ``pip install`` in a RUN, as the shell splits them."""
    targets = []
    for word, rest in instructions():
        if word != "RUN":
            continue
        for command in rest.split("&&"):
            argv = shlex.split(command)
            if argv[:2] == ["pip", "install"]:
                targets.append([a for a in argv[2:] if not a.startswith("-")])
    return targets


def pyproject() -> dict:
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def test_the_image_installs_loopwatch_with_the_worker_extra():
    assert pip_installs() == [[".[worker]"]]
    assert "worker" in pyproject()["project"]["optional-dependencies"]


def test_the_image_runs_loopwatch_worker():
    found = dict(instructions())
    assert json.loads(found["ENTRYPOINT"]) == ["loopwatch"]
    assert json.loads(found["CMD"]) == ["worker"]
    assert "loopwatch" in pyproject()["project"]["scripts"]


def test_the_image_copies_what_the_build_reads():
    copied = set()
    for word, rest in instructions():
        if word == "COPY":
            copied.update(p.rstrip("/") for p in shlex.split(rest)[:-1])
    project = pyproject()
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert {"pyproject.toml", project["project"]["readme"], *packages} <= copied
