"""Listeners: one asyncio server per `listeners` entry, and the shutdown order.

Shutdown follows h11/uvicorn: stop accepting, let each connection finish the request it is
processing, wait up to a timeout, then abort what is left. Idle connections close after
`connections.max.idle.ms`, as in Kafka.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from broker.config import BrokerConfig, Listener

from .admission import Admission, ConnectionQuotas, MemoryPool
from .connection import Connection, scratch_buffer
from .dispatcher import Dispatcher

__all__ = ["BoundListener", "BrokerServer"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BoundListener:
    """A listener and the port it actually got (port 0 in the config means any free port)."""

    name: str
    host: str
    port: int


class BrokerServer:
    def __init__(
        self, config: BrokerConfig, dispatcher: Dispatcher, *, controller: bool = False
    ) -> None:
        """Serves the client and inter-broker listeners, or (`controller`) the controller
        listeners (`controller.listener.names`) with their own handlers."""
        self._config = config
        self._dispatcher = dispatcher
        self._controller = controller
        self._servers: list[asyncio.Server] = []
        self._connections: set[Connection] = set()
        self._scratch = scratch_buffer()
        """Read into by every connection of this server, one at a time (on its event loop)."""
        self.admission = Admission(
            ConnectionQuotas(
                config.max_connections,
                config.max_connections_per_ip,
                config.max_connections_per_ip_overrides,
            ),
            MemoryPool(
                config.queued_max_request_bytes if config.queued_max_request_bytes > 0 else None
            ),
        )
        self._sweeper: asyncio.Task[None] | None = None
        self.bound: list[BoundListener] = []

    async def start(self, *, serve: bool = True) -> list[BoundListener]:
        """Bind every listener; accept connections at once, or (`serve=False`) only from
        `serve()` on: a broker binds first, to know its ports, and accepts clients once the
        controller has unfenced it, as Kafka's does."""
        loop = asyncio.get_running_loop()
        for listener in self._config.listeners:
            if (listener.name in self._config.controller_listener_names) != self._controller:
                continue
            server = await loop.create_server(
                lambda listener=listener: self._connection(listener),
                host=listener.host or None,
                port=listener.port,
                reuse_address=True,
                start_serving=serve,
            )
            self._servers.append(server)
            port = server.sockets[0].getsockname()[1]
            self.bound.append(BoundListener(listener.name, listener.host, port))
            log.info("listening on %s://%s:%d", listener.name, listener.host, port)
        self._sweeper = loop.create_task(self._close_idle_connections())
        return self.bound

    async def serve(self) -> None:
        """Start accepting connections on listeners bound with `start(serve=False)`."""
        for server in self._servers:
            await server.start_serving()

    @property
    def serving(self) -> bool:
        """Whether every bound listener accepts connections."""
        return bool(self._servers) and all(server.is_serving() for server in self._servers)

    def _connection(self, listener: Listener) -> Connection:
        return Connection(
            self._dispatcher,
            listener.name,
            self._config.socket_request_max_bytes,
            self._connections,
            admission=self.admission,
            scratch=self._scratch,
        )

    async def _close_idle_connections(self) -> None:
        idle_ms = self._config.connections_max_idle_ms
        if idle_ms < 0:
            return
        period = max(min(idle_ms / 10_000, 30.0), 0.05)
        while True:
            await asyncio.sleep(period)
            deadline = time.monotonic() - idle_ms / 1000
            for connection in list(self._connections):
                if connection.stalled and connection.last_active < deadline:
                    log.info("closing idle connection from %s", connection.peer)
                    if connection.idle:
                        connection.close()
                    else:
                        connection.abort()  # its client stopped reading

    async def stop(self, timeout: float = 10.0) -> None:
        for server in self._servers:
            server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        connections = list(self._connections)
        for connection in connections:
            connection.close()
        waits = [asyncio.ensure_future(c.wait_closed()) for c in connections]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=timeout)
            for connection in connections:
                connection.abort()
            for waiter in pending:
                waiter.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
