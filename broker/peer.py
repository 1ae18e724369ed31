"""A connection from this node to another node of the cluster, on the project's codec: the
quorum's Vote, BeginQuorumEpoch, EndQuorumEpoch, Fetch and FetchSnapshot today; registration,
heartbeats, forwarding and replica fetches next.

Requests are pipelined on one TCP connection and matched to their responses by correlation
id. A connection that fails fails every request in flight (`PeerUnavailable`) and the next
request connects again, after a backoff that grows from `reconnect.backoff.ms` to
`reconnect.backoff.max.ms` (Kafka's defaults: 50 ms and 1 s) while the peer stays away.

A request that times out closes its connection, as Kafka's NetworkClient does, and the next
request connects anew (resolving the peer's name again); connecting is bounded by the same
timeout. A peer whose address vanished (a Kubernetes pod replaced, its IP gone without a
reset) otherwise leaves a connection that looks open and swallows every request, or a
connect that hangs, for as long as TCP retransmits (minutes).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import struct
import time
from collections.abc import Mapping

from broker.aio import wait_for
from broker.protocol import (
    MalformedInput,
    RequestBody,
    RequestHeader,
    ResponseBody,
    decode_response,
    encode_request,
)

__all__ = ["ActiveControllerPeers", "PeerConnection", "PeerUnavailable"]

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
MAX_RESPONSE_BYTES = 128 * 1024 * 1024
"""A response larger than this from a peer is refused (a bug or not a Gregor node)."""
RECONNECT_BACKOFF_MS = 50
RECONNECT_BACKOFF_MAX_MS = 1000


class PeerUnavailable(Exception):
    """The peer could not be reached or the connection broke; the request may be retried."""


class PeerConnection:
    def __init__(self, node_id: int, host: str, port: int, *, client_id: str) -> None:
        self.node_id = node_id
        self.host = host
        self.port = port
        self._client_id = client_id
        self._correlation = itertools.count(1)
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._pending: dict[int, tuple[int, int, asyncio.Future[ResponseBody]]] = {}
        self._connecting: asyncio.Lock | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._closed = False

    def __repr__(self) -> str:
        return f"node {self.node_id} at {self.host}:{self.port}"

    async def request(
        self, api_key: int, api_version: int, body: RequestBody, *, timeout_s: float
    ) -> ResponseBody:
        """Send one request and wait for its response. Raises `PeerUnavailable` when the
        connection fails or cannot be made within `timeout_s`, and `TimeoutError` when no
        answer comes within `timeout_s`."""
        writer = await self._connected(timeout_s)
        correlation_id = next(self._correlation)
        header = RequestHeader(api_key, api_version, correlation_id, self._client_id)
        future: asyncio.Future[ResponseBody] = asyncio.get_running_loop().create_future()
        self._pending[correlation_id] = (api_key, api_version, future)
        try:
            writer.write(encode_request(header, body))
            return await wait_for(future, timeout_s)
        except TimeoutError:
            if self._writer is writer:
                log.info("%s: no answer within %.0f ms: reconnecting", self, timeout_s * 1000)
                self._writer = None
                writer.close()  # its reader fails the other requests in flight on it
            raise
        finally:
            self._pending.pop(correlation_id, None)

    async def _connected(self, timeout_s: float) -> asyncio.StreamWriter:
        if self._closed:
            raise PeerUnavailable(f"{self}: closed")
        if self._writer is not None and not self._writer.is_closing():
            return self._writer
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            wait = self._retry_at - time.monotonic()
            if wait > 0:
                raise PeerUnavailable(f"{self}: unreachable, next attempt in {wait * 1000:.0f} ms")
            try:
                # Bounded: a SYN to an address nobody holds any more goes unanswered for
                # minutes, and every request would queue behind it.
                reader, writer = await wait_for(
                    asyncio.open_connection(self.host, self.port), timeout_s
                )
            except (OSError, TimeoutError) as exc:
                self._back_off()
                said = str(exc) or f"no connection within {timeout_s * 1000:.0f} ms"
                raise PeerUnavailable(f"{self}: {said}") from None
            if self.closed:  # closed while connecting
                writer.close()
                raise PeerUnavailable(f"{self}: closed")
            self._failures = 0
            self._writer = writer
            self._reader_task = asyncio.get_running_loop().create_task(
                self._read(reader, writer), name=f"peer-{self.node_id}"
            )
            return writer

    def _back_off(self) -> None:
        self._failures += 1
        backoff = min(RECONNECT_BACKOFF_MS * 2 ** (self._failures - 1), RECONNECT_BACKOFF_MAX_MS)
        self._retry_at = time.monotonic() + backoff / 1000

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reason: str = "closed by the peer"
        try:
            while True:
                (size,) = _SIZE.unpack(await reader.readexactly(_SIZE.size))
                if not 0 < size <= MAX_RESPONSE_BYTES:
                    reason = f"response of {size} bytes refused"
                    break
                frame = await reader.readexactly(size)
                if size < _SIZE.size:
                    reason = f"response of {size} bytes has no correlation id"
                    break
                (correlation_id,) = _SIZE.unpack_from(frame)
                found = self._pending.get(correlation_id)
                if found is None:
                    continue  # its requester gave up waiting
                api_key, api_version, future = found
                try:
                    _, body = decode_response(api_key, api_version, frame)
                except MalformedInput as exc:
                    reason = f"malformed response: {exc}"
                    break
                if not future.done():
                    future.set_result(body)
        except (asyncio.IncompleteReadError, OSError, struct.error) as exc:
            reason = str(exc) or type(exc).__name__
        finally:
            if self._writer is writer:
                self._writer = None
                self._back_off()
            writer.close()
            for _, _, future in list(self._pending.values()):
                if not future.done():
                    future.set_exception(PeerUnavailable(f"{self}: {reason}"))
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        self._closed = True
        writer, task = self._writer, self._reader_task
        self._writer = None
        if writer is not None:
            writer.close()
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            # Its CancelledError holds `_read`'s frame, which holds this connection: let go.
            self._reader_task = None


class ActiveControllerPeers:
    """Connections to the active controller's controller listener (the metadata quorum's
    leader, at its `controller.quorum.voters` address), one per leader this node has known,
    kept open for the next request: the broker's lifecycle and forwarding both go there."""

    def __init__(self, voters: Mapping[int, tuple[str, int]], client_id: str) -> None:
        self._voters = voters
        self._client_id = client_id
        self._peers: dict[int, PeerConnection] = {}

    def to(self, leader: int | None) -> PeerConnection | None:
        """The connection to `leader`; None when there is no leader or it is no voter."""
        address = None if leader is None else self._voters.get(leader)
        if leader is None or address is None:
            return None
        peer = self._peers.get(leader)
        if peer is None:
            peer = self._peers[leader] = PeerConnection(leader, *address, client_id=self._client_id)
        return peer

    async def close(self) -> None:
        for peer in self._peers.values():
            await peer.close()
