"""Requests for every API Gregor serves, at any of its versions, built through the codec.

One set of values per API is written for all of its versions (`TEMPLATES`); `fill` makes one
version's request class from them, leaving out the fields that version lacks and giving the
fields no value names their zero. Topics are named both ways, by name and by id (`topic_id`,
the real id of `TOPIC` on the node asked), so each version sends the one it has. The
every-version sweep sends them to a real node; the dispatcher's unit tests feed them to failing
handlers.
"""

from __future__ import annotations

import dataclasses
import time
import types
import typing
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any

from broker.protocol import ApiKey
from broker.protocol.records import Record, build_batch

__all__ = ["ANY_TOPIC_ID", "TEMPLATES", "TOPIC", "Template", "error_codes", "fill"]

TOPIC = "sweep"
ANY_TOPIC_ID = uuid.UUID("0c5e3b9a-7d41-4f0e-8a36-2b1f9d6e4c77")
"""A topic id for requests that never reach a real topic (the dispatcher's unit tests)."""
PARTITION_BYTES = 1 << 20


def _batch() -> bytes:
    now_ms = time.time_ns() // 1_000_000
    return build_batch([Record(offset=0, timestamp=now_ms, key=b"k", value=b"v")])


Values = Mapping[str, Any]
Template = Callable[[int, uuid.UUID], Values]
"""The values of one API's request, written for all of its versions, given the version (some
requests must differ per version to be repeatable: the topic a CreateTopics makes) and the id
of `TOPIC`."""


def _special_timestamp(version: int) -> int:
    """The newest special timestamp ListOffsets `version` may ask for: -6 earliest pending
    upload (v11), -5 latest tiered (v9), -4 earliest local (v8), -3 max timestamp (v7), else
    -1 latest."""
    for first, timestamp in ((11, -6), (9, -5), (8, -4), (7, -3)):
        if version >= first:
            return timestamp
    return -1


