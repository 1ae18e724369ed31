"""Container images for Gregor and its local cluster, built with Docker and no registry.

Owns: a Docker daemon that answers (dockerd started in the background when none does), the
Debian bookworm base made with debootstrap (`gregor/debian:bookworm`, its rootfs tarball cached
under `${GREGOR_CACHE:-~/.cache/gregor}/images/`), Debian's Python 3.11 on top of it
(`gregor/python:3.11-bookworm`, the stand-in for `python:3.11-slim-bookworm`), the project
images built from `images/` (`gregor-broker:dev`, `gregor-operator:dev`, `gregor-spark:dev`),
the small images the local Kubernetes cluster runs (pause, CoreDNS, local-path-provisioner)
from binaries the caller hands over, and loading images into containerd or kind.

Never: pulls an image (every FROM is built here, or is the caller's choice of BASE_IMAGE),
writes inside the repository, or stops a daemon it did not start. Builds go through the
classic builder or BuildKit alike: the Dockerfiles use nothing only one of them understands.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO

from . import config
from .context import context_files, dockerfile_args, parse_dockerignore
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
PAUSE_VERSION = "3.10"
"""The tag of gregor/pause; Kubernetes 1.31+ expects pause 3.10 as the sandbox image."""
CONTAINERD_ADDRESS = "/run/containerd/containerd.sock"

_SUITE = "bookworm"
_MIRROR = "http://deb.debian.org/debian"
_SECURITY_MIRROR = "http://deb.debian.org/debian-security"
_CLUSTER_ROLES = ("pause", "coredns", "local-path-provisioner")
LOCAL_PATH_HELPER = "local-path-helper"
"""The role under which build_cluster_images returns the image of local-path-provisioner's
setup and teardown pods: DEBIAN_IMAGE itself, which has the sh, mkdir, rm and chmod they run."""

# dockerd, once started here, runs for the rest of the machine's session; the reference keeps
# Python from reaping the Popen (and warning about it) while this process lives.
_started_daemons: list[subprocess.Popen[bytes]] = []


class ImageError(RuntimeError):
    """A step of building or loading images failed; the message says which, and where its log is."""


# Paths ---------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """`${GREGOR_CACHE:-~/.cache/gregor}/images`: rootfs tarballs and logs, outside the repo."""
    path = config.cache_dir() / "images"
    path.mkdir(parents=True, exist_ok=True)
    return path


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


# Docker --------------------------------------------------------------------------------------


def _docker() -> str:
    docker = shutil.which("docker")
    if docker is None:
        raise ImageError("the docker command is not installed (apt-get install docker.io)")
    return docker


def _daemon_error() -> str | None:
    """None if a Docker daemon answers `docker info`, else what the client said."""
    try:
        result = subprocess.run(
            [_docker(), "info", "--format", "{{.ServerVersion}}"],
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
    log_path = cache_dir() / "dockerd.log"
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
    result = subprocess.run([_docker(), "image", "inspect", ref], capture_output=True, check=False)
    return result.returncode == 0


def image_size(ref: str) -> int:
    """The image's size in bytes, as `docker images` reports it (all its layers)."""
    result = subprocess.run(
        [_docker(), "image", "inspect", "--format", "{{.Size}}", ref],
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
    command = [_docker(), "build", "--tag", tag, "--file", dockerfile]
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
        subprocess.run([_docker(), "rmi", previous], capture_output=True, check=False)


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


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root.resolve()) + "/"
    mounts = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1].encode().decode("unicode_escape")
        if point.startswith(prefix):
            mounts.append(point)
    return sorted(mounts, reverse=True)


def _remove_rootfs(root: Path) -> None:
    """Delete a debootstrap target, unmounting what a failed run left mounted first: deleting
    through a /proc, /sys or bind-mounted /dev would reach the host's."""
    if not root.exists():
        return
    for point in _mounts_under(root):
        subprocess.run(["umount", "--lazy", point], check=False)
    if _mounts_under(root):
        raise ImageError(f"{root} still has mounts under it ({_mounts_under(root)}); not deleting")
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
    tarball = cache_dir() / f"debian-{_SUITE}-minbase-{_architecture()}.tar"
    if tarball.exists():
        return tarball
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise ImageError("debootstrap is not installed (apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise ImageError("debootstrap needs root")
    root = cache_dir() / f"rootfs-{_SUITE}"
    _remove_rootfs(root)
    log_path = cache_dir() / "debootstrap.log"
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
            [_docker(), "import", "--change", 'CMD ["bash"]', "--message",
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
        default = PAUSE_VERSION if role == "pause" else image_tag_for(binary)
        ref = f"gregor/{role}:{versions.get(role, default)}"
        dockerfile = cluster_image_dir() / role / "Dockerfile"
        files = [("Dockerfile", dockerfile), (role, binary.resolve())]
        args = _declared_args(dockerfile, {"DEBIAN_IMAGE": debian})
        docker_build(ref, "Dockerfile", files, args, executables=frozenset({role}))
        refs[role] = ref
    if "local-path-provisioner" in binaries:
        refs[LOCAL_PATH_HELPER] = debian
    return refs


# Loading into a cluster's runtime ------------------------------------------------------------


def load_into_containerd(
    images: Sequence[str], namespace: str = "k8s.io", address: str = CONTAINERD_ADDRESS
) -> None:
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
    save = subprocess.Popen([_docker(), "save", *missing], stdout=subprocess.PIPE)
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


def _image_id(tag: str) -> str | None:
    """Docker's id of the image `tag` names (its config digest), None if there is none."""
    found = subprocess.run(
        [_docker(), "image", "inspect", "--format", "{{.Id}}", tag],
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
