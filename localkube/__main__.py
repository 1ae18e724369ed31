"""`python -m localkube up|down|env|status`: what `make cluster`, `make cluster-down` and
`make cluster-env` run."""

from __future__ import annotations

import argparse
import json
import sys

from .cluster import KIND_KUBECONFIG, down, status, up
from .config import default_layout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localkube", description=__doc__)
    parser.add_argument("command", choices=("up", "down", "env", "status"))
    arguments = parser.parse_args(argv)
    if arguments.command == "up":
        kubeconfig = up()
        print(f"export KUBECONFIG={kubeconfig}")
    elif arguments.command == "down":
        down()
    elif arguments.command == "env":
        kubeconfig = default_layout().kubeconfig
        if not kubeconfig.exists() and KIND_KUBECONFIG.exists():
            kubeconfig = KIND_KUBECONFIG
        print(f"export KUBECONFIG={kubeconfig}")
    else:
        print(json.dumps(status(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
