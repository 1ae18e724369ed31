"""Builds the local cluster's binaries from source, once, into a cache outside the repository.

This module owns the recipes (which module, which packages, which version stamps), running the
Go toolchain on the wrapper module that `gomod` writes (so `go build` can compile a module whose
own go.mod replaces its sibling modules with local directories), and the stamps that make a
warm call free. Everything lands in
`${GREGOR_CACHE:-~/.cache/gregor}/localkube/<name>-<version>/bin/`, with Go's module and build
caches beside it, so `make clean` never throws a build away.

It must never start a cluster component (it only asks each new binary for its version), write
inside the repository, touch the network or run a subprocess when everything is already built,
or run two builds at once: the machine has two cores.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from localkube import versions
from localkube.config import cache_dir
from localkube.gomod import wrapper_go_mod
from localkube.processes import log_tail

PAUSE_SOURCE = Path(__file__).with_name("pause.c")
WRAPPER_MODULE_PREFIX = "localkube.gregor.invalid"
"""The wrapper modules' own path: a domain that can never resolve, so it never shadows a module."""

LOG_TAIL_LINES = 40

BUILD_REVISION = 2
"""Part of every stamp: bump it when a build command here changes, so stamps go stale."""


class BuildError(RuntimeError):
    """A component failed to build; the message names it and ends with the tool's last lines."""


@dataclass(frozen=True)
class Binaries:
    """Where each binary of the local cluster lives; every path is an executable file."""

    apiserver: Path
    controller_manager: Path
    scheduler: Path
    kubelet: Path
    kube_proxy: Path
    kubectl: Path
    etcd: Path
    etcdctl: Path
    coredns: Path
    local_path_provisioner: Path
    pause: Path
    helm: Path
    kubeadm: Path


@dataclass(frozen=True)
class KindBinaries:
    """What a kind node runs besides Kubernetes' own binaries (ADR 0027), and the kind CLI."""

    kind: Path
    containerd: Path
    ctr: Path
    containerd_shim_runc_v2: Path
    runc: Path
    crictl: Path
    cni_plugins: tuple[Path, ...]
    """bridge, host-local, loopback, portmap, ptp: the node's /opt/cni/bin."""


@dataclass(frozen=True)
class Binary:
    """One executable of a component, and how to ask it for its version."""

    name: str
    package: str
    """The Go import path of its main package (unused for C programs)."""
    version_args: tuple[str, ...] = ("--version",)


@dataclass(frozen=True)
class GoComponent:
    """A set of Go commands built from one upstream module through a wrapper module."""

    name: str
    version: str
    module: str
    """The module whose go.mod the wrapper is derived from (it must require every binary's)."""
    sibling_version: str
    """The published version of the sibling modules that `module` replaces with directories."""
    binaries: tuple[Binary, ...]
    ldflags_x: tuple[tuple[str, str], ...] = ()
    """`-X symbol=value` version stamps."""
    build_date_symbols: tuple[str, ...] = ()
    """Symbols stamped with the build's UTC time (kept out of the stamp: it changes every build)."""
    go_sum: tuple[str, ...] = ()
    """go.sum lines to trust without the checksum database (see versions.py for why)."""
    cgo: bool = False
    """Link with the C toolchain (runc: its namespace setup is C, its seccomp is libseccomp)."""
    tags: tuple[str, ...] = ()
    """Go build tags (`-tags`)."""


_OPTIONAL_RECIPE_FIELDS = {"cgo": False, "tags": ()}
"""GoComponent fields left out of a fingerprint while at their default, so that adding them
did not make every component built before them stale."""


@dataclass(frozen=True)
class CComponent:
    """A single-file C program, linked statically."""

    name: str
    version: str
    source: Path
    binaries: tuple[Binary, ...]


Component = GoComponent | CComponent


