"""One client connection: frames in, responses out, in request order.

Clients may pipeline; requests are processed one after another and responses keep their
order, one per turn of the event loop, so a pipelining client does not hold the loop from the
others; requests of `HEAVY_REQUEST_BYTES` or more take turns across connections. A request
waiting in `parked()` (a long-poll Fetch) is cancelled if its client goes away. Memory per
connection is bounded (`admission.py`): reading pauses while the requests
waiting behind the one being processed hold `MAX_READ_AHEAD_BYTES` or number
`MAX_QUEUED_REQUESTS`, and while `queued.max.request.bytes` has nothing left for a request
whose size prefix has arrived; the next request is not started while the transport's write
buffer is full (a client that never reads stops being read from, and counts as idle). A
connection over `max.connections` or `max.connections.per.ip` is closed once accepted.
Fetch responses come as buffers around file regions; the regions go out with `sendfile`
(`sendfile.py`). A frame larger than `socket.request.max.bytes`, or malformed framing, closes
the connection at once.

Reading is zero-copy where it pays: a large request, once its memory is reserved, is received
straight from the socket into a buffer of its own (`FrameReader.receive_buffer`); smaller ones
arrive through a scratch buffer that the server's connections share (they are read one at a
time, on the event loop). A thread faults in the pages of a gathered frame just ahead of the
bytes arriving, and unmaps the frame's buffer once its request is answered (`frame_memory`).
Under a flood of 8 MiB Produce requests, a copy of every byte, a 256 KiB `bytes` per read, the
page faults of the fresh memory (two fifths of the loop's time) and the unmapping left the event
loop this way.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import mmap
import time
import weakref
from collections import deque
from collections.abc import Iterator
from typing import Any

from broker.protocol import FrameReader, MalformedInput

from . import frame_memory
from .admission import (
    HEAVY_REQUEST_BYTES,
    MAX_QUEUED_REQUESTS,
    MAX_READ_AHEAD_BYTES,
    SMALL_REQUEST_BYTES,
    Admission,
    ConnectionQuotas,
    MemoryPool,
)
from .dispatcher import CloseConnection, Dispatcher, Frame
from .sendfile import send_region

__all__ = ["Connection", "parked"]

log = logging.getLogger(__name__)

_PARKED: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()


@contextlib.contextmanager
def parked() -> Iterator[None]:
    """Mark the request being processed as waiting for something that may never come (a
    long-poll Fetch, a turn): if its client goes away meanwhile, the wait is cancelled rather
    than outliving the connection (a Fetch may ask to wait 24 days)."""
    task = asyncio.current_task()
    if task is None:
        yield
        return
    _PARKED.add(task)
    try:
        yield
    finally:
        _PARKED.discard(task)


_UNLIMITED = Admission(ConnectionQuotas(2**31 - 1, 2**31 - 1), MemoryPool(None))
READ_BYTES = 256 * 1024
"""The most read from a socket at once (asyncio's own chunk)."""


POPULATE_AHEAD_MAX_BYTES = 4 * 1024 * 1024
"""How far ahead of the bytes arrived the pages of a gathered frame are faulted in, at most."""


def scratch_buffer() -> bytearray:
    """A buffer for connections served by one event loop to read into (`Connection`)."""
    return bytearray(READ_BYTES)


class Connection(asyncio.BufferedProtocol):
    def __init__(
        self,
        dispatcher: Dispatcher,
        listener: str,
        max_request_bytes: int,
        registry: set[Connection],
        *,
        admission: Admission = _UNLIMITED,
        scratch: bytearray | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        self._scratch = memoryview(scratch_buffer() if scratch is None else scratch)
        """Where bytes outside a gathered frame are read to; shared by the connections of one
        event loop, which fill and empty it in one callback."""
        self._into_frame = False
        """The last `get_buffer` handed out the rest of a gathered frame."""
        self._populated_to = 0
        """Of the frame being gathered: its pages up to here are faulted in, or being."""
        self._ready_to = 0
        """Of the frame being gathered: its pages up to here are faulted in."""
        self._populating = False
        self._listener = listener
        self._frames: deque[tuple[bytes | memoryview, int]] = deque()
        """Requests read and waiting, each with the bytes it holds of the memory pool."""
        self._queued_bytes = 0
        self._reader = FrameReader(max_request_bytes)
        self._max_request_bytes = max_request_bytes
        self._registry = registry
        self._admission = admission
        self._ip: str | None = None
        """The address counted against the connection quotas, once admitted."""
        self._receiving: int | None = None
        """Pool bytes reserved for the request being received (None: none yet)."""
        self._small_held = False
        """This connection holds its one small request outside the pool."""
        self._transport: asyncio.Transport | None = None
        self._wakeup = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._paused: set[str] = set()
        """Why reading is paused: "read-ahead", "memory", "buffer" (`_populate_ahead`)."""
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._done = asyncio.Event()
        self._sending: asyncio.Future[None] | None = None
        """The file region being sent, while one is."""
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
        ip = str(peer[0]) if isinstance(peer, tuple) else self.peer
        refused = self._admission.quotas.admit(ip)
        if refused is not None:
            log.info("rejected connection from %s: %s", ip, refused)
            self._closing = True
            transport.close()
            return
        self._ip = ip
        self._registry.add(self)
        self._task = asyncio.get_running_loop().create_task(self._serve())
        self._task.add_done_callback(self._served)

    def get_buffer(self, sizehint: int) -> memoryview:
        view = self._reader.receive_buffer()
        self._into_frame = view is not None
        if view is not None:
            # No more at once than elsewhere: with 40 connections flooding, reads of whatever
            # their sockets held (megabytes each) made one turn of the loop last 100 ms.
            return view[:READ_BYTES]
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        if self._ip is None:
            return  # refused
        self.last_active = time.monotonic()
        if self._into_frame:
            self._reader.received_into(nbytes)
        else:
            self._reader.receive_data(self._scratch[:nbytes])
        self._take_frames()
        self._populate_ahead()

    def _take_frames(self) -> None:
        """Cut what has arrived into requests, each once it has its share of memory."""
        if self._closing:
            return
        reader = self._reader
        try:
            while (size := reader.pending_frame_size()) is not None:
                if self._receiving is None and 0 <= size <= self._max_request_bytes:
                    if "memory" in self._paused:
                        break  # already waiting for memory
                    if not self._reserve(size):
                        self._pause("memory")
                        self._admission.pool.wait(self._memory_released)
                        break
                    reader.gather()  # a large frame goes straight into memory of its own
                    self._populated_to = self._ready_to = 0
                frame = reader.next_frame()  # raises for a size out of bounds
                if frame is None:
                    break
                self._frames.append((frame, self._receiving or 0))
                self._queued_bytes += len(frame)
                self._receiving = None
        except MalformedInput as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
            exc.__traceback__ = None  # the reader keeps it: no cycle through this frame
            self.abort()
            return
        if self._frames:
            self._wakeup.set()
        if len(self._frames) >= MAX_QUEUED_REQUESTS or self._queued_bytes >= MAX_READ_AHEAD_BYTES:
            self._pause("read-ahead")

    def _populate_ahead(self) -> None:
        """Have the pages of the frame being gathered faulted in on a thread ahead of the bytes
        arriving, so that the loop's reads land in memory that is ready for them: page faults
        were two fifths of the loop's time under a produce flood. The pages are made ready no
        further ahead than what has arrived, and not before `READ_BYTES` have: a client that
        announces a large frame and sends little costs at most twice what it sent. Reading
        goes on meanwhile, and pauses only if it catches up with the thread."""
        gathering = self._reader.gathering()
        if gathering is None or self._closing:
            return
        buffer, filled = gathering
        if self._populating:
            if filled >= self._ready_to:
                self._pause("buffer")  # caught up with the thread: wait for it
            return
        if filled < READ_BYTES:
            return
        end = min(len(buffer), filled + min(filled, POPULATE_AHEAD_MAX_BYTES))
        if self._populated_to - filled >= (end - filled) // 2:
            return  # enough is ready ahead
        start = max(self._populated_to, filled) // mmap.PAGESIZE * mmap.PAGESIZE
        if end <= start:
            return
        self._populating = True
        self._populated_to = end
        future = frame_memory.populate(buffer, start, end)
        future.add_done_callback(functools.partial(self._populated, buffer, end))

    def _populated(self, buffer: mmap.mmap, end: int, future: asyncio.Future[None]) -> None:
        self._populating = False
        gathering = self._reader.gathering()
        if gathering is not None and gathering[0] is buffer:
            self._ready_to = end
        self._resume("buffer")
        if not future.cancelled() and (exc := future.exception()) is not None:
            log.warning("could not fault in a request's buffer ahead of its bytes: %r", exc)
            return
        self._populate_ahead()

    def _reserve(self, size: int) -> bool:
        """Memory for a request of `size` bytes: the connection's one small request outside the
        pool, or a share of `queued.max.request.bytes`. Sets `_receiving` if granted."""
        if size <= SMALL_REQUEST_BYTES and not self._small_held:
            self._small_held = True
            self._receiving = -1
            return True
        if not self._admission.pool.try_reserve(size):
            return False
        self._receiving = size
        return True

    def _release(self, reserved: int) -> None:
        if reserved < 0:
            self._small_held = False
            if "memory" in self._paused:
                self._memory_released()  # this connection's own small request may go next
        elif reserved:
            self._admission.pool.release(reserved)

    def _memory_released(self) -> None:
        if self._closing or "memory" not in self._paused:
            return
        self._admission.pool.forget(self._memory_released)
        self._resume("memory")
        self._take_frames()

    def _pause(self, reason: str) -> None:
        if reason in self._paused:
            return
        if not self._paused and self._transport is not None:
            self._transport.pause_reading()
        self._paused.add(reason)

    def _resume(self, reason: str) -> None:
        if reason not in self._paused:
            return
        self._paused.discard(reason)
        if not self._paused and self._transport is not None and not self._closing:
            self._transport.resume_reading()

    def _served(self, task: asyncio.Task[None]) -> None:
        # A task ended by an exception keeps it, and its traceback this connection (`_serve`'s
        # frame): letting go of the task makes that no cycle, so the connection and all its
        # request held (a parked Fetch's thousands of objects) go when the last reference does,
        # rather than at the collector's next full walk.
        if self._task is task:
            self._task = None
        self._done.set()
        if not task.cancelled() and (exc := task.exception()) is not None:
            # A bug of ours (every request's failure is answered by the dispatcher): the
            # connection cannot go on, and left open it would hold its client waiting.
            log.error("serving the connection from %s failed: closing it", self.peer, exc_info=exc)
            self.abort()

    def eof_received(self) -> bool | None:
        self._closing = True
        self._wakeup.set()
        if self._task is not None and self._task in _PARKED:
            self._task.cancel()  # a client that closed its end waits for no long poll
        return True  # keep the transport open until pending responses are written

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._registry.discard(self)
        self._wakeup.set()
        self._writable.set()
        if self._task is not None and (not self.busy or self._task in _PARKED):
            self._task.cancel()
        if self._sending is not None:
            self._sending.cancel()  # the response cannot be completed: release its regions
        if self._ip is not None:
            self._admission.quotas.release(self._ip)
            self._ip = None
            self._drop_queued()

    def _drop_queued(self) -> None:
        """Give back the memory of every request not processed (the connection is going)."""
        self._admission.pool.forget(self._memory_released)
        while self._frames:
            frame, reserved = self._frames.popleft()
            self._queued_bytes -= len(frame)
            self._release(reserved)
        if self._receiving is not None:
            self._release(self._receiving)
            self._receiving = None

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
                frame, reserved = self._next_frame()
                self.busy = True
                heavy = len(frame) >= HEAVY_REQUEST_BYTES
                try:
                    if heavy:
                        with parked():
                            await self._admission.heavy_turn.acquire()
                    try:
                        response = await self._dispatcher.dispatch(frame, self._listener, self.peer)
                    finally:
                        if heavy:
                            self._admission.heavy_turn.release()
                except CloseConnection as exc:
                    log.warning("closing connection from %s: %s", self.peer, exc)
                    transport.abort()
                    return
                finally:
                    self.busy = False
                    buffer = frame.obj if isinstance(frame, memoryview) else None
                    del frame
                    frame_memory.unmap(buffer)
                    del buffer
                    self._release(reserved)
                if response is not None:
                    self.busy = self.waiting_on_peer = True
                    try:
                        await self._write(transport, response)
                    finally:
                        self.busy = self.waiting_on_peer = False
                self.last_active = time.monotonic()
                # One request per connection per turn of the loop: most requests complete
                # without suspending, and a client pipelining many must not hold the loop
                # from everyone else until its queue is empty.
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            transport.abort()
            raise

    def _next_frame(self) -> tuple[bytes | memoryview, int]:
        """The oldest request read, with the pool bytes it holds; reading resumes once the
        queue is down to half its limits."""
        frame, reserved = self._frames.popleft()
        self._queued_bytes -= len(frame)
        if (
            len(self._frames) < MAX_QUEUED_REQUESTS // 2
            and self._queued_bytes < MAX_READ_AHEAD_BYTES // 2
        ):
            self._resume("read-ahead")
        return frame, reserved

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
                    # A task of its own, so that a connection lost meanwhile can cancel it:
                    # `loop.sendfile` never wakes up once the transport has closed its socket.
                    self._sending = asyncio.ensure_future(send_region(transport, part))
                    try:
                        await self._sending
                    finally:
                        self._sending = None
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
        """Finish what is being processed, then close (clean shutdown)."""
        self._closing = True
        self._drop_queued()
        self._wakeup.set()

    def abort(self) -> None:
        self._closing = True
        transport = self._transport
        if transport is None:
            return
        sending = self._sending
        if sending is not None and not sending.done():
            # Let the region's sendfile unwind before the socket goes (asyncio's own cleanup
            # of an interrupted sendfile fails once the transport has closed it).
            sending.cancel()
            sending.add_done_callback(lambda _: transport.abort())
        else:
            transport.abort()

    async def wait_closed(self) -> None:
        if self._task is not None:
            await self._done.wait()
