"""The `gregor` console script (the commands are DESIGN.md's contract).

- `gregor broker --config server.properties [--override key=value …] [--cluster-id ID]` runs
  one node, on log dirs `gregor format` formatted; `--cluster-id` checks they are that
  cluster's. A node never formats its metadata log dir itself (`broker/node.py`).
- `gregor local up [--brokers N] [--controllers C] [--data-dir DIR] [--port P]` runs a local
  cluster of N combined nodes, or of N brokers and C dedicated controllers (one node in this
  process; more as processes of their own, `broker/local.py`), and prints its bootstrap
  servers.
- `gregor format --config server.properties --cluster-id ID [--ignore-formatted]` formats a
  new node's dirs, its metadata log dir and its log dirs (Kafka's `kafka-storage format`):
  `meta.properties` with the cluster id, the node id and a directory id of each dir's own.
- `gregor audit retention --bootstrap-server HOST:PORT --topic NAME … --output DIR` checks
  what retention and compaction really deliver on any Kafka cluster, with Spark
  (`gregor_audit`, ADR 0026).
- `gregor api-versions` prints the ApiVersions advertisement a node sends: each API it has a
  handler for, with its version range, exactly as on the wire.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import logging
import os
import resource
import sys
from collections.abc import Sequence
from pathlib import Path

from broker import __version__
from broker.aio import report_slow_callbacks
from broker.config import BrokerConfig, InvalidConfig
from broker.handlers import HANDLED_APIS
from broker.handlers.api_versions import advertisement
from broker.heap import HeapPolicy
from broker.local import run_local_cluster
from broker.node import Node, NodeError, new_cluster_id
from broker.storage import StorageError
from broker.storage.meta_properties import format_dirs, load_or_format, read_meta_properties
from broker.storage.partition_metadata import encode_uuid

log = logging.getLogger("gregor")


def _api_versions(_args: argparse.Namespace) -> int:
    """What a node's ApiVersions response says, entry for entry, and nothing else."""
    for api_key, low, high in advertisement(HANDLED_APIS):
        print(f"{api_key.name:<32} {int(api_key):>3}  v{low}-v{high}")
    return 0


def _overrides(pairs: Sequence[str]) -> dict[str, str]:
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidConfig(pair, pair, "an override must be key=value")
        result[key.strip()] = value.strip()
    return result


def _raise_open_files_limit() -> None:
    """Let the node open as many files as the hard limit allows, as the JVM does for Kafka: a
    segment costs a descriptor, and the default soft limit (often 1024) is a few hundred
    partitions."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_LARGE_ALLOCATION = 1024 * 1024


def _return_large_buffers_to_the_system() -> None:
    """Have glibc's malloc map every buffer of 1 MiB or more on its own and unmap it when
    freed. By default its threshold grows to the largest buffer freed (up to 32 MiB), after
    which request-sized buffers come from the heap and stay in the process's resident memory
    once freed: a burst of large requests would leave the broker that much bigger for good,
    and `queued.max.request.bytes` would bound live requests but not the memory they leave."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, _LARGE_ALLOCATION)
        libc.mallopt(_M_TRIM_THRESHOLD, 2 * _LARGE_ALLOCATION)
    except (OSError, AttributeError):
        pass  # not glibc: its allocator keeps its own policy


SWITCH_INTERVAL_S = 0.001
"""How long a thread may hold the GIL while another waits for it (Python's default: 5 ms)."""


