"""Hostile clients on raw sockets: batches that lie about themselves, and how such clients send.

What it owns: opening many connections and abandoning them (reset, silent, half a frame); a
writer that pushes large frames down many non-blocking connections from one thread; collecting
answers from many connections at once. The frames themselves are built by `tests.support.wire`,
the broker's memory is read by `tests.support.processes`. It never busy-loops: every wait is
a `selectors` wait with a timeout, so that a 2-core machine keeps its CPU for the broker and
the pinger. Every socket it opens is closed when the `with` block that opened it ends.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import time
from collections.abc import Callable, Iterator, Mapping

import google_crc32c

from broker.protocol import (
    FrameReader,
)
from tests.support.wire import exchange

__all__ = [
    "answered",
    "collect_frames",
    "connections",
    "lying_batch",
    "push",
    "reset",
    "still_open",
]

MiB = 1 << 20
_WAIT_S = 0.2
"""The longest a selector wait lasts before deadlines and stop flags are checked again."""


# -- batches that lie ------------------------------------------------------------------------------


def lying_batch(batch: bytes, *, records_count: int, last_offset_delta: int) -> bytes:
    """`batch` with its header's record count and last offset delta replaced, and a CRC that
    is valid for the lie."""
    data = bytearray(batch)
    struct.pack_into(">i", data, 23, last_offset_delta)
    struct.pack_into(">i", data, 57, records_count)
    struct.pack_into(">I", data, 17, google_crc32c.value(bytes(data[21:])))
    return bytes(data)


# -- connections -----------------------------------------------------------------------------------


@contextlib.contextmanager
def connections(
    port: int, count: int, *, greeting: bytes | None = None
) -> Iterator[list[socket.socket]]:
    """`count` connections to the broker on localhost, all closed (FIN) when the block ends.
    With a `greeting` (a request frame), each sends it and waits for the answer before the next
    one opens: every connection is then accepted and served, none waits out a dropped SYN (one
    second) because the listen backlog was full."""
    opened: list[socket.socket] = []
    try:
        for _ in range(count):
            opened.append(socket.create_connection(("localhost", port), timeout=10))
            if greeting is not None and exchange(opened[-1], greeting) is None:
                raise ConnectionError("the broker closed a connection instead of answering")
        yield opened
    finally:
        for sock in opened:
            sock.close()


def reset(sock: socket.socket) -> None:
    """Close with a TCP reset instead of a FIN (SO_LINGER on, timeout 0): a client killed or a
    NAT forgetting the connection, as the broker sees it."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def answered(socks: list[socket.socket]) -> list[socket.socket]:
    """The sockets with something to read right now (an answer, or the broker's close)."""
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ, sock)
        ready = {key.fileobj for key, _ in selector.select(0)}
    return [sock for sock in socks if sock in ready]


def still_open(socks: list[socket.socket], timeout: float) -> list[socket.socket]:
    """Wait up to `timeout` seconds for the broker to close each of `socks` (end of file or
    reset; anything it sends first is read and ignored); the ones it has not closed."""
    open_ = set(socks)
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ, sock)
        deadline = time.monotonic() + timeout
        while open_ and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(min(left, _WAIT_S)):
                sock = key.data
                try:
                    closed = not sock.recv(65536, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    closed = False
                except OSError:
                    closed = True
                if closed:
                    open_.discard(sock)
                    selector.unregister(sock)
    return [sock for sock in socks if sock in open_]


def collect_frames(
    socks: list[socket.socket], per_socket: int, timeout: float
) -> dict[socket.socket, list[bytes]]:
    """Read up to `per_socket` response frames from each of `socks` for up to `timeout`
    seconds; a socket the broker closes keeps the frames it got before."""
    got: dict[socket.socket, list[bytes]] = {sock: [] for sock in socks}
    readers = {sock: FrameReader() for sock in socks}
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ, sock)
        waiting = len(socks)
        deadline = time.monotonic() + timeout
        while waiting and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(min(left, _WAIT_S)):
                sock = key.data
                try:
                    data = sock.recv(1 << 20, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                readers[sock].receive_data(data)
                while len(got[sock]) < per_socket:
                    frame = readers[sock].next_frame()
                    if frame is None:
                        break
                    got[sock].append(bytes(frame))
                if not data or len(got[sock]) == per_socket:
                    selector.unregister(sock)
                    waiting -= 1
    return got


def push(
    chunks: Mapping[socket.socket, list[bytes | memoryview]],
    *,
    timeout: float,
    keep_going: Callable[[], bool] = lambda: True,
) -> int:
    """Send each socket's chunks in order, from this one thread, on non-blocking sockets, as
    fast as the broker takes them, without reading anything back; stops at `timeout` seconds,
    when `keep_going()` says so, or when the broker closes a socket (that socket's chunks are
    dropped). Returns the bytes sent."""
    queues = {sock: [memoryview(chunk) for chunk in chunks[sock]] for sock in chunks}
    sent = 0
    with selectors.DefaultSelector() as selector:
        for sock in queues:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_WRITE, sock)
        deadline = time.monotonic() + timeout
        while selector.get_map() and keep_going() and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(min(left, _WAIT_S)):
                sock = key.data
                queue = queues[sock]
                try:
                    count = sock.send(queue[0])
                except BlockingIOError:
                    continue
                except OSError:
                    queue.clear()
                    count = 0
                sent += count
                if queue:
                    queue[0] = queue[0][count:]
                    if not queue[0]:
                        queue.pop(0)
                if not queue:
                    selector.unregister(sock)
    return sent
