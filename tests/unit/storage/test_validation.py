"""What the leader does to batches on their way into the log, by topic config: recompression to
`compression.type`, LogAppendTime stamps, the CreateTime bounds, and a refusal that names every
invalid record of the batch (KIP-467)."""

from __future__ import annotations

import struct
from typing import Any

import google_crc32c
import pytest

from broker.protocol import Codec
from broker.protocol.records import Record, build_batch, validate_batch
from broker.storage import CorruptRecordError, InvalidRecord, InvalidTimestamp, LogConfig
from broker.storage.config import InvalidConfig
from broker.storage.errors import RecordError

from .logs import SMALL, LogOpener, batch, consume, headers, records_of

NOW = 1_700_000_000_000
HOUR = 3600 * 1000


def config(**settings: str) -> LogConfig:
    return LogConfig.from_properties(settings, SMALL)


def produced(codec: Codec = Codec.NONE, timestamps: list[int] | None = None) -> bytes:
    """An idempotent producer's batch of three records with keys, values and headers."""
    stamps = timestamps or [NOW - 30, NOW - 20, NOW - 10]
    return build_batch(
        [
            Record(i, ts, f"k{i}".encode(), f"value {i}".encode() * 10, (("h", b"x"),))
            for i, ts in enumerate(stamps)
        ],
        codec=codec,
        producer_id=42,
        producer_epoch=3,
        base_sequence=7,
    )


def test_a_producer_codec_topic_stores_the_producers_bytes(open_log: LogOpener) -> None:
    log = open_log(config())
    sent = produced(Codec.GZIP)
    log.append_as_leader(sent, leader_epoch=0, now_ms=NOW)
    (stored,) = consume(log)
    assert stored[61:] == sent[61:]  # past the header: the records as the producer wrote them
    assert headers([stored])[0].codec is Codec.GZIP


@pytest.mark.parametrize(
    ("setting", "sent", "stored"),
    [
        ("zstd", Codec.NONE, Codec.ZSTD),
        ("lz4", Codec.GZIP, Codec.LZ4),
        ("uncompressed", Codec.SNAPPY, Codec.NONE),
        ("gzip", Codec.ZSTD, Codec.GZIP),
    ],
)
def test_batches_are_recompressed_to_the_topics_codec(
    open_log: LogOpener, setting: str, sent: Codec, stored: Codec
) -> None:
    log = open_log(config(**{"compression.type": setting}))
    original = produced(sent)
    info = log.append_as_leader(original, leader_epoch=0, now_ms=NOW)
    assert (info.first_offset, info.last_offset, info.record_count) == (0, 2, 3)
    (kept,) = consume(log)
    header = validate_batch(kept)
    assert header.codec is stored
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 7)
    assert records_of([kept]) == records_of([original])


def test_a_recompressed_retry_is_still_a_duplicate(open_log: LogOpener) -> None:
    log = open_log(config(**{"compression.type": "zstd"}))
    first = log.append_as_leader(produced(), leader_epoch=0, now_ms=NOW)
    retry = log.append_as_leader(produced(), leader_epoch=0, now_ms=NOW)
    assert retry.duplicate
    assert retry.first_offset == first.first_offset
    assert log.log_end_offset == 3


def test_log_append_time_stamps_each_batch_with_the_broker_clock(open_log: LogOpener) -> None:
    log = open_log(config(**{"message.timestamp.type": "LogAppendTime"}))
    info = log.append_as_leader(produced(Codec.LZ4), leader_epoch=0, now_ms=NOW)
    assert info.log_append_time == NOW
    assert info.max_timestamp == NOW
    (kept,) = consume(log)
    header = validate_batch(kept)  # the CRC was recomputed over the new header
    assert header.is_log_append_time
    assert header.max_timestamp == NOW
    assert header.codec is Codec.LZ4
    assert log.offset_for_timestamp(NOW)[0] == 0  # type: ignore[index]


