"""KRaft metadata records: the values written to `__cluster_metadata`, in Kafka's format.

Each record value is `uvarint frame_version (1) · uvarint api_key · uvarint version · message`,
with the message in the flexible encoding (KIP-482) that every metadata record uses from v0.
Record keys are null. The field tables below are written from Kafka's metadata record
schemas; `tests/unit/metadata/test_records.py` checks them field by field against those
schemas, so a table that drifts from Kafka fails the build.

Only the records Gregor's controller writes or replays are defined here; a record of any other
type in the log is an error naming its API key, never silently skipped.
"""

from __future__ import annotations

import dataclasses
import struct
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar

from broker.protocol.errors import MalformedInput
from broker.protocol.primitives import read_uvarint, write_uvarint

__all__ = [
    "FENCE",
    "UNFENCE",
    "BrokerRegistrationChangeRecord",
    "ConfigRecord",
    "FeatureLevelRecord",
    "FenceBrokerRecord",
    "MetadataRecord",
    "PartitionChangeRecord",
    "PartitionRecord",
    "ProducerIdsRecord",
    "RegisterBrokerRecord",
    "RemoveTopicRecord",
    "TopicRecord",
    "UnfenceBrokerRecord",
    "UnregisterBrokerRecord",
    "decode_record",
    "encode_record",
]

FRAME_VERSION = 1


@dataclass(frozen=True, slots=True)
class Spec:
    """One field: its wire type, the versions it exists in, whether null is allowed, its tag."""

    name: str
    type: str
    since: int = 0
    nullable: bool = False
    tag: int | None = None


class Struct:
    """A metadata record's message or one of its nested structs: its fields in wire order."""

    FIELDS: ClassVar[tuple[Spec, ...]]


class MetadataRecord(Struct):
    """A record value of `__cluster_metadata`, identified on the wire by its API key."""

    API_KEY: ClassVar[int]
    VERSION: ClassVar[int]
    """The version Gregor writes (the newest it reads)."""


@dataclass(frozen=True, slots=True)
class BrokerEndpoint(Struct):
    name: str
    host: str
    port: int
    security_protocol: int
    FIELDS: ClassVar = (
        Spec("name", "string"),
        Spec("host", "string"),
        Spec("port", "uint16"),
        Spec("security_protocol", "int16"),
    )


@dataclass(frozen=True, slots=True)
class BrokerFeature(Struct):
    name: str
    min_supported_version: int
    max_supported_version: int
    FIELDS: ClassVar = (
        Spec("name", "string"),
        Spec("min_supported_version", "int16"),
        Spec("max_supported_version", "int16"),
    )


@dataclass(frozen=True, slots=True)
class RegisterBrokerRecord(MetadataRecord):
    broker_id: int
    incarnation_id: uuid.UUID
    broker_epoch: int
    end_points: tuple[BrokerEndpoint, ...]
    features: tuple[BrokerFeature, ...] = ()
    rack: str | None = None
    fenced: bool = True
    in_controlled_shutdown: bool = False
    is_migrating_zk_broker: bool = False
    log_dirs: tuple[uuid.UUID, ...] = ()
    cordoned_log_dirs: tuple[uuid.UUID, ...] | None = None
    API_KEY: ClassVar = 0
    VERSION: ClassVar = 4
    FIELDS: ClassVar = (
        Spec("broker_id", "int32"),
        Spec("is_migrating_zk_broker", "bool", since=2),
        Spec("incarnation_id", "uuid"),
        Spec("broker_epoch", "int64"),
        Spec("end_points", "[]BrokerEndpoint"),
        Spec("features", "[]BrokerFeature"),
        Spec("rack", "string", nullable=True),
        Spec("fenced", "bool"),
        Spec("in_controlled_shutdown", "bool", since=1),
        Spec("log_dirs", "[]uuid", since=3, tag=0),
        Spec("cordoned_log_dirs", "[]uuid", since=4, nullable=True, tag=1),
    )


@dataclass(frozen=True, slots=True)
class TopicRecord(MetadataRecord):
    name: str
    topic_id: uuid.UUID
    API_KEY: ClassVar = 2
    VERSION: ClassVar = 0
    FIELDS: ClassVar = (Spec("name", "string"), Spec("topic_id", "uuid"))


