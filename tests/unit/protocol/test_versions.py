"""The version table and what the broker answers at versions outside it."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from broker.protocol import (
    REFUSED,
    SUPPORTED,
    ApiKey,
    ErrorCode,
    UnsupportedVersion,
    advertised,
    decode_request,
    decode_response,
    unsupported_version_answer,
)
from broker.protocol.framing import FrameReader


def _request(api_key: int, version: int, correlation_id: int = 42) -> bytes:
    """A request frame with a v1 header (null client id) and a few body bytes."""
    return struct.pack(">hhih", api_key, version, correlation_id, -1) + b"\x00" * 8


def test_api_versions_at_an_unknown_version_gets_kafkas_v0_answer() -> None:
    """KIP-511: error 35 with the ApiVersions range, in a v0 body behind a v0 header."""
    with pytest.raises(UnsupportedVersion) as caught:
        decode_request(_request(ApiKey.API_VERSIONS, 9, correlation_id=42))
    answer = unsupported_version_answer(caught.value)
    assert answer is not None
    reader = FrameReader()
    reader.receive_data(answer)
    frame = reader.next_frame()
    assert frame is not None
    correlation_id, body = decode_response(ApiKey.API_VERSIONS, 0, frame)
    response: Any = body
    assert correlation_id == 42
    assert response.error_code == ErrorCode.unsupported_version
    assert [(k.api_key, k.min_version, k.max_version) for k in response.api_keys] == [
        (ApiKey.API_VERSIONS, 0, 4)
    ]


@pytest.mark.parametrize("version", [0, 1, 2])
def test_produce_v0_to_v2_is_advertised_but_refused_by_closing(version: int) -> None:
    assert version in SUPPORTED[ApiKey.PRODUCE]
    assert version in REFUSED[ApiKey.PRODUCE]
    with pytest.raises(UnsupportedVersion) as caught:
        decode_request(_request(ApiKey.PRODUCE, version))
    assert unsupported_version_answer(caught.value) is None


@pytest.mark.parametrize(
    ("api_key", "version"), [(ApiKey.FETCH, 3), (ApiKey.METADATA, 14), (24, 0), (999, 0), (-1, 0)]
)
def test_other_unsupported_requests_close_the_connection(api_key: int, version: int) -> None:
    with pytest.raises(UnsupportedVersion) as caught:
        decode_request(_request(api_key, version))
    assert "unsupported API key" in str(caught.value)
    assert unsupported_version_answer(caught.value) is None


def test_only_apis_with_a_handler_are_advertised() -> None:
    table = advertised({ApiKey.API_VERSIONS, ApiKey.METADATA})
    assert set(table) == {ApiKey.API_VERSIONS, ApiKey.METADATA}
    assert table[ApiKey.METADATA] == SUPPORTED[ApiKey.METADATA]
    assert advertised([]) == {}


# Versions that clients in the field check for exactly, or cannot go below (protocol brief §0):
# librdkafka < 2.11.1 (Debian's kcat) and aiokafka 0.14's hand-written structs.
_EXACT_VERSIONS_OLD_LIBRDKAFKA = {
    ApiKey.PRODUCE: [2, 3, 7],
    ApiKey.FETCH: [4, 10],
    ApiKey.JOIN_GROUP: [0],
    ApiKey.SYNC_GROUP: [0],
    ApiKey.HEARTBEAT: [0],
    ApiKey.LEAVE_GROUP: [0],
    ApiKey.FIND_COORDINATOR: [0],
    ApiKey.INIT_PRODUCER_ID: [0],
    ApiKey.LIST_OFFSETS: [1],
    ApiKey.OFFSET_COMMIT: [2],
    ApiKey.OFFSET_FETCH: [1],
    ApiKey.SASL_HANDSHAKE: [1],
}
_AIOKAFKA_MAX = {
    ApiKey.PRODUCE: 7,
    ApiKey.FETCH: 11,
    ApiKey.LIST_OFFSETS: 3,
    ApiKey.METADATA: 5,
    ApiKey.OFFSET_COMMIT: 3,
    ApiKey.OFFSET_FETCH: 3,
    ApiKey.FIND_COORDINATOR: 1,
    ApiKey.JOIN_GROUP: 5,
    ApiKey.HEARTBEAT: 1,
    ApiKey.LEAVE_GROUP: 1,
    ApiKey.SYNC_GROUP: 3,
    ApiKey.API_VERSIONS: 0,
    ApiKey.CREATE_TOPICS: 3,
    ApiKey.DELETE_TOPICS: 3,
}


@pytest.mark.parametrize(("api_key", "versions"), _EXACT_VERSIONS_OLD_LIBRDKAFKA.items())
def test_versions_old_librdkafka_checks_for_are_advertised(
    api_key: ApiKey, versions: list[int]
) -> None:
    for version in versions:
        assert version in SUPPORTED[api_key]


@pytest.mark.parametrize(("api_key", "highest"), _AIOKAFKA_MAX.items())
def test_no_floor_above_what_aiokafka_can_send(api_key: ApiKey, highest: int) -> None:
    assert SUPPORTED[api_key].min <= highest
