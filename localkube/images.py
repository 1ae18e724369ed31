"""Container images for Gregor and its local cluster, built with Docker and no registry.

Owns which images there are and what each is built from: the Debian bookworm base made with
debootstrap (`gregor/debian:bookworm`, its rootfs tarball cached under
`${GREGOR_CACHE:-~/.cache/gregor}/images/`), Debian's Python 3.11 on top of it
(`gregor/python:3.11-bookworm`, the stand-in for `python:3.11-slim-bookworm`), the project
images built from `images/` (`gregor-broker:dev`, `gregor-operator:dev`, `gregor-spark:dev`),
and the small images the local Kubernetes cluster runs (pause, CoreDNS, local-path-provisioner)
from binaries the caller hands over. Talking to Docker, and loading images into containerd or
kind, is `localkube.docker`.

Never: pulls an image (every FROM is built here, or is the caller's choice of BASE_IMAGE) or
writes inside the repository. Builds go through the classic builder or BuildKit alike: the
Dockerfiles use nothing only one of them understands.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .context import context_files, dockerfile_args, parse_dockerignore
from .docker import (
    ImageError,
    docker_build,
    docker_cli,
    ensure_docker,
    image_cache_dir,
    image_exists,
    image_size,
    load_into_containerd,
    prune_build_stages,
)
from .host import mounts_under, unmount_under
from .processes import log_tail

log = logging.getLogger(__name__)

DEBIAN_IMAGE = "gregor/debian:bookworm"
"""The debootstrapped Debian base: the FROM of everything built here."""
PYTHON_IMAGE = "gregor/python:3.11-bookworm"
"""Debian's Python 3.11 on DEBIAN_IMAGE: the BASE_IMAGE where no registry is reachable."""
UPSTREAM_BASE = "python:3.11-slim-bookworm"
"""The Dockerfiles' default BASE_IMAGE, for users who can pull it."""
PROJECT_IMAGES = ("broker", "operator", "spark")
PROJECT_TAG = "dev"
PAUSE_TAG = "3.10"
"""The tag of gregor/pause (not our pause program's own version, `versions.PAUSE_VERSION`):
Kubernetes 1.31+ expects pause 3.10 as the sandbox image."""

_SUITE = "bookworm"
_MIRROR = "http://deb.debian.org/debian"
_SECURITY_MIRROR = "http://deb.debian.org/debian-security"
_CLUSTER_ROLES = ("pause", "coredns", "local-path-provisioner")
LOCAL_PATH_HELPER = "local-path-helper"
"""The role under which build_cluster_images returns the image of local-path-provisioner's
setup and teardown pods: DEBIAN_IMAGE itself, which has the sh, mkdir, rm and chmod they run."""


# Paths ---------------------------------------------------------------------------------------


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def images_dir() -> Path:
    return repo_root() / "images"


def cluster_image_dir() -> Path:
    """Where the Dockerfiles of the local cluster's images live, one folder per role."""
    return images_dir() / "cluster"


def image_tag_for(binary: Path) -> str:
    """A tag that changes whenever the binary does: the first 12 hex digits of its SHA-256."""
    digest = hashlib.sha256()
    with binary.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:12]


def _declared_args(dockerfile: Path, wanted: Mapping[str, str]) -> dict[str, str]:
    """The build args among `wanted` that the Dockerfile declares (Docker warns about others)."""
    declared = dockerfile_args(dockerfile.read_text())
    return {name: value for name, value in wanted.items() if name in declared}


# The Debian and Python bases -----------------------------------------------------------------


def _architecture() -> str:
    result = subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


def _remove_rootfs(root: Path) -> None:
    """Delete a debootstrap target, unmounting what a failed run left mounted first: deleting
    through a /proc, /sys or bind-mounted /dev would reach the host's."""
    if not root.exists():
        return
    unmount_under(root)
    if left := mounts_under(root):
        raise ImageError(f"{root} still has mounts under it ({left}); not deleting")
    shutil.rmtree(root)


