"""Admission control: how many connections the node holds, from whom, and how many request
bytes it keeps in memory, with Kafka's settings and defaults.

- `max.connections` (default 2^31 - 1): a connection beyond it is closed as soon as it is
  accepted. (Kafka's acceptor stops accepting instead and lets new connections wait in the
  kernel's backlog, unanswered until a slot frees; closed at once, a client retries after its
  reconnect backoff.)
- `max.connections.per.ip` (default 2^31 - 1), with `max.connections.per.ip.overrides`
  (`host:count,...`): a connection from an address that already holds its maximum is closed as
  soon as it is accepted, as in Kafka ("Rejected connection from ...").
- `queued.max.request.bytes` (default -1: no bound): the bytes of requests received and not
  yet processed, across every connection. A connection reserves a frame's announced size as
  soon as its size prefix arrives, and gives it back once the request has been processed; while
  nothing is left, connections that need more are not read (TCP pushes back on their clients)
  and are woken in turn as memory comes back. As Kafka's `SimpleMemoryPool` (non-strict), a
  reservation is granted while anything at all is left, so the pool may run over by one
  request: the bound is `queued.max.request.bytes + socket.request.max.bytes`. Unlike Kafka,
  each connection may hold one request of up to `SMALL_REQUEST_BYTES` outside the pool, so
  that heartbeats, metadata and small produces still flow while large requests have used it
  up (with Kafka an exhausted pool stops every connection, and consumer groups time out);
  that adds at most `max.connections × SMALL_REQUEST_BYTES`.

Per connection, reading also pauses once the requests waiting behind the one being processed
hold `MAX_READ_AHEAD_BYTES` or `MAX_QUEUED_REQUESTS` (the connection's own read-ahead; Kafka
reads no request ahead at all).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Mapping

__all__ = [
    "HEAVY_REQUEST_BYTES",
    "MAX_QUEUED_REQUESTS",
    "MAX_READ_AHEAD_BYTES",
    "SMALL_REQUEST_BYTES",
    "Admission",
    "ConnectionQuotas",
    "MemoryPool",
]


MAX_QUEUED_REQUESTS = 16
"""Requests read ahead of the one being processed before reading pauses."""
MAX_READ_AHEAD_BYTES = 1024 * 1024
"""Bytes of requests read ahead of the one being processed before reading pauses (a larger
request is still read whole: at least one is always read ahead)."""
SMALL_REQUEST_BYTES = 64 * 1024
"""A request this small may be held outside `queued.max.request.bytes`, one per connection."""
HEAVY_REQUEST_BYTES = 1024 * 1024
"""Requests this large take turns, one at a time across connections, and between two of them
every small request that is ready gets its turn. An 8 MiB produce held the event loop 20-50 ms
when this was written; most of its work has left the loop since (ADR 0009, 0012), and the
turns still keep the threads to one large append at a time."""


class ConnectionQuotas:
    """Open connections, in total and per address, against `max.connections` and
    `max.connections.per.ip`."""

    def __init__(
        self, max_connections: int, max_per_ip: int, overrides: Mapping[str, int] | None = None
    ) -> None:
        self.max_connections = max_connections
        self.max_per_ip = max_per_ip
        self.overrides = dict(overrides or {})
        self.total = 0
        self.per_ip: dict[str, int] = {}

    def limit_for(self, ip: str) -> int:
        return self.overrides.get(ip, self.max_per_ip)

    def admit(self, ip: str) -> str | None:
        """Count a new connection from `ip`; or, if it is over a limit, why it is refused."""
        held = self.per_ip.get(ip, 0)
        limit = self.limit_for(ip)
        if held >= limit:
            return f"address already has the configured maximum of {limit} connections"
        if self.total >= self.max_connections:
            return f"the broker already has max.connections={self.max_connections} connections"
        self.per_ip[ip] = held + 1
        self.total += 1
        return None

    def release(self, ip: str) -> None:
        held = self.per_ip.get(ip, 0) - 1
        if held > 0:
            self.per_ip[ip] = held
        else:
            self.per_ip.pop(ip, None)
        self.total -= 1


class MemoryPool:
    """`queued.max.request.bytes` as Kafka's non-strict `SimpleMemoryPool`; `capacity` None is
    no bound (Kafka's -1)."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self.available = capacity if capacity is not None else 0
        self._waiters: deque[Callable[[], None]] = deque()

    @property
    def used(self) -> int:
        return 0 if self.capacity is None else self.capacity - self.available

    def try_reserve(self, size: int) -> bool:
        if self.capacity is None:
            return True
        if self.available <= 0:
            return False
        self.available -= size
        return True

    def release(self, size: int) -> None:
        if self.capacity is None or size == 0:
            return
        self.available += size
        # Wake waiters in turn while memory is left; each one that cannot reserve waits again.
        while self._waiters and self.available > 0:
            self._waiters.popleft()()

    def wait(self, wake: Callable[[], None]) -> None:
        """Call `wake` (once) when memory is released."""
        self._waiters.append(wake)

    def forget(self, wake: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(wake)


class Admission:
    """What every connection of the node checks in with."""

    def __init__(self, quotas: ConnectionQuotas, pool: MemoryPool) -> None:
        self.quotas = quotas
        self.pool = pool
        self.heavy_turn = asyncio.Semaphore(1)
        """Held while a request of `HEAVY_REQUEST_BYTES` or more is processed."""
