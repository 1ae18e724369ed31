"""`python -m localkube up|down|env|status|images|packages [--mode kind|host] [--nodes N]`:
what `make cluster`, `make cluster-down`, `make cluster-env`, `make images` and `make
host-packages` run. The mode (default $LOCALKUBE_MODE, else kind) picks the multi-node kind
cluster (ADR 0027; `make cluster NODES=1` for one node) or the single-node cluster of host
processes (ADR 0005; `make cluster LOCALKUBE_MODE=host`)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from .cluster import KIND_KUBECONFIG, MODES, down, load_images, mode, status, up
from .config import default_layout
from .host import ensure_packages
from .images import PROJECT_IMAGES, build_project_images, ensure_base_image


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localkube", description=__doc__)
    parser.add_argument("command", choices=("up", "down", "env", "status", "images", "packages"))
    parser.add_argument(
        "--mode", choices=MODES,
        help="kind: the kind cluster on our own node image; host: host processes"
        " (default: $LOCALKUBE_MODE, else kind)",
    )  # fmt: skip
    parser.add_argument(
        "--nodes",
        type=int,
        help="kind: workers (default $NODES, else 3); 1: the control plane alone",
    )
    arguments = parser.parse_args(argv)
    try:
        _run(arguments.command, chosen=arguments.mode, nodes=arguments.nodes)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        # Every localkube error names what failed and quotes the log that says why.
        print(f"localkube {arguments.command}: {exc}", file=sys.stderr)
        logs = default_layout().logs
        if arguments.command == "up" and logs.exists():
            print(f"the cluster's logs: {logs}", file=sys.stderr)
        return 1
    return 0


def _run(command: str, *, chosen: str | None = None, nodes: int | None = None) -> None:
    if command == "up":
        kubeconfig = up(chosen=chosen, nodes=nodes)
        print(f"export KUBECONFIG={kubeconfig}")
    elif command == "down":
        down(chosen=chosen)
    elif command == "env":
        kubeconfig = KIND_KUBECONFIG if mode(chosen) == "kind" else default_layout().kubeconfig
        print(f"export KUBECONFIG={kubeconfig}")
    elif command == "packages":
        ensure_packages(print)
    elif command == "images":
        ensure_packages(print)
        tags = build_project_images(ensure_base_image(), PROJECT_IMAGES)
        if load_images(tags, chosen=chosen) is None:
            print(f"built {', '.join(tags)}; no cluster runs, so nothing was loaded")
    else:
        print(json.dumps(status(), indent=2))


if __name__ == "__main__":
    sys.exit(main())