def _kubernetes() -> GoComponent:
    version = versions.KUBERNETES_VERSION
    major, minor = version.removeprefix("v").split(".")[:2]
    stamps = {
        "gitVersion": version,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "gitCommit": versions.KUBERNETES_GIT_COMMIT,
    }
    # hack/lib/version.sh stamps both packages: servers report component-base's, clients the other.
    packages = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
    commands = (
        ("kube-apiserver", ("--version",)),
        ("kube-controller-manager", ("--version",)),
        ("kube-scheduler", ("--version",)),
        ("kubelet", ("--version",)),
        ("kube-proxy", ("--version",)),
        ("kubectl", ("version", "--client")),
        ("kubeadm", ("version", "-o", "short")),
    )
    return GoComponent(
        name="kubernetes",
        version=version,
        module="k8s.io/kubernetes",
        sibling_version=versions.KUBERNETES_STAGING_VERSION,
        binaries=tuple(
            Binary(name, f"k8s.io/kubernetes/cmd/{name}", args) for name, args in commands
        ),
        ldflags_x=tuple(
            (f"{package}.{symbol}", value)
            for package in packages
            for symbol, value in stamps.items()
        ),
        build_date_symbols=tuple(f"{package}.buildDate" for package in packages),
    )


def components() -> tuple[Component, ...]:
    """Every component, smallest first, so a broken toolchain shows up within a minute."""
    etcd = versions.ETCD_VERSION
    return (
        CComponent(
            name="pause",
            version=versions.PAUSE_VERSION,
            source=PAUSE_SOURCE,
            binaries=(Binary("pause", ""),),
        ),
        GoComponent(
            name="local-path-provisioner",
            version=versions.LOCAL_PATH_PROVISIONER_VERSION,
            module="github.com/rancher/local-path-provisioner",
            sibling_version=versions.LOCAL_PATH_PROVISIONER_VERSION,
            binaries=(
                Binary("local-path-provisioner", "github.com/rancher/local-path-provisioner"),
            ),
            ldflags_x=(("main.VERSION", versions.LOCAL_PATH_PROVISIONER_VERSION),),
            go_sum=versions.LOCAL_PATH_PROVISIONER_GO_SUM,
        ),
        GoComponent(
            name="coredns",
            version=versions.COREDNS_VERSION,
            module="github.com/coredns/coredns",
            sibling_version=versions.COREDNS_VERSION,
            binaries=(Binary("coredns", "github.com/coredns/coredns", ("-version",)),),
            ldflags_x=(
                ("github.com/coredns/coredns/coremain.GitCommit", versions.COREDNS_GIT_COMMIT),
            ),
        ),
        GoComponent(
            name="etcd",
            version=etcd,
            # The repository's root module requires and replaces every etcd module.
            module="go.etcd.io/etcd/v3",
            sibling_version=etcd,
            binaries=(
                Binary("etcd", "go.etcd.io/etcd/server/v3"),
                Binary("etcdctl", "go.etcd.io/etcd/etcdctl/v3", ("version",)),
            ),
            ldflags_x=(("go.etcd.io/etcd/api/v3/version.GitSHA", versions.ETCD_GIT_COMMIT[:7]),),
        ),
        GoComponent(
            name="helm",
            version=versions.HELM_VERSION,
            module="helm.sh/helm/v3",
            sibling_version=versions.HELM_VERSION,
            binaries=(Binary("helm", "helm.sh/helm/v3/cmd/helm", ("version", "--short")),),
            ldflags_x=(("helm.sh/helm/v3/internal/version.version", versions.HELM_VERSION),),
        ),
        _kubernetes(),
    )


