"""The `gregor` console script.

Subcommands arrive with the layers that implement them (DESIGN.md lists the contract:
`gregor broker`, `gregor local up`, `gregor operator`, `gregor audit retention`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from broker import __version__
from broker.protocol import SUPPORTED


def _api_versions(_args: argparse.Namespace) -> int:
    """Print the version table the broker serves, one API per line."""
    for api_key, versions in sorted(SUPPORTED.items()):
        print(f"{api_key.name:<32} {int(api_key):>3}  v{versions.min}-v{versions.max}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gregor", description="Gregor: a Kafka-compatible broker and its operator."
    )
    parser.add_argument("--version", action="version", version=f"gregor {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    api_versions = commands.add_parser(
        "api-versions", help="print the Kafka API versions this broker serves"
    )
    api_versions.set_defaults(run=_api_versions)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
