"""A TCP proxy between a real Kafka client and a real broker that loses responses on purpose.

A fault injector, named as such: a client retries a Produce only when it never got the answer,
and no client can be made to lose one. The proxy forwards every frame unchanged, remembers the
API key of each request by its correlation id, and for the next `drops` responses to requests
of the chosen API it closes the client's connection instead of passing the response on: the
broker has written the batch, the client believes it has not, and sends it again on a new
connection. Everything else is real: the client, its retry logic and the broker.

The broker must advertise the proxy's port (`advertised.listeners`), or the client would
connect to the broker directly after bootstrapping.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["LossyProxy", "lossy_proxy"]


@dataclass
class LossyProxy:
    port: int
    upstream: tuple[str, int]
    api_key: int
    drops: int
    """Responses still to lose."""
    dropped: int = 0
    forwarded: dict[int, int] = field(default_factory=dict)
    """Requests passed to the broker, by API key."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _sockets: list[socket.socket] = field(default_factory=list)

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _close_all(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _close(sock)

    def _take_drop(self) -> bool:
        with self._lock:
            if self.drops <= 0:
                return False
            self.drops -= 1
            self.dropped += 1
            return True


def _frames(sock: socket.socket) -> Iterator[bytes]:
    """Whole Kafka frames (size prefix included) read from `sock`, until it closes."""
    buffer = b""
    while True:
        try:
            data = sock.recv(65536)
        except OSError:
            return
        if not data:
            return
        buffer += data
        while len(buffer) >= 4:
            (size,) = struct.unpack_from(">i", buffer)
            if len(buffer) < 4 + size:
                break
            yield buffer[: 4 + size]
            buffer = buffer[4 + size :]


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _serve(proxy: LossyProxy, client: socket.socket) -> None:
    try:
        broker = socket.create_connection(proxy.upstream)
    except OSError:
        _close(client)
        return
    proxy._track(broker)
    pending: dict[int, int] = {}
    lock = threading.Lock()

    def close_both() -> None:
        _close(client)
        _close(broker)

    def requests() -> None:
        for frame in _frames(client):
            api_key, _, correlation_id = struct.unpack_from(">hhi", frame, 4)
            with lock:
                pending[correlation_id] = api_key
            with proxy._lock:
                proxy.forwarded[api_key] = proxy.forwarded.get(api_key, 0) + 1
            try:
                broker.sendall(frame)
            except OSError:
                break
        close_both()

    threading.Thread(target=requests, daemon=True).start()
    for frame in _frames(broker):
        (correlation_id,) = struct.unpack_from(">i", frame, 4)
        with lock:
            api_key = pending.pop(correlation_id, None)
        if api_key == proxy.api_key and proxy._take_drop():
            break
        try:
            client.sendall(frame)
        except OSError:
            break
    close_both()


@contextlib.contextmanager
def lossy_proxy(
    port: int, upstream: tuple[str, int], api_key: int, drops: int
) -> Iterator[LossyProxy]:
    """Listen on localhost:`port` and forward to `upstream`, losing the next `drops` responses
        to `api_key` requests as described above. Stops listening and closes every connection on
    exit."""
    proxy = LossyProxy(port, upstream, api_key, drops)
    listener = socket.create_server(("localhost", port))
    stopped = threading.Event()

    def accept() -> None:
        while not stopped.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            proxy._track(client)
            threading.Thread(target=_serve, args=(proxy, client), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield proxy
    finally:
        stopped.set()
        # Closing the listener does not wake a thread blocked in accept(): that one would go
        # on accepting (a client reconnecting after the block, proxied to the broker). A
        # shutdown wakes it.
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        acceptor.join()
        listener.close()
        proxy._close_all()