def test_log_append_time_accepts_any_producer_timestamp(open_log: LogOpener) -> None:
    log = open_log(config(**{"message.timestamp.type": "LogAppendTime"}))
    future = produced(timestamps=[NOW + 5 * HOUR] * 3)
    info = log.append_as_leader(future, leader_epoch=0, now_ms=NOW)
    assert info.log_append_time == NOW


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"message.timestamp.type": "LogAppendTime"},
        {"message.timestamp.type": "LogAppendTime", "compression.type": "lz4"},
        {"compression.type": "zstd"},
        {"message.timestamp.before.max.ms": str(HOUR)},
    ],
    ids=["default", "log-append-time", "log-append-time-recompressing", "recompressing", "past"],
)
def test_a_batch_corrupted_on_the_way_in_is_refused(
    open_log: LogOpener, settings: dict[str, str]
) -> None:
    """Whatever the topic rewrites, a batch whose CRC does not match is never written (a
    LogAppendTime stamp must not give it a fresh, matching CRC)."""
    log = open_log(config(**settings))
    for codec in (Codec.NONE, Codec.LZ4):
        damaged = bytearray(produced(codec))
        damaged[-1] ^= 0xFF
        with pytest.raises(CorruptRecordError, match="CRC mismatch"):
            log.append_as_leader(bytes(damaged), leader_epoch=0, now_ms=NOW)
    assert log.log_end_offset == 0


def test_create_time_topics_report_no_append_time(open_log: LogOpener) -> None:
    info = open_log(config()).append_as_leader(produced(), leader_epoch=0, now_ms=NOW)
    assert info.log_append_time == -1


def late(index: int, timestamp: int, earliest: int = 0) -> RecordError:
    """Kafka's record error for a record whose CreateTime is out of the default bounds."""
    return RecordError(
        index,
        f"Timestamp {timestamp} of message with offset {index} is out of range. The timestamp "
        f"should be within [{earliest}, {NOW + HOUR}]",
    )


KEYLESS = RecordError(0, "Compacted topic cannot accept message without key in topic partition")


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.LZ4], ids=["uncompressed", "lz4"])
@pytest.mark.parametrize("rewrites", [False, True], ids=["default", "recompressing"])
def test_a_timestamp_too_far_in_the_future_is_refused(
    open_log: LogOpener, rewrites: bool, codec: Codec
) -> None:
    settings = {"compression.type": "zstd"} if rewrites else {}
    log = open_log(config(**settings))
    future, further = NOW + HOUR + 1, NOW + 2 * HOUR
    # The batch's max timestamp refuses it; an uncompressed batch's records are then read to
    # name each late one, a compressed one is refused whole, never decompressed for it.
    with pytest.raises(InvalidTimestamp) as refused:
        log.append_as_leader(
            produced(codec, timestamps=[NOW, future, NOW, further]), leader_epoch=0, now_ms=NOW
        )
    if codec is Codec.NONE:
        said = "One or more records have been rejected due to invalid timestamp"
        assert str(refused.value) == said
        assert refused.value.record_errors == (late(1, future), late(3, further))
    else:
        assert str(refused.value).startswith(f"Timestamp {further} of the batch")
        assert refused.value.record_errors == ()
    assert log.log_end_offset == 0
    log.append_as_leader(produced(timestamps=[NOW + HOUR] * 3), leader_epoch=0, now_ms=NOW)
    assert log.log_end_offset == 3


def test_a_max_timestamp_no_record_has_refuses_the_batch_as_a_whole(open_log: LogOpener) -> None:
    """A header claiming a late max timestamp its records do not have: refused by the header,
    with no record to name."""
    lying = bytearray(produced())
    struct.pack_into(">q", lying, 35, NOW + 2 * HOUR)  # max timestamp
    struct.pack_into(">I", lying, 17, google_crc32c.value(bytes(lying[21:])))
    with pytest.raises(
        InvalidTimestamp, match=f"Timestamp {NOW + 2 * HOUR} of the batch"
    ) as refused:
        open_log(config()).append_as_leader(bytes(lying), leader_epoch=0, now_ms=NOW)
    assert refused.value.record_errors == ()


def test_the_future_bound_follows_the_topic_setting(open_log: LogOpener) -> None:
    log = open_log(config(**{"message.timestamp.after.max.ms": "1000"}))
    with pytest.raises(InvalidTimestamp) as refused:
        log.append_as_leader(produced(timestamps=[NOW + 2000] * 3), leader_epoch=0, now_ms=NOW)
    assert [e.batch_index for e in refused.value.record_errors] == [0, 1, 2]
    assert refused.value.record_errors[0].message.endswith(r"within [0, 1700000001000]")


def test_a_timestamp_too_far_in_the_past_is_refused_when_bounded(open_log: LogOpener) -> None:
    old = [NOW, NOW - 10 * HOUR, NOW, NOW - 2 * HOUR]  # the oldest record is not the first
    unbounded = open_log(config())
    unbounded.append_as_leader(produced(timestamps=old), leader_epoch=0, now_ms=NOW)
    assert unbounded.log_end_offset == 4
    bounded = open_log(
        config(**{"message.timestamp.before.max.ms": str(HOUR)}),
        directory=unbounded.directory.parent / "orders-1",
    )
    with pytest.raises(InvalidTimestamp) as refused:
        bounded.append_as_leader(produced(timestamps=old), leader_epoch=0, now_ms=NOW)
    assert refused.value.record_errors == (
        late(1, NOW - 10 * HOUR, NOW - HOUR),
        late(3, NOW - 2 * HOUR, NOW - HOUR),
    )
    assert bounded.log_end_offset == 0


