"""`python -m localkube up|down|env|status|images|packages`: what `make cluster`,
`make cluster-down`, `make cluster-env`, `make images` and `make host-packages` run."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from .cluster import KIND_KUBECONFIG, down, load_images, status, up
from .config import default_layout
from .host import ensure_packages
from .images import PROJECT_IMAGES, build_project_images, ensure_base_image


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localkube", description=__doc__)
    parser.add_argument("command", choices=("up", "down", "env", "status", "images", "packages"))
    arguments = parser.parse_args(argv)
    try:
        _run(arguments.command)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        # Every localkube error names what failed and quotes the log that says why.
        print(f"localkube {arguments.command}: {exc}", file=sys.stderr)
        logs = default_layout().logs
        if arguments.command == "up" and logs.exists():
            print(f"the cluster's logs: {logs}", file=sys.stderr)
        return 1
    return 0


def _run(command: str) -> None:
    if command == "up":
        kubeconfig = up()
        print(f"export KUBECONFIG={kubeconfig}")
    elif command == "down":
        down()
    elif command == "env":
        kubeconfig = default_layout().kubeconfig
        if not kubeconfig.exists() and KIND_KUBECONFIG.exists():
            kubeconfig = KIND_KUBECONFIG
        print(f"export KUBECONFIG={kubeconfig}")
    elif command == "packages":
        ensure_packages(print)
    elif command == "images":
        ensure_packages(print)
        tags = build_project_images(ensure_base_image(), PROJECT_IMAGES)
        if load_images(tags) is None:
            print(f"built {', '.join(tags)}; no cluster runs, so nothing was loaded")
    else:
        print(json.dumps(status(), indent=2))


if __name__ == "__main__":
    sys.exit(main())