@dataclass(frozen=True, slots=True)
class PartitionRecord(MetadataRecord):
    partition_id: int
    topic_id: uuid.UUID
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0
    removing_replicas: tuple[int, ...] = ()
    adding_replicas: tuple[int, ...] = ()
    leader_recovery_state: int = 0
    directories: tuple[uuid.UUID, ...] = ()
    eligible_leader_replicas: tuple[int, ...] | None = None
    last_known_elr: tuple[int, ...] | None = None
    API_KEY: ClassVar = 3
    VERSION: ClassVar = 2
    FIELDS: ClassVar = (
        Spec("partition_id", "int32"),
        Spec("topic_id", "uuid"),
        Spec("replicas", "[]int32"),
        Spec("isr", "[]int32"),
        Spec("removing_replicas", "[]int32"),
        Spec("adding_replicas", "[]int32"),
        Spec("leader", "int32"),
        Spec("leader_recovery_state", "int8", tag=0),
        Spec("leader_epoch", "int32"),
        Spec("partition_epoch", "int32"),
        Spec("directories", "[]uuid", since=1),
        Spec("eligible_leader_replicas", "[]int32", since=2, nullable=True, tag=1),
        Spec("last_known_elr", "[]int32", since=2, nullable=True, tag=2),
    )


@dataclass(frozen=True, slots=True)
class ConfigRecord(MetadataRecord):
    resource_type: int
    """2 = topic, 4 = broker (Kafka's ConfigResource.Type ids)."""
    resource_name: str
    """The topic name, or the broker id as a string ("" for the cluster-wide default)."""
    name: str
    value: str | None
    """None deletes the key (back to the default)."""
    API_KEY: ClassVar = 4
    VERSION: ClassVar = 0
    FIELDS: ClassVar = (
        Spec("resource_type", "int8"),
        Spec("resource_name", "string"),
        Spec("name", "string"),
        Spec("value", "string", nullable=True),
    )


@dataclass(frozen=True, slots=True)
class PartitionChangeRecord(MetadataRecord):
    partition_id: int
    topic_id: uuid.UUID
    isr: tuple[int, ...] | None = None
    leader: int = -2
    """-2: unchanged; -1: no leader."""
    replicas: tuple[int, ...] | None = None
    removing_replicas: tuple[int, ...] | None = None
    adding_replicas: tuple[int, ...] | None = None
    leader_recovery_state: int = -1
    directories: tuple[uuid.UUID, ...] | None = None
    eligible_leader_replicas: tuple[int, ...] | None = None
    last_known_elr: tuple[int, ...] | None = None
    API_KEY: ClassVar = 5
    VERSION: ClassVar = 2
    FIELDS: ClassVar = (
        Spec("partition_id", "int32"),
        Spec("topic_id", "uuid"),
        Spec("isr", "[]int32", nullable=True, tag=0),
        Spec("leader", "int32", tag=1),
        Spec("replicas", "[]int32", nullable=True, tag=2),
        Spec("removing_replicas", "[]int32", nullable=True, tag=3),
        Spec("adding_replicas", "[]int32", nullable=True, tag=4),
        Spec("leader_recovery_state", "int8", tag=5),
        Spec("directories", "[]uuid", since=1, nullable=True, tag=8),
        Spec("eligible_leader_replicas", "[]int32", since=2, nullable=True, tag=6),
        Spec("last_known_elr", "[]int32", since=2, nullable=True, tag=7),
    )


@dataclass(frozen=True, slots=True)
class UnfenceBrokerRecord(MetadataRecord):
    id: int
    epoch: int
    API_KEY: ClassVar = 8
    VERSION: ClassVar = 0
    FIELDS: ClassVar = (Spec("id", "int32"), Spec("epoch", "int64"))


@dataclass(frozen=True, slots=True)
class FenceBrokerRecord(MetadataRecord):
    """The broker missed its heartbeats (or asked to be fenced): it leads nothing, clients are
    not told of it."""

    id: int
    epoch: int
    API_KEY: ClassVar = 7
    VERSION: ClassVar = 0
    FIELDS: ClassVar = (Spec("id", "int32"), Spec("epoch", "int64"))


@dataclass(frozen=True, slots=True)
class UnregisterBrokerRecord(MetadataRecord):
    broker_id: int
    broker_epoch: int
    API_KEY: ClassVar = 1
    VERSION: ClassVar = 0
    FIELDS: ClassVar = (Spec("broker_id", "int32"), Spec("broker_epoch", "int64"))


