"""Real `gregor broker` processes for integration tests.

What it owns: writing a single-node `server.properties` on a temporary directory (or one per
node of a cluster: combined nodes, or dedicated controllers and broker-only nodes), formatting
a new node's dirs (`gregor format`, as `kafka_dist.format_storage` runs `kafka-storage format`
for Kafka), starting `gregor broker` on a free port and waiting until it listens, stopping it
(SIGTERM) or killing it (SIGKILL), and a start that must be refused. The broker's output goes
to `broker.log` next to its data, never to a pipe nobody drains (a full pipe would stall the
broker mid-test).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.config import BrokerConfig
from broker.node import new_cluster_id
from broker.protocol import ApiKey, ErrorCode, request_type
from broker.storage.meta_properties import format_dirs, read_meta_properties
from tests.support.requests import fill
from tests.support.wire import call

__all__ = [
    "QUORUM_CLUSTER_ID",
    "Cluster",
    "RunningNode",
    "format_node",
    "free_port",
    "refused_start",
    "run_node",
    "spawn_node",
    "start_cluster",
    "start_node",
    "start_quorum",
    "wait_for_brokers",
    "wait_listening",
]


_PORTS = range(20_000, 30_000)
"""Where test listeners go: below Linux's ephemeral range (32768-60999), whose ports the
kernel also hands to outgoing connections (a client connecting between the probe and the
node's own bind took one: "address already in use"), and below Kubernetes' NodePort range
(30000-32767), which kube-proxy's rules redirect on a machine running `make cluster`."""


_handed_out: set[int] = set()
"""Ports `free_port` has already given in this process: a node started later binds its port
only when it starts, so a probe alone would give two listeners of one cluster the same port
(a 6-port cluster drawing from 10,000 ports clashes once in ~700 starts)."""


def free_port() -> int:
    """A port nothing listens on now, outside the ephemeral range (`_PORTS`), and not given
    before in this process."""
    if len(_handed_out) > len(_PORTS) // 2:
        _handed_out.clear()  # the earliest are long closed by now
    for _ in range(200):
        port = random.choice(_PORTS)
        if port in _handed_out:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class RunningNode:
    process: subprocess.Popen[str]
    port: int
    config: Path
    controller_port: int | None = None
    cluster_id: str | None = None
    node_id: int = 1

    def restart(self) -> None:
        """Start the node again on the same directory and settings (after a stop or kill),
        without formatting anything: it is not a new node; returns without waiting for it to
        serve."""
        assert self.process.poll() is not None, "the node is still running"
        self.process = _popen(self.config, None, self.cluster_id)

    @property
    def bootstrap(self) -> str:
        return f"localhost:{self.port}"

    @property
    def log(self) -> Path:
        """Everything the broker wrote to stdout and stderr, across restarts on this directory."""
        return self.config.parent / "broker.log"

    def log_tail(self, characters: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-characters:] if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL: the broker dies mid-flight, as in a crash or an OOM kill."""
        self.process.kill()
        self.process.wait(10)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, as Kubernetes and systemd stop a broker; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)


def start_node(
    tmp: Path, extra: dict[str, str] | None = None, *, open_files: int | None = None
) -> RunningNode:
    """Start `gregor broker` on `tmp`; `open_files` caps its file descriptors (soft and hard
    RLIMIT_NOFILE), as a small container or systemd's LimitNOFILE would."""
    port = free_port()
    properties = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "listeners": f"PLAINTEXT://localhost:{port}",
        "log.dirs": str(tmp / "logs"),
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "5",
        "group.initial.rebalance.delay.ms": "0",
    } | (extra or {})
    node = spawn_node(tmp, properties, port, open_files=open_files)
    wait_listening(node)
    return node


