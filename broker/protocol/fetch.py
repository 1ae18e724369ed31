"""The Fetch response (v4–v18), encoded by hand so record batches never pass through Python.

A Fetch response is almost all record bytes. The generic codec would copy them from the log
into Python, then into the encoded frame, then into the socket's buffer; here each partition's
records stay a `Region` — a range of a segment file — and the frame comes out as parts:
encoded bytes around regions, which the server sends with `sendfile` (zero-copy, as Kafka's
`FileRecords.writeTo`). Only the versions the broker serves are written (see `versions.py`);
the encoding is checked byte for byte against the generic codec in the unit tests.

From v13 a topic is named by its id (KIP-516); from v12 a partition may carry its current leader
and from v16 the response the endpoints of those leaders (KIP-951), both as tagged fields, written
only when they hold something, as the generic codec writes them.

The response classes carry the generic codec's field names and error-code markers, so code that
inspects responses (the metrics) reads them as it reads any other.
"""

from __future__ import annotations

import dataclasses
import struct
import uuid
from typing import Protocol

from .errors import ErrorCode
from .primitives import write_uvarint

__all__ = [
    "FIRST_FLEXIBLE_VERSION",
    "FetchPartition",
    "FetchResponse",
    "FetchTopic",
    "NodeEndpoint",
    "Region",
    "encode_fetch_response",
]

FIRST_FLEXIBLE_VERSION = 12
FIRST_TOPIC_ID_VERSION = 13
FIRST_NODE_ENDPOINTS_VERSION = 16
LAST_VERSION = 18
NO_TOPIC_ID = uuid.UUID(int=0)
_ERROR_CODE = {"kafka_type": "error_code"}

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_THROTTLE_ERROR_SESSION = struct.Struct(">ihi")
_PARTITION_V4 = struct.Struct(">ihqq")  # index, error, high watermark, last stable offset
_PARTITION_V5 = struct.Struct(">ihqqq")  # … and log start offset
_LEADER = struct.Struct(">ii")  # leader id, leader epoch
_EPOCH_END = struct.Struct(">iq")  # epoch, end offset
_DIVERGING_EPOCH_TAG = 0  # in a partition
_NO_TAGGED_FIELDS = b"\x00"
_CURRENT_LEADER_TAG = 1  # in a partition
_NODE_ENDPOINTS_TAG = 0  # in the response


class Region(Protocol):
    """Bytes of a file sent as they are: `sendfile` on plain sockets, `read()` elsewhere."""

    @property
    def fd(self) -> int: ...

    @property
    def position(self) -> int: ...

    def __len__(self) -> int: ...

    def read(self) -> bytes: ...

    def close(self) -> None: ...


@dataclasses.dataclass(slots=True)
class FetchPartition:
    partition_index: int
    error_code: ErrorCode = dataclasses.field(metadata=_ERROR_CODE)
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    records: bytes | Region
    preferred_read_replica: int = -1
    current_leader_id: int = -1
    """KIP-951 (v12+, tagged): the leader a NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH
    partition now has, so the client need not ask Metadata; -1 when not told."""
    current_leader_epoch: int = -1
    diverging_epoch: tuple[int, int] | None = None
    """To a follower (v12+, tagged): (epoch, end offset) where its log parted from the
    leader's; None when it did not."""


@dataclasses.dataclass(slots=True)
class FetchTopic:
    topic: str
    partitions: tuple[FetchPartition, ...]
    topic_id: uuid.UUID = NO_TOPIC_ID
    """How v13+ names the topic (the name is not on the wire from v13)."""


@dataclasses.dataclass(frozen=True, slots=True)
class NodeEndpoint:
    """A current leader's address on the request's listener (v16+, KIP-951)."""

    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclasses.dataclass(slots=True)
class FetchResponse:
    throttle_time_ms: int
    error_code: ErrorCode = dataclasses.field(metadata=_ERROR_CODE)
    session_id: int
    responses: tuple[FetchTopic, ...]
    node_endpoints: tuple[NodeEndpoint, ...] = ()

    def regions(self) -> list[Region]:
        """The file regions this response holds open (close them once it is sent or dropped)."""
        return [
            p.records
            for t in self.responses
            for p in t.partitions
            if not isinstance(p.records, bytes)
        ]


