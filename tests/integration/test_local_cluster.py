"""`gregor local up --brokers 3`: three combined nodes on loopback, each its own process, that a
Kafka client uses as one cluster (a replicated topic, a consumer group), and that Ctrl-C stops
cleanly, every node with it."""

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


def test_three_local_nodes_serve_as_one_cluster_and_stop_together(tmp_path: Path) -> None:
    base = _free_base(3)
    command = [sys.executable, "-m", "broker.cli", "local", "up", "--brokers", "3"]
    command += ["--port", str(base), "--data-dir", str(tmp_path)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()
        assert "Gregor is running: 3 nodes" in banner, banner
        bootstrap = ",".join(f"localhost:{base + i}" for i in range(3))
        assert bootstrap in banner

        admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
        deadline = time.monotonic() + 30
        while len(admin.list_topics(timeout=10).brokers) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.2)
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
        consumer.close()
        assert got == {b"%d" % i for i in range(100)}

        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0
        # Every node went with it: their ports are free again.
        for i in range(3):
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("localhost", base + i), timeout=1).close()
        assert all((tmp_path / f"node-{i}" / "node.log").exists() for i in (1, 2, 3))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def test_dedicated_controllers_are_refused_with_a_message(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "broker.cli", "local", "up", "--brokers", "3", "--controllers", "1"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode != 0
    assert "dedicated controllers are not supported yet" in result.stderr
