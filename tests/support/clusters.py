"""Three combined nodes (broker and controller each, node ids 1-3), whichever system runs them:
Gregor's `gregor broker` processes or Apache Kafka's, behind one small interface, so that a
scenario runs against both and the Kafka run proves the scenario before it judges Gregor.

What it owns: starting the three, killing (SIGKILL), stopping (SIGTERM), pausing (SIGSTOP) and
restarting one of them, and where each keeps its log dirs. Waiting for what the cluster says
(ISR, leaders) is the scenarios' business: they ask through real clients."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from broker.protocol import ApiKey, ErrorCode, request_type
from broker.storage.meta_properties import read_meta_properties
from tests.support.kafka_dist import (
    KafkaBroker,
    format_storage,
    start_kafka_cluster,
    stop_kafka_cluster,
)
from tests.support.nodes import (
    Cluster,
    format_node,
    start_cluster,
    wait_listening,
)
from tests.support.requests import fill
from tests.support.wire import call

__all__ = ["KINDS", "ThreeNodes", "three_nodes"]

KINDS = ("gregor", "kafka")


@dataclass
class ThreeNodes:
    kind: str
    bootstrap: str
    _gregor: Cluster | None = None
    _kafka: list[KafkaBroker] = field(default_factory=list)

    def kill(self, node_id: int) -> None:
        """SIGKILL: the node dies mid-flight, as in a crash or an OOM kill."""
        if self._gregor is not None:
            self._gregor.node(node_id).kill()
        else:
            process = self._kafka[node_id - 1].process
            process.send_signal(signal.SIGKILL)
            process.wait(10)

    def pause(self, node_id: int) -> None:
        """SIGSTOP: the node stays registered and in its ISRs until its session or
        `replica.lag.time.max.ms` runs out, but answers and fetches nothing (a long GC pause, a
        stalled disk) until `resume`. Returns once every thread of it has stopped: the signal
        is delivered to each thread in turn, and on a busy machine a JVM's fetcher could
        otherwise fetch once more after this returned."""
        process = self._process(node_id)
        process.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not _all_stopped(process.pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {node_id} (pid {process.pid}) did not stop")
            time.sleep(0.005)

    def resume(self, node_id: int) -> None:
        self._process(node_id).send_signal(signal.SIGCONT)

    def _process(self, node_id: int) -> subprocess.Popen[Any]:
        if self._gregor is not None:
            return self._gregor.node(node_id).process
        return self._kafka[node_id - 1].process

    def stop(self, node_id: int) -> int:
        """SIGTERM (a controlled shutdown); the exit code, 0 for a clean stop. (Kafka's JVM
        exits with 143, 128 + SIGTERM, once its shutdown hooks are done: that is its 0.)"""
        if self._gregor is not None:
            return self._gregor.node(node_id).stop(timeout=60)
        code = self._kafka[node_id - 1].stop()
        return 0 if code == 128 + signal.SIGTERM else code

    def restart(self, node_id: int, timeout: float = 90) -> None:
        """Start a stopped or killed node again on its log dirs; returns once it listens."""
        if self._gregor is not None:
            node = self._gregor.node(node_id)
            node.restart()
            wait_listening(node, timeout=timeout)
        else:
            self._kafka[node_id - 1].restart(timeout)

    def running(self, node_id: int) -> bool:
        if self._gregor is not None:
            return self._gregor.node(node_id).process.poll() is None
        return self._kafka[node_id - 1].process.poll() is None

    def log_dir(self, node_id: int) -> Path:
        """The node's (only) log dir."""
        if self._gregor is not None:
            return self._gregor.node(node_id).config.parent / "logs"
        return self._kafka[node_id - 1].directory / "data"

    def replace_disk(self, node_id: int) -> None:
        """The stopped node's volume is replaced by an empty one, formatted again for the
        cluster by hand (`gregor format`; Kafka's `kafka-storage format`), as a platform's
        tooling might: neither node would format its metadata log dir itself. The metadata
        log goes with it: these are combined nodes, and with static voters neither quorum can
        tell the formatted voter from the one it replaced (ADR 0023)."""
        assert not self.running(node_id), "replace the disk of a stopped node"
        others = next(n for n in (1, 2, 3) if n != node_id)
        found = read_meta_properties(self.log_dir(others))
        assert found is not None
        shutil.rmtree(self.log_dir(node_id))
        if self._gregor is None:
            broker = self._kafka[node_id - 1]
            format_storage(broker.directory / "server.properties", found.cluster_id)
            return
        format_node(self._gregor.node(node_id).config, found.cluster_id)

    def log_tail(self, node_id: int) -> str:
        if self._gregor is not None:
            return self._gregor.node(node_id).log_tail()
        return self._kafka[node_id - 1].log_tail()

    def restart_stopped(self) -> None:
        """Start again every node a scenario left stopped, so the next finds three."""
        for node_id in (1, 2, 3):
            if not self.running(node_id):
                self.restart(node_id)


@contextlib.contextmanager
def three_nodes(
    kind: str,
    directory: Path,
    extra: Mapping[str, str] | None = None,
    *,
    kafka_heap: str = "384m",
    each: Mapping[int, Mapping[str, str]] | None = None,
) -> Iterator[ThreeNodes]:
    """Three combined nodes of `kind`; `kafka_heap`: each Kafka JVM's heap (the tests' small
    default holds a few hundred partitions; 10,000 need about 1 GiB); `each`: settings of one
    node, by node id."""
    if kind == "gregor":
        per_node = {node_id: dict(settings) for node_id, settings in (each or {}).items()}
        cluster = start_cluster(directory, 3, 0, dict(extra or {}), each=per_node)
        try:
            yield ThreeNodes(kind, ",".join(b.bootstrap for b in cluster.brokers), _gregor=cluster)
        finally:
            cluster.kill()
    else:
        brokers = start_kafka_cluster(directory, 3, extra, heap=kafka_heap, each=each)
        try:
            yield ThreeNodes(kind, ",".join(b.bootstrap for b in brokers), _kafka=brokers)
        finally:
            stop_kafka_cluster(brokers)


def shared_three_nodes(settings: Mapping[str, str]) -> Any:
    """A pytest fixture, module-scoped and run once per kind: three combined nodes with
    `settings`, shared by the module's tests (three Kafka nodes take 15 s to start)."""

    @pytest.fixture(scope="module", params=KINDS)
    def cluster(
        request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[ThreeNodes]:
        directory = tmp_path_factory.mktemp(request.param)
        with three_nodes(request.param, directory, settings) as running:
            yield running

    return cluster


def active_controller(address: tuple[str, int]) -> int:
    """The active controller (the quorum's leader) as the node at `address` names it
    (DescribeQuorum, which Kafka 4 serves on brokers too)."""
    values = {
        "topics": [{"topic_name": "__cluster_metadata", "partitions": [{"partition_index": 0}]}]
    }
    body = fill(request_type(ApiKey.DESCRIBE_QUORUM, 1), values)
    partition = call(address, ApiKey.DESCRIBE_QUORUM, 1, body).topics[0].partitions[0]
    assert partition.error_code == ErrorCode.none, partition
    return int(partition.leader_id)


def _all_stopped(pid: int) -> bool:
    """Every thread of process `pid` is stopped (state T in /proc)."""
    tasks = Path(f"/proc/{pid}/task")
    for task in tasks.iterdir():
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:
            continue  # the thread has just ended
        if stat.rsplit(")", 1)[1].split()[0] != "T":
            return False
    return True
