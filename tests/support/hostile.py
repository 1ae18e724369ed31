"""Hostile clients on raw sockets: the frames they send, how they send them, and the broker's
resident memory while they run.

What it owns: request frames built by hand through the project's codec
(`tests.support.requests.fill`), including batches that lie about themselves; opening many
connections and abandoning them (reset, silent, half a frame); a writer that pushes large
frames down many non-blocking connections from one thread; collecting answers from many
connections at once; and sampling the resident memory (VmRSS) of a process and all of its
descendants. It never busy-loops: every wait is a `selectors` wait with a timeout, so that a
2-core machine keeps its CPU for the broker and the pinger. Every socket it opens is closed when
the `with` block that opened it ends.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import google_crc32c

from broker.protocol import (
    ApiKey,
    FrameReader,
    RequestHeader,
    decode_response,
    encode_request,
    request_type,
)
from broker.protocol.records import Record, build_batch
from tests.support.requests import fill
from tests.support.wire import exchange

__all__ = [
    "API_VERSIONS",
    "ResidentMemory",
    "answered",
    "collect_frames",
    "connections",
    "fetch_frame",
    "lying_batch",
    "now_ms",
    "produce_frame",
    "produce_values",
    "produced",
    "push",
    "request_frame",
    "reset",
    "resident_bytes",
    "still_open",
]

MiB = 1 << 20
_WAIT_S = 0.2
"""The longest a selector wait lasts before deadlines and stop flags are checked again."""


# -- requests by hand ------------------------------------------------------------------------------


def request_frame(
    api_key: int, version: int, values: Mapping[str, Any], correlation_id: int = 1
) -> bytes:
    """A size-prefixed request frame, the body given as values (`fill`'s nested mappings)."""
    body = fill(request_type(api_key, version), values)
    header = RequestHeader(api_key, version, correlation_id, "gregor-hostile")
    return encode_request(header, body)


def now_ms() -> int:
    """Milliseconds since the epoch, as record timestamps count them."""
    return time.time_ns() // 1_000_000


API_VERSIONS = request_frame(
    ApiKey.API_VERSIONS,
    3,
    {"client_software_name": "gregor-hostile", "client_software_version": "1"},
)
"""The cheapest request there is: a greeting, and a check that a connection is still served."""


def produce_values(topic: str, batch: bytes) -> dict[str, Any]:
    """Produce v9 (acks=all) of `batch` to partition 0 of `topic`, as `fill` values."""
    return {
        "transactional_id": None,
        "acks": -1,
        "timeout": timedelta(seconds=30),
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}],
    }


def produce_frame(topic: str, frame_size: int) -> bytes:
    """A well-formed Produce v9 frame whose size prefix announces exactly `frame_size`: one
    batch of one record, its value as long as it takes."""
    value_bytes = frame_size
    for _ in range(5):
        batch = build_batch([Record(0, now_ms(), None, b"\0" * value_bytes)])
        frame = request_frame(ApiKey.PRODUCE, 9, produce_values(topic, batch))
        if len(frame) - 4 == frame_size:
            return frame
        value_bytes += frame_size - (len(frame) - 4)
    raise AssertionError(f"no Produce frame of exactly {frame_size} bytes")


def produced(frame: bytes) -> Any:
    """The one partition's answer in a Produce v9 response frame."""
    body: Any
    _, body = decode_response(ApiKey.PRODUCE, 9, frame)
    return body.responses[0].partition_responses[0]


def fetch_frame(topic: str, max_wait: timedelta, partitions: Iterable[int] = (0,)) -> bytes:
    """Fetch v12 of `partitions` from offset 0, waiting up to `max_wait` for one byte."""
    return request_frame(
        ApiKey.FETCH,
        12,
        {
            "replica_id": -1,
            "max_wait": max_wait,
            "min_bytes": 1,
            "max_bytes": MiB,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [
                {
                    "topic": topic,
                    "partitions": [
                        {
                            "partition": partition,
                            "current_leader_epoch": -1,
                            "fetch_offset": 0,
                            "last_fetched_epoch": -1,
                            "log_start_offset": -1,
                            "partition_max_bytes": MiB,
                        }
                        for partition in partitions
                    ],
                }
            ],
            "forgotten_topics_data": [],
            "rack_id": "",
        },
    )


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
                    got[sock].append(frame)
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


# -- the broker's memory ---------------------------------------------------------------------------


def _rss(pid: int) -> int:
    """VmRSS of one process in bytes; 0 once it has gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _descendants(pid: int) -> list[int]:
    """`pid` and every process below it, from the parent ids in /proc/*/stat (the kernels the
    suite runs on may lack /proc/<pid>/task/<tid>/children)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(entry.path, "stat").read_text()
                parent = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    found = [pid]
    for process in found:
        found.extend(children.get(process, ()))
    return found


def resident_bytes(pid: int) -> int:
    """VmRSS of `pid` and its descendants (the log cleaner's worker, multiprocessing's
    resource tracker) in bytes, now."""
    return sum(_rss(process) for process in _descendants(pid))


class ResidentMemory:
    """The resident memory of a process and its descendants, sampled on a thread every
    `interval` seconds while the `with` block runs; the process tree is re-read every second,
    VmRSS at every sample. `peak` is the largest sum seen, `latest` the last one."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self._pid = pid
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)
        self.peak = 0
        self.latest = 0
        self.samples = 0

    def __enter__(self) -> ResidentMemory:
        self._record(resident_bytes(self._pid))
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self._record(resident_bytes(self._pid))

    def _record(self, value: int) -> None:
        self.latest = value
        self.peak = max(self.peak, value)
        self.samples += 1

    def _sample(self) -> None:
        tree: list[int] = []
        refreshed = 0.0
        while not self._stop.wait(self._interval):
            if time.monotonic() - refreshed >= 1.0:
                tree = _descendants(self._pid)
                refreshed = time.monotonic()
            self._record(sum(_rss(process) for process in tree))
