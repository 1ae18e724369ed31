"""Real `gregor broker` processes for integration tests.

What it owns: writing a single-node `server.properties` on a temporary directory, starting
`gregor broker` on a free port and waiting until it listens, stopping it (SIGTERM) or killing it
(SIGKILL), and a start that must be refused. The broker's output goes to `broker.log` next to
its data, never to a pipe nobody drains (a full pipe would stall the broker mid-test).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunningNode", "free_port", "refused_start", "run_node", "start_node"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class RunningNode:
    process: subprocess.Popen[str]
    port: int
    config: Path

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
    config = tmp / "server.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
    command = [sys.executable, "-m", "broker.cli", "broker", "--config", str(config)]
    if open_files is not None:
        # util-linux's prlimit sets the limits and execs the broker (same process).
        command = ["prlimit", f"--nofile={open_files}:{open_files}", "--", *command]
    with (tmp / "broker.log").open("a") as output:
        process = subprocess.Popen(
            command,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
            env=os.environ | {"PYTHONUNBUFFERED": "1"},
        )
    node = RunningNode(process, port, config)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"gregor broker exited with {process.returncode}:\n{node.log_tail()}"
            )
        with contextlib.suppress(OSError), socket.create_connection(("localhost", port), 0.2):
            return node
        time.sleep(0.05)
    node.stop()
    raise RuntimeError(f"gregor broker did not start listening within 20 s:\n{node.log_tail()}")


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