def keyed(keys: list[bytes | None], timestamps: list[int] | None = None, **kw: Any) -> bytes:
    stamps = timestamps or [NOW] * len(keys)
    return build_batch(
        [Record(i, ts, key, b"v") for i, (key, ts) in enumerate(zip(keys, stamps, strict=True))],
        **kw,
    )


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.ZSTD], ids=["uncompressed", "zstd"])
def test_every_keyless_record_on_a_compacted_topic_is_named(
    open_log: LogOpener, codec: Codec
) -> None:
    """Kafka 4.3 answers this batch (3 keyless records of 5) with INVALID_RECORD naming
    indices 1, 2 and 4, and quotes at most three of them in the message."""
    log = open_log(config(**{"cleanup.policy": "compact"}))
    with pytest.raises(InvalidRecord) as refused:
        log.append_as_leader(
            keyed([b"a", None, None, b"d", None], codec=codec), leader_epoch=0, now_ms=NOW
        )
    assert refused.value.record_errors == tuple(KEYLESS._replace(batch_index=i) for i in (1, 2, 4))
    assert str(refused.value) == (
        "One or more records have been rejected due to 3 record errors in total, and only "
        "showing the first three errors at most: ["
        + ", ".join(f"RecordError(batchIndex={i}, message='{KEYLESS.message}')" for i in (1, 2, 4))
        + "]"
    )
    assert log.log_end_offset == 0


def test_four_keyless_records_are_all_named_and_three_quoted(open_log: LogOpener) -> None:
    log = open_log(config(**{"cleanup.policy": "compact"}))
    with pytest.raises(InvalidRecord, match="due to 4 record errors in total") as refused:
        log.append_as_leader(keyed([None] * 4), leader_epoch=0, now_ms=NOW)
    assert [e.batch_index for e in refused.value.record_errors] == [0, 1, 2, 3]
    assert str(refused.value).count("RecordError(") == 3


@pytest.mark.parametrize(
    "settings",
    [{}, {"message.timestamp.before.max.ms": str(HOUR)}],
    ids=["header-refused", "each-record-checked"],
)
def test_keyless_and_late_records_are_named_together(
    open_log: LogOpener, settings: dict[str, str]
) -> None:
    """As Kafka answers it: INVALID_TIMESTAMP once a record is late, every invalid record
    named in batch order, a record both keyless and late named for its key."""
    log = open_log(config(**{"cleanup.policy": "compact", **settings}))
    future = NOW + 2 * HOUR
    sent = keyed([None, b"b", b"c", None], [NOW, NOW, future, future])
    with pytest.raises(InvalidTimestamp) as refused:
        log.append_as_leader(sent, leader_epoch=0, now_ms=NOW)
    earliest = NOW - HOUR if settings else 0
    assert refused.value.record_errors == (
        KEYLESS,
        late(2, future, earliest),
        KEYLESS._replace(batch_index=3),
    )


def test_several_batches_in_one_request_are_each_checked(open_log: LogOpener) -> None:
    log = open_log(config())
    request = batch(2, timestamp=NOW) + batch(2, timestamp=NOW + 2 * HOUR)
    with pytest.raises(InvalidTimestamp):
        log.append_as_leader(request, leader_epoch=0, now_ms=NOW)
    assert log.log_end_offset == 0


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("compression.type", "brotli"),
        ("message.timestamp.type", "WallClock"),
        ("message.timestamp.after.max.ms", "-1"),
    ],
)
def test_invalid_settings_name_the_key(key: str, value: str) -> None:
    with pytest.raises(InvalidConfig, match=key):
        LogConfig.from_properties({key: value})


def test_only_non_default_settings_take_the_rewriting_path() -> None:
    assert not LogConfig().rewrites_batches
    assert not config(**{"message.timestamp.after.max.ms": "5"}).rewrites_batches
    for key, value in [
        ("compression.type", "uncompressed"),
        ("message.timestamp.type", "LogAppendTime"),
        ("message.timestamp.before.max.ms", "100"),
    ]:
        assert config(**{key: value}).rewrites_batches
