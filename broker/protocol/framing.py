"""Size-prefixed frames: an int32 big-endian length, then that many bytes, in both directions.

`FrameReader` is incremental and sans-io (`receive_data` or `receive_buffer` → `next_frame`).
It never allocates ahead of the bytes it has been given: a client that announces 90 MiB and
sends four bytes costs four bytes, and a frame larger than `socket.request.max.bytes` is refused
as soon as its size prefix arrives, before any of it is buffered, exactly when Kafka's
`NetworkReceive` refuses it.
"""

from __future__ import annotations

import mmap
import struct

from .errors import FrameTooLarge, MalformedInput
from .primitives import Buffer

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "GATHER_BYTES", "FrameReader", "encode_frame"]

DEFAULT_MAX_REQUEST_BYTES = 104_857_600
"""Kafka's default `socket.request.max.bytes` (100 MiB)."""

GATHER_BYTES = 256 * 1024
"""Frames this large may be gathered into a buffer of their own (`FrameReader.gather`)."""

_SIZE = struct.Struct(">i")


def encode_frame(payload: Buffer) -> bytes:
    """Prefix a header-and-body payload with its size."""
    data = bytes(payload)
    return _SIZE.pack(len(data)) + data


class FrameReader:
    """Cuts a byte stream into frames.

    A server that has reserved the memory of a large frame calls `gather` once its size prefix
    has arrived: the frame is then received straight into a buffer of its size and handed out
    as a read-only view of that buffer. A server that can read from its socket into a buffer
    asks `receive_buffer` for the rest of the frame being gathered and reports with
    `received_into`: each byte of the frame is then copied once, by the kernel. Otherwise the
    bytes are appended to one buffer and each frame is cut out of it, a second copy (with
    reallocations as the buffer grows: 8 MiB of Produce cost the event loop 10 ms).

    Once `next_frame` has raised, the stream is out of sync and the connection must close; the
    reader keeps raising rather than guessing where the next frame starts.
    """

    __slots__ = ("_buffer", "_error", "_filled", "_frame", "_max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
        if max_frame_bytes < 0:
            raise ValueError(f"max_frame_bytes must be >= 0, got {max_frame_bytes}")
        self._max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        """Bytes received and not yet cut; while a frame is gathered, those after it."""
        self._frame: mmap.mmap | None = None
        """The frame being gathered (`gather`), `_filled` bytes of it received."""
        self._filled = 0
        self._error: MalformedInput | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not yet handed out as frames."""
        gathered = 0 if self._frame is None else _SIZE.size + self._filled
        return len(self._buffer) + gathered

    def receive_data(self, data: Buffer) -> None:
        frame = self._frame
        if frame is None:
            self._buffer += data
            return
        with memoryview(data) as view:
            take = min(len(view), len(frame) - self._filled)
            frame[self._filled : self._filled + take] = view[:take]
            self._filled += take
            if take < len(view):
                self._buffer += view[take:]

    def receive_buffer(self) -> memoryview | None:
        """Where the next bytes may be received in place: the part of the frame being gathered
        that has not arrived yet, or None (hand them to `receive_data`, which keeps what comes
        after the frame). Report the bytes written there with `received_into` before anything
        else is asked of the reader."""
        frame = self._frame
        if frame is None or self._filled == len(frame):
            return None
        return memoryview(frame)[self._filled :]

    def gathering(self) -> tuple[mmap.mmap, int] | None:
        """The buffer of the frame being gathered and how many of its bytes have arrived."""
        if self._frame is None:
            return None
        return self._frame, self._filled

    def received_into(self, count: int) -> None:
        """`count` bytes were written at the start of the last `receive_buffer`."""
        if self._frame is None or not 0 <= count <= len(self._frame) - self._filled:
            raise ValueError(f"{count} bytes do not fit the frame being gathered")
        self._filled += count

    def gather(self) -> None:
        """Receive the pending frame, whose size prefix has arrived, into a buffer of its own,
        allocated now (the caller has reserved its memory). Frames under `GATHER_BYTES`, too
        large, or already all here are cut from the shared buffer as usual."""
        size = self.pending_frame_size()
        if self._frame is not None or size is None or size < GATHER_BYTES:
            return
        if size > self._max_frame_bytes or len(self._buffer) >= _SIZE.size + size:
            return
        # Anonymous memory of its own: zeroed by the kernel page by page as the chunks land,
        # where bytearray(size) would write every byte of it first; unmapped once released.
        # Private: a shared anonymous mapping (mmap's default) is backed by shmem, whose page
        # faults and unmapping cost the event loop a quarter of its time under a produce flood.
        frame = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
        with memoryview(self._buffer) as view:
            body = view[_SIZE.size :]
            frame[: len(body)] = body
            self._filled = len(body)
            del body
        self._buffer.clear()
        self._frame = frame

    def pending_frame_size(self) -> int | None:
        """The announced size of the next frame, once its prefix has arrived.

        Lets a server decide how much more to read without reading past the frame.
        """
        if self._frame is not None:
            return len(self._frame)
        if len(self._buffer) < _SIZE.size:
            return None
        (size,) = _SIZE.unpack_from(self._buffer, 0)
        return int(size)

    def next_frame(self) -> bytes | memoryview | None:
        """The next complete frame without its size prefix, or None until more data arrives;
        a gathered frame is a read-only view of its own buffer."""
        if self._error is not None:
            raise self._error
        if self._frame is not None:
            if self._filled < len(self._frame):
                return None
            gathered = memoryview(self._frame).toreadonly()
            self._frame = None
            self._filled = 0
            return gathered
        size = self.pending_frame_size()
        if size is None:
            return None
        if size < 0:
            self._error = MalformedInput(f"negative frame size {size}", where="frame size prefix")
            raise self._error
        if size > self._max_frame_bytes:
            self._error = FrameTooLarge(size, self._max_frame_bytes)
            raise self._error
        end = _SIZE.size + size
        if len(self._buffer) < end:
            return None
        with memoryview(self._buffer) as view:
            frame = bytes(view[_SIZE.size : end])  # one copy (a bytearray slice is another)
        # Deleting from the front of a bytearray moves its start pointer; it does not copy.
        del self._buffer[:end]
        return frame
