"""Docker, and the container runtimes it feeds: the mechanism under `localkube.images`.

Owns: a Docker daemon that answers (dockerd started in the background when none does), `docker
build` from a context streamed as a tar of exactly the files the caller names, asking Docker
about an image, and loading built images into a cluster's runtime: `docker save | ctr import`
into a containerd (skipped for images it already holds), or `kind load docker-image`.

Never: decides what to build or from which files (that is `images`), pulls an image, or stops a
daemon it did not start.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO

from . import config
from .processes import log_tail

__all__ = [
    "BUILD_STAGE_LABEL",
    "ImageError",
    "docker_build",
    "docker_cli",
    "docker_reference",
    "ensure_docker",
    "image_cache_dir",
    "image_exists",
    "image_id",
    "image_size",
    "load_into_containerd",
    "load_into_kind",
    "prune_build_stages",
]

log = logging.getLogger(__name__)

# dockerd, once started here, runs for the rest of the machine's session; the reference keeps
# Python from reaping the Popen (and warning about it) while this process lives.
_started_daemons: list[subprocess.Popen[bytes]] = []


# The label project Dockerfiles put on their build stage (`FROM … AS build`).
BUILD_STAGE_LABEL = "io.gregor.build-stage"


class ImageError(RuntimeError):
    """A step of building or loading images failed; the message says which, and where its log is."""


def image_cache_dir() -> Path:
    """`${GREGOR_CACHE:-~/.cache/gregor}/images`: rootfs tarballs and logs, outside the repo."""
    path = config.cache_dir() / "images"
    path.mkdir(parents=True, exist_ok=True)
    return path


# Docker --------------------------------------------------------------------------------------


def docker_cli() -> str:
    """The docker command's path; ImageError if it is not installed."""
    docker = shutil.which("docker")
    if docker is None:
        raise ImageError("the docker command is not installed (apt-get install docker.io)")
    return docker