_SOURCES = f"""\
Types: deb
URIs: {_MIRROR}
Suites: {_SUITE} {_SUITE}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: {_SECURITY_MIRROR}
Suites: {_SUITE}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""

# No downloaded .debs, package caches or translations of package descriptions in image layers.
_APT_CLEAN = """\
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
"""  # noqa: E501


def _finish_rootfs(root: Path) -> None:
    """Make a fresh debootstrap target a container base: apt sources with updates and security,
    no services started by package scripts, no caches, no files describing the build host."""
    (root / "etc/apt/sources.list").unlink(missing_ok=True)
    (root / "etc/apt/sources.list.d/debian.sources").write_text(_SOURCES)
    (root / "etc/apt/apt.conf.d/docker-clean").write_text(_APT_CLEAN)
    policy = root / "usr/sbin/policy-rc.d"
    policy.write_text(
        "#!/bin/sh\n# Containers run no init system: packages start no services.\nexit 101\n"
    )
    policy.chmod(0o755)
    for name in ("etc/hostname", "etc/resolv.conf"):
        (root / name).unlink(missing_ok=True)
        (root / name).write_text("")
    for pattern in ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*"):
        for path in root.glob(pattern):
            if path.is_file():
                path.unlink()
    for path in (root / "var/log").rglob("*"):
        if path.is_file():
            path.write_bytes(b"")


def rootfs_tarball() -> Path:
    """The cached `debootstrap --variant=minbase` rootfs of Debian bookworm, made on first use."""
    tarball = image_cache_dir() / f"debian-{_SUITE}-minbase-{_architecture()}.tar"
    if tarball.exists():
        return tarball
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise ImageError("debootstrap is not installed (apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise ImageError("debootstrap needs root")
    root = image_cache_dir() / f"rootfs-{_SUITE}"
    _remove_rootfs(root)
    log_path = image_cache_dir() / "debootstrap.log"
    log.info("debootstrap %s into %s (log: %s)", _SUITE, root, log_path)
    with log_path.open("wb") as log_file:
        result = subprocess.run(
            [
                debootstrap,
                "--variant=minbase",
                f"--arch={_architecture()}",
                _SUITE,
                str(root),
                _MIRROR,
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if result.returncode != 0:
        _remove_rootfs(root)
        raise ImageError(
            f"debootstrap failed; its log, {log_path}, ends with:\n{log_tail(log_path, 20)}"
        )
    _finish_rootfs(root)
    partial = tarball.with_suffix(".partial")
    subprocess.run(
        ["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-cf", str(partial),
         "--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*", "."],
        check=True,
    )  # fmt: skip
    partial.rename(tarball)
    _remove_rootfs(root)
    return tarball


def ensure_debian_image() -> str:
    """`gregor/debian:bookworm`, imported from the cached rootfs tarball if Docker lacks it."""
    ensure_docker()
    if not image_exists(DEBIAN_IMAGE):
        tarball = rootfs_tarball()
        log.info("importing %s as %s", tarball, DEBIAN_IMAGE)
        subprocess.run(
            [docker_cli(), "import", "--change", 'CMD ["bash"]', "--message",
             f"debootstrap --variant=minbase {_SUITE} {_MIRROR}", str(tarball), DEBIAN_IMAGE],
            check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
    return DEBIAN_IMAGE


def extra_ca_certificates() -> list[Path]:
    """The build host's locally added CA certificates (a TLS-inspecting proxy's, a company's),
    which the Python base trusts too so that pip and apt work from inside builds."""
    return sorted(Path("/usr/local/share/ca-certificates").glob("**/*.crt"))


def ensure_base_image() -> str:
    """`gregor/python:3.11-bookworm` (Debian's python3 3.11, venv, pip, `python`) on the
    debootstrapped base: the BASE_IMAGE where python:3.11-slim-bookworm cannot be pulled.
    Warm calls reuse the rootfs tarball, the imported image and Docker's layer cache."""
    debian = ensure_debian_image()
    base = images_dir() / "base"
    files = [("Dockerfile", base / "Dockerfile"), ("certs", base)]
    files += [(f"certs/{cert.name}", cert) for cert in extra_ca_certificates()]
    docker_build(
        PYTHON_IMAGE,
        "Dockerfile",
        files,
        _declared_args(base / "Dockerfile", {"DEBIAN_IMAGE": debian}),
    )
    return PYTHON_IMAGE


# Project and cluster images ------------------------------------------------------------------


def build_project_images(base: str, names: Sequence[str] = PROJECT_IMAGES) -> list[str]:
    """Build `gregor-<name>:dev` from `images/<name>/Dockerfile` on `base` (their BASE_IMAGE),
    with the repository as context minus what `images/.dockerignore` names. Returns the tags."""
    ensure_docker()
    root = repo_root()
    rules = parse_dockerignore((images_dir() / ".dockerignore").read_text())
    files = list(context_files(root, rules))
    tags = []
    for name in names:
        dockerfile = images_dir() / name / "Dockerfile"
        if "BASE_IMAGE" not in dockerfile_args(dockerfile.read_text()):
            raise ImageError(f"{dockerfile} declares no BASE_IMAGE argument")
        tag = f"gregor-{name}:{PROJECT_TAG}"
        docker_build(tag, dockerfile.relative_to(root).as_posix(), files, {"BASE_IMAGE": base})
        tags.append(tag)
    prune_build_stages()
    return tags


def build_cluster_images(
    binaries: Mapping[str, Path], *, versions: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Build the local cluster's images from binaries, keyed by role: `pause` (static, FROM
    scratch), `coredns` and `local-path-provisioner` (FROM gregor/debian). Tags come from
    `versions`, else 3.10 for pause and the binary's digest for the others. Returns the image
    refs by role, with `local-path-helper` (gregor/debian) when local-path-provisioner is built.
    """
    unknown = sorted(set(binaries) - set(_CLUSTER_ROLES))
    if unknown:
        raise ImageError(f"unknown cluster image roles {unknown}; known: {list(_CLUSTER_ROLES)}")
    debian = ensure_debian_image()
    versions = versions or {}
    refs: dict[str, str] = {}
    for role, binary in binaries.items():
        if not binary.is_file():
            raise ImageError(f"the {role} binary {binary} is not a file")
        default = PAUSE_TAG if role == "pause" else image_tag_for(binary)
        ref = f"gregor/{role}:{versions.get(role, default)}"
        dockerfile = cluster_image_dir() / role / "Dockerfile"
        files = [("Dockerfile", dockerfile), (role, binary.resolve())]
        args = _declared_args(dockerfile, {"DEBIAN_IMAGE": debian})
        docker_build(ref, "Dockerfile", files, args, executables=frozenset({role}))
        refs[role] = ref
    if "local-path-provisioner" in binaries:
        refs[LOCAL_PATH_HELPER] = debian
    return refs


SPARK_OPERATOR_IMAGE = "gregor/spark-operator"


def build_spark_operator_image(binary: Path, version: str, spark_image: str) -> str:
    """`gregor/spark-operator:<version>`: the Kubeflow Spark Operator's binary on `spark_image`
    (gregor-spark), whose spark-submit its controller runs. Returns the ref."""
    ensure_docker()
    if not binary.is_file():
        raise ImageError(f"the spark-operator binary {binary} is not a file")
    ref = f"{SPARK_OPERATOR_IMAGE}:{version}"
    dockerfile = cluster_image_dir() / "spark-operator" / "Dockerfile"
    files = [("Dockerfile", dockerfile), ("spark-operator", binary.resolve())]
    args = _declared_args(dockerfile, {"SPARK_IMAGE": spark_image})
    docker_build(ref, "Dockerfile", files, args, executables=frozenset({"spark-operator"}))
    return ref


# Loading into a cluster's runtime ------------------------------------------------------------


# python -m localkube.images ------------------------------------------------------------------


def _role_binary(pair: str) -> tuple[str, Path]:
    role, sep, path = pair.partition("=")
    if not sep or not role or not path:
        raise argparse.ArgumentTypeError(f"{pair!r} is not ROLE=PATH")
    return role, Path(path)


def _megabytes(ref: str) -> str:
    return f"{image_size(ref) / 1e6:.0f} MB"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m localkube.images",
        description="Build Gregor's images with Docker, on a Debian base made here.",
    )
    parser.add_argument(
        "--base-image",
        help=f"BASE_IMAGE of the project images (default: {PYTHON_IMAGE}, built here)",
    )
    parser.add_argument(
        "--images", nargs="*", choices=PROJECT_IMAGES, default=list(PROJECT_IMAGES),
        help="which project images to build (default: all)",
    )  # fmt: skip
    parser.add_argument(
        "--cluster-binary", action="append", type=_role_binary, default=[], metavar="ROLE=PATH",
        help=f"also build a cluster image; ROLE is one of {', '.join(_CLUSTER_ROLES)}",
    )  # fmt: skip
    parser.add_argument(
        "--containerd", metavar="SOCKET", help="load the built images into this containerd"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    timings: list[tuple[str, float]] = []
    built: list[str] = []

    def step(name: str, started: float) -> None:
        timings.append((name, time.monotonic() - started))

    try:
        started = time.monotonic()
        ensure_docker()
        step("docker daemon", started)
        base = args.base_image
        if base is None:
            started = time.monotonic()
            ensure_debian_image()
            step(f"{DEBIAN_IMAGE} (debootstrap, import)", started)
            started = time.monotonic()
            base = ensure_base_image()
            step(PYTHON_IMAGE, started)
            built += [DEBIAN_IMAGE, PYTHON_IMAGE]
        for name in args.images:
            started = time.monotonic()
            built += build_project_images(base, [name])
            step(f"gregor-{name}:{PROJECT_TAG}", started)
        if args.cluster_binary:
            started = time.monotonic()
            refs = build_cluster_images(dict(args.cluster_binary))
            step("cluster images", started)
            built += sorted(set(refs.values()) - set(built))
        if args.containerd:
            started = time.monotonic()
            load_into_containerd(built, address=args.containerd)
            step(f"load into containerd {args.containerd}", started)
    except (ImageError, subprocess.CalledProcessError) as exc:
        print(f"images: {exc}", file=sys.stderr)
        return 1
    print("\nTimes:")
    for name, seconds in timings:
        print(f"  {name:<45} {seconds:7.1f} s")
    print("Images:")
    for ref in built:
        print(f"  {ref:<45} {_megabytes(ref):>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
