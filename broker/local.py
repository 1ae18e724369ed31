"""`gregor local up --brokers N`: a local cluster of N combined nodes (broker and controller
each, voters of one metadata quorum), each a `gregor broker` process of its own, supervised
by this one.

Node i listens for clients on `port + i - 1` and for the quorum on `port + 10000 + i - 1`,
keeps its logs in `DATA_DIR/node-i` (its output in `node-i/node.log`), and all share the
cluster id kept in `DATA_DIR/cluster-id`, so a second `local up` on the same directory starts
the same cluster again. `__consumer_offsets` is replicated three times (or N, if fewer).
SIGINT or SIGTERM stops every node with a controlled shutdown; a node that dies on its own
stops the others and the command fails, naming it.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from broker.node import NodeError, new_cluster_id

__all__ = ["CONTROLLER_PORT_OFFSET", "run_local_cluster"]

CONTROLLER_PORT_OFFSET = 10_000
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


@dataclass
class _Node:
    node_id: int
    port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None


def run_local_cluster(data_dir: Path, brokers: int, port: int) -> int:
    if not 1 <= brokers <= 9:
        raise NodeError(f"--brokers {brokers}: a local cluster has 1 to 9 nodes")
    if port + CONTROLLER_PORT_OFFSET + brokers > 65_536:
        raise NodeError(f"--port {port}: the controller ports (port + 10000 …) do not fit")
    data_dir.mkdir(parents=True, exist_ok=True)
    cluster_id = _cluster_id(data_dir)
    nodes = [_Node(i, port + i - 1, data_dir / f"node-{i}") for i in range(1, brokers + 1)]
    voters = ",".join(f"{n.node_id}@localhost:{n.port + CONTROLLER_PORT_OFFSET}" for n in nodes)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda number, _frame: stopping.append(number))
    signal.signal(signal.SIGINT, lambda number, _frame: stopping.append(number))
    try:
        for node in nodes:
            node.process = _spawn(node, voters, cluster_id, brokers)
        _wait_serving(nodes, stopping)
        if not stopping:
            bootstrap = ",".join(f"localhost:{n.port}" for n in nodes)
            print(
                f"Gregor is running: {brokers} nodes, bootstrap servers {bootstrap} "
                f"(data and logs in {data_dir}).\n"
                f"Try: kcat -b {bootstrap} -L    Stop with Ctrl-C.",
                flush=True,
            )
        while not stopping:
            for node in nodes:
                assert node.process is not None
                if node.process.poll() is not None:
                    raise NodeError(
                        f"node {node.node_id} exited with {node.process.returncode}; "
                        f"see {node.directory / 'node.log'}"
                    )
            time.sleep(0.5)
        return 0
    finally:
        _stop(nodes)


def _cluster_id(data_dir: Path) -> str:
    path = data_dir / "cluster-id"
    if path.exists():
        return path.read_text().strip()
    cluster_id = new_cluster_id()
    path.write_text(cluster_id + "\n")
    return cluster_id


def _spawn(node: _Node, voters: str, cluster_id: str, brokers: int) -> subprocess.Popen[bytes]:
    node.directory.mkdir(parents=True, exist_ok=True)
    controller = node.port + CONTROLLER_PORT_OFFSET
    properties = {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        "listeners": f"PLAINTEXT://localhost:{node.port},CONTROLLER://localhost:{controller}",
        "controller.listener.names": "CONTROLLER",
        "controller.quorum.voters": voters,
        "log.dirs": str(node.directory / "logs"),
        "offsets.topic.replication.factor": str(min(3, brokers)),
    }
    config = node.directory / "server.properties"
    config.write_text("".join(f"{key}={value}\n" for key, value in properties.items()))
    with (node.directory / "node.log").open("ab") as output:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "broker.cli",
                "broker",
                "--config",
                str(config),
                "--cluster-id",
                cluster_id,
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches this supervisor, which stops them in turn
        )


def _wait_serving(nodes: list[_Node], stopping: list[int]) -> None:
    """Until every node accepts connections (it serves clients once it is registered)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    waiting = list(nodes)
    while waiting and not stopping:
        for node in list(waiting):
            assert node.process is not None
            if node.process.poll() is not None:
                raise NodeError(
                    f"node {node.node_id} did not start (exit {node.process.returncode}); "
                    f"see {node.directory / 'node.log'}"
                )
            try:
                socket.create_connection(("localhost", node.port), timeout=1).close()
            except OSError:
                continue
            waiting.remove(node)
        if waiting and time.monotonic() > deadline:
            names = ", ".join(str(n.node_id) for n in waiting)
            raise NodeError(f"nodes {names} did not start within {START_TIMEOUT_S:.0f} s")
        time.sleep(0.2)


def _stop(nodes: list[_Node]) -> None:
    """SIGTERM to every node (a controlled shutdown each), then wait; SIGKILL what is left."""
    running = [n.process for n in nodes if n.process is not None and n.process.poll() is None]
    for process in running:
        process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for process in running:
        try:
            process.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