def encode_fetch_response(
    correlation_id: int, api_version: int, response: FetchResponse
) -> list[bytes | Region]:
    """The size-prefixed frame as parts: bytes, and regions to send between them."""
    if not 4 <= api_version <= LAST_VERSION:
        raise ValueError(f"Fetch v{api_version} is not encoded here (v4–v{LAST_VERSION} are)")
    flexible = api_version >= FIRST_FLEXIBLE_VERSION
    parts: list[bytes | Region] = []
    out = bytearray(_INT32.pack(correlation_id))
    if flexible:
        out += _NO_TAGGED_FIELDS  # response header v1
    if api_version >= 7:
        out += _THROTTLE_ERROR_SESSION.pack(
            response.throttle_time_ms, response.error_code, response.session_id
        )
    else:
        out += _INT32.pack(response.throttle_time_ms)
    _array_length(out, len(response.responses), flexible)
    for topic in response.responses:
        if api_version >= FIRST_TOPIC_ID_VERSION:
            out += topic.topic_id.bytes
        else:
            name = topic.topic.encode()
            out += write_uvarint(len(name) + 1) if flexible else _INT16.pack(len(name))
            out += name
        _array_length(out, len(topic.partitions), flexible)
        for partition in topic.partitions:
            _partition_header(out, partition, api_version, flexible)
            records = partition.records
            size = len(records)
            _array_length(out, size, flexible)
            if isinstance(records, bytes):
                out += records
            elif size:
                parts.append(bytes(out))
                parts.append(records)
                out = bytearray()
            if flexible:
                _partition_tagged_fields(out, partition)
        if flexible:
            out += _NO_TAGGED_FIELDS
    if flexible:
        _response_tagged_fields(out, response, api_version)
    parts.append(bytes(out))
    head = parts[0]
    assert isinstance(head, bytes)  # the response header always comes first
    parts[0] = _INT32.pack(sum(len(part) for part in parts)) + head
    return parts


def _partition_header(
    out: bytearray, partition: FetchPartition, api_version: int, flexible: bool
) -> None:
    if api_version >= 5:
        out += _PARTITION_V5.pack(
            partition.partition_index,
            partition.error_code,
            partition.high_watermark,
            partition.last_stable_offset,
            partition.log_start_offset,
        )
    else:
        out += _PARTITION_V4.pack(
            partition.partition_index,
            partition.error_code,
            partition.high_watermark,
            partition.last_stable_offset,
        )
    # Aborted transactions: null (no transactions are served).
    out += b"\x00" if flexible else b"\xff\xff\xff\xff"
    if api_version >= 11:
        out += _INT32.pack(partition.preferred_read_replica)


def _partition_tagged_fields(out: bytearray, partition: FetchPartition) -> None:
    """The partition's tagged fields, in tag order: DivergingEpoch (0), CurrentLeader (1)."""
    fields = []
    if partition.diverging_epoch is not None:
        fields.append((_DIVERGING_EPOCH_TAG, _EPOCH_END.pack(*partition.diverging_epoch)))
    leader = (partition.current_leader_id, partition.current_leader_epoch)
    if leader != (-1, -1):
        fields.append((_CURRENT_LEADER_TAG, _LEADER.pack(*leader)))
    out += write_uvarint(len(fields))
    for tag, packed in fields:
        value = packed + _NO_TAGGED_FIELDS
        out += write_uvarint(tag) + write_uvarint(len(value)) + value


def _response_tagged_fields(out: bytearray, response: FetchResponse, api_version: int) -> None:
    if api_version < FIRST_NODE_ENDPOINTS_VERSION or not response.node_endpoints:
        out += _NO_TAGGED_FIELDS
        return
    value = bytearray(write_uvarint(len(response.node_endpoints) + 1))
    for node in response.node_endpoints:
        host = node.host.encode()
        value += _INT32.pack(node.node_id) + write_uvarint(len(host) + 1) + host
        value += _INT32.pack(node.port)
        if node.rack is None:
            value += b"\x00"
        else:
            rack = node.rack.encode()
            value += write_uvarint(len(rack) + 1) + rack
        value += _NO_TAGGED_FIELDS
    out += b"\x01" + write_uvarint(_NODE_ENDPOINTS_TAG) + write_uvarint(len(value)) + value


def _array_length(out: bytearray, length: int, flexible: bool) -> None:
    """An array's or bytes' length: compact (unsigned varint of length + 1) from v12, else
    int32."""
    if flexible:
        out += write_uvarint(length + 1)
    else:
        out += _INT32.pack(length)
