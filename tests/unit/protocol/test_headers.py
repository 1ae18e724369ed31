"""Request headers v0–v2 and response headers v0–v1 round-trip, and bad ones are refused with
the project's error."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.protocol import MalformedInput, RequestHeader, ResponseHeader
from broker.protocol.headers import (
    decode_request_header,
    decode_response_header,
    encode_request_header,
    encode_response_header,
)

int16 = st.integers(-(2**15), 2**15 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
tagged = st.dictionaries(st.integers(0, 2**31), st.binary(max_size=8), max_size=3).map(
    lambda d: tuple(sorted(d.items()))
)


@given(
    version=st.sampled_from([0, 1, 2]),
    api_key=int16,
    api_version=int16,
    correlation_id=int32,
    client_id=st.none() | st.text(max_size=40),
    tagged_fields=tagged,
    body=st.binary(max_size=16),
)
def test_request_header_round_trips(
    version: int,
    api_key: int,
    api_version: int,
    correlation_id: int,
    client_id: str | None,
    tagged_fields: tuple[tuple[int, bytes], ...],
    body: bytes,
) -> None:
    header = RequestHeader(
        api_key,
        api_version,
        correlation_id,
        client_id if version >= 1 else None,
        tagged_fields if version >= 2 else (),
    )
    encoded = encode_request_header(header, version)
    decoded, body_start = decode_request_header(encoded + body, version)
    assert decoded == header
    assert body_start == len(encoded)


@given(version=st.sampled_from([0, 1]), correlation_id=int32, tagged_fields=tagged)
def test_response_header_round_trips(
    version: int, correlation_id: int, tagged_fields: tuple[tuple[int, bytes], ...]
) -> None:
    header = ResponseHeader(correlation_id, tagged_fields if version == 1 else ())
    encoded = encode_response_header(header, version)
    assert decode_response_header(encoded, version) == (header, len(encoded))


def test_request_header_v1_layout_matches_kafka() -> None:
    # api_key=18, api_version=3, correlation_id=7, client_id="abc" (int16 length)
    encoded = encode_request_header(RequestHeader(18, 3, 7, "abc"), 1)
    assert encoded == bytes.fromhex("00120003000000070003") + b"abc"


def test_client_id_longer_than_the_frame_is_malformed() -> None:
    frame = struct.pack(">hhih", 3, 1, 9, 50) + b"short"
    with pytest.raises(MalformedInput, match="client_id of 50 bytes is truncated"):
        decode_request_header(frame, 1)


def test_client_id_with_invalid_utf8_is_malformed() -> None:
    frame = struct.pack(">hhih", 3, 1, 9, 2) + b"\xff\xfe"
    with pytest.raises(MalformedInput, match="UTF-8"):
        decode_request_header(frame, 1)


def test_tagged_fields_out_of_order_are_malformed() -> None:
    frame = struct.pack(">hhih", 18, 3, 9, -1) + bytes([2, 5, 0, 1, 0])
    with pytest.raises(MalformedInput, match="out of order"):
        decode_request_header(frame, 2)


def test_frame_shorter_than_a_header_is_malformed() -> None:
    with pytest.raises(MalformedInput, match="shorter than a request header"):
        decode_request_header(b"\x00\x12", 1)