TEMPLATES: dict[ApiKey, Template] = {
    ApiKey.API_VERSIONS: lambda v, topic_id: {
        "client_software_name": "gregor-sweep",
        "client_software_version": "1.0",
    },
    ApiKey.METADATA: lambda v, topic_id: {
        "topics": [{"name": TOPIC}],
        "allow_auto_topic_creation": False,
    },
    ApiKey.PRODUCE: lambda v, topic_id: {
        "transactional_id": None,
        "acks": -1,
        "timeout": timedelta(seconds=10),
        "topic_data": [
            {
                "name": TOPIC,
                "topic_id": topic_id,
                "partition_data": [{"index": 0, "records": _batch()}],
            }
        ],
    },
    ApiKey.FETCH: lambda v, topic_id: {
        "replica_id": -1,
        "max_wait": timedelta(0),
        "max_bytes": PARTITION_BYTES,
        "session_epoch": -1,
        "topics": [
            {
                "topic": TOPIC,
                "topic_id": topic_id,
                "partitions": [
                    {
                        "partition": 0,
                        "current_leader_epoch": -1,
                        "last_fetched_epoch": -1,
                        "log_start_offset": -1,
                        "partition_max_bytes": PARTITION_BYTES,
                        "high_watermark": -1,  # v18: a consumer knows none
                    }
                ],
            }
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    },
    ApiKey.LIST_OFFSETS: lambda v, topic_id: {
        "replica_id": -1,
        "timeout": timedelta(seconds=10),
        "topics": [
            {
                "name": TOPIC,
                "partitions": [
                    {
                        "partition_index": 0,
                        "current_leader_epoch": -1,
                        "timestamp": _special_timestamp(v),
                    }
                ],
            }
        ],
    },
    ApiKey.CREATE_TOPICS: lambda v, topic_id: {
        "topics": [{"name": f"made-v{v}", "num_partitions": 1, "replication_factor": 1}],
        "timeout": timedelta(seconds=30),
    },
    ApiKey.DELETE_TOPICS: lambda v, topic_id: {
        "topic_names": [f"doomed-v{v}"],
        "topics": [{"name": f"doomed-v{v}", "topic_id": uuid.UUID(int=0)}],
        "timeout": timedelta(seconds=30),
    },
    ApiKey.CREATE_PARTITIONS: lambda v, topic_id: {
        "topics": [{"name": TOPIC, "count": 2, "assignments": None}],
        "timeout": timedelta(seconds=30),
        "validate_only": True,
    },
    ApiKey.ELECT_LEADERS: lambda v, topic_id: {
        "election_type": v % 2,  # preferred and unclean, both not needed on one node
        "topic_partitions": [{"topic": TOPIC, "partitions": [0]}],
        "timeout": timedelta(seconds=30),
    },
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: lambda v, topic_id: {
        # The partition's own replica (node 1) again: nothing to move on one node.
        "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "replicas": [1]}]}],
        "timeout": timedelta(seconds=30),
    },
    ApiKey.LIST_PARTITION_REASSIGNMENTS: lambda v, topic_id: {
        "topics": None,
        "timeout": timedelta(seconds=30),
    },
    ApiKey.UNREGISTER_BROKER: lambda v, topic_id: {"broker_id": 99},  # no such broker
    ApiKey.DELETE_RECORDS: lambda v, topic_id: {
        "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "offset": 0}]}],
        "timeout": timedelta(seconds=30),
    },
    ApiKey.INIT_PRODUCER_ID: lambda v, topic_id: {
        "transactional_id": None,
        "transaction_timeout": timedelta(seconds=60),
        "producer_id": -1,
        "producer_epoch": -1,
    },
    ApiKey.DESCRIBE_CONFIGS: lambda v, topic_id: {
        "resources": [{"resource_type": 2, "resource_name": TOPIC, "configuration_keys": None}],
        "include_synonyms": True,
        "include_documentation": True,
    },
    ApiKey.ALTER_CONFIGS: lambda v, topic_id: {
        "resources": [
            {
                "resource_type": 2,
                "resource_name": TOPIC,
                "configs": [{"name": "retention.ms", "value": "86400000"}],
            }
        ],
    },
    ApiKey.INCREMENTAL_ALTER_CONFIGS: lambda v, topic_id: {
        "resources": [
            {
                "resource_type": 2,
                "resource_name": TOPIC,
                "configs": [{"name": "retention.ms", "config_operation": 0, "value": "3600000"}],
            }
        ],
    },
    ApiKey.DESCRIBE_CLUSTER: lambda v, topic_id: {
        "include_cluster_authorized_operations": True,
        "include_fenced_brokers": True,
    },
    ApiKey.DESCRIBE_LOG_DIRS: lambda v, topic_id: {"topics": None},
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: lambda v, topic_id: {
        "topics": [{"name": TOPIC}],
        "response_partition_limit": 2000,
        "cursor": {"topic_name": TOPIC, "partition_index": 0},
    },
    ApiKey.LIST_CONFIG_RESOURCES: lambda v, topic_id: {"resource_types": []},
    ApiKey.DESCRIBE_QUORUM: lambda v, topic_id: {
        "topics": [{"topic_name": "__cluster_metadata", "partitions": [{"partition_index": 0}]}]
    },
    ApiKey.FIND_COORDINATOR: lambda v, topic_id: {
        "key": "sweep-group",
        "key_type": 0,
        "coordinator_keys": ["sweep-group"],
    },
    ApiKey.JOIN_GROUP: lambda v, topic_id: {
        "group_id": f"join-v{v}",
        "session_timeout": timedelta(seconds=10),
        "rebalance_timeout": timedelta(seconds=10),
        "member_id": "",
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b""}],
        "reason": None,
    },
    ApiKey.SYNC_GROUP: lambda v, topic_id: {
        "group_id": "sweep-group",
        "generation_id": 1,
        "member_id": "nobody",
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocol_name": "range",
        "assignments": [],
    },
    ApiKey.HEARTBEAT: lambda v, topic_id: {
        "group_id": "sweep-group",
        "generation_id": 1,
        "member_id": "nobody",
        "group_instance_id": None,
    },
    ApiKey.LEAVE_GROUP: lambda v, topic_id: {
        "group_id": "sweep-group",
        "member_id": "nobody",
        "members": [{"member_id": "nobody", "group_instance_id": None, "reason": None}],
    },
    ApiKey.OFFSET_COMMIT: lambda v, topic_id: {
        "group_id": f"commit-v{v}",
        "generation_id_or_member_epoch": -1,
        "member_id": "",
        "group_instance_id": None,
        "retention_time": timedelta(milliseconds=-1),
        "topics": [
            {
                "name": TOPIC,
                "topic_id": topic_id,
                "partitions": [
                    {
                        "partition_index": 0,
                        "committed_offset": 1,
                        "committed_leader_epoch": -1,
                        "commit_timestamp": -1,
                        "committed_metadata": "",
                    }
                ],
            }
        ],
    },
    ApiKey.OFFSET_FETCH: lambda v, topic_id: {
        "group_id": "commit-v8",
        "topics": [{"name": TOPIC, "partition_indexes": [0]}],
        "groups": [
            {
                "group_id": "commit-v8",
                "member_id": None,
                "member_epoch": -1,
                "topics": [{"name": TOPIC, "topic_id": topic_id, "partition_indexes": [0]}],
            }
        ],
        "require_stable": False,
    },
    ApiKey.OFFSET_DELETE: lambda v, topic_id: {
        "group_id": "commit-v2",
        "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0}]}],
    },
    ApiKey.DESCRIBE_GROUPS: lambda v, topic_id: {
        "groups": ["commit-v8", "nobody-here"],
        "include_authorized_operations": True,
    },
    ApiKey.LIST_GROUPS: lambda v, topic_id: {"states_filter": [], "types_filter": []},
    ApiKey.DELETE_GROUPS: lambda v, topic_id: {"groups_names": [f"commit-v{v + 3}"]},
}