def extras() -> tuple[Component, ...]:
    """Components the local cluster itself does not need, built when asked for (by name, or by
    `python -m localkube.build` with none): the Kubeflow Spark Operator, whose SparkApplications
    the e2e tier launches retention audits through."""
    return (
        GoComponent(
            name="spark-operator",
            version=versions.SPARK_OPERATOR_VERSION,
            module="github.com/kubeflow/spark-operator/v2",
            sibling_version=versions.SPARK_OPERATOR_VERSION,
            binaries=(
                Binary(
                    "spark-operator",
                    "github.com/kubeflow/spark-operator/v2/cmd/operator",
                    ("version",),
                ),
            ),
            ldflags_x=(
                (
                    "github.com/kubeflow/spark-operator/v2.version",
                    versions.SPARK_OPERATOR_VERSION.removeprefix("v"),
                ),
            ),
        ),
    )


_CONTAINERD_MODULE = "github.com/containerd/containerd/v2"


def kind_components() -> tuple[Component, ...]:
    """What a kind node needs that the host-process cluster does not, smallest first: the kind
    CLI, crictl, the CNI plugins, runc and containerd 2 (ADR 0027). `make cluster-build` builds
    them; `python -m localkube up` too, when missing."""
    containerd = versions.CONTAINERD_VERSION
    cni = versions.CNI_PLUGINS_VERSION
    cni_plugins = (
        ("bridge", "main"),
        ("host-local", "ipam"),
        ("loopback", "main"),
        ("portmap", "meta"),
        ("ptp", "main"),
    )
    return (
        GoComponent(
            name="kind",
            version=versions.KIND_VERSION,
            module="sigs.k8s.io/kind",
            sibling_version=versions.KIND_VERSION,
            binaries=(Binary("kind", "sigs.k8s.io/kind", ("version",)),),
        ),
        GoComponent(
            name="cri-tools",
            version=versions.CRI_TOOLS_VERSION,
            module="sigs.k8s.io/cri-tools",
            sibling_version=versions.CRI_TOOLS_VERSION,
            binaries=(Binary("crictl", "sigs.k8s.io/cri-tools/cmd/crictl"),),
            ldflags_x=(("sigs.k8s.io/cri-tools/pkg/version.Version", versions.CRI_TOOLS_VERSION),),
        ),
        GoComponent(
            name="cni-plugins",
            version=cni,
            module="github.com/containernetworking/plugins",
            sibling_version=cni,
            binaries=tuple(
                Binary(name, f"github.com/containernetworking/plugins/plugins/{group}/{name}", ())
                for name, group in cni_plugins
            ),
            ldflags_x=(
                ("github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion", cni),
            ),
        ),
        GoComponent(
            name="runc",
            version=versions.RUNC_VERSION,
            module="github.com/opencontainers/runc",
            sibling_version=versions.RUNC_VERSION,
            binaries=(Binary("runc", "github.com/opencontainers/runc"),),
            ldflags_x=(("main.version", versions.RUNC_VERSION.removeprefix("v")),),
            cgo=True,
            tags=("seccomp", "urfave_cli_no_docs"),
        ),
        GoComponent(
            name="containerd",
            version=containerd,
            module="github.com/containerd/containerd/v2",
            sibling_version=containerd,
            binaries=(
                Binary("containerd", "github.com/containerd/containerd/v2/cmd/containerd"),
                Binary("ctr", "github.com/containerd/containerd/v2/cmd/ctr"),
                Binary(
                    "containerd-shim-runc-v2",
                    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
                    ("-v",),
                ),
            ),
            ldflags_x=(
                ("github.com/containerd/containerd/v2/version.Version", containerd),
                ("github.com/containerd/containerd/v2/version.Package", _CONTAINERD_MODULE),
            ),
            # kind's base builds it with these: none of those snapshotters is used in a node.
            tags=("no_aufs", "no_zfs", "no_btrfs", "no_devmapper"),
        ),
    )


def component_home(root: Path, component: Component) -> Path:
    return root / f"{component.name}-{component.version}"


