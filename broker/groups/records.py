"""The records of `__consumer_offsets`, byte for byte as Kafka writes and reads them.

Every record's key and value start with an int16 version. The key version says what the record
is: 0 and 1 an offset commit (`OffsetCommitKey`: group, topic, partition), 2 a classic group
(`GroupMetadataKey`: group); higher ones belong to the consumer and share group protocols,
which Gregor does not serve, and are skipped on replay. A value of None is a tombstone: the key
is gone, and compaction keeps the tombstone for `delete.retention.ms` so replicas see it too.

Versions written are the ones Kafka 3.x and 4.x write: key 1 for offsets and 2 for groups;
`OffsetCommitValue` v3 (v1 for a commit carrying its own expiry, from OffsetCommit v2–v4
`retention_time`), `GroupMetadataValue` v3. Values v0–v4 are read (v4 is the first flexible
one, KIP-915). Which partition a group lives in is Kafka's
`Utils.abs(groupId.hashCode()) % offsets.topic.num.partitions`, with Java's String.hashCode
over UTF-16 code units.

It also reads the topics out of a member's consumer protocol subscription, the bytes a
GroupMetadataValue stores for each member.

This module is pure: bytes in, dataclasses out. It never touches the log.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

from broker.protocol.errors import MalformedInput
from broker.protocol.primitives import read_tagged_fields, read_uvarint

__all__ = [
    "GROUP_METADATA_KEY_VERSION",
    "GroupMetadataKey",
    "GroupMetadataValue",
    "GroupRecordError",
    "MemberMetadata",
    "OffsetCommitKey",
    "OffsetCommitValue",
    "decode_group_metadata_value",
    "decode_key",
    "decode_offset_commit_value",
    "encode_group_metadata_key",
    "encode_group_metadata_value",
    "encode_offset_commit_key",
    "encode_offset_commit_value",
    "java_string_hash",
    "partition_for",
    "subscribed_topics",
]

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY = 1
GROUP_METADATA_VALUE_VERSION = 3
_MAX_VALUE_VERSION = 4

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class GroupRecordError(ValueError):
    """A `__consumer_offsets` record this module cannot read (corrupt, or a future version)."""


def java_string_hash(text: str) -> int:
    """Java's `String.hashCode()`: `s[0]*31^(n-1) + … + s[n-1]` over UTF-16 code units, as a
    signed 32-bit integer."""
    data = text.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for(group_id: str, num_partitions: int) -> int:
    """The `__consumer_offsets` partition that holds a group (Kafka's `Utils.abs` maps
    Integer.MIN_VALUE to 0 rather than leaving it negative)."""
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions


# -- values ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OffsetCommitValue:
    offset: int
    metadata: str
    commit_timestamp: int
    leader_epoch: int = -1
    """-1: unknown (commits before OffsetCommit v6, or a client that does not send it)."""
    expire_timestamp: int | None = None
    """Set only by OffsetCommit v2–v4 with a `retention_time`; written as value v1."""


@dataclass(frozen=True, slots=True)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    """The member's metadata for the group's selected protocol."""
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int = -1
    """When the group entered its current state (-1 in values older than v2)."""
    members: tuple[MemberMetadata, ...] = ()


# -- writing ---------------------------------------------------------------------------------


def _string(text: str) -> bytes:
    data = text.encode()
    if len(data) > 0x7FFF:
        raise ValueError(f"string of {len(data)} bytes does not fit an int16 length")
    return _I16.pack(len(data)) + data


def _nullable_string(text: str | None) -> bytes:
    return _I16.pack(-1) if text is None else _string(text)


def _bytes(data: bytes) -> bytes:
    return _I32.pack(len(data)) + data


def encode_offset_commit_key(group_id: str, topic: str, partition: int) -> bytes:
    return (
        _I16.pack(OFFSET_COMMIT_KEY_VERSION)
        + _string(group_id)
        + _string(topic)
        + _I32.pack(partition)
    )


def encode_group_metadata_key(group_id: str) -> bytes:
    return _I16.pack(GROUP_METADATA_KEY_VERSION) + _string(group_id)


def encode_offset_commit_value(value: OffsetCommitValue) -> bytes:
    if value.expire_timestamp is not None:
        return (
            _I16.pack(OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY)
            + _I64.pack(value.offset)
            + _string(value.metadata)
            + _I64.pack(value.commit_timestamp)
            + _I64.pack(value.expire_timestamp)
        )
    return (
        _I16.pack(OFFSET_COMMIT_VALUE_VERSION)
        + _I64.pack(value.offset)
        + _I32.pack(value.leader_epoch)
        + _string(value.metadata)
        + _I64.pack(value.commit_timestamp)
    )


def encode_group_metadata_value(value: GroupMetadataValue) -> bytes:
    parts = [
        _I16.pack(GROUP_METADATA_VALUE_VERSION),
        _string(value.protocol_type),
        _I32.pack(value.generation),
        _nullable_string(value.protocol),
        _nullable_string(value.leader),
        _I64.pack(value.current_state_timestamp),
        _I32.pack(len(value.members)),
    ]
    for member in value.members:
        parts += [
            _string(member.member_id),
            _nullable_string(member.group_instance_id),
            _string(member.client_id),
            _string(member.client_host),
            _I32.pack(member.rebalance_timeout_ms),
            _I32.pack(member.session_timeout_ms),
            _bytes(member.subscription),
            _bytes(member.assignment),
        ]
    return b"".join(parts)


# -- reading ---------------------------------------------------------------------------------


class _Reader:
    """A cursor over one key or value; `flexible` switches to compact lengths (value v4)."""

    def __init__(self, data: bytes, what: str, *, flexible: bool = False) -> None:
        self.data = data
        self.pos = 0
        self.what = what
        self.flexible = flexible

    def _take(self, size: int) -> bytes:
        if size < 0 or self.pos + size > len(self.data):
            raise GroupRecordError(f"{self.what} is truncated at byte {self.pos}")
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def int16(self) -> int:
        return int(_I16.unpack(self._take(2))[0])

    def int32(self) -> int:
        return int(_I32.unpack(self._take(4))[0])

    def int64(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    def _length(self, wide: bool) -> int:
        if self.flexible:
            try:
                length, self.pos = read_uvarint(self.data, self.pos, self.what)
            except MalformedInput as exc:
                raise GroupRecordError(str(exc)) from exc
            return length - 1
        return self.int32() if wide else self.int16()

    def nullable_string(self) -> str | None:
        length = self._length(wide=False)
        if length < 0:
            return None
        try:
            return self._take(length).decode()
        except UnicodeDecodeError as exc:
            raise GroupRecordError(f"{self.what} holds a string that is not UTF-8") from exc

    def string(self) -> str:
        text = self.nullable_string()
        if text is None:
            raise GroupRecordError(f"{self.what} holds a null where a string is required")
        return text

    def bytes_(self) -> bytes:
        length = self._length(wide=True)
        return b"" if length < 0 else self._take(length)

    def array_length(self) -> int:
        length = self._length(wide=True)
        if length < 0:
            raise GroupRecordError(f"{self.what} holds a null array")
        return length

    def tagged_fields(self) -> None:
        if self.flexible:
            try:
                _, self.pos = read_tagged_fields(self.data, self.pos, self.what)
            except MalformedInput as exc:
                raise GroupRecordError(str(exc)) from exc


class OffsetCommitKey(NamedTuple):
    group_id: str
    topic: str
    partition: int


class GroupMetadataKey(NamedTuple):
    group_id: str


def decode_key(key: bytes) -> OffsetCommitKey | GroupMetadataKey | None:
    """What a record is about; None for the record types of other group protocols."""
    reader = _Reader(key, "__consumer_offsets key")
    version = reader.int16()
    if version in (0, OFFSET_COMMIT_KEY_VERSION):
        return OffsetCommitKey(reader.string(), reader.string(), reader.int32())
    if version == GROUP_METADATA_KEY_VERSION:
        return GroupMetadataKey(reader.string())
    if version < 0:
        raise GroupRecordError(f"negative key version {version}")
    return None


def _value_reader(value: bytes, what: str) -> tuple[_Reader, int]:
    reader = _Reader(value, what)
    version = reader.int16()
    if not 0 <= version <= _MAX_VALUE_VERSION:
        raise GroupRecordError(f"{what} version {version} is not readable")
    reader.flexible = version >= 4
    return reader, version


def decode_offset_commit_value(value: bytes) -> OffsetCommitValue:
    reader, version = _value_reader(value, "OffsetCommitValue")
    offset = reader.int64()
    leader_epoch = reader.int32() if version >= 3 else -1
    metadata = reader.string()
    commit_timestamp = reader.int64()
    expire_timestamp = reader.int64() if version == 1 else None
    reader.tagged_fields()
    return OffsetCommitValue(
        offset=offset,
        metadata=metadata,
        commit_timestamp=commit_timestamp,
        leader_epoch=leader_epoch,
        expire_timestamp=None if expire_timestamp == -1 else expire_timestamp,
    )


def decode_group_metadata_value(value: bytes) -> GroupMetadataValue:
    reader, version = _value_reader(value, "GroupMetadataValue")
    protocol_type = reader.string()
    generation = reader.int32()
    protocol = reader.nullable_string()
    leader = reader.nullable_string()
    current_state_timestamp = reader.int64() if version >= 2 else -1
    members = []
    for _ in range(reader.array_length()):
        member_id = reader.string()
        group_instance_id = reader.nullable_string() if version >= 3 else None
        client_id = reader.string()
        client_host = reader.string()
        rebalance_timeout = reader.int32() if version >= 1 else -1
        session_timeout = reader.int32()
        if version == 0:
            rebalance_timeout = session_timeout  # v0 groups rebalanced within the session
        subscription = reader.bytes_()
        assignment = reader.bytes_()
        reader.tagged_fields()
        members.append(
            MemberMetadata(
                member_id=member_id,
                group_instance_id=group_instance_id,
                client_id=client_id,
                client_host=client_host,
                rebalance_timeout_ms=rebalance_timeout,
                session_timeout_ms=session_timeout,
                subscription=subscription,
                assignment=assignment,
            )
        )
    reader.tagged_fields()
    return GroupMetadataValue(
        protocol_type=protocol_type,
        generation=generation,
        protocol=protocol,
        leader=leader,
        current_state_timestamp=current_state_timestamp,
        members=tuple(members),
    )


def subscribed_topics(metadata: bytes) -> frozenset[str] | None:
    """The topics of a consumer protocol subscription (`ConsumerProtocolSubscription`, read as
    v0, the prefix of every version), or None if the metadata does not parse."""
    reader = _Reader(metadata, "ConsumerProtocolSubscription")
    try:
        reader.int16()  # version
        count = reader.array_length()
        if count > len(metadata):
            return None
        return frozenset(reader.string() for _ in range(count))
    except GroupRecordError:
        return None