FENCE = 1
UNFENCE = -1


@dataclass(frozen=True, slots=True)
class BrokerRegistrationChangeRecord(MetadataRecord):
    """A registered broker's state changes: `fenced` is FENCE, UNFENCE or 0 (unchanged);
    `in_controlled_shutdown` 1 once it asked to shut down."""

    broker_id: int
    broker_epoch: int
    fenced: int = 0
    in_controlled_shutdown: int = 0
    log_dirs: tuple[uuid.UUID, ...] = ()
    cordoned_log_dirs: tuple[uuid.UUID, ...] | None = None
    API_KEY: ClassVar = 17
    VERSION: ClassVar = 3
    FIELDS: ClassVar = (
        Spec("broker_id", "int32"),
        Spec("broker_epoch", "int64"),
        Spec("fenced", "int8", tag=0),
        Spec("in_controlled_shutdown", "int8", since=1, tag=1),
        Spec("log_dirs", "[]uuid", since=2, tag=2),
        Spec("cordoned_log_dirs", "[]uuid", since=3, nullable=True, tag=3),
    )


@dataclass(frozen=True, slots=True)
class RemoveTopicRecord(MetadataRecord):
    topic_id: uuid.UUID
    API_KEY: ClassVar = 9
    VERSION: ClassVar = 0
    FIELDS: ClassVar = (Spec("topic_id", "uuid"),)


@dataclass(frozen=True, slots=True)
class FeatureLevelRecord(MetadataRecord):
    name: str
    feature_level: int
    API_KEY: ClassVar = 12
    VERSION: ClassVar = 0
    FIELDS: ClassVar = (Spec("name", "string"), Spec("feature_level", "int16"))


@dataclass(frozen=True, slots=True)
class ProducerIdsRecord(MetadataRecord):
    broker_id: int
    broker_epoch: int
    next_producer_id: int
    """The first id not yet handed out: the next block starts here."""
    API_KEY: ClassVar = 15
    VERSION: ClassVar = 0
    FIELDS: ClassVar = (
        Spec("broker_id", "int32"),
        Spec("broker_epoch", "int64"),
        Spec("next_producer_id", "int64"),
    )


RECORD_TYPES: dict[int, type[Any]] = {
    cls.API_KEY: cls
    for cls in (
        RegisterBrokerRecord,
        TopicRecord,
        PartitionRecord,
        ConfigRecord,
        PartitionChangeRecord,
        UnfenceBrokerRecord,
        FenceBrokerRecord,
        UnregisterBrokerRecord,
        BrokerRegistrationChangeRecord,
        RemoveTopicRecord,
        FeatureLevelRecord,
        ProducerIdsRecord,
    )
}
STRUCT_TYPES: dict[str, type[Any]] = {
    "BrokerEndpoint": BrokerEndpoint,
    "BrokerFeature": BrokerFeature,
}
"""The nested structs by the name a field's `[]Name` type gives them."""

# -- encoding -------------------------------------------------------------------------------

_FIXED = {
    "int8": struct.Struct(">b"),
    "int16": struct.Struct(">h"),
    "uint16": struct.Struct(">H"),
    "int32": struct.Struct(">i"),
    "int64": struct.Struct(">q"),
}


def _write_value(out: bytearray, kind: str, value: Any) -> None:
    if kind in _FIXED:
        out += _FIXED[kind].pack(value)
    elif kind == "bool":
        out.append(1 if value else 0)
    elif kind == "uuid":
        out += value.bytes
    elif kind == "string":
        if value is None:
            out += write_uvarint(0)
        else:
            data = value.encode()
            out += write_uvarint(len(data) + 1) + data
    elif kind.startswith("[]"):
        if value is None:
            out += write_uvarint(0)
            return
        out += write_uvarint(len(value) + 1)
        element = kind[2:]
        for item in value:
            if element in STRUCT_TYPES:
                _write_struct(out, item, 0)
            else:
                _write_value(out, element, item)
    else:  # pragma: no cover - the field tables are checked by the tests
        raise TypeError(f"unknown metadata field type {kind}")


