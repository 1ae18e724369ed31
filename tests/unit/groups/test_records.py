"""`__consumer_offsets` records: the bytes Kafka writes and reads, built here field by field
from Kafka's record schemas (OffsetCommitKey/Value, GroupMetadataKey/Value)."""

from __future__ import annotations

import struct

import pytest

from broker.groups.records import (
    GroupMetadataKey,
    GroupMetadataValue,
    GroupRecordError,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    encode_group_metadata_key,
    encode_group_metadata_value,
    encode_offset_commit_key,
    encode_offset_commit_value,
    java_string_hash,
    partition_for,
    subscribed_topics,
)

from .harness import subscription


def s(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def compact(text: str | None) -> bytes:
    if text is None:
        return b"\x00"
    data = text.encode()
    return bytes([len(data) + 1]) + data


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("a", 97),
        ("hello", 99162322),
        ("console-consumer-12345", 158455506),
        ("my-group", -1906497762),
        ("polygenelubricants", -(2**31)),  # Integer.MIN_VALUE
        ("\U0001f600", 0xD83D * 31 + 0xDE00),  # one code point, two UTF-16 code units
    ],
)
def test_java_string_hash(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


def test_partition_for_follows_utils_abs_of_the_hash() -> None:
    assert partition_for("hello", 50) == 99162322 % 50
    assert partition_for("polygenelubricants", 50) == 0  # Utils.abs(MIN_VALUE) is 0
    # A negative hash counts by its absolute value (Python's % alone would give 38).
    assert partition_for("my-group", 50) == 1906497762 % 50 == 12


def test_offset_commit_key_is_version_1_group_topic_partition() -> None:
    key = encode_offset_commit_key("g", "orders", 3)
    assert key == struct.pack(">h", 1) + s("g") + s("orders") + struct.pack(">i", 3)
    assert decode_key(key) == OffsetCommitKey("g", "orders", 3)
    # Version 0 keys (written by Kafka before 0.10) are read the same way.
    assert decode_key(b"\x00\x00" + key[2:]) == OffsetCommitKey("g", "orders", 3)


def test_group_metadata_key_is_version_2() -> None:
    key = encode_group_metadata_key("my-group")
    assert key == struct.pack(">h", 2) + s("my-group")
    assert decode_key(key) == GroupMetadataKey("my-group")


def test_keys_of_other_group_protocols_are_skipped() -> None:
    assert decode_key(struct.pack(">h", 3) + s("consumer-group")) is None


def test_offset_commit_value_is_written_as_v3() -> None:
    value = OffsetCommitValue(offset=42, metadata="m", commit_timestamp=1000, leader_epoch=5)
    data = encode_offset_commit_value(value)
    assert data == (struct.pack(">hqi", 3, 42, 5) + s("m") + struct.pack(">q", 1000))
    assert decode_offset_commit_value(data) == value


def test_offset_commit_value_with_expiry_is_written_as_v1() -> None:
    value = OffsetCommitValue(offset=7, metadata="", commit_timestamp=10, expire_timestamp=99)
    data = encode_offset_commit_value(value)
    assert data == struct.pack(">hq", 1, 7) + s("") + struct.pack(">qq", 10, 99)
    assert decode_offset_commit_value(data) == value


def test_offset_commit_values_v0_v2_and_flexible_v4_are_read() -> None:
    v0 = struct.pack(">hq", 0, 5) + s("meta") + struct.pack(">q", 77)
    v2 = struct.pack(">hq", 2, 5) + s("meta") + struct.pack(">q", 77)
    v4 = struct.pack(">hqi", 4, 5, 9) + compact("meta") + struct.pack(">q", 77) + b"\x00"
    assert decode_offset_commit_value(v0) == OffsetCommitValue(5, "meta", 77)
    assert decode_offset_commit_value(v2) == OffsetCommitValue(5, "meta", 77)
    assert decode_offset_commit_value(v4) == OffsetCommitValue(5, "meta", 77, leader_epoch=9)


def _member(**overrides: object) -> MemberMetadata:
    fields: dict[str, object] = {
        "member_id": "c-1",
        "group_instance_id": "i-1",
        "client_id": "c",
        "client_host": "/127.0.0.1",
        "rebalance_timeout_ms": 30_000,
        "session_timeout_ms": 10_000,
        "subscription": b"sub",
        "assignment": b"asg",
    }
    fields.update(overrides)
    return MemberMetadata(**fields)  # type: ignore[arg-type]


def test_group_metadata_value_is_written_as_v3() -> None:
    value = GroupMetadataValue("consumer", 4, "range", "c-1", 1234, (_member(),))
    data = encode_group_metadata_value(value)
    expected = (
        struct.pack(">h", 3)
        + s("consumer")
        + struct.pack(">i", 4)
        + s("range")
        + s("c-1")
        + struct.pack(">q", 1234)
        + struct.pack(">i", 1)
        + s("c-1")
        + s("i-1")
        + s("c")
        + s("/127.0.0.1")
        + struct.pack(">ii", 30_000, 10_000)
        + struct.pack(">i", 3)
        + b"sub"
        + struct.pack(">i", 3)
        + b"asg"
    )
    assert data == expected
    assert decode_group_metadata_value(data) == value


def test_an_empty_group_has_null_protocol_and_leader() -> None:
    value = GroupMetadataValue("", 0, None, None, -1, ())
    data = encode_group_metadata_value(value)
    assert data == struct.pack(">h", 3) + s("") + struct.pack(">ihhqi", 0, -1, -1, -1, 0)
    assert decode_group_metadata_value(data) == value


def test_group_metadata_v0_rebalances_within_the_session_timeout() -> None:
    data = (
        struct.pack(">h", 0)
        + s("consumer")
        + struct.pack(">i", 1)
        + s("range")
        + s("m")
        + struct.pack(">i", 1)
        + s("m")
        + s("c")
        + s("h")
        + struct.pack(">i", 6000)
        + struct.pack(">i", 0)
        + struct.pack(">i", 0)
    )
    value = decode_group_metadata_value(data)
    (member,) = value.members
    assert (member.session_timeout_ms, member.rebalance_timeout_ms) == (6000, 6000)
    assert member.group_instance_id is None
    assert value.current_state_timestamp == -1


def test_group_metadata_v4_is_flexible() -> None:
    data = (
        struct.pack(">h", 4)
        + compact("consumer")
        + struct.pack(">i", 2)
        + compact("range")
        + compact(None)
        + struct.pack(">q", 5)
        + b"\x02"  # one member
        + compact("m")
        + compact(None)
        + compact("c")
        + compact("h")
        + struct.pack(">ii", 100, 200)
        + b"\x02x"
        + b"\x01"
        + b"\x00"  # member tagged fields
        + b"\x00"  # value tagged fields
    )
    value = decode_group_metadata_value(data)
    assert value == GroupMetadataValue(
        "consumer", 2, "range", None, 5, (MemberMetadata("m", None, "c", "h", 100, 200, b"x", b""),)
    )


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00", struct.pack(">h", 9) + b"x", struct.pack(">hq", 3, 1) + b"\x00"],
)
def test_unreadable_values_raise_group_record_error(data: bytes) -> None:
    with pytest.raises(GroupRecordError):
        decode_offset_commit_value(data)


def test_subscribed_topics_reads_a_consumer_protocol_subscription() -> None:
    assert subscribed_topics(subscription("orders", "payments")) == frozenset(
        {"orders", "payments"}
    )
    # Metadata that is not a subscription leaves the topics unknown.
    assert subscribed_topics(b"sub") is None
    assert subscribed_topics(subscription("orders")[:-6]) is None  # truncated
    assert subscribed_topics(struct.pack(">hi", 0, -1)) is None  # a null topic array
