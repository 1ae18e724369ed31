"""The Produce request (v3–v13), decoded by hand so that record batches are never copied.

A large Produce request is almost all record bytes. The generic codec returns each partition's
records as a new `bytes`: under a flood of 8 MiB requests that copy, and the faults of the fresh
memory it lands in, took a third of the event loop. Here each partition's records are a
read-only `memoryview` slice of the request frame, which the storage layer writes as it is.
Requests under `ZERO_COPY_PRODUCE_BYTES` still go through the generic codec (`messages.py`).
The frame stays in memory while any slice of it is referenced, which the request's lifetime
already bounds: the connection accounts for its memory until the request is answered.

Everything else matches the generic codec: the same kio classes, the same values (a timeout is a
`timedelta`, a zero topic id is None), and every length checked against the bytes that remain
before anything is built, so a hostile length is `MalformedInput` and never an allocation. The
unit tests compare both decoders on every version. Where they differ, this one does what Kafka's
generated parsers do: it refuses a null array or string where the schema allows none, and a
string over 32767 bytes, which kio reads; and it skips unknown tagged fields, which kio refuses
(in smaller Produce requests too, as in every other API: ADR 0012).
"""

from __future__ import annotations

import importlib
import struct
import uuid
from datetime import timedelta
from typing import Any

from .errors import MalformedInput
from .framing import GATHER_BYTES
from .primitives import Buffer

__all__ = ["ZERO_COPY_PRODUCE_BYTES", "decode_produce_request"]

ZERO_COPY_PRODUCE_BYTES = GATHER_BYTES
"""Produce requests this large are decoded here; smaller ones by the generic codec, whose native
reader is faster when the copy is small: 9 against 15 µs for one partition of 16 KiB, 1.3
against 2.2 ms for 1000 partitions of 200 bytes. From this size on, frames are read into
buffers of their own (`GATHER_BYTES`), and not copying them is what counts."""

FIRST_FLEXIBLE_VERSION = 9
FIRST_TOPIC_ID_VERSION = 13

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")
_NO_TOPIC_ID = bytes(16)
_MAX_STRING_BYTES = 0x7FFF
"""Kafka's limit for a string field, also in flexible versions, whose lengths could say more."""


class _Truncated(Exception):
    """Raised inside the walk; becomes `MalformedInput` with the message's name."""


def decode_produce_request(request_class: type[Any], data: Buffer, position: int) -> Any:
    """The body of a Produce request of `request_class` (kio's, which gives the version) that
    starts at `position` in `data`. Raises `MalformedInput` for bytes that do not fit."""
    view = memoryview(data)
    if not view.readonly:
        view = view.toreadonly()  # records must not be writable through the request
    version: int = request_class.__version__
    topic_class, partition_class = _classes(request_class)
    read = _Read(view, position, version >= FIRST_FLEXIBLE_VERSION)
    try:
        transactional_id = read.string(nullable=True)
        acks, timeout_ms = read.fixed(_ACKS_TIMEOUT)
        topics = []
        for _ in range(read.count()):
            if version >= FIRST_TOPIC_ID_VERSION:
                raw_id = read.take(16)
                name = None
                topic_id = None if raw_id == _NO_TOPIC_ID else uuid.UUID(bytes=bytes(raw_id))
            else:
                name = read.string(nullable=False)
            partitions = []
            for _ in range(read.count()):
                (index,) = read.fixed(_INT32)
                records = read.records()
                read.tagged_fields()
                partitions.append(partition_class(index=index, records=records))
            read.tagged_fields()
            if version >= FIRST_TOPIC_ID_VERSION:
                topic = topic_class(topic_id=topic_id, partition_data=tuple(partitions))
            else:
                topic = topic_class(name=name, partition_data=tuple(partitions))
            topics.append(topic)
        read.tagged_fields()
    except _Truncated as exc:
        raise MalformedInput(str(exc), where=f"{request_class.__name__} body") from None
    # Like Kafka, bytes after the body are ignored.
    return request_class(
        transactional_id=transactional_id,
        acks=acks,
        timeout=timedelta(milliseconds=timeout_ms),
        topic_data=tuple(topics),
    )


_nested: dict[str, tuple[type[Any], type[Any]]] = {}


def _classes(request_class: type[Any]) -> tuple[type[Any], type[Any]]:
    """The topic and partition classes of a Produce request version (kio's, in its module)."""
    found = _nested.get(request_class.__module__)
    if found is None:
        module = importlib.import_module(request_class.__module__)
        found = _nested[request_class.__module__] = (
            module.TopicProduceData,
            module.PartitionProduceData,
        )
    return found


class _Read:
    """A cursor over the body; every read checks that the bytes are there."""

    __slots__ = ("_flexible", "_pos", "_view")

    def __init__(self, view: memoryview, position: int, flexible: bool) -> None:
        self._view = view
        self._pos = position
        self._flexible = flexible

    def take(self, size: int) -> memoryview:
        start = self._pos
        end = start + size
        if end > len(self._view):
            raise _Truncated(f"{size} bytes at byte {start} run past the end of the frame")
        self._pos = end
        return self._view[start:end]

    def fixed(self, layout: struct.Struct) -> tuple[Any, ...]:
        start = self._pos
        if start + layout.size > len(self._view):
            raise _Truncated(f"truncated at byte {start}")
        self._pos = start + layout.size
        return layout.unpack_from(self._view, start)

    def uvarint(self) -> int:
        view = self._view
        value = 0
        for shift in range(0, 35, 7):
            if self._pos >= len(view):
                raise _Truncated("truncated varint")
            byte = view[self._pos]
            self._pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                if value > 0xFFFFFFFF:
                    raise _Truncated("unsigned varint exceeds 32 bits")
                return int(value)
        raise _Truncated("varint longer than 5 bytes")

    def _length(self, layout: struct.Struct) -> int:
        """A length or count: -1 for null."""
        if self._flexible:
            return self.uvarint() - 1
        (length,) = self.fixed(layout)
        return int(length)

    def count(self) -> int:
        """An array's element count, which the bytes left must be able to hold (one byte per
        element at least), as Kafka's generated parsers require."""
        count = self._length(_INT32)
        if count < 0:
            raise _Truncated("null array where an array is required")
        if count > len(self._view) - self._pos:
            raise _Truncated(
                f"array of {count} elements at byte {self._pos} is longer than the frame"
            )
        return count

    def string(self, *, nullable: bool) -> str | None:
        length = self._length(_INT16)
        if length < 0:
            if nullable and length == -1:
                return None
            raise _Truncated(f"string length {length}")
        if length > _MAX_STRING_BYTES:
            raise _Truncated(f"string of {length} bytes is longer than {_MAX_STRING_BYTES}")
        try:
            return str(self.take(length), "utf-8")
        except UnicodeDecodeError as exc:
            raise _Truncated(f"string is not UTF-8: {exc}") from None

    def records(self) -> memoryview | None:
        length = self._length(_INT32)
        if length < 0:
            if length == -1:
                return None
            raise _Truncated(f"records length {length}")
        return self.take(length)

    def tagged_fields(self) -> None:
        """Skip a tagged-field section (flexible versions): Produce defines no tagged field,
        and Kafka's parsers skip the ones they do not know, in whatever order they come."""
        if not self._flexible:
            return
        for _ in range(self.uvarint()):
            self.uvarint()  # the tag
            self.take(self.uvarint())