def _write_struct(out: bytearray, message: Any, version: int) -> None:
    tagged: list[tuple[int, bytes]] = []
    for spec in message.FIELDS:
        if version < spec.since:
            continue
        value = getattr(message, spec.name)
        if spec.tag is None:
            _write_value(out, spec.type, value)
        elif value != _default_of(type(message), spec.name):
            encoded = bytearray()
            _write_value(encoded, spec.type, value)
            tagged.append((spec.tag, bytes(encoded)))
    out += write_uvarint(len(tagged))
    for tag, value_bytes in sorted(tagged):
        out += write_uvarint(tag) + write_uvarint(len(value_bytes)) + value_bytes


def _default_of(cls: type[Any], name: str) -> Any:
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            return None
    raise KeyError(name)  # pragma: no cover


def encode_record(record: MetadataRecord) -> bytes:
    """A metadata record value as it is stored in `__cluster_metadata`."""
    out = bytearray(write_uvarint(FRAME_VERSION))
    out += write_uvarint(record.API_KEY) + write_uvarint(record.VERSION)
    _write_struct(out, record, record.VERSION)
    return bytes(out)


# -- decoding -------------------------------------------------------------------------------


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, size: int, what: str) -> bytes:
        end = self.pos + size
        if size < 0 or end > len(self.data):
            raise MalformedInput(f"{what} runs past the end of the record", where="metadata record")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def uvarint(self, what: str) -> int:
        value, self.pos = read_uvarint(self.data, self.pos, what)
        return value


def _read_value(reader: _Reader, kind: str, what: str) -> Any:
    if kind in _FIXED:
        codec = _FIXED[kind]
        return codec.unpack(reader.take(codec.size, what))[0]
    if kind == "bool":
        return reader.take(1, what) != b"\x00"
    if kind == "uuid":
        return uuid.UUID(bytes=reader.take(16, what))
    if kind == "string":
        length = reader.uvarint(what)
        if length == 0:
            return None
        try:
            return reader.take(length - 1, what).decode()
        except UnicodeDecodeError as exc:
            raise MalformedInput(f"{what} is not UTF-8", where="metadata record") from exc
    if kind.startswith("[]"):
        count = reader.uvarint(what)
        if count == 0:
            return None
        if count - 1 > len(reader.data) - reader.pos:
            raise MalformedInput(f"{what} claims {count - 1} elements", where="metadata record")
        element = kind[2:]
        if element in STRUCT_TYPES:
            return tuple(_read_struct(reader, STRUCT_TYPES[element], 0) for _ in range(count - 1))
        return tuple(_read_value(reader, element, what) for _ in range(count - 1))
    raise TypeError(f"unknown metadata field type {kind}")  # pragma: no cover


def _read_struct(reader: _Reader, cls: type[Any], version: int) -> Any:
    values: dict[str, Any] = {}
    by_tag: dict[int, Spec] = {}
    for spec in cls.FIELDS:
        if version < spec.since:
            continue
        if spec.tag is not None:
            by_tag[spec.tag] = spec
            continue
        value = _read_value(reader, spec.type, f"{cls.__name__}.{spec.name}")
        if value is None and spec.type.startswith("[]") and not spec.nullable:
            value = ()
        values[spec.name] = value
    for _ in range(reader.uvarint("tagged field count")):
        tag = reader.uvarint("tag")
        size = reader.uvarint("tagged field size")
        raw = reader.take(size, f"tagged field {tag}")
        tagged_spec = by_tag.get(tag)
        if tagged_spec is not None:
            values[tagged_spec.name] = _read_value(_Reader(raw), tagged_spec.type, tagged_spec.name)
    return cls(**values)


def decode_record(value: bytes) -> MetadataRecord:
    """The record stored in a `__cluster_metadata` record value."""
    reader = _Reader(value)
    frame = reader.uvarint("frame version")
    if frame != FRAME_VERSION:
        raise MalformedInput(f"metadata frame version {frame} is not 1", where="metadata record")
    api_key = reader.uvarint("record type")
    version = reader.uvarint("record version")
    cls = RECORD_TYPES.get(api_key)
    if cls is None:
        raise MalformedInput(f"metadata record type {api_key} is unknown", where="metadata record")
    if version > cls.VERSION:
        raise MalformedInput(
            f"{cls.__name__} v{version} is newer than v{cls.VERSION}", where="metadata record"
        )
    record: MetadataRecord = _read_struct(reader, cls, version)
    if reader.pos != len(value):
        raise MalformedInput(
            f"{len(value) - reader.pos} bytes left after {cls.__name__}", where="metadata record"
        )
    return record
