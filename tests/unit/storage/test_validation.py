"""What the leader does to batches on their way into the log, by topic config: recompression to
`compression.type`, LogAppendTime stamps, and the CreateTime bounds."""

from __future__ import annotations

import pytest

from broker.protocol import Codec
from broker.protocol.records import Record, build_batch, validate_batch
from broker.storage import CorruptRecordError, InvalidTimestamp, LogConfig
from broker.storage.config import InvalidConfig

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


@pytest.mark.parametrize("rewrites", [False, True], ids=["default", "recompressing"])
def test_a_timestamp_too_far_in_the_future_is_refused(open_log: LogOpener, rewrites: bool) -> None:
    settings = {"compression.type": "zstd"} if rewrites else {}
    log = open_log(config(**settings))
    future = NOW + HOUR + 1
    # Judged on the batch's max timestamp: no record is decompressed to find the late one.
    with pytest.raises(InvalidTimestamp, match=f"Timestamp {future} of the batch"):
        log.append_as_leader(produced(timestamps=[NOW, future, NOW]), leader_epoch=0, now_ms=NOW)
    assert log.log_end_offset == 0
    log.append_as_leader(produced(timestamps=[NOW + HOUR] * 3), leader_epoch=0, now_ms=NOW)
    assert log.log_end_offset == 3


def test_the_future_bound_follows_the_topic_setting(open_log: LogOpener) -> None:
    log = open_log(config(**{"message.timestamp.after.max.ms": "1000"}))
    with pytest.raises(InvalidTimestamp, match=r"within \[0, 1700000001000\]"):
        log.append_as_leader(produced(timestamps=[NOW + 2000] * 3), leader_epoch=0, now_ms=NOW)


def test_a_timestamp_too_far_in_the_past_is_refused_when_bounded(open_log: LogOpener) -> None:
    old = [NOW, NOW - 10 * HOUR, NOW]  # the oldest record is not the batch's first
    unbounded = open_log(config())
    unbounded.append_as_leader(produced(timestamps=old), leader_epoch=0, now_ms=NOW)
    assert unbounded.log_end_offset == 3
    bounded = open_log(
        config(**{"message.timestamp.before.max.ms": str(HOUR)}),
        directory=unbounded.directory.parent / "orders-1",
    )
    with pytest.raises(InvalidTimestamp, match="of message with offset 1 is out of range"):
        bounded.append_as_leader(produced(timestamps=old), leader_epoch=0, now_ms=NOW)
    assert bounded.log_end_offset == 0


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
