"""Admission control on a real `gregor broker`: connections over `max.connections` or
`max.connections.per.ip` are refused while the others are served; a connection reads only so
far ahead of the request it is processing; `queued.max.request.bytes` bounds the requests
held in memory across connections while small requests still flow.

On main before this change there was no limit on connections, and each connection read up to
16 frames of up to `socket.request.max.bytes` ahead: three connections added 378 MiB."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

from tests.integration.clients import create_topic
from tests.support.nodes import RunningNode, run_node
from tests.support.processes import resident_bytes
from tests.support.wire import API_VERSIONS, exchange, fetch_frame, produce_frame

MiB = 1024 * 1024
PARKED_FOR = timedelta(seconds=5)
"""How long each connection's first request, a Fetch of an empty partition, waits: the
requests sent behind it on the same connection wait with it (processed in order)."""


def _connect(node: RunningNode, source: str = "127.0.0.1") -> socket.socket:
    """A connection from `source`; create_connection closes the socket if it cannot connect."""
    return socket.create_connection(("127.0.0.1", node.port), 10, source_address=(source, 0))


def _served(sock: socket.socket) -> bool:
    """Whether the broker answers an ApiVersions on `sock` (False: it closed the connection).
    Both are events on the socket, not the end of a wait: a connection neither answered nor
    closed raises TimeoutError (10 s) and fails the test, so False cannot mean "too slow"."""
    try:
        return exchange(sock, API_VERSIONS) is not None
    except ConnectionError:
        return False


def _eventually(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@contextlib.contextmanager
def _sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    try:
        yield opened
    finally:
        for sock in opened:
            sock.close()


def test_connections_over_the_limits_are_refused_and_the_rest_served(tmp_path: Path) -> None:
    limits = {
        "max.connections": "5",
        "max.connections.per.ip": "3",
        "max.connections.per.ip.overrides": "127.0.0.3:1",
    }
    with run_node(tmp_path, limits) as node, _sockets() as opened:
        for _ in range(3):
            opened.append(_connect(node, "127.0.0.1"))
            assert _served(opened[-1])
        fourth = _connect(node, "127.0.0.1")
        opened.append(fourth)
        assert not _served(fourth)  # over max.connections.per.ip
        for _ in range(2):
            opened.append(_connect(node, "127.0.0.2"))
            assert _served(opened[-1])
        over_total = _connect(node, "127.0.0.4")
        opened.append(over_total)
        assert not _served(over_total)  # over max.connections

        opened[0].close()  # a slot frees: the next connection is served
        _eventually(lambda: _served(_keep(opened, _connect(node, "127.0.0.3"))), "a slot")
        assert not _served(_keep(opened, _connect(node, "127.0.0.3")))  # its override is 1

        text = node.log_tail(100_000)
        assert (
            "rejected connection from 127.0.0.1: address already has the configured maximum "
            "of 3 connections" in text
        )
        assert "the broker already has max.connections=5 connections" in text


def _keep(opened: list[socket.socket], sock: socket.socket) -> socket.socket:
    opened.append(sock)
    return sock


def _pipeline_behind_a_parked_fetch(
    node: RunningNode, connections: int, frames: list[bytes], opened: list[socket.socket]
) -> None:
    """Each connection: a Fetch that parks, then `frames`, sent without reading anything, for
    as long as the broker takes them (until nothing moves for half a second)."""
    pending: list[tuple[socket.socket, memoryview]] = []
    for _ in range(connections):
        sock = _connect(node)
        sock.setblocking(False)
        opened.append(sock)
        pending.append((sock, memoryview(fetch_frame("empty", PARKED_FOR) + b"".join(frames))))
    last_progress = time.monotonic()
    while pending and time.monotonic() - last_progress < 0.5:
        still: list[tuple[socket.socket, memoryview]] = []
        for sock, data in pending:
            left = data
            with contextlib.suppress(BlockingIOError):
                left = data[sock.send(data) :]
                last_progress = time.monotonic()
            if left:
                still.append((sock, left))
        pending = still
        time.sleep(0.01)


def test_a_connection_reads_only_so_far_ahead_of_the_request_it_processes(
    tmp_path: Path,
) -> None:
    """No memory bound configured (Kafka's default): each connection still holds at most about
    `MAX_READ_AHEAD_BYTES` (1 MiB, or one request if larger) behind the request it processes,
    plus one socket read (256 KiB). Ten connections pipelining sixteen 1 MiB requests behind a
    parked Fetch: before, each held all 16 (160 MiB); now about 2 MiB each."""
    with run_node(tmp_path, {"socket.request.max.bytes": str(8 * MiB)}) as node:
        create_topic(node.bootstrap, "empty", 1)
        before = resident_bytes(node.process.pid)
        with _sockets() as opened:
            _pipeline_behind_a_parked_fetch(node, 10, [produce_frame("empty", MiB)] * 16, opened)
            time.sleep(1)
            grown = resident_bytes(node.process.pid) - before
            fresh = _keep(opened, _connect(node))
            assert _served(fresh)
        assert grown < 40 * MiB, f"the broker grew by {grown / MiB:.0f} MiB"


def test_queued_max_request_bytes_bounds_memory_and_small_requests_still_flow(
    tmp_path: Path,
) -> None:
    """`queued.max.request.bytes=4 MiB`: ten connections each pipelining four 3 MiB requests
    behind a parked Fetch. Held in memory: the pool (4 MiB) plus one request over it (3 MiB),
    plus a socket read per connection (256 KiB): about 10 MiB, against 120 MiB before. A new
    client's ApiVersions is still answered (a small request may be held outside the pool);
    once the hostile connections close, their memory is back and a large request goes through.
    """
    settings = {"queued.max.request.bytes": str(4 * MiB), "socket.request.max.bytes": str(8 * MiB)}
    with run_node(tmp_path, settings) as node:
        create_topic(node.bootstrap, "empty", 1)
        before = resident_bytes(node.process.pid)
        with _sockets() as opened:
            _pipeline_behind_a_parked_fetch(node, 10, [produce_frame("empty", 3 * MiB)] * 4, opened)
            time.sleep(1)
            grown = resident_bytes(node.process.pid) - before
            assert _served(_keep(opened, _connect(node)))
        assert grown < 30 * MiB, f"the broker grew by {grown / MiB:.0f} MiB"

        with _connect(node) as sock:  # the pool is free again: a 3 MiB request is processed
            sock.settimeout(20)
            assert exchange(sock, produce_frame("empty", 3 * MiB)) is not None
