"""The hand-written Fetch response encoder writes, byte for byte, what the generic codec writes —
for every served version, with records given as bytes or as regions of a real file."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.protocol import (
    SUPPORTED,
    ApiKey,
    ErrorCode,
    RequestHeader,
    build,
    encode_response,
    response_module,
)
from broker.protocol.fetch import (
    FetchPartition,
    FetchResponse,
    FetchTopic,
    NodeEndpoint,
    Region,
    encode_fetch_response,
)
from broker.storage import FileSlice

VERSIONS = list(SUPPORTED[ApiKey.FETCH])

error_codes = st.sampled_from(list(ErrorCode))
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
partitions = st.builds(
    FetchPartition,
    partition_index=int32,
    error_code=error_codes,
    high_watermark=int64,
    last_stable_offset=int64,
    log_start_offset=int64,
    records=st.binary(max_size=300),
    preferred_read_replica=int32,
    current_leader_id=st.one_of(st.just(-1), int32),
    current_leader_epoch=st.one_of(st.just(-1), int32),
)
topics = st.builds(
    FetchTopic,
    topic=st.text(max_size=20),
    partitions=st.lists(partitions, max_size=4).map(tuple),
    topic_id=st.uuids(),
)
endpoints = st.builds(
    NodeEndpoint,
    node_id=int32,
    host=st.text(max_size=20),
    port=int32,
    rack=st.one_of(st.none(), st.text(max_size=10)),
)
responses = st.builds(
    FetchResponse,
    throttle_time_ms=st.integers(0, 2**31 - 1),
    error_code=error_codes,
    session_id=int32,
    responses=st.lists(topics, max_size=4).map(tuple),
    node_endpoints=st.lists(endpoints, max_size=3).map(tuple),
)


class Segment:
    """A file that regions point into (a stand-in for a segment's `.log`)."""

    def __init__(self, path: Path) -> None:
        self.size = 4096
        path.write_bytes(os.urandom(self.size))
        self.fd = os.open(path, os.O_RDONLY)

    def __repr__(self) -> str:
        return f"Segment(fd={self.fd})"


@pytest.fixture(scope="module")
def segment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Segment]:
    file = Segment(tmp_path_factory.mktemp("segment") / "00000000000000000000.log")
    yield file
    os.close(file.fd)


def generic(correlation_id: int, version: int, response: FetchResponse) -> bytes:
    """The same response through the generic (kio) codec."""
    schema = response_module(ApiKey.FETCH, version)

    def records(value: bytes | Region) -> bytes:
        return value if isinstance(value, bytes) else value.read()

    body: Any = build(
        schema.FetchResponse,
        throttle_time=timedelta(milliseconds=response.throttle_time_ms),
        error_code=response.error_code,
        session_id=response.session_id,
        responses=tuple(
            build(
                schema.FetchableTopicResponse,
                topic=topic.topic,
                topic_id=topic.topic_id,
                partitions=tuple(
                    build(
                        schema.PartitionData,
                        partition_index=p.partition_index,
                        error_code=p.error_code,
                        high_watermark=p.high_watermark,
                        last_stable_offset=p.last_stable_offset,
                        log_start_offset=p.log_start_offset,
                        aborted_transactions=None,
                        preferred_read_replica=p.preferred_read_replica,
                        records=records(p.records),
                        current_leader=build(
                            schema.LeaderIdAndEpoch,
                            leader_id=p.current_leader_id,
                            leader_epoch=p.current_leader_epoch,
                        )
                        if version >= 12
                        else None,
                    )
                    for p in topic.partitions
                ),
            )
            for topic in response.responses
        ),
        node_endpoints=tuple(
            build(schema.NodeEndpoint, node_id=n.node_id, host=n.host, port=n.port, rack=n.rack)
            for n in response.node_endpoints
        )
        if version >= 16
        else (),
    )
    return encode_response(RequestHeader(ApiKey.FETCH, version, correlation_id, "c"), body)


def joined(parts: list[bytes | Region]) -> bytes:
    return b"".join(p if isinstance(p, bytes) else p.read() for p in parts)


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(response=responses, correlation_id=int32, data=st.data())
def test_matches_the_generic_codec(
    version: int,
    response: FetchResponse,
    correlation_id: int,
    data: st.DataObject,
    segment: Segment,
) -> None:
    for topic in response.responses:
        for partition in topic.partitions:
            if data.draw(st.booleans(), label="as a region"):
                start = data.draw(st.integers(0, segment.size), label="region start")
                size = data.draw(st.integers(0, segment.size - start), label="region size")
                partition.records = FileSlice(segment.fd, start, size).pin()
    parts = encode_fetch_response(correlation_id, version, response)
    assert joined(parts) == generic(correlation_id, version, response)
    for region in response.regions():
        region.close()


def one_partition(records: bytes | Region) -> FetchResponse:
    partition = FetchPartition(0, ErrorCode.none, 10, 10, 0, records)
    return FetchResponse(0, ErrorCode.none, 0, (FetchTopic("t", (partition,)),))


def test_regions_stay_out_of_the_encoded_bytes(segment: Segment) -> None:
    region = FileSlice(segment.fd, 100, 2000).pin()
    parts = encode_fetch_response(7, 12, one_partition(region))
    assert [p for p in parts if not isinstance(p, bytes)] == [region]
    assert sum(len(p) for p in parts if isinstance(p, bytes)) < 100
    head = parts[0]
    assert isinstance(head, bytes)
    assert int.from_bytes(head[:4], "big") == sum(len(p) for p in parts) - 4
    region.close()


def test_an_empty_region_is_written_inline(segment: Segment) -> None:
    region = FileSlice(segment.fd, 0, 0).pin()
    parts = encode_fetch_response(1, 11, one_partition(region))
    assert all(isinstance(p, bytes) for p in parts)
    region.close()


@pytest.mark.parametrize("version", [3, 19])
def test_versions_outside_the_served_range_are_refused(version: int) -> None:
    with pytest.raises(ValueError, match=f"Fetch v{version}"):
        encode_fetch_response(1, version, FetchResponse(0, ErrorCode.none, 0, ()))
