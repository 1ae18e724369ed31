"""One client connection: frames in, responses out, in request order.

Clients may pipeline; requests are processed one after another and responses keep their
order. Memory per connection is bounded: reading pauses while `MAX_QUEUED_REQUESTS` frames
wait, and the next request is not started while the transport's write buffer is full (a
client that never reads stops being read from, and counts as idle). Fetch responses come as
buffers around file regions; the regions go out with `sendfile` (`sendfile.py`). A frame
larger than `socket.request.max.bytes`, or malformed framing, closes the connection at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from broker.protocol import FrameReader, MalformedInput

from .dispatcher import CloseConnection, Dispatcher, Frame
from .sendfile import send_region

__all__ = ["Connection"]

log = logging.getLogger(__name__)

MAX_QUEUED_REQUESTS = 16
"""Frames read ahead of the one being processed before reading pauses."""


class Connection(asyncio.Protocol):
    def __init__(
        self,
        dispatcher: Dispatcher,
        listener: str,
        max_request_bytes: int,
        registry: set[Connection],
    ) -> None:
        self._dispatcher = dispatcher
        self._listener = listener
        self._frames: deque[bytes] = deque()
        self._reader = FrameReader(max_request_bytes)
        self._registry = registry
        self._transport: asyncio.Transport | None = None
        self._wakeup = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._reading_paused = False
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self.busy = False
        self.waiting_on_peer = False
        """Blocked until the client reads what it was sent."""
        self.last_active = time.monotonic()
        self.peer = "?"

    # -- asyncio callbacks ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._registry.add(self)
        self._task = asyncio.get_running_loop().create_task(self._serve())

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        self._reader.receive_data(data)
        try:
            while (frame := self._reader.next_frame()) is not None:
                self._frames.append(frame)
        except MalformedInput as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
            self.abort()
            return
        if self._frames:
            self._wakeup.set()
        if len(self._frames) >= MAX_QUEUED_REQUESTS and not self._reading_paused:
            assert self._transport is not None
            self._transport.pause_reading()
            self._reading_paused = True

    def eof_received(self) -> bool | None:
        self._closing = True
        self._wakeup.set()
        return True  # keep the transport open until pending responses are written

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._registry.discard(self)
        self._wakeup.set()
        self._writable.set()
        if self._task is not None and not self.busy:
            self._task.cancel()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self.last_active = time.monotonic()  # the client is reading
        self._writable.set()

    # -- serving --------------------------------------------------------------------------

    async def _serve(self) -> None:
        assert self._transport is not None
        transport = self._transport
        try:
            while True:
                while not self._frames:
                    if self._closing:
                        transport.close()
                        return
                    self._wakeup.clear()
                    await self._wakeup.wait()
                if not self._writable.is_set():
                    self.waiting_on_peer = True
                    await self._writable.wait()
                    self.waiting_on_peer = False
                if transport.is_closing():
                    return
                frame = self._frames.popleft()
                if self._reading_paused and len(self._frames) < MAX_QUEUED_REQUESTS // 2:
                    transport.resume_reading()
                    self._reading_paused = False
                self.busy = True
                try:
                    response = await self._dispatcher.dispatch(frame, self._listener, self.peer)
                except CloseConnection as exc:
                    log.warning("closing connection from %s: %s", self.peer, exc)
                    transport.abort()
                    return
                finally:
                    self.busy = False
                if response is not None:
                    self.busy = self.waiting_on_peer = True
                    try:
                        await self._write(transport, response)
                    finally:
                        self.busy = self.waiting_on_peer = False
                self.last_active = time.monotonic()
        except asyncio.CancelledError:
            transport.abort()
            raise

    async def _write(self, transport: asyncio.Transport, frame: Frame) -> None:
        if isinstance(frame, bytes):
            if not transport.is_closing():
                transport.write(frame)
            return
        try:
            for part in frame:
                if transport.is_closing():
                    return
                if isinstance(part, bytes):
                    transport.write(part)
                else:
                    await send_region(transport, part)
        except OSError as exc:
            log.info("closing connection to %s: sending a response failed: %s", self.peer, exc)
            transport.abort()
        finally:
            for part in frame:
                if not isinstance(part, bytes):
                    part.close()

    @property
    def idle(self) -> bool:
        return not self.busy and not self._frames

    @property
    def stalled(self) -> bool:
        """Idle as Kafka counts it: no request to work on, or a client that does not read."""
        return self.idle or self.waiting_on_peer

    def close(self) -> None:
        """Finish what is queued, then close (clean shutdown)."""
        self._closing = True
        self._frames.clear()
        self._wakeup.set()

    def abort(self) -> None:
        self._closing = True
        if self._transport is not None:
            self._transport.abort()

    async def wait_closed(self) -> None:
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
