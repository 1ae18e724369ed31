"""`gregor local up --brokers N [--controllers C]`: a local cluster, each node a `gregor broker`
process of its own, supervised by this one.

Without `--controllers`, the N nodes are combined (broker and controller each, voters of one
metadata quorum). With it, the quorum is C dedicated controllers (`process.roles=controller`,
node ids N+1 … N+C) and the N brokers (node ids 1 … N) are broker-only nodes, observers of its
log: clients see brokers 1 … N either way.

Node k listens for clients on `port + k - 1` (a broker) and for the quorum on
`port + 10000 + k - 1` (a voter), keeps its logs in `DATA_DIR/node-k` (a broker or combined
node) or `DATA_DIR/controller-k` (a dedicated controller), its output in `node.log` there, and
all share the cluster id kept in `DATA_DIR/cluster-id`, so a second `local up` on the same
directory starts the same cluster again. Each node's dirs are formatted before it starts
(`gregor format --ignore-formatted`): on the user's own laptop cluster an empty dir is always
a new node's. `__consumer_offsets` is replicated three times (or N, if fewer). SIGINT or
SIGTERM stops every node with a controlled shutdown, brokers before controllers; a node that
dies on its own stops the others and the command fails, naming it.
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
from broker.storage import StorageError
from broker.storage.meta_properties import format_dirs

__all__ = ["CONTROLLER_PORT_OFFSET", "run_local_cluster"]

CONTROLLER_PORT_OFFSET = 10_000
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
MAX_NODES = 9


@dataclass
class _Node:
    node_id: int
    roles: str
    """`process.roles`: broker,controller; broker; or controller."""
    port: int
    """Where it serves: its client port, or a dedicated controller's controller port."""
    directory: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return (
            f"controller {self.node_id}" if self.roles == "controller" else f"node {self.node_id}"
        )


def run_local_cluster(data_dir: Path, brokers: int, port: int, dedicated: int | None = None) -> int:
    """Run the cluster until SIGINT or SIGTERM: `dedicated` controllers, or combined nodes."""
    if not 1 <= brokers <= MAX_NODES:
        raise NodeError(f"--brokers {brokers}: a local cluster has 1 to {MAX_NODES} brokers")
    if dedicated is not None and not 1 <= dedicated <= MAX_NODES:
        raise NodeError(
            f"--controllers {dedicated}: a local cluster has 1 to {MAX_NODES} dedicated "
            "controllers (leave --controllers out for combined nodes)"
        )
    controllers = dedicated or 0
    highest = brokers + controllers
    if port < 1 or port + CONTROLLER_PORT_OFFSET + highest > 65_536:
        raise NodeError(f"--port {port}: the controller ports (port + 10000 …) do not fit")
    data_dir.mkdir(parents=True, exist_ok=True)
    cluster_id = _cluster_id(data_dir)
    nodes = _plan(data_dir, brokers, controllers, port)
    voters = ",".join(
        f"{n.node_id}@localhost:{port + CONTROLLER_PORT_OFFSET + n.node_id - 1}"
        for n in nodes
        if "controller" in n.roles
    )
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda number, _frame: stopping.append(number))
    signal.signal(signal.SIGINT, lambda number, _frame: stopping.append(number))
    try:
        for node in nodes:
            node.process = _spawn(node, voters, cluster_id, brokers, port)
        _wait_serving(nodes, stopping)
        if not stopping:
            bootstrap = ",".join(f"localhost:{n.port}" for n in nodes if "broker" in n.roles)
            shape = (
                f"{brokers} brokers and {controllers} dedicated controllers"
                if controllers
                else f"{brokers} nodes"
            )
            print(
                f"Gregor is running: {shape}, bootstrap servers {bootstrap} "
                f"(data and logs in {data_dir}).\n"
                f"Try: kcat -b {bootstrap} -L    Stop with Ctrl-C.",
                flush=True,
            )
        while not stopping:
            for node in nodes:
                assert node.process is not None
                if node.process.poll() is not None:
                    raise NodeError(
                        f"{node.name} exited with {node.process.returncode}; "
                        f"see {node.directory / 'node.log'}"
                    )
            time.sleep(0.5)
        return 0
    finally:
        # Brokers first: a broker's controlled shutdown needs its controllers.
        _stop([n for n in nodes if "broker" in n.roles])
        _stop(nodes)


def _plan(data_dir: Path, brokers: int, controllers: int, port: int) -> list[_Node]:
    if not controllers:
        return [
            _Node(i, "broker,controller", port + i - 1, data_dir / f"node-{i}")
            for i in range(1, brokers + 1)
        ]
    planned = [
        _Node(i, "broker", port + i - 1, data_dir / f"node-{i}") for i in range(1, brokers + 1)
    ]
    for k in range(brokers + 1, brokers + controllers + 1):
        controller_port = port + CONTROLLER_PORT_OFFSET + k - 1
        planned.append(_Node(k, "controller", controller_port, data_dir / f"controller-{k}"))
    return planned


def _cluster_id(data_dir: Path) -> str:
    path = data_dir / "cluster-id"
    if path.exists():
        return path.read_text().strip()
    cluster_id = new_cluster_id()
    path.write_text(cluster_id + "\n")
    return cluster_id


def _spawn(
    node: _Node, voters: str, cluster_id: str, brokers: int, port: int
) -> subprocess.Popen[bytes]:
    node.directory.mkdir(parents=True, exist_ok=True)
    controller = f"CONTROLLER://localhost:{port + CONTROLLER_PORT_OFFSET + node.node_id - 1}"
    client = f"PLAINTEXT://localhost:{port + node.node_id - 1}"
    listeners = {"broker,controller": f"{client},{controller}", "broker": client}
    properties = {
        "process.roles": node.roles,
        "node.id": str(node.node_id),
        "listeners": listeners.get(node.roles, controller),
        "controller.listener.names": "CONTROLLER",
        "controller.quorum.voters": voters,
        "log.dirs": str(node.directory / "logs"),
        "offsets.topic.replication.factor": str(min(3, brokers)),
    }
    config = node.directory / "server.properties"
    config.write_text("".join(f"{key}={value}\n" for key, value in properties.items()))
    try:
        format_dirs([Path(properties["log.dirs"])], cluster_id, node.node_id, ignore_formatted=True)
    except StorageError as exc:
        raise NodeError(f"{node.name}: {exc}") from None
    with (node.directory / "node.log").open("ab") as output:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "broker.cli",
                "broker",
                "--config",
                str(config),
                f"--cluster-id={cluster_id}",  # checked: the dirs are this cluster's
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches this supervisor, which stops them in turn
        )


def _wait_serving(nodes: list[_Node], stopping: list[int]) -> None:
    """Until every node accepts connections (a broker serves clients once it is registered;
    a dedicated controller listens for the quorum at once)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    waiting = list(nodes)
    while waiting and not stopping:
        for node in list(waiting):
            assert node.process is not None
            if node.process.poll() is not None:
                raise NodeError(
                    f"{node.name} did not start (exit {node.process.returncode}); "
                    f"see {node.directory / 'node.log'}"
                )
            try:
                socket.create_connection(("localhost", node.port), timeout=1).close()
            except OSError:
                continue
            waiting.remove(node)
        if waiting and time.monotonic() > deadline:
            names = ", ".join(n.name for n in waiting)
            raise NodeError(f"{names} did not start within {START_TIMEOUT_S:.0f} s")
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