def _hand_the_gil_back_sooner() -> None:
    """Threads that decode, encode, walk records or clean logs hold the GIL in turns with the
    event loop; the loop gives it up at every system call (each receive, send and poll) and then
    waits for the worker's turn to end before it serves the next client. At Python's default of
    5 ms, a well-behaved client's round trip through a few such waits took 20 ms and more
    while a worker decoded 1000-topic CreateTopics requests back to back (hostile suite: p99
    56-180 ms over six runs; with 1 ms, 41-74 ms over five)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def _run_node(
    config: BrokerConfig,
    banner: str | None = None,
    *,
    cluster_id: str | None = None,
    config_path: str | None = None,
) -> int:
    _raise_open_files_limit()
    _return_large_buffers_to_the_system()
    _hand_the_gil_back_sooner()
    heap = HeapPolicy()
    heap.install()
    slow_ms = os.environ.get("GREGOR_SLOW_CALLBACK_MS")
    if slow_ms:
        report_slow_callbacks(float(slow_ms))

    async def main() -> None:
        node = Node(config, cluster_id=cluster_id, config_path=config_path)
        node.banner = banner
        await node.run_until_signalled(started=heap.settle)

    asyncio.run(main())
    return 0


def _broker(args: argparse.Namespace) -> int:
    config = BrokerConfig.load(Path(args.config), _overrides(args.override))
    return _run_node(config, cluster_id=args.cluster_id, config_path=args.config)


def _format(args: argparse.Namespace) -> int:
    config = BrokerConfig.load(Path(args.config), _overrides(args.override))
    formatted = format_dirs(
        config.storage_dirs,
        args.cluster_id,
        config.node_id,
        ignore_formatted=args.ignore_formatted,
    )
    for log_dir in config.storage_dirs:
        meta = read_meta_properties(log_dir)
        assert meta is not None
        assert meta.directory_id is not None
        said = "formatted" if log_dir in formatted else "already formatted"
        print(f"{log_dir}: {said} (directory.id {encode_uuid(meta.directory_id)})")
    return 0


def _local_up(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).resolve()
    if args.brokers != 1 or args.controllers is not None:
        return run_local_cluster(data_dir, args.brokers, args.port, args.controllers)
    config = BrokerConfig.from_properties(
        {
            "process.roles": "broker,controller",
            "node.id": "1",
            "listeners": f"PLAINTEXT://localhost:{args.port}",
            "log.dirs": str(data_dir / "node-1"),
            "offsets.topic.replication.factor": "1",
        }
    )
    # `gregor format --ignore-formatted` for the user: a new cluster in a new data dir, the
    # same one again in a data dir that has it.
    load_or_format(list(config.storage_dirs), config.node_id, None, new_cluster_id=new_cluster_id())
    banner = (
        f"Gregor is running: bootstrap servers localhost:{args.port} (data in {data_dir}).\n"
        f"Try: kcat -b localhost:{args.port} -L    Stop with Ctrl-C."
    )
    return _run_node(config, banner)


def _operator_arguments(parser: argparse.ArgumentParser) -> None:
    from gregor_operator.main import add_arguments  # noqa: PLC0415 - the broker runs without it

    add_arguments(parser)


def _operator(args: argparse.Namespace) -> int:
    from gregor_operator.main import run  # noqa: PLC0415 - the broker runs without it

    return run(args)


def _audit_arguments(parser: argparse.ArgumentParser) -> None:
    from gregor_audit.cli import add_arguments  # noqa: PLC0415 - the broker runs without it

    add_arguments(parser)


def _audit_retention(args: argparse.Namespace) -> int:
    from gregor_audit.cli import run_command  # noqa: PLC0415 - the broker runs without it

    return run_command(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gregor", description="Gregor: a Kafka-compatible broker and its operator."
    )
    parser.add_argument("--version", action="version", version=f"gregor {__version__}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    broker = commands.add_parser("broker", help="run one node from a server.properties file")
    broker.add_argument("--config", required=True, help="path to server.properties")
    broker.add_argument(
        "--override", action="append", default=[], metavar="KEY=VALUE", help="override a property"
    )
    broker.add_argument(
        "--cluster-id",
        help="refuse to start unless the log dirs belong to this cluster (they are formatted "
        "for it by `gregor format`, which a node never does for its metadata log dir itself)",
    )
    broker.set_defaults(run=_broker)

    format_ = commands.add_parser(
        "format", help="format a new node's log dirs for a cluster (as kafka-storage format)"
    )
    format_.add_argument("--config", required=True, help="path to server.properties")
    format_.add_argument(
        "--override", action="append", default=[], metavar="KEY=VALUE", help="override a property"
    )
    format_.add_argument(
        "--cluster-id", required=True, help="the cluster's id: the same on every node"
    )
    format_.add_argument(
        "--ignore-formatted",
        action="store_true",
        help="leave dirs formatted for this cluster and node as they are (without it, any "
        "formatted dir is an error)",
    )
    format_.set_defaults(run=_format)

    local = commands.add_parser("local", help="a local cluster for development")
    local_commands = local.add_subparsers(dest="local_command", metavar="COMMAND", required=True)
    up = local_commands.add_parser("up", help="start a local cluster and print how to connect")
    up.add_argument(
        "--brokers", type=int, default=1, help="how many nodes (each a broker and a controller)"
    )
    up.add_argument(
        "--controllers",
        type=int,
        help="run the metadata quorum on this many dedicated controllers (process.roles="
        "controller), the brokers being broker-only; without it, every node is both",
    )
    up.add_argument("--data-dir", default="var/local", help="where the nodes keep their logs")
    up.add_argument("--port", type=int, default=9092, help="the bootstrap port")
    up.set_defaults(run=_local_up)

    operator = commands.add_parser(
        "operator", help="run the Kubernetes operator (KafkaCluster, Topic, User)"
    )
    _operator_arguments(operator)
    operator.set_defaults(run=_operator)

    audit = commands.add_parser("audit", help="audit a Kafka cluster (with Spark)")
    audit_commands = audit.add_subparsers(dest="audit_command", metavar="COMMAND", required=True)
    retention = audit_commands.add_parser(
        "retention",
        help="check what retention and compaction really deliver, topic by topic",
    )
    _audit_arguments(retention)
    retention.set_defaults(run=_audit_retention)

    api_versions = commands.add_parser(
        "api-versions", help="print the ApiVersions advertisement a node sends"
    )
    api_versions.set_defaults(run=_api_versions)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.run(args))
    except (InvalidConfig, NodeError, StorageError, OSError) as exc:
        print(f"gregor: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