def _struct_of(annotation: Any) -> type[Any] | None:
    """The struct class of an array field (`tuple[Struct, ...]`, maybe nullable), else None."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    args = [a for a in typing.get_args(annotation) if a is not type(None)] if union else []
    for arg in args or [annotation]:
        if typing.get_origin(arg) is tuple:
            (item, *_) = typing.get_args(arg)
            if dataclasses.is_dataclass(item):
                return typing.cast(type[Any], item)
    return None


def _single_struct_of(annotation: Any) -> type[Any]:
    """The struct class of a struct field (`Struct`, maybe nullable)."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    args = [a for a in typing.get_args(annotation) if a is not type(None)] if union else []
    (struct,) = [a for a in args or [annotation] if dataclasses.is_dataclass(a)]
    return typing.cast(type[Any], struct)


def _zero(field: dataclasses.Field[Any], annotation: Any) -> Any:
    kind = field.metadata.get("kafka_type")
    if kind in ("int8", "int16", "int32", "int64", "uint16", "uint32", "float64"):
        return 0
    if kind in ("string",):
        return ""
    if kind == "bool":
        return False
    if kind == "uuid":
        return uuid.UUID(int=0)
    if kind in ("bytes", "records"):
        return b""
    if kind in ("timedelta_i32", "timedelta_i64"):
        return timedelta(0)
    if typing.get_origin(annotation) is tuple or _struct_of(annotation) is not None:
        return ()
    raise AssertionError(f"no zero for {field.name} ({kind}, {annotation})")


def fill(message: type[Any], values: Values) -> Any:
    """An instance of `message` (one version's class) from `values`, recursively: a struct
    array is given as a list of value mappings, a struct as one; fields the class lacks are
    ignored."""
    hints = typing.get_type_hints(message)
    given: dict[str, Any] = {}
    for field in dataclasses.fields(message):
        annotation = hints[field.name]
        if field.name in values:
            value = values[field.name]
            item = _struct_of(annotation)
            if item is not None and value is not None:
                value = tuple(fill(item, v) for v in value)
            elif isinstance(value, dict):  # a struct field (DescribeTopicPartitions' Cursor)
                value = fill(_single_struct_of(annotation), value)
            elif isinstance(value, list):
                value = tuple(value)
            given[field.name] = value
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            given[field.name] = _zero(field, annotation)
    return message(**given)


def error_codes(message: Any) -> Iterator[tuple[str, int]]:
    """Every error code in a response, with where it is."""
    if not dataclasses.is_dataclass(message):
        return
    for field in dataclasses.fields(message):
        value = getattr(message, field.name)
        if field.name == "error_code":
            yield type(message).__name__, int(value)
        elif isinstance(value, tuple):
            for item in value:
                yield from error_codes(item)
        elif dataclasses.is_dataclass(value):
            yield from error_codes(value)
