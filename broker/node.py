"""A Gregor node: its log dirs, its listeners, its handlers, and its lifecycle.

On first start a node formats its empty log dirs (`meta.properties` with the cluster id and its
node id, as `kafka-storage format` would); later starts refuse a log dir that belongs to
another cluster or another node. SIGTERM stops the node cleanly and it exits 0.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import signal
import time
import uuid
from pathlib import Path

from broker.config import BrokerConfig
from broker.handlers import NodeState, build_dispatcher
from broker.handlers.context import Endpoint
from broker.server import BoundListener, BrokerServer
from broker.storage import LogManager

__all__ = ["Node", "NodeError", "format_log_dirs", "new_cluster_id"]

log = logging.getLogger(__name__)

META_PROPERTIES = "meta.properties"


class NodeError(Exception):
    """The node cannot start; the message says what an operator must fix."""


def new_cluster_id() -> str:
    """Kafka's form: a random UUID in URL-safe base64 without padding (22 characters)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def format_log_dirs(config: BrokerConfig, cluster_id: str | None) -> str:
    """Check or write each log dir's `meta.properties`; return the cluster id they share."""
    found: dict[Path, dict[str, str]] = {}
    for log_dir in config.log_dirs:
        meta = log_dir / META_PROPERTIES
        if meta.exists():
            entries = dict(
                line.split("=", 1) for line in meta.read_text().splitlines() if "=" in line
            )
            found[log_dir] = entries
    ids = {entries.get("cluster.id") for entries in found.values()}
    if len(ids) > 1:
        raise NodeError(f"log dirs belong to different clusters: {sorted(map(str, ids))}")
    existing = next(iter(ids), None)
    if existing and cluster_id and existing != cluster_id:
        raise NodeError(
            f"log dir belongs to cluster {existing}, not {cluster_id}; refusing to start"
        )
    for log_dir, entries in found.items():
        if entries.get("node.id") != str(config.node_id):
            raise NodeError(
                f"{log_dir} belongs to node {entries.get('node.id')}, not node.id="
                f"{config.node_id}; refusing to start"
            )
    chosen = existing or cluster_id or new_cluster_id()
    for log_dir in config.log_dirs:
        if log_dir not in found:
            log_dir.mkdir(parents=True, exist_ok=True)
            if any(p.name != ".lock" for p in log_dir.iterdir()):
                raise NodeError(f"{log_dir} is not empty and has no {META_PROPERTIES}")
            (log_dir / META_PROPERTIES).write_text(
                f"version=1\ncluster.id={chosen}\nnode.id={config.node_id}\n"
            )
    return chosen


class Node:
    def __init__(self, config: BrokerConfig, *, cluster_id: str | None = None) -> None:
        self.config = config
        self.cluster_id = format_log_dirs(config, cluster_id)
        self.logs = LogManager(
            list(config.log_dirs),
            config.log,
            producer_id_expiration_ms=config.producer_id_expiration_ms,
        )
        self.state = NodeState(config, self.cluster_id)
        self.server = BrokerServer(config, build_dispatcher(self.state))
        self._stopped = asyncio.Event()

    async def start(self) -> list[BoundListener]:
        self.logs.startup(now_ms=int(time.time() * 1000))
        bound = await self.server.start()
        by_name = {b.name: b for b in bound}
        for listener in self.config.advertised:
            port = listener.port or by_name[listener.name].port
            host = listener.host or "localhost"
            self.state.advertised[listener.name] = Endpoint(host, port)
        return bound

    async def stop(self) -> None:
        await self.server.stop()
        self.logs.shutdown(now_ms=int(time.time() * 1000))
        self._stopped.set()

    async def run_until_signalled(self) -> None:
        """Serve until SIGTERM or SIGINT, then stop cleanly."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        log.info("stopping node %d", self.config.node_id)
        await self.stop()
