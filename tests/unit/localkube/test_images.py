"""The pure helpers behind `python -m localkube.images`: Dockerfile ARGs, .dockerignore rules,
the build context they select, and content tags. Building images needs Docker and is not done
here."""

from __future__ import annotations

from pathlib import Path

import pytest

from localkube.context import context_files, dockerfile_args, is_ignored, parse_dockerignore
from localkube.docker import docker_reference
from localkube.images import (
    UPSTREAM_BASE,
    cluster_image_dir,
    image_tag_for,
    images_dir,
    repo_root,
)


@pytest.mark.parametrize("name", ["broker", "operator", "spark"])
def test_project_dockerfiles_default_to_the_upstream_python_base(name: str) -> None:
    args = dockerfile_args((images_dir() / name / "Dockerfile").read_text())
    assert args["BASE_IMAGE"] == UPSTREAM_BASE


def _build_stage(dockerfile: Path) -> list[str]:
    """The instructions of a Dockerfile's first stage (`FROM … AS build` up to the next FROM)."""
    lines = [line for line in dockerfile.read_text().splitlines() if not line.startswith("#")]
    start = lines.index("FROM ${BASE_IMAGE} AS build")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("FROM "))
    return [line for line in lines[start:end] if line.strip()]


def test_the_operator_builds_on_the_brokers_build_stage_so_docker_builds_it_once() -> None:
    broker = _build_stage(images_dir() / "broker" / "Dockerfile")
    assert len(broker) > 3
    assert _build_stage(images_dir() / "operator" / "Dockerfile") == broker


@pytest.mark.parametrize("role", ["coredns", "local-path-provisioner"])
def test_cluster_dockerfiles_build_on_the_debootstrapped_base(role: str) -> None:
    args = dockerfile_args((cluster_image_dir() / role / "Dockerfile").read_text())
    assert args == {"DEBIAN_IMAGE": "gregor/debian:bookworm"}


def test_dockerfile_args_handles_continuations_quotes_and_missing_defaults() -> None:
    text = (
        "# ARG COMMENTED=1\n"
        "ARG BASE_IMAGE=python:3.11-slim-bookworm\n"
        "FROM ${BASE_IMAGE}\n"
        "arg NO_DEFAULT\n"
        'ARG QUOTED="a b" \\\n'
        "    SECOND=2\n"
        "RUN echo ARG NOT_AN_ARG=1\n"
        "ARG BASE_IMAGE=ignored-redeclaration\n"
    )
    assert dockerfile_args(text) == {
        "BASE_IMAGE": "python:3.11-slim-bookworm",
        "NO_DEFAULT": None,
        "QUOTED": "a b",
        "SECOND": "2",
    }


@pytest.mark.parametrize(
    ("path", "ignored"),
    [
        (".venv", True),
        (".venv/bin/python", True),
        ("tools/.venv", False),  # a plain pattern is anchored at the context's root
        ("broker/__pycache__/x.cpython-311.pyc", True),
        ("broker/storage/y.pyc", True),
        ("broker/storage/y.py", False),
        ("gregor.egg-info/PKG-INFO", True),
        ("var", True),
        ("variables.md", False),
        ("docs/keep.md", False),
        ("docs/drop.md", True),
        ("docs/drop.md.bak", False),
        ("build/lib/x.py", False),  # re-included by the last matching rule
    ],
)
def test_dockerignore_rules(path: str, ignored: bool) -> None:
    rules = parse_dockerignore(
        "# comment\n"
        ".venv\n"
        "/var/\n"
        "**/__pycache__\n"
        "**/*.py[co]\n"
        "**/*.egg-info\n"
        "docs/dr?p.md\n"
        "build\n"
        "!build/lib\n"
    )
    assert is_ignored(path, rules) is ignored


def test_context_holds_the_source_and_not_the_virtualenv_or_data(tmp_path: Path) -> None:
    for name in [
        "pyproject.toml",
        "broker/__init__.py",
        "broker/__pycache__/__init__.cpython-311.pyc",
        ".venv/bin/python",
        "var/local/node-1/meta.properties",
        "images/broker/Dockerfile",
    ]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    rules = parse_dockerignore((images_dir() / ".dockerignore").read_text())
    names = sorted(name for name, _ in context_files(tmp_path, rules))
    assert names == ["broker/__init__.py", "images/broker/Dockerfile", "pyproject.toml"]


def test_the_repository_context_leaves_out_local_state() -> None:
    rules = parse_dockerignore((images_dir() / ".dockerignore").read_text())
    names = {name for name, _ in context_files(repo_root(), rules)}
    assert {"pyproject.toml", "README.md", "broker/cli.py", "images/broker/Dockerfile"} <= names
    assert not {n for n in names if n.split("/")[0] in {".venv", "var", ".git", ".mypy_cache"}}
    assert not {n for n in names if "__pycache__" in n}


def test_image_tag_follows_the_binary(tmp_path: Path) -> None:
    binary = tmp_path / "coredns"
    binary.write_bytes(b"v1")
    first = image_tag_for(binary)
    assert first == image_tag_for(binary)
    assert len(first) == 12
    binary.write_bytes(b"v2")
    assert image_tag_for(binary) != first


@pytest.mark.parametrize(
    ("tag", "reference"),
    [
        ("gregor-broker:dev", "docker.io/library/gregor-broker:dev"),
        ("gregor/pause:3.10", "docker.io/gregor/pause:3.10"),
        ("registry.example:5000/team/app:1", "registry.example:5000/team/app:1"),
        ("localhost/app:1", "localhost/app:1"),
    ],
)
def test_short_tags_get_the_names_containerd_gives_them(tag: str, reference: str) -> None:
    assert docker_reference(tag) == reference
