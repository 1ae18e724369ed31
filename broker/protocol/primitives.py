"""Variable-length integers and tagged fields, the primitives kio does not expose for our own
formats (request headers and records inside record batches).

Readers take a buffer and a position and return `(value, next_position)`; they raise
`MalformedInput` naming `where` on truncated or overlong input, never `IndexError`.
"""

from __future__ import annotations

from .errors import MalformedInput

__all__ = [
    "Buffer",
    "TaggedFields",
    "read_tagged_fields",
    "read_uvarint",
    "read_varint",
    "read_varlong",
    "write_tagged_fields",
    "write_uvarint",
    "write_varint",
]

Buffer = bytes | bytearray | memoryview
"""Any contiguous bytes the protocol reads from or patches (PEP 688's Buffer is 3.12+)."""

TaggedFields = tuple[tuple[int, bytes], ...]
"""Unknown tagged fields kept as raw `(tag, bytes)` pairs in ascending tag order (KIP-482)."""

_MAX_UVARINT_BYTES = 5
_MAX_UVARLONG_BYTES = 10


def _read_unsigned(buf: Buffer, pos: int, max_bytes: int, where: str) -> tuple[int, int]:
    view = memoryview(buf)
    value = 0
    shift = 0
    for i in range(max_bytes):
        if pos + i >= len(view):
            raise MalformedInput("truncated varint", where=where)
        byte = view[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos + i + 1
        shift += 7
    raise MalformedInput(f"varint longer than {max_bytes} bytes", where=where)


def read_uvarint(buf: Buffer, pos: int, where: str = "unsigned varint") -> tuple[int, int]:
    """An unsigned 32-bit varint (lengths and counts in flexible versions)."""
    value, end = _read_unsigned(buf, pos, _MAX_UVARINT_BYTES, where)
    if value > 0xFFFFFFFF:
        raise MalformedInput("unsigned varint exceeds 32 bits", where=where)
    return value, end


def read_varint(buf: Buffer, pos: int, where: str = "varint") -> tuple[int, int]:
    """A zigzag-encoded signed 32-bit varint (record lengths and deltas)."""
    raw, end = _read_unsigned(buf, pos, _MAX_UVARINT_BYTES, where)
    if raw > 0xFFFFFFFF:
        raise MalformedInput("varint exceeds 32 bits", where=where)
    return (raw >> 1) ^ -(raw & 1), end


def read_varlong(buf: Buffer, pos: int, where: str = "varlong") -> tuple[int, int]:
    """A zigzag-encoded signed 64-bit varint (record timestamp deltas)."""
    raw, end = _read_unsigned(buf, pos, _MAX_UVARLONG_BYTES, where)
    if raw > 0xFFFFFFFFFFFFFFFF:
        raise MalformedInput("varlong exceeds 64 bits", where=where)
    return (raw >> 1) ^ -(raw & 1), end


def write_uvarint(value: int) -> bytes:
    if value < 0:
        raise ValueError(f"unsigned varint cannot hold {value}")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def write_varint(value: int) -> bytes:
    """Zigzag-encode a signed value (32 or 64 bits; the encoding is the same)."""
    return write_uvarint((value << 1) ^ (value >> 63))


def read_tagged_fields(buf: Buffer, pos: int, where: str) -> tuple[TaggedFields, int]:
    """Read a tagged-field section; tags must be strictly ascending, as Kafka requires."""
    view = memoryview(buf)
    count, pos = read_uvarint(view, pos, where)
    fields: list[tuple[int, bytes]] = []
    previous = -1
    for _ in range(count):
        tag, pos = read_uvarint(view, pos, where)
        if tag <= previous:
            raise MalformedInput(f"tagged field {tag} out of order", where=where)
        size, pos = read_uvarint(view, pos, where)
        if pos + size > len(view):
            raise MalformedInput(f"tagged field {tag} of {size} bytes is truncated", where=where)
        fields.append((tag, bytes(view[pos : pos + size])))
        pos += size
        previous = tag
    return tuple(fields), pos


def write_tagged_fields(fields: TaggedFields) -> bytes:
    out = bytearray(write_uvarint(len(fields)))
    for tag, data in sorted(fields):
        out += write_uvarint(tag)
        out += write_uvarint(len(data))
        out += data
    return bytes(out)
