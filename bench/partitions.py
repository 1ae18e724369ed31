"""Many partitions at once: one CreateTopics of thousands of partitions on three combined
nodes, then each node restarted in turn, while another client keeps producing.

    python -m bench.partitions [--target both|gregor|kafka] [--partitions N] [--no-restarts]
                               [--dir DIR]

Each target is three combined nodes (broker and controller in each process, all three voters)
started afresh on this machine, as `tests/support/clusters.py` starts them; the scenario and
its phases are `tests/support/many_partitions.py`'s.

The report gives, per phase, the probe's p50, p99 and max (and when the slowest send went)
and its failed sends, the quorum epochs seen (an election moves the epoch) and which brokers
went missing from Metadata outside their own restart. It is a measurement, never a pass/fail
test: on a shared 2-core machine the probe, the watcher and the three nodes compete for the
CPU. `tests/integration/test_many_partitions.py` holds the same scenario to its rules.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.support.clusters import three_nodes
from tests.support.many_partitions import run as scenario

KAFKA_HEAP = "1g"
"""Each Kafka node's heap: with the tests' 384 MiB, 10,000 partitions ran a node out of memory
(and into minutes of garbage collection before that)."""


def run(kind: str, partitions: int, restarts: bool, keep: Path | None = None) -> Iterator[str]:
    """The phases' lines; the nodes' data and logs go under `keep` (kept) if given."""
    with contextlib.ExitStack() as stack:
        if keep is None:
            where = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        else:
            where = keep / kind
            where.mkdir(parents=True)
        nodes = three_nodes(kind, where, kafka_heap=KAFKA_HEAP)
        for phase in scenario(stack.enter_context(nodes), partitions, restarts):
            yield phase.describe()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=("both", "gregor", "kafka"), default="gregor")
    parser.add_argument("--partitions", type=int, default=9_999)
    parser.add_argument("--no-restarts", action="store_true")
    parser.add_argument(
        "--dir", type=Path, help="keep the nodes' data and logs here (a new directory per target)"
    )
    args = parser.parse_args(argv)
    kinds = ("gregor", "kafka") if args.target == "both" else (args.target,)
    for kind in kinds:
        for line in run(kind, args.partitions, not args.no_restarts, args.dir):
            print(f"{kind} {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