def _daemon_error() -> str | None:
    """None if a Docker daemon answers `docker info`, else what the client said."""
    try:
        result = subprocess.run(
            [docker_cli(), "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "docker info did not answer within 30 s"
    return None if result.returncode == 0 else (result.stderr.strip() or "docker info failed")


def ensure_docker(timeout: float = 60.0) -> None:
    """A Docker daemon that answers `docker info`: the one running, or dockerd started here in
    its own session (it outlives this process), logging to `<cache>/dockerd.log`."""
    error = _daemon_error()
    if error is None:
        return
    if os.environ.get("DOCKER_HOST"):
        raise ImageError(
            f"DOCKER_HOST={os.environ['DOCKER_HOST']} does not answer ({error}); start that "
            "daemon: dockerd is started here only for the local socket"
        )
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise ImageError(
            "no Docker daemon answers and dockerd is not installed: "
            "apt-get install docker.io iptables"
        )
    if os.geteuid() != 0:
        raise ImageError(f"no Docker daemon answers ({error}), and starting dockerd needs root")
    log_path = image_cache_dir() / "dockerd.log"
    log.info("starting dockerd (log: %s)", log_path)
    with log_path.open("ab") as log_file:
        process = subprocess.Popen(
            [dockerd],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _started_daemons.append(process)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _daemon_error() is None:
            log.info("dockerd %d answers", process.pid)
            return
        if process.poll() is not None:
            raise ImageError(
                f"dockerd exited with status {process.returncode}; its log, {log_path}, "
                f"ends with:\n{log_tail(log_path, 20)}"
            )
        time.sleep(0.5)
    raise ImageError(f"dockerd did not answer within {timeout:.0f}s; see {log_path}")


def image_exists(ref: str) -> bool:
    result = subprocess.run(
        [docker_cli(), "image", "inspect", ref], capture_output=True, check=False
    )
    return result.returncode == 0


def image_size(ref: str) -> int:
    """The image's size in bytes, as `docker images` reports it (all its layers)."""
    result = subprocess.run(
        [docker_cli(), "image", "inspect", "--format", "{{.Size}}", ref],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(result.stdout.strip())


def _tar_filter(executable: bool) -> Callable[[tarfile.TarInfo], tarfile.TarInfo]:
    def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        # Whole seconds: a fractional mtime makes tarfile write a PAX header first, and then the
        # docker CLI, which sniffs the first 512 bytes of stdin, takes the tar for a Dockerfile.
        info.mtime = int(info.mtime)
        if executable:
            info.mode = 0o755
        return info

    return normalise


def docker_build(
    tag: str,
    dockerfile: str,
    files: Iterable[tuple[str, Path]],
    build_args: Mapping[str, str] | None = None,
    executables: frozenset[str] = frozenset(),
) -> None:
    """`docker build` with a context streamed as a tar of exactly `files` (name in context,
    path), so nothing else on disk is sent; `executables` are added with mode 0755."""
    command = [docker_cli(), "build", "--tag", tag, "--file", dockerfile]
    for name, value in (build_args or {}).items():
        command += ["--build-arg", f"{name}={value}"]
    command.append("-")
    log.info("building %s from %s", tag, dockerfile)
    previous = _image_id(tag)
    process = subprocess.Popen(command, stdin=subprocess.PIPE)
    stdin: IO[bytes] | None = process.stdin
    assert stdin is not None
    try:
        with tarfile.open(fileobj=stdin, mode="w|", format=tarfile.GNU_FORMAT) as tar:
            for name, path in files:
                tar.add(
                    path, arcname=name, recursive=False, filter=_tar_filter(name in executables)
                )
    except BrokenPipeError:
        pass  # docker stopped reading; its status says why
    except BaseException:
        process.kill()
        process.wait()
        raise
    finally:
        with contextlib.suppress(BrokenPipeError):
            stdin.close()
    if process.wait() != 0:
        raise ImageError(f"docker build of {tag} ({dockerfile}) failed: see its output above")
    # The image the tag named before is untagged now: remove it (and the layers only it used)
    # rather than leave most of a gigabyte behind on every rebuild of the Spark image. Build
    # stages are separate images and stay, as Docker's cache for the next build.
    if previous is not None and previous != _image_id(tag):
        subprocess.run([docker_cli(), "rmi", previous], capture_output=True, check=False)


def prune_build_stages(keep: int = 2) -> list[str]:
    """Remove the untagged build-stage images (labelled BUILD_STAGE_LABEL) that older builds
    left behind, keeping the `keep` newest of each stage as Docker's cache for the next build
    (two: a checkout and a worktree built in turn both keep theirs). Every source change makes
    a new stage image of up to a gigabyte; without this they fill the disk, and a kubelet short
    of disk schedules no more pods. Returns the ids removed."""
    listed = subprocess.run(
        [docker_cli(), "images", "--quiet", "--no-trunc", "--filter", "dangling=true",
         "--filter", f"label={BUILD_STAGE_LABEL}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    ids = sorted(set(listed.stdout.split()))
    if listed.returncode != 0 or len(ids) <= keep:
        return []
    inspected = subprocess.run(
        [docker_cli(), "image", "inspect", *ids], capture_output=True, text=True, check=False
    )
    if inspected.returncode != 0:
        return []
    kept: dict[str, int] = {}
    stale = []
    for image in sorted(json.loads(inspected.stdout), key=_created, reverse=True):
        stage = ((image.get("Config") or {}).get("Labels") or {}).get(BUILD_STAGE_LABEL, "")
        kept[stage] = kept.get(stage, 0) + 1
        if kept[stage] > keep:
            stale.append(image["Id"])
    if stale:
        log.info("removing %d build-stage images older builds left behind", len(stale))
        subprocess.run([docker_cli(), "rmi", *stale], capture_output=True, check=False)
    return stale


def _created(image: Mapping[str, str]) -> str:
    """An image's creation time as a sortable string: RFC 3339 with the fraction padded to
    nanoseconds (Docker drops its trailing zeros)."""
    created = image.get("Created", "")
    seconds, _, fraction = created.rstrip("Z").partition(".")
    return f"{seconds}.{fraction.ljust(9, '0')}"


# Loading into a cluster's runtime ------------------------------------------------------------


def load_into_containerd(images: Sequence[str], *, address: str, namespace: str = "k8s.io") -> None:
    """`docker save | ctr images import -` into containerd's `namespace` (k8s.io is the one the
    kubelet's CRI sees), unpacked for its default snapshotter. An image containerd already
    holds with the same config digest (Docker's image id) is not sent again."""
    ctr = shutil.which("ctr")
    if ctr is None:
        raise ImageError("ctr is not installed (apt-get install containerd)")
    command = [ctr, "--namespace", namespace, "--address", address]
    held = _containerd_config_digests(command, [docker_reference(i) for i in images])
    missing = [i for i in images if held.get(docker_reference(i)) != _image_id(i)]
    if not missing:
        log.info("containerd %s (%s) already holds %s", address, namespace, list(images))
        return
    save = subprocess.Popen([docker_cli(), "save", *missing], stdout=subprocess.PIPE)
    try:
        imported = subprocess.run(
            [*command, "images", "import", "-"],
            stdin=save.stdout,
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        if save.stdout is not None:
            save.stdout.close()
        saved = save.wait()
    if saved != 0 or imported.returncode != 0:
        raise ImageError(
            f"loading {missing} into containerd at {address} failed "
            f"(docker save: {saved}, ctr import: {imported.returncode}): {imported.stderr.strip()}"
        )
    log.info("imported into containerd %s (%s): %s", address, namespace, imported.stdout.strip())


def docker_reference(tag: str) -> str:
    """The fully qualified name Docker and containerd give a short tag: `gregor-broker:dev` is
    `docker.io/library/gregor-broker:dev`, `gregor/pause:3.10` is `docker.io/gregor/pause:3.10`."""
    first, _, rest = tag.partition("/")
    if not rest:
        return f"docker.io/library/{tag}"
    if "." in first or ":" in first or first == "localhost":
        return tag
    return f"docker.io/{tag}"


def _containerd_config_digests(ctr: Sequence[str], references: Sequence[str]) -> dict[str, str]:
    """For each of `references` containerd holds, the config digest its manifest names."""
    listed = subprocess.run(
        [*ctr, "images", "ls"], capture_output=True, text=True, check=False
    ).stdout
    manifests = {
        fields[0]: fields[2]
        for fields in (line.split() for line in listed.splitlines()[1:])
        if len(fields) >= 3 and fields[0] in references
    }
    digests: dict[str, str] = {}
    for reference, manifest in manifests.items():
        content = subprocess.run(
            [*ctr, "content", "get", manifest], capture_output=True, text=True, check=False
        )
        try:
            digests[reference] = json.loads(content.stdout)["config"]["digest"]
        except (ValueError, KeyError, TypeError):
            continue  # an index or a damaged record: import again
    return digests


def image_id(tag: str) -> str | None:
    """Docker's id of the image `tag` names (its config digest), None if there is none."""
    return _image_id(tag)


def _image_id(tag: str) -> str | None:
    """Docker's id of the image `tag` names (its config digest), None if there is none."""
    found = subprocess.run(
        [docker_cli(), "image", "inspect", "--format", "{{.Id}}", tag],
        capture_output=True,
        text=True,
        check=False,
    )
    return found.stdout.strip() if found.returncode == 0 else None


def load_into_kind(images: Sequence[str], cluster: str = "kind") -> None:
    """`kind load docker-image` of `images` into every node of the kind cluster `cluster`."""
    kind = shutil.which("kind")
    if kind is None:
        raise ImageError("kind is not installed")
    subprocess.run([kind, "load", "docker-image", "--name", cluster, *images], check=True)
