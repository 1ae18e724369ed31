"""Size-prefixed frames: an int32 big-endian length, then that many bytes, in both directions.

`FrameReader` is incremental and sans-io (`receive_data` → `next_frame`). It never allocates
ahead of the bytes it has been given: a client that announces 90 MiB and sends four bytes costs
four bytes, and a frame larger than `socket.request.max.bytes` is refused as soon as its size
prefix arrives, before any of it is buffered, exactly when Kafka's `NetworkReceive` refuses it.
"""

from __future__ import annotations

import struct

from .errors import FrameTooLarge, MalformedInput
from .primitives import Buffer

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "FrameReader", "encode_frame"]

DEFAULT_MAX_REQUEST_BYTES = 104_857_600
"""Kafka's default `socket.request.max.bytes` (100 MiB)."""

_SIZE = struct.Struct(">i")


def encode_frame(payload: Buffer) -> bytes:
    """Prefix a header-and-body payload with its size."""
    data = bytes(payload)
    return _SIZE.pack(len(data)) + data


class FrameReader:
    """Cuts a byte stream into frames.

    Once `next_frame` has raised, the stream is out of sync and the connection must close; the
    reader keeps raising rather than guessing where the next frame starts.
    """

    __slots__ = ("_buffer", "_error", "_max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
        if max_frame_bytes < 0:
            raise ValueError(f"max_frame_bytes must be >= 0, got {max_frame_bytes}")
        self._max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._error: MalformedInput | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not yet handed out as frames."""
        return len(self._buffer)

    def receive_data(self, data: Buffer) -> None:
        self._buffer += data

    def pending_frame_size(self) -> int | None:
        """The announced size of the next frame, once its prefix has arrived.

        Lets a server decide how much more to read without reading past the frame.
        """
        if len(self._buffer) < _SIZE.size:
            return None
        (size,) = _SIZE.unpack_from(self._buffer, 0)
        return int(size)

    def next_frame(self) -> bytes | None:
        """The next complete frame without its size prefix, or None until more data arrives."""
        if self._error is not None:
            raise self._error
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