def format_node(config: Path, cluster_id: str | None = None) -> str:
    """`gregor format --config CONFIG --cluster-id ID --ignore-formatted`, the command's own
    code run in this process (a Python start per node would cost the suite minutes): ID is
    `cluster_id`, else the one the node's metadata log dir has (a node started again on its
    directory), else a new one. Returns ID."""
    settings = BrokerConfig.load(config)
    found = read_meta_properties(settings.metadata_dir)
    chosen = cluster_id or (found.cluster_id if found is not None else new_cluster_id())
    format_dirs(settings.storage_dirs, chosen, settings.node_id, ignore_formatted=True)
    return chosen


def spawn_node(
    tmp: Path,
    properties: dict[str, str],
    port: int,
    *,
    open_files: int | None = None,
    cluster_id: str | None = None,
    controller_port: int | None = None,
) -> RunningNode:
    """Format the node's dirs (`format_node`), then start `gregor broker` with `properties`
    written to `tmp/server.properties`, without waiting for it (a node of a quorum listens
    for clients only once the quorum has formed). With `cluster_id`, the node is also told it
    (`--cluster-id`, which checks its dirs are that cluster's)."""
    config = tmp / "server.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
    format_node(config, cluster_id)
    node = RunningNode(
        _popen(config, open_files, cluster_id), port, config, controller_port, cluster_id
    )
    return node


def _popen(config: Path, open_files: int | None, cluster_id: str | None) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "broker.cli", "broker", "--config", str(config)]
    if cluster_id is not None:
        command += ["--cluster-id", cluster_id]
    if open_files is not None:
        # util-linux's prlimit sets the limits and execs the broker (same process).
        command = ["prlimit", f"--nofile={open_files}:{open_files}", "--", *command]
    with (config.parent / "broker.log").open("a") as output:
        return subprocess.Popen(
            command,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
            env=os.environ | {"PYTHONUNBUFFERED": "1"},
        )


