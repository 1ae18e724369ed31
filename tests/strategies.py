"""Hypothesis strategies for Kafka messages, built from the message classes themselves.

Each field's strategy follows its Kafka type (the `kafka_type` metadata) and its Python type
(optional, array, nested struct), and draws only values the wire format can carry exactly, so
a failed round trip is a codec bug rather than a lossy value.
"""

from __future__ import annotations

import dataclasses
import datetime
import types
import typing
from typing import Any

from hypothesis import strategies as st

from broker.protocol import ErrorCode
from tests.kafka_schemas import INT_RANGES

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
# kio converts int64 milliseconds through float seconds, exact up to 2**53 microseconds (285
# years either way); real durations (retention, timeouts, -1 sentinels) are far inside it.
_TIMEDELTA_MS = 2**53 // 1000
# Timestamps go through the same float conversion: exact until 2**53 microseconds after the
# epoch (the year 2255).
_MAX_DATETIME_MS = 2**53 // 1000


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"unsupported union {tp}")
        return args[0], True
    return tp, False


def _primitive(kafka_type: str, flexible: bool, nullable: bool) -> st.SearchStrategy[Any]:
    if kafka_type in INT_RANGES:
        lo, hi = INT_RANGES[kafka_type]
        return st.integers(lo, hi)
    if kafka_type == "float64":
        return st.floats(allow_nan=False, allow_infinity=False)
    if kafka_type == "bool":
        return st.booleans()
    if kafka_type == "string":
        return st.text(max_size=12)
    if kafka_type in ("bytes", "records"):
        return st.binary(max_size=24)
    if kafka_type == "uuid":
        # The all-zero UUID is Kafka's "no topic id" and decodes as None.
        return st.uuids().filter(lambda u: u.int != 0)
    if kafka_type == "error_code":
        return st.sampled_from(list(ErrorCode))
    if kafka_type == "timedelta_i32":
        return st.integers(-(2**31), 2**31 - 1).map(lambda ms: datetime.timedelta(milliseconds=ms))
    if kafka_type == "timedelta_i64":
        return st.integers(-_TIMEDELTA_MS, _TIMEDELTA_MS).map(
            lambda ms: datetime.timedelta(milliseconds=ms)
        )
    if kafka_type == "datetime_i64":
        # Kafka timestamps are milliseconds since the epoch; -1 ("none") decodes as None.
        return st.integers(0, _MAX_DATETIME_MS).map(
            lambda ms: _EPOCH + datetime.timedelta(milliseconds=ms)
        )
    raise TypeError(f"no strategy for kafka type {kafka_type!r}")


def _field(entity: type[Any], field: dataclasses.Field[Any]) -> st.SearchStrategy[Any]:
    flexible = bool(entity.__flexible__)
    inner, nullable = _unwrap_optional(field.type)
    is_array = typing.get_origin(inner) is tuple
    element = typing.get_args(inner)[0] if is_array else inner
    element, element_nullable = _unwrap_optional(element)
    if dataclasses.is_dataclass(element):
        base: st.SearchStrategy[Any] = st.deferred(lambda: message(typing.cast(type, element)))
        if element_nullable:
            base = st.none() | base
    else:
        base = _primitive(field.metadata["kafka_type"], flexible, nullable)
    if is_array:
        base = st.lists(base, max_size=3).map(tuple)
    if nullable:
        base = st.none() | base
    return base


def message(entity: type[Any]) -> st.SearchStrategy[Any]:
    """Instances of a kio message (or nested struct) class with every field drawn."""
    return st.builds(entity, **{f.name: _field(entity, f) for f in dataclasses.fields(entity)})


_SAMPLE_VALUES: dict[str, Any] = {
    "bool": True,
    "float64": 1.5,
    "string": "ab",
    "bytes": b"xy",
    "records": b"xy",
    "uuid": None,
    "error_code": ErrorCode.none,
    "timedelta_i32": datetime.timedelta(milliseconds=5),
    "timedelta_i64": datetime.timedelta(milliseconds=5),
    "datetime_i64": _EPOCH,
}


def sample(entity: type[Any]) -> Any:
    """One deterministic instance with every array holding one element and every nullable
    field set, so that every length and count field of the message appears on the wire."""
    values: dict[str, Any] = {}
    for field in dataclasses.fields(entity):
        inner, _ = _unwrap_optional(field.type)
        is_array = typing.get_origin(inner) is tuple
        element, _ = _unwrap_optional(typing.get_args(inner)[0] if is_array else inner)
        if dataclasses.is_dataclass(element):
            value = sample(typing.cast(type, element))
        else:
            kafka_type = field.metadata["kafka_type"]
            value = _SAMPLE_VALUES.get(kafka_type, 1)
        values[field.name] = (value,) if is_array else value
    return entity(**values)
