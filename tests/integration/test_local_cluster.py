"""`gregor local up --brokers 3 [--controllers 3]`: three combined nodes, or three brokers and
three dedicated controllers, on loopback, each its own process, that a Kafka client uses as one
cluster (a replicated topic, a consumer group), and that Ctrl-C stops cleanly, every node with
it, with its consumer group still active and no traceback in any node's log."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from broker.local import CONTROLLER_PORT_OFFSET
from tests.integration.clients import QUIET
from tests.support.nodes import describe_quorum, wait_for_brokers

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _free_base(count: int) -> int:
    """A port p with p … p+count-1 and their controller ports all free."""
    for _ in range(100):
        base = random.randint(20_000, 50_000)
        ports = [base + i for i in range(count)]
        ports += [p + CONTROLLER_PORT_OFFSET for p in ports]
        sockets = []
        try:
            for port in ports:
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("localhost", port))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        return base
    raise AssertionError("no free ports")


@pytest.mark.parametrize(
    ("flags", "banner", "voters"),
    [
        ([], "Gregor is running: 3 nodes", {1, 2, 3}),
        (
            ["--controllers", "3"],
            "Gregor is running: 3 brokers and 3 dedicated controllers",
            {4, 5, 6},
        ),
    ],
    ids=["combined", "dedicated"],
)
def test_a_local_cluster_serves_as_one_and_stops_together(
    tmp_path: Path, flags: list[str], banner: str, voters: set[int]
) -> None:
    """Three combined nodes, or three brokers and three dedicated controllers (node ids 4-6,
    listening only for the quorum): a Kafka client uses brokers 1-3 as one cluster (a
    replicated topic, a consumer group), and Ctrl-C stops every process cleanly."""
    base = _free_base(6)
    command = [sys.executable, "-m", "broker.cli", "local", "up", "--brokers", "3", *flags]
    command += ["--port", str(base), "--data-dir", str(tmp_path)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        said = process.stdout.readline()
        assert banner in said, said
        bootstrap = ",".join(f"localhost:{base + i}" for i in range(3))
        assert bootstrap in said

        admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
        node_logs = {i: tmp_path / f"node-{i}" / "node.log" for i in (1, 2, 3)}
        wait_for_brokers({i: base + i - 1 for i in (1, 2, 3)}, {1, 2, 3}, 30, node_logs)
        ports = [base + CONTROLLER_PORT_OFFSET + v - 1 for v in voters]
        quorum = describe_quorum(ports)
        assert {v.replica_id for v in quorum.current_voters} == voters
        # Broker-only nodes replicate the metadata log as observers (the leader lists each
        # once it has fetched from it).
        deadline = time.monotonic() + 15
        while {o.replica_id for o in quorum.observers} != {1, 2, 3} - voters:
            assert time.monotonic() < deadline, f"observers: {quorum.observers}"
            time.sleep(0.2)
            quorum = describe_quorum(ports)
        admin.create_topics([NewTopic("local", 3, 3)], operation_timeout=10)["local"].result(30)
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", **QUIET})
        for i in range(100):
            producer.produce("local", value=b"%d" % i)
        assert producer.flush(30) == 0
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "local-readers",
                "auto.offset.reset": "earliest",
                "auto.commit.interval.ms": 100,
                # Bounds its close once the cluster has gone (else 45 s, Kafka's default).
                "session.timeout.ms": 6_000,
                **QUIET,
            }
        )
        consumer.subscribe(["local"])
        got: set[bytes | None] = set()
        deadline = time.monotonic() + 60
        while len(got) < 100 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.add(message.value())
        assert got == {b"%d" % i for i in range(100)}

        # Stopped with the group active: its member commits and leaves while every node
        # shuts down at once and the leaderships of __consumer_offsets move from node to node.
        process.send_signal(signal.SIGINT)
        consumer.close()
        assert process.wait(60) == 0
        # Every process went with it: their ports are free again.
        for port in [base + i for i in range(3)] + [
            base + CONTROLLER_PORT_OFFSET + v - 1 for v in voters
        ]:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("localhost", port), timeout=1).close()
        logs = ["node-1", "node-2", "node-3"]
        logs += [f"controller-{v}" for v in voters if v > 3]
        assert all((tmp_path / name / "node.log").exists() for name in logs)
        # A routine shutdown: the groups are unloaded in a line each, never with a traceback.
        for name in logs:
            said = (tmp_path / name / "node.log").read_text(errors="replace")
            assert "Traceback" not in said, f"{name}:\n{said[-6000:]}"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--controllers", "0"], "--controllers 0: a local cluster has 1 to 9 dedicated"),
        (["--brokers", "10"], "--brokers 10: a local cluster has 1 to 9 brokers"),
    ],
)
def test_a_cluster_of_impossible_size_is_refused_with_a_message(
    tmp_path: Path, flags: list[str], named: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "broker.cli", "local", "up", *flags, "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode != 0
    assert named in result.stderr
