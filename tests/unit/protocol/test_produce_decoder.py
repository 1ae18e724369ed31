"""The hand-written Produce decoder reads what the generic codec reads — for every served
version, on valid bodies and on damaged ones — and hands out records as read-only slices of
the frame, never as copies."""

from __future__ import annotations

import importlib
import mmap
import struct
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.protocol import (
    SUPPORTED,
    ApiKey,
    MalformedInput,
    RequestHeader,
    build,
    decode_request,
    encode_request,
    encode_request_body,
    request_type,
)
from broker.protocol.bounds import check_bounds
from broker.protocol.messages import _reader
from broker.protocol.produce import decode_produce_request
from broker.protocol.versions import is_decodable
from tests.strategies import message, sample

VERSIONS = [v for v in SUPPORTED[ApiKey.PRODUCE] if is_decodable(ApiKey.PRODUCE, v)]


def _generic(entity: type[Any], data: bytes) -> Any:
    """The generic codec's reading of a body, or the exception it ends in."""
    try:
        check_bounds(entity, data, 0)
        return _reader(entity)(data, 0)[0]
    except Exception as exc:  # any failure counts as refused
        return exc


def _ours(entity: type[Any], data: bytes) -> Any:
    try:
        return decode_produce_request(entity, data, 0)
    except MalformedInput as exc:
        return exc


def _records(body: Any) -> list[Any]:
    return [p.records for t in body.topic_data for p in t.partition_data]


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_valid_bodies_decode_as_the_generic_codec_does(version: int, data: st.DataObject) -> None:
    entity = request_type(ApiKey.PRODUCE, version)
    body = data.draw(message(entity))
    encoded = encode_request_body(body)
    generic, ours = _generic(entity, encoded), _ours(entity, encoded)
    assert not isinstance(generic, Exception), generic
    assert ours == generic
    for records in _records(ours):
        assert records is None or (isinstance(records, memoryview) and records.readonly)


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_damaged_bodies_are_refused_exactly_when_the_generic_codec_refuses_them(
    version: int, data: st.DataObject
) -> None:
    """Truncated, overwritten and random bodies: both refuse, or both read the same thing."""
    entity = request_type(ApiKey.PRODUCE, version)
    encoded = bytearray(encode_request_body(data.draw(message(entity))))
    damage = data.draw(st.sampled_from(["truncate", "overwrite", "random"]))
    if damage == "truncate" and encoded:
        del encoded[data.draw(st.integers(0, len(encoded) - 1)) :]
    elif damage == "overwrite" and encoded:
        at = data.draw(st.integers(0, len(encoded) - 1))
        patch = data.draw(st.binary(min_size=1, max_size=4))
        encoded[at : at + len(patch)] = patch
    else:
        encoded = bytearray(data.draw(st.binary(max_size=64)))
    generic, ours = _generic(entity, bytes(encoded)), _ours(entity, bytes(encoded))
    if isinstance(generic, KeyError) and "Unknown tagged field" in str(generic):
        return  # kio refuses tags it does not know; Kafka, and ours, skip them (tested below)
    if isinstance(generic, Exception):
        assert isinstance(ours, MalformedInput), f"generic refused ({generic!r}), ours read {ours}"
    elif isinstance(ours, MalformedInput):
        # A null where the schema allows none, which the generic codec lets through as None
        # (and the handler would then fail on), or a string too long: Kafka refuses both.
        assert _null_where_forbidden(generic) or _string_too_long(generic), (
            f"ours refused ({ours}), generic read {generic}"
        )
    else:
        assert ours == generic


def _string_too_long(body: Any) -> bool:
    names = [getattr(topic, "name", "") or "" for topic in body.topic_data]
    strings = [body.transactional_id or "", *names]
    return any(len(text.encode()) > 0x7FFF for text in strings)


def _null_where_forbidden(body: Any) -> bool:
    if body.topic_data is None:
        return True
    for topic in body.topic_data:
        if topic.partition_data is None or getattr(topic, "name", "") is None:
            return True
    return False


def test_records_are_slices_of_the_frame_not_copies() -> None:
    """An 8 MiB batch is not copied on decoding: the records share the frame's memory."""
    entity = request_type(ApiKey.PRODUCE, 9)
    module = importlib.import_module(entity.__module__)
    records = b"\x07" * (8 << 20)
    partition = module.PartitionProduceData(index=0, records=records)
    body = build(
        entity,
        transactional_id=None,
        acks=-1,
        timeout=timedelta(seconds=30),
        topic_data=(module.TopicProduceData(name="t", partition_data=(partition,)),),
    )
    frame = encode_request(RequestHeader(ApiKey.PRODUCE, 9, 1, "c"), body)[4:]
    mapping = mmap.mmap(-1, len(frame), flags=mmap.MAP_PRIVATE)
    mapping[:] = frame
    decoded = decode_request(memoryview(mapping).toreadonly()).body
    (got,) = _records(decoded)
    assert isinstance(got, memoryview)
    assert got.readonly
    assert got.obj is mapping
    assert got == records
    # Three empty tagged-field sections (partition, topic, request) follow the records.
    mapping[len(frame) - 3 - len(records)] = 0x08
    assert got[0] == 0x08, "the records are a copy"


def test_a_hostile_array_length_is_refused_before_anything_is_built() -> None:
    entity = request_type(ApiKey.PRODUCE, 8)
    # transactional id null, acks, timeout, then 2^31-1 topics in a 10-byte body
    body = struct.pack(">hhii", -1, -1, 30_000, 2**31 - 1)
    with pytest.raises(MalformedInput, match="array of 2147483647 elements"):
        decode_produce_request(entity, body, 0)


def test_unknown_tagged_fields_are_skipped_in_any_order_as_kafka_does() -> None:
    entity = request_type(ApiKey.PRODUCE, 9)
    encoded = encode_request_body(sample(entity))
    assert encoded.endswith(b"\x00")  # the request's own tagged fields: none
    tagged = encoded[:-1] + bytes([2, 7, 1, 0xAA, 3, 2, 0xBB, 0xCC])  # tags 7 then 3
    assert decode_produce_request(entity, tagged, 0) == decode_produce_request(entity, encoded, 0)


def test_a_string_longer_than_kafka_allows_is_refused() -> None:
    entity = request_type(ApiKey.PRODUCE, 9)
    # transactional id: a compact string of 40 000 bytes
    body = bytes([0xC1, 0xB8, 0x02]) + b"t" * 40_000 + struct.pack(">hi", -1, 30_000) + b"\x01\x00"
    with pytest.raises(MalformedInput, match="longer than 32767"):
        decode_produce_request(entity, body, 0)
