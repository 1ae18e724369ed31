"""`python -m localkube up|down|env|status|images|packages [--kind] [--nodes N]`: what `make
cluster`, `make cluster-down`, `make cluster-env`, `make images` and `make host-packages` run.
`--kind` (or LOCALKUBE_MODE=kind; `make cluster KIND=1 NODES=3`) acts on the multi-node kind
cluster instead of the host-process one."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from .cluster import KIND_KUBECONFIG, down, load_images, mode, status, up
from .config import default_layout
from .host import ensure_packages
from .images import PROJECT_IMAGES, build_project_images, ensure_base_image


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localkube", description=__doc__)
    parser.add_argument("command", choices=("up", "down", "env", "status", "images", "packages"))
    parser.add_argument(
        "--kind", action="store_true", default=None,
        help="the kind cluster on our own node image (default: $LOCALKUBE_MODE, else host)",
    )  # fmt: skip
    parser.add_argument(
        "--nodes",
        type=int,
        help="kind: workers (default $NODES, else 3); 1: the control plane alone",
    )
    arguments = parser.parse_args(argv)
    try:
        _run(arguments.command, kind=arguments.kind, nodes=arguments.nodes)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        # Every localkube error names what failed and quotes the log that says why.
        print(f"localkube {arguments.command}: {exc}", file=sys.stderr)
        logs = default_layout().logs
        if arguments.command == "up" and logs.exists():
            print(f"the cluster's logs: {logs}", file=sys.stderr)
        return 1
    return 0


def _run(command: str, *, kind: bool | None = None, nodes: int | None = None) -> None:
    if command == "up":
        kubeconfig = up(kind=kind, nodes=nodes)
        print(f"export KUBECONFIG={kubeconfig}")
    elif command == "down":
        down(kind=kind)
    elif command == "env":
        kubeconfig = default_layout().kubeconfig
        chose_kind = mode("kind" if kind else None) == "kind"
        if chose_kind or (not kubeconfig.exists() and KIND_KUBECONFIG.exists()):
            kubeconfig = KIND_KUBECONFIG
        print(f"export KUBECONFIG={kubeconfig}")
    elif command == "packages":
        ensure_packages(print)
    elif command == "images":
        ensure_packages(print)
        tags = build_project_images(ensure_base_image(), PROJECT_IMAGES)
        if load_images(tags, kind=kind) is None:
            print(f"built {', '.join(tags)}; no cluster runs, so nothing was loaded")
    else:
        print(json.dumps(status(), indent=2))


if __name__ == "__main__":
    sys.exit(main())
