"""Every request and response version Gregor serves survives encode → decode unchanged, through
the project's own interface (frames with headers, not kio directly)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.protocol import (
    SUPPORTED,
    ApiKey,
    RequestHeader,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    request_type,
    response_type,
)
from broker.protocol.versions import is_decodable
from tests.strategies import message

VERSIONS = [
    pytest.param(key, version, id=f"{key.name}-v{version}")
    for key, versions in SUPPORTED.items()
    for version in versions
    if is_decodable(key, version)
]

client_ids = st.none() | st.text(max_size=16)
correlation_ids = st.integers(-(2**31), 2**31 - 1)


@pytest.mark.parametrize(("api_key", "version"), VERSIONS)
@settings(max_examples=25)
@given(data=st.data(), correlation_id=correlation_ids, client_id=client_ids)
def test_request_round_trips(
    api_key: ApiKey, version: int, data: st.DataObject, correlation_id: int, client_id: str | None
) -> None:
    body: Any = data.draw(message(request_type(api_key, version)))
    header = RequestHeader(api_key, version, correlation_id, client_id)
    frame = encode_request(header, body)
    decoded = decode_request(frame[4:])
    assert decoded.header == header
    assert decoded.body == body


@pytest.mark.parametrize(("api_key", "version"), VERSIONS)
@settings(max_examples=25)
@given(data=st.data(), correlation_id=correlation_ids)
def test_response_round_trips(
    api_key: ApiKey, version: int, data: st.DataObject, correlation_id: int
) -> None:
    body: Any = data.draw(message(response_type(api_key, version)))
    request = RequestHeader(api_key, version, correlation_id, "client")
    frame = encode_response(request, body)
    decoded_correlation_id, decoded = decode_response(api_key, version, frame[4:])
    assert decoded_correlation_id == correlation_id
    assert decoded == body
