"""Speaking the Kafka protocol to a broker by hand, for the tests no client library can write:
hostile frames, exact versions, and retries a real client would never send. Requests are
built through the project's codec from values (`tests.support.requests.fill`)."""

from __future__ import annotations

import itertools
import socket
import time
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from broker.protocol import (
    ApiKey,
    ErrorCode,
    FrameReader,
    RequestHeader,
    decode_response,
    encode_request,
    request_type,
)
from broker.protocol.records import Record, build_batch
from tests.support.requests import fill

__all__ = [
    "API_VERSIONS",
    "api_versions_frame",
    "call",
    "exchange",
    "fetch_frame",
    "init_producer_id",
    "now_ms",
    "produce",
    "produce_frame",
    "produce_values",
    "produced",
    "request_frame",
]

MiB = 1 << 20

_correlation_ids = itertools.count(1)


def exchange(sock: socket.socket, frame: bytes) -> bytes | None:
    """Send one frame; the response frame, or None if the broker closed the connection."""
    sock.sendall(frame)
    reader = FrameReader()
    while (response := reader.next_frame()) is None:
        data = sock.recv(65536)
        if not data:
            return None
        reader.receive_data(data)
    return bytes(response)


def call(
    address: tuple[str, int], api_key: int, version: int, body: Any, timeout: float = 10.0
) -> Any:
    """One request on a fresh connection; the decoded response body (its correlation id
    checked). Fails if the broker closes the connection instead of answering."""
    correlation_id = next(_correlation_ids)
    frame = encode_request(RequestHeader(api_key, version, correlation_id, "gregor-tests"), body)
    with socket.create_connection(address, timeout=timeout) as sock:
        response = exchange(sock, frame)
    if response is None:
        raise ConnectionError(f"the broker closed the connection instead of answering {api_key}")
    answered_id, decoded = decode_response(api_key, version, response)
    assert answered_id == correlation_id
    return decoded


# -- requests by hand, as frames or as calls ------------------------------------------------------


def request_frame(
    api_key: int,
    version: int,
    values: Mapping[str, Any],
    correlation_id: int = 1,
    client_id: str = "gregor-tests",
) -> bytes:
    """A size-prefixed request frame, the body given as values (`fill`'s nested mappings)."""
    body = fill(request_type(api_key, version), values)
    header = RequestHeader(api_key, version, correlation_id, client_id)
    return encode_request(header, body)


def now_ms() -> int:
    """Milliseconds since the epoch, as record timestamps count them."""
    return time.time_ns() // 1_000_000


def api_versions_frame(correlation_id: int = 1, client_id: str = "gregor-tests") -> bytes:
    """ApiVersions v3: the cheapest request there is, a greeting, and a check that a
    connection is still served."""
    values = {"client_software_name": client_id, "client_software_version": "1"}
    return request_frame(ApiKey.API_VERSIONS, 3, values, correlation_id, client_id)


API_VERSIONS = api_versions_frame()


def produce_values(topic: str, batch: bytes) -> dict[str, Any]:
    """Produce v9 (acks=all) of `batch` to partition 0 of `topic`, as `fill` values."""
    return {
        "transactional_id": None,
        "acks": -1,
        "timeout": timedelta(seconds=30),
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}],
    }


def produce_frame(topic: str, frame_size: int) -> bytes:
    """A well-formed Produce v9 frame whose size prefix announces exactly `frame_size`: one
    batch of one record, its value as long as it takes."""
    value_bytes = frame_size
    for _ in range(5):
        batch = build_batch([Record(0, now_ms(), None, b"\0" * value_bytes)])
        frame = request_frame(ApiKey.PRODUCE, 9, produce_values(topic, batch))
        if len(frame) - 4 == frame_size:
            return frame
        value_bytes += frame_size - (len(frame) - 4)
    raise AssertionError(f"no Produce frame of exactly {frame_size} bytes")


def produced(frame: bytes) -> Any:
    """The one partition's answer in a Produce v9 response frame."""
    body: Any
    _, body = decode_response(ApiKey.PRODUCE, 9, frame)
    return body.responses[0].partition_responses[0]


def fetch_values(
    topic: str,
    max_wait: timedelta,
    partitions: Iterable[int] = (0,),
    *,
    fetch_offset: int = 0,
    min_bytes: int = 1,
) -> dict[str, Any]:
    """A Fetch v12 body (`fill`'s values) of `partitions` from `fetch_offset`, waiting up to
    `max_wait` for `min_bytes`."""
    return {
        "replica_id": -1,
        "max_wait": max_wait,
        "min_bytes": min_bytes,
        "max_bytes": MiB,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {
                "topic": topic,
                "partitions": [
                    {
                        "partition": partition,
                        "current_leader_epoch": -1,
                        "fetch_offset": fetch_offset,
                        "last_fetched_epoch": -1,
                        "log_start_offset": -1,
                        "partition_max_bytes": MiB,
                    }
                    for partition in partitions
                ],
            }
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }


def fetch_frame(topic: str, max_wait: timedelta, partitions: Iterable[int] = (0,)) -> bytes:
    """Fetch v12 of `partitions` from offset 0, waiting up to `max_wait` for one byte."""
    return request_frame(ApiKey.FETCH, 12, fetch_values(topic, max_wait, partitions))


def produce(address: tuple[str, int], topic: str, batch: bytes, version: int = 9) -> Any:
    """Produce `batch` (acks=all, v9 unless told) to partition 0 of `topic` on a fresh
    connection; the partition's answer."""
    body = fill(request_type(ApiKey.PRODUCE, version), produce_values(topic, batch))
    return call(address, ApiKey.PRODUCE, version, body).responses[0].partition_responses[0]


def init_producer_id(
    address: tuple[str, int], producer_id: int = -1, epoch: int = -1
) -> tuple[int, int]:
    """InitProducerId v4 without a transactional id (naming `producer_id` and `epoch` as a
    client recovering one would): the id and epoch the broker hands out."""
    values = {
        "transactional_id": None,
        "transaction_timeout": timedelta(seconds=60),
        "producer_id": producer_id,
        "producer_epoch": epoch,
    }
    body = fill(request_type(ApiKey.INIT_PRODUCER_ID, 4), values)
    response = call(address, ApiKey.INIT_PRODUCER_ID, 4, body)
    assert response.error_code == ErrorCode.none, response
    return int(response.producer_id), int(response.producer_epoch)


def topic_metadata(address: tuple[str, int], topic: str) -> Any:
    """Metadata v12 for `topic` (never creating it) as the node at `address` sees it."""
    values = {"topics": [{"name": topic}], "allow_auto_topic_creation": False}
    return call(address, ApiKey.METADATA, 12, fill(request_type(ApiKey.METADATA, 12), values))