def wait_listening(node: RunningNode, timeout: float = 20.0) -> None:
    """Until the node accepts clients; stops it and raises with its log if it does not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if node.process.poll() is not None:
            raise RuntimeError(
                f"gregor broker exited with {node.process.returncode}:\n{node.log_tail()}"
            )
        with contextlib.suppress(OSError), socket.create_connection(("localhost", node.port), 0.2):
            return
        time.sleep(0.05)
    node.stop()
    raise RuntimeError(
        f"gregor broker did not start listening within {timeout:.0f} s:\n{node.log_tail()}"
    )


def wait_for_brokers(
    ports: Mapping[int, int],
    expected: set[int],
    timeout: float = 30.0,
    logs: Mapping[int, Path] | None = None,
) -> None:
    """Until every broker (node id -> client port), asked itself, lists every `expected`
    broker. Each answers from its own copy of the metadata log, and a client that hears one
    leave a peer out drops its connection to that peer (and any request on it), so a test
    that must see the whole cluster waits for all of them. On timeout the message says what
    each broker listed, with the log of each that lagged (`logs`, by node id)."""
    deadline = time.monotonic() + timeout
    request = fill(request_type(ApiKey.METADATA, 12), {"topics": []})
    seen: dict[int, object] = {}
    while True:
        for node_id, port in ports.items():
            try:
                metadata = call(("localhost", port), ApiKey.METADATA, 12, request, 5.0)
                seen[node_id] = {broker.node_id for broker in metadata.brokers}
            except OSError as error:
                seen[node_id] = error
        lagging = [node_id for node_id, listed in seen.items() if listed != expected]
        if not lagging:
            return
        if time.monotonic() > deadline:
            said = "\n".join(f"broker {i} lists {seen[i]}" for i in sorted(seen))
            tails = "".join(
                f"\n--- broker {i}'s log ---\n{logs[i].read_text(errors='replace')[-4000:]}"
                for i in lagging
                if logs is not None and i in logs and logs[i].exists()
            )
            raise AssertionError(f"not every broker lists {sorted(expected)}:\n{said}{tails}")
        time.sleep(0.2)


def start_quorum(
    tmp: Path,
    count: int = 3,
    extra: dict[str, str] | None = None,
    *,
    cluster_ids: dict[int, str] | None = None,
    spawn: set[int] | None = None,
    each: dict[int, dict[str, str]] | None = None,
) -> list[RunningNode]:
    """`count` combined nodes (broker and controller) of one cluster, voters of one metadata
    quorum, each in `tmp/node-<id>`; returns once every one serves clients. `cluster_ids`
    formats some nodes for another cluster: those are not waited for. With `spawn`, only
    those nodes are started, and none is waited for. `each` adds settings to one node (by
    node id), over `extra`."""
    cluster_ids = cluster_ids or {}
    ports = [(free_port(), free_port()) for _ in range(count)]
    voters = ",".join(f"{i + 1}@localhost:{c}" for i, (_, c) in enumerate(ports))
    nodes = []
    for i, (port, controller_port) in enumerate(ports):
        directory = tmp / f"node-{i + 1}"
        directory.mkdir(parents=True, exist_ok=True)
        properties = (
            {
                "process.roles": "broker,controller",
                "node.id": str(i + 1),
                "listeners": f"PLAINTEXT://localhost:{port},CONTROLLER://localhost:{controller_port}",
                "controller.listener.names": "CONTROLLER",
                "controller.quorum.voters": voters,
                "log.dirs": str(directory / "logs"),
                "offsets.topic.replication.factor": "1",
                "offsets.topic.num.partitions": "5",
                "group.initial.rebalance.delay.ms": "0",
            }
            | (extra or {})
            | (each or {}).get(i + 1, {})
        )
        if spawn is not None and i + 1 not in spawn:
            continue
        node = spawn_node(
            directory,
            properties,
            port,
            cluster_id=cluster_ids.get(i + 1, QUORUM_CLUSTER_ID),
            controller_port=controller_port,
        )
        node.node_id = i + 1
        nodes.append(node)
    if spawn is not None:
        return nodes
    try:
        for node in nodes:
            if node.cluster_id == QUORUM_CLUSTER_ID:
                wait_listening(node, timeout=30)
    except BaseException:
        for node in nodes:
            node.kill()
        raise
    return nodes


@dataclass
class Cluster:
    """A running cluster: `brokers[i]` is broker `i + 1`; `controllers` are the voters of its
    metadata quorum (the brokers themselves when they are combined nodes)."""

    brokers: list[RunningNode]
    controllers: list[RunningNode]

    @property
    def nodes(self) -> list[RunningNode]:
        """Every process of the cluster, once each."""
        return self.brokers + [c for c in self.controllers if c not in self.brokers]

    def broker(self, node_id: int) -> RunningNode:
        return next(b for b in self.brokers if b.node_id == node_id)

    def node(self, node_id: int) -> RunningNode:
        return next(n for n in self.nodes if n.node_id == node_id)

    def kill(self) -> None:
        """SIGKILL every process still running (a test's cleanup)."""
        for node in self.nodes:
            if node.process.poll() is None:
                node.kill()


def start_cluster(
    tmp: Path,
    brokers: int = 3,
    controllers: int = 0,
    extra: dict[str, str] | None = None,
    *,
    each: dict[int, dict[str, str]] | None = None,
) -> Cluster:
    """`brokers` brokers (node ids 1..N) of one cluster; returns once each serves clients.
    With `controllers` 0 they are combined nodes, voters of the metadata quorum themselves
    (`start_quorum`); otherwise the quorum is that many dedicated controllers
    (`process.roles=controller`, node ids N+1..N+C) and the brokers are broker-only nodes,
    observers of its log. `each` adds settings to one node, by node id."""
    if controllers == 0:
        nodes = start_quorum(tmp, brokers, extra, each=each)
        return _registered(Cluster(nodes, nodes))
    ids = range(brokers + 1, brokers + controllers + 1)
    controller_ports = {node_id: free_port() for node_id in ids}
    voters = ",".join(f"{i}@localhost:{port}" for i, port in controller_ports.items())
    common = {
        "controller.listener.names": "CONTROLLER",
        "controller.quorum.voters": voters,
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "5",
        "group.initial.rebalance.delay.ms": "0",
    }
    started: list[RunningNode] = []
    try:
        for node_id, port in controller_ports.items():
            directory = tmp / f"controller-{node_id}"
            directory.mkdir(parents=True, exist_ok=True)
            properties = (
                common
                | {
                    "process.roles": "controller",
                    "node.id": str(node_id),
                    "listeners": f"CONTROLLER://localhost:{port}",
                    "log.dirs": str(directory / "logs"),
                }
                | (extra or {})
                | (each or {}).get(node_id, {})
            )
            node = spawn_node(
                directory, properties, port, cluster_id=QUORUM_CLUSTER_ID, controller_port=port
            )
            node.node_id = node_id
            started.append(node)
        for node_id in range(1, brokers + 1):
            directory = tmp / f"node-{node_id}"
            directory.mkdir(parents=True, exist_ok=True)
            port = free_port()
            properties = (
                common
                | {
                    "process.roles": "broker",
                    "node.id": str(node_id),
                    "listeners": f"PLAINTEXT://localhost:{port}",
                    "log.dirs": str(directory / "logs"),
                }
                | (extra or {})
                | (each or {}).get(node_id, {})
            )
            node = spawn_node(directory, properties, port, cluster_id=QUORUM_CLUSTER_ID)
            node.node_id = node_id
            started.append(node)
        for node in started:
            wait_listening(node, timeout=30)
    except BaseException:
        for node in started:
            if node.process.poll() is None:
                node.kill()
        raise
    return _registered(Cluster(started[controllers:], started[:controllers]))


def _registered(cluster: Cluster) -> Cluster:
    """`cluster` once every broker lists every broker. A broker listens before its own
    registration, and its peers' registrations, reach its metadata; a client told of a
    cluster without a broker drops its connection to it, and what it sent there (a
    CreateTopics naming that broker in its assignment then waits out the client's timeout)."""
    try:
        wait_for_brokers(
            {node.node_id: node.port for node in cluster.brokers},
            {node.node_id for node in cluster.brokers},
            30,
            {node.node_id: node.log for node in cluster.nodes},
        )
    except BaseException:
        cluster.kill()
        raise
    return cluster


QUORUM_CLUSTER_ID = "GregorQuorumTestsA1b2C3"
"""The cluster id every node of `start_quorum` is formatted with."""


@contextlib.contextmanager
def run_node(
    tmp: Path, extra: dict[str, str] | None = None, *, open_files: int | None = None
) -> Iterator[RunningNode]:
    node = start_node(tmp, extra, open_files=open_files)
    try:
        yield node
    finally:
        code = node.stop()
        assert code == 0, f"gregor broker exited with {code} on SIGTERM:\n{node.log_tail()}"


def refused_start(config: Path) -> str:
    """Start `gregor broker` with `config`; it must refuse with exit code 1. Returns what it
    said (stderr), for the test to check that the message names the problem."""
    result = subprocess.run(
        [sys.executable, "-m", "broker.cli", "broker", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    return result.stderr


def describe_quorum(ports: list[int]) -> Any:
    """DescribeQuorum as the quorum's leader answers it (the voter among `ports` that does)."""
    body = fill(
        request_type(ApiKey.DESCRIBE_QUORUM, 2),
        {"topics": [{"topic_name": "__cluster_metadata", "partitions": [{"partition_index": 0}]}]},
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        for port in ports:
            answer: Any = call(("localhost", port), ApiKey.DESCRIBE_QUORUM, 2, body)
            partition = answer.topics[0].partitions[0]
            if partition.error_code == ErrorCode.none:
                return partition
        time.sleep(0.2)
    raise AssertionError("no voter answers DescribeQuorum as the leader")
