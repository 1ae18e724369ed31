"""The error response of any API: what a handler that failed answers instead of closing the
connection, as Kafka's `AbstractRequest.getErrorResponse` does for every request type.

The response mirrors the request: each topic, partition, resource or group the request named
comes back with the error code (and the message, where the version has one), its identity
(name, index, id) copied from the request; every other field holds Kafka's "unknown" value
(-1 for numbers, empty or null otherwise). Built from the response class of the request's
version, so it exists at every version the broker advertises without a table per API.
"""

from __future__ import annotations

import dataclasses
import types
import typing
import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from broker.protocol import ErrorCode, ResponseBody, response_type

__all__ = ["error_response"]

_ARRAYS: Mapping[str, tuple[str, ...]] = {
    "responses": ("topic_data", "topics", "topic_names", "resources"),
    "partition_responses": ("partition_data",),
    "topics": ("topics",),
    "partitions": ("partitions", "partition_indexes"),
    "coordinators": ("coordinator_keys",),
    "results": ("resources", "topics", "groups_names"),
    "groups": ("groups", "groups_names"),
    "members": ("members",),
    "replica_election_results": ("topic_partitions",),
    "partition_result": ("partitions",),
}
"""A response's array of per-item results → the request arrays it answers, by field name
(ProduceResponse.responses answers ProduceRequest.topic_data, ...)."""

_IDENTITY: Mapping[str, tuple[str, ...]] = {
    "name": ("name", "topic", "topic_name"),
    "topic": ("topic", "name"),
    "index": ("index", "partition", "partition_index"),
    "partition_index": ("partition_index", "partition", "index"),
    "partition": ("partition", "partition_index", "index"),
    "partition_id": ("partition_id", "partition_index", "partition", "index"),
    "topic_id": ("topic_id",),
    "resource_type": ("resource_type",),
    "resource_name": ("resource_name",),
    "group_id": ("group_id",),
    "key": ("key",),
    "member_id": ("member_id",),
    "group_instance_id": ("group_instance_id",),
}
"""A response item's identity fields → the request item's fields they copy."""

_NO_ITEMS = frozenset({"DescribeLogDirsResponse", "DescribeClusterResponse"})
"""Responses whose arrays do not answer the request's items (log dirs, brokers): Kafka's error
response leaves them empty."""

_INTEGERS = frozenset({"int8", "int16", "int32", "int64", "uint16", "uint32"})


def error_response(
    api_key: int, api_version: int, request: Any, error: ErrorCode, message: str | None = None
) -> ResponseBody:
    """`request`'s response at its version with `error` on every item it names."""
    response_class = response_type(api_key, api_version)
    mirror_items = response_class.__name__ not in _NO_ITEMS
    response: ResponseBody = _mirror(response_class, request, error, message, mirror_items)
    return response


def _mirror(cls: type[Any], source: Any, error: ErrorCode, message: str | None, items: bool) -> Any:
    if isinstance(source, str):  # DeleteTopics v1-v5 names topics, FindCoordinator v4 keys
        source = types.SimpleNamespace(name=source, key=source, group_id=source)
    elif isinstance(source, int):  # OffsetFetch names partitions by index
        source = types.SimpleNamespace(partition_index=source)
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        annotation = hints[field.name]
        if field.name == "error_code":
            values[field.name] = error
            continue
        if field.name == "error_message":
            values[field.name] = message
            continue
        item = _struct_of(annotation)
        if item is not None:
            sources = _request_items(source, field.name) if items else None
            if sources is not None:
                values[field.name] = tuple(_mirror(item, s, error, message, items) for s in sources)
                continue
        copied = _identity(source, field.name)
        if copied is not _MISSING:
            values[field.name] = copied
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            values[field.name] = _unknown(field, annotation, error, message)
    return cls(**values)


_MISSING = object()


def _identity(source: Any, name: str) -> Any:
    for candidate in _IDENTITY.get(name, ()):
        value = getattr(source, candidate, _MISSING)
        if value is not _MISSING:
            return value
    return _MISSING


def _request_items(source: Any, name: str) -> tuple[Any, ...] | None:
    for candidate in _ARRAYS.get(name, ()):
        value = getattr(source, candidate, None)
        if isinstance(value, tuple):
            return value
    return None


def _struct_of(annotation: Any) -> type[Any] | None:
    """The struct class of an array field (`tuple[Struct, ...]`, maybe nullable), else None."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    args = [a for a in typing.get_args(annotation) if a is not type(None)] if union else []
    for arg in args or [annotation]:
        if typing.get_origin(arg) is tuple:
            item = typing.get_args(arg)[0]
            if dataclasses.is_dataclass(item):
                return typing.cast(type[Any], item)
    return None


def _nullable(annotation: Any) -> bool:
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    return union and type(None) in typing.get_args(annotation)


def _unknown(
    field: dataclasses.Field[Any], annotation: Any, error: ErrorCode, message: str | None
) -> Any:
    if _nullable(annotation):
        return None
    kind = field.metadata.get("kafka_type")
    if kind in _INTEGERS:
        return -1
    if kind == "float64":
        return -1.0
    if kind == "string":
        return ""
    if kind == "bool":
        return False
    if kind == "uuid":
        return uuid.UUID(int=0)
    if kind in ("bytes", "records"):
        return b""
    if kind in ("timedelta_i32", "timedelta_i64"):
        return timedelta(0)
    if kind == "error_code":
        return error
    if typing.get_origin(annotation) is tuple:
        return ()
    if dataclasses.is_dataclass(annotation):
        return _mirror(typing.cast(type[Any], annotation), None, error, message, items=False)
    raise TypeError(f"no unknown value for {field.name}: {annotation}")