def fingerprint(component: Component) -> str:
    """What a build depends on: the recipe, and for C the source text. Written as the stamp."""
    recipe: dict[str, object] = dataclasses.asdict(component)
    for field, default in _OPTIONAL_RECIPE_FIELDS.items():
        if field in recipe and recipe[field] == default:
            del recipe[field]
    recipe["kind"] = type(component).__name__
    recipe["revision"] = BUILD_REVISION
    if isinstance(component, CComponent):
        recipe["source"] = hashlib.sha256(component.source.read_bytes()).hexdigest()
    return json.dumps(recipe, sort_keys=True, default=str)


def is_built(root: Path, component: Component) -> bool:
    home = component_home(root, component)
    stamp = home / ".stamp"
    if not stamp.is_file() or stamp.read_text() != fingerprint(component):
        return False
    return all(os.access(home / "bin" / b.name, os.X_OK) for b in component.binaries)


def ensure_binaries(
    cache: Path | None = None,
    log: Callable[[str], None] = print,
    only: Sequence[str] | None = None,
) -> Binaries:
    """Build whatever is missing under `<cache>/localkube` (of the components named in `only`,
    when given) and return where every binary is.

    `cache` is the project's cache root (default: $GREGOR_CACHE or ~/.cache/gregor). A warm call
    reads a stamp per component and nothing else. Raises BuildError naming the component that
    failed.
    """
    root = (cache if cache is not None else cache_dir()) / "localkube"
    every = (*components(), *extras(), *kind_components())
    wanted = [c for c in every if c.name in only] if only is not None else list(components())
    missing = [c for c in wanted if not is_built(root, c)]
    if missing:
        root.mkdir(parents=True, exist_ok=True)
        # One build at a time, also across processes (a harness and `make` may both ask).
        with (root / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            for component in missing:
                if not is_built(root, component):  # another process may have built it
                    _build(root, component, log)
    return _binaries(root)


def built_binaries(cache: Path | None = None) -> Binaries | None:
    """Where every binary is if all are built, else None; never builds (for `cluster-down`)."""
    root = (cache if cache is not None else cache_dir()) / "localkube"
    if not all(is_built(root, c) for c in components()):
        return None
    return _binaries(root)


def ensure_kind_binaries(
    cache: Path | None = None, log: Callable[[str], None] = print
) -> KindBinaries:
    """Build what a kind node needs that is missing (`kind_components`) and say where it is."""
    ensure_binaries(cache, log, only=[c.name for c in kind_components()])
    root = (cache if cache is not None else cache_dir()) / "localkube"
    paths = {
        b.name: component_home(root, c) / "bin" / b.name
        for c in kind_components()
        for b in c.binaries
    }
    cni = next(c for c in kind_components() if c.name == "cni-plugins")
    return KindBinaries(
        kind=paths["kind"],
        containerd=paths["containerd"],
        ctr=paths["ctr"],
        containerd_shim_runc_v2=paths["containerd-shim-runc-v2"],
        runc=paths["runc"],
        crictl=paths["crictl"],
        cni_plugins=tuple(paths[b.name] for b in cni.binaries),
    )


def spark_operator_binary(cache: Path | None = None, log: Callable[[str], None] = print) -> Path:
    """The Kubeflow Spark Operator's binary, built if missing."""
    ensure_binaries(cache, log, only=["spark-operator"])
    root = (cache if cache is not None else cache_dir()) / "localkube"
    (component,) = extras()
    return component_home(root, component) / "bin" / "spark-operator"


def spark_operator_chart(cache: Path | None = None) -> Path:
    """The Kubeflow Spark Operator's Helm chart, from the Go module its binary is built from
    (built here if missing, as that fetches the module)."""
    spark_operator_binary(cache, log=lambda _: None)
    root = (cache if cache is not None else cache_dir()) / "localkube"
    module = f"github.com/kubeflow/spark-operator/v2@{versions.SPARK_OPERATOR_VERSION}"
    chart = root / "go" / "pkg" / "mod" / module / "charts" / "spark-operator-chart"
    if not (chart / "Chart.yaml").is_file():
        raise BuildError(f"localkube: no Spark operator chart at {chart}: build spark-operator")
    return chart


def _build(root: Path, component: Component, log: Callable[[str], None]) -> None:
    """Build one component, check every binary reports the pinned version, then stamp it."""
    started = time.monotonic()
    log(f"localkube: building {component.name} {component.version} …")
    home = component_home(root, component)
    (home / ".stamp").unlink(missing_ok=True)
    if isinstance(component, GoComponent):
        _build_go(root, component, log)
    else:
        _build_c(root, component)
    for binary in component.binaries:
        reported = _check_version(component, home / "bin" / binary.name, binary)
        log(f"localkube:   {binary.name}: {reported}")
    (home / ".stamp").write_text(fingerprint(component))
    log(f"localkube: built {component.name} in {time.monotonic() - started:.0f}s")


def _binaries(root: Path) -> Binaries:
    paths = {
        b.name: component_home(root, c) / "bin" / b.name for c in components() for b in c.binaries
    }
    return Binaries(
        apiserver=paths["kube-apiserver"],
        controller_manager=paths["kube-controller-manager"],
        scheduler=paths["kube-scheduler"],
        kubelet=paths["kubelet"],
        kube_proxy=paths["kube-proxy"],
        kubectl=paths["kubectl"],
        etcd=paths["etcd"],
        etcdctl=paths["etcdctl"],
        coredns=paths["coredns"],
        local_path_provisioner=paths["local-path-provisioner"],
        pause=paths["pause"],
        helm=paths["helm"],
        kubeadm=paths["kubeadm"],
    )


def _go_env(root: Path, *, cgo: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        GOPATH=str(root / "go"),
        GOMODCACHE=str(root / "go" / "pkg" / "mod"),
        GOCACHE=str(root / "go-build"),
        GOFLAGS="-mod=mod",
        CGO_ENABLED="1" if cgo else "0",
        GOTOOLCHAIN="local",  # never download a toolchain: the installed Go builds all of it
        GOWORK="off",
    )
    return env


def _build_go(root: Path, component: GoComponent, log: Callable[[str], None]) -> None:
    home = component_home(root, component)
    src, bin_dir, log_path = home / "src", home / "bin", home / "build.log"
    src.mkdir(parents=True, exist_ok=True)
    bin_dir.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")
    env = _go_env(root, cgo=component.cgo)
    wrapper = f"{WRAPPER_MODULE_PREFIX}/{component.name}"
    # A bare module first, so fetching the upstream go.mod is checked against the pinned sums.
    (src / "go.mod").write_text(f"module {wrapper}\n\ngo 1.21\n")
    (src / "go.sum").write_text("".join(line + "\n" for line in component.go_sum))
    fetched = _run(
        component,
        ["go", "mod", "download", "-json", f"{component.module}@{component.version}"],
        cwd=src,
        env=env,
        log_path=log_path,
    )
    info = json.loads(fetched)
    if "Error" in info or "GoMod" not in info or "Dir" not in info:
        raise BuildError(
            f"localkube: cannot fetch {component.module}@{component.version} for "
            f"{component.name}: {info.get('Error', 'no go.mod in the answer')}"
        )
    upstream = Path(info["GoMod"]).read_text()
    # Trust what the release itself recorded for its dependencies, as `go install pkg@v` would:
    # the checksum database reachable from here does not know every module.
    released_sums = Path(info["Dir"]) / "go.sum"
    if released_sums.is_file():
        with (src / "go.sum").open("a") as go_sum:
            go_sum.write(released_sums.read_text())
    (src / "go.mod").write_text(
        wrapper_go_mod(
            wrapper=wrapper,
            upstream=upstream,
            module=component.module,
            version=component.version,
            sibling_version=component.sibling_version,
        )
    )
    build_date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    stamps = [*component.ldflags_x, *((s, build_date) for s in component.build_date_symbols)]
    ldflags = " ".join(["-s", "-w", *(f"-X '{symbol}={value}'" for symbol, value in stamps)])
    for binary in component.binaries:
        log(f"localkube:   go build {binary.package}")
        command = ["go", "build", "-trimpath", "-ldflags", ldflags]
        if component.tags:
            command += ["-tags", ",".join(component.tags)]
        _run(
            component,
            [*command, "-o", str(bin_dir / binary.name), binary.package],
            cwd=src,
            env=env,
            log_path=log_path,
        )


def _build_c(root: Path, component: CComponent) -> None:
    home = component_home(root, component)
    bin_dir, log_path = home / "bin", home / "build.log"
    bin_dir.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")
    (binary,) = component.binaries
    command = [
        "gcc",
        "-static",
        "-O2",
        "-s",
        "-Wall",
        "-Wextra",
        "-Werror",
        f'-DPAUSE_VERSION="{component.version}"',
        "-o",
        str(bin_dir / binary.name),
        str(component.source),
    ]
    _run(component, command, cwd=home, env=dict(os.environ), log_path=log_path)


def _run(
    component: Component, command: Sequence[str], *, cwd: Path, env: dict[str, str], log_path: Path
) -> str:
    """Run one build step, its stderr appended to the log; return its stdout."""
    with log_path.open("a") as log_file:
        log_file.write(f"$ {' '.join(command)}\n")
        log_file.flush()
        try:
            done = subprocess.run(
                command,
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=log_file,
                text=True,
                check=False,
            )
        except FileNotFoundError as exc:
            raise BuildError(
                f"localkube: building {component.name} needs `{command[0]}` on PATH"
            ) from exc
        log_file.write(done.stdout)
    if done.returncode != 0:
        tail = log_tail(log_path, LOG_TAIL_LINES)
        raise BuildError(
            f"localkube: building {component.name} {component.version} failed: "
            f"`{' '.join(command[:3])} …` exited {done.returncode}. Last lines of its output "
            f"(all of it in {log_path}):\n{tail}"
        )
    return done.stdout


def _check_version(component: Component, path: Path, binary: Binary) -> str:
    """Ask a fresh binary for its version; it must name the version we pinned."""
    done = subprocess.run(
        [str(path), *binary.version_args], capture_output=True, text=True, check=False, timeout=60
    )
    output = (done.stdout + done.stderr).strip()
    expected = component.version.removeprefix("v")
    if done.returncode != 0 or expected not in output:
        raise BuildError(
            f"localkube: {path} {' '.join(binary.version_args)} exited {done.returncode} and "
            f"did not report {component.name} {expected}:\n{output}"
        )
    return " ".join(output.split())


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m localkube.build [COMPONENT ...]`: build every component, or those named
    (`make install` builds `helm` alone), and print where each binary is."""
    names = list(sys.argv[1:] if argv is None else argv)
    known = {c.name: c for c in (*components(), *extras(), *kind_components())}
    unknown = [name for name in names if name not in known]
    if unknown:
        print(f"unknown component {', '.join(unknown)}: one of {', '.join(known)}", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        binaries = ensure_binaries(
            log=lambda line: print(line, file=sys.stderr, flush=True), only=names or None
        )
        if not names:  # everything: the cluster's, kind's and the extras (CI's warm-up)
            ensure_binaries(
                log=lambda line: print(line, file=sys.stderr, flush=True),
                only=[c.name for c in (*kind_components(), *extras())],
            )
    except BuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    if names:
        root = cache_dir() / "localkube"
        for name in names:
            for binary in known[name].binaries:
                path = component_home(root, known[name]) / "bin" / binary.name
                print(f"{binary.name:<24} {path}")
    else:
        for field in dataclasses.fields(binaries):
            print(f"{field.name:<24} {getattr(binaries, field.name)}")
    print(f"localkube binaries ready in {time.monotonic() - started:.2f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
