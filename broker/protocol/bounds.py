"""A bounds walk over a message body before kio decodes it.

kio's native reader reserves memory for an array from the array's length field before reading
its elements, so a 30-byte request claiming 2^32 elements makes it ask the allocator for
hundreds of gigabytes and abort the whole process (found by `tests/unit/protocol/test_fuzz.py`).
Kafka's own generated parsers refuse any array whose length exceeds the bytes that remain; this
module applies that rule, and checks that every string, bytes field and tagged field fits in the
frame, by walking the body once without building anything. Only a body that passes reaches kio.

Walkers are compiled once per message class from the same dataclass metadata kio uses
(`kafka_type`, `tag`, optional, tuple, nested dataclass), so they follow every API version
without a table of our own. Consecutive fixed-size fields collapse into one skip, which keeps
the walk of a Produce or Fetch request to a handful of steps per partition.
"""

from __future__ import annotations

import dataclasses
import struct
import types
import typing
from collections.abc import Callable
from typing import Any

from .errors import MalformedInput

__all__ = ["check_bounds"]

Walker = Callable[[bytes, int], int]
"""Walk one value starting at a position in the body; return the position after it."""

_FIXED_SIZES = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


class _Truncated(Exception):
    """Raised inside the walk; turned into `MalformedInput` with the message's name."""


def check_bounds(entity: type[Any], body: bytes, position: int) -> None:
    """Raise `MalformedInput` unless every length in the body fits in the body."""
    try:
        _walker(entity)(body, position)
    except _Truncated as exc:
        raise MalformedInput(str(exc), where=f"{entity.__name__} body") from None


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise _Truncated("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise _Truncated("varint longer than 5 bytes")


def _need(buf: bytes, pos: int, size: int, what: str) -> int:
    end = pos + size
    if end > len(buf):
        raise _Truncated(f"{what} of {size} bytes at byte {pos} runs past the end")
    return end


def _fixed(size: int) -> Walker:
    def walk(buf: bytes, pos: int) -> int:
        return _need(buf, pos, size, "field")

    return walk


def _sized(kafka_type: str, flexible: bool) -> Walker:
    """Strings, bytes and records: a length (or -1 for null) then that many bytes."""
    if flexible:

        def walk_compact(buf: bytes, pos: int) -> int:
            length_plus_one, pos = _uvarint(buf, pos)
            return _need(buf, pos, max(length_plus_one - 1, 0), kafka_type)

        return walk_compact
    prefix = _INT16 if kafka_type == "string" else _INT32

    def walk_legacy(buf: bytes, pos: int) -> int:
        start = _need(buf, pos, prefix.size, f"{kafka_type} length")
        (length,) = prefix.unpack_from(buf, pos)
        if length < -1:
            raise _Truncated(f"{kafka_type} has negative length {length} at byte {pos}")
        return _need(buf, start, max(length, 0), kafka_type)

    return walk_legacy


def _array(element: Walker, flexible: bool) -> Walker:
    def walk(buf: bytes, pos: int) -> int:
        if flexible:
            count_plus_one, pos = _uvarint(buf, pos)
            count = count_plus_one - 1
        else:
            start = _need(buf, pos, 4, "array length")
            (count,) = _INT32.unpack_from(buf, pos)
            pos = start
            if count < -1:
                raise _Truncated(f"array has negative length {count}")
        if count > len(buf) - pos:
            raise _Truncated(
                f"array of {count} elements at byte {pos} exceeds the {len(buf) - pos} bytes left"
            )
        for _ in range(count):
            pos = element(buf, pos)
        return pos

    return walk


def _nullable_struct(inner: Walker) -> Walker:
    def walk(buf: bytes, pos: int) -> int:
        start = _need(buf, pos, 1, "struct presence marker")
        return start if buf[pos] == 0xFF else inner(buf, start)

    return walk


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


def _field_walker(field: dataclasses.Field[Any], flexible: bool) -> tuple[Walker, int | None]:
    """A walker for one field, and its fixed size if it has one."""
    inner, nullable = _unwrap_optional(field.type)
    is_array = typing.get_origin(inner) is tuple
    element_type, _ = _unwrap_optional(typing.get_args(inner)[0] if is_array else inner)
    if dataclasses.is_dataclass(element_type):
        element = _walker(typing.cast(type, element_type))
        if not is_array and nullable:
            element = _nullable_struct(element)
        size = None
    else:
        kafka_type = field.metadata["kafka_type"]
        size = _FIXED_SIZES.get(kafka_type)
        element = _fixed(size) if size is not None else _sized(kafka_type, flexible)
    if is_array:
        return _array(element, flexible), None
    return element, size


def _tagged_section(known: dict[int, Walker]) -> Walker:
    def walk(buf: bytes, pos: int) -> int:
        count, pos = _uvarint(buf, pos)
        for _ in range(count):
            tag, pos = _uvarint(buf, pos)
            size, pos = _uvarint(buf, pos)
            end = _need(buf, pos, size, f"tagged field {tag}")
            walker = known.get(tag)
            if walker is not None and walker(buf, pos) > end:
                raise _Truncated(f"tagged field {tag} overruns its {size} bytes")
            pos = end
        return pos

    return walk


_walkers: dict[type[Any], Walker] = {}


def _walker(entity: type[Any]) -> Walker:
    walker = _walkers.get(entity)
    if walker is None:
        walker = _walkers[entity] = _compile(entity)
    return walker


def _compile(entity: type[Any]) -> Walker:
    flexible = bool(entity.__flexible__)
    steps: list[Walker] = []
    fixed_run = 0
    tagged: dict[int, Walker] = {}
    for field in dataclasses.fields(entity):
        walker, size = _field_walker(field, flexible)
        if "tag" in field.metadata:
            tagged[int(field.metadata["tag"])] = walker
        elif size is not None:
            fixed_run += size
        else:
            if fixed_run:
                steps.append(_fixed(fixed_run))
                fixed_run = 0
            steps.append(walker)
    if fixed_run:
        steps.append(_fixed(fixed_run))
    if flexible:
        steps.append(_tagged_section(tagged))

    def walk(buf: bytes, pos: int) -> int:
        for step in steps:
            pos = step(buf, pos)
        return pos

    return walk
