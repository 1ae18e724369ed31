"""Idempotent producers, as a leader sees them: a retry of one of the last five batches is not
written again and gets its original offsets; a gap, a retry older than that, or a new epoch not
starting at 0 is OUT_OF_ORDER_SEQUENCE_NUMBER; an older epoch is INVALID_PRODUCER_EPOCH;
sequences wrap at 2^31-1; followers record without checking; truncation and expiration rewind
or drop the state."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.protocol.records import Record, build_batch
from broker.storage import (
    InvalidProducerEpoch,
    Log,
    LogConfig,
    LogManager,
    OutOfOrderSequence,
)

from .logs import LogOpener, batch, offsets_of

PID = 4000
MAX_SEQUENCE = 2**31 - 1
ROOMY = LogConfig(segment_bytes=1 << 20, index_interval_bytes=128)
"""Large enough that these tests never roll a segment."""


def produced(
    sequence: int,
    count: int = 3,
    *,
    producer_id: int = PID,
    epoch: int = 0,
    timestamp: int = 1_000,
    offset: int = 0,
) -> bytes:
    """A batch from an idempotent producer: `count` records from `sequence` on."""
    return build_batch(
        [Record(offset + i, timestamp, f"k{i}".encode(), b"v" * 20) for i in range(count)],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
    )


def lead(log: Log, data: bytes, now_ms: int = 0) -> tuple[int, int, bool]:
    """Append as leader; (first offset, last offset, duplicate) as the produce response uses."""
    info = log.append_as_leader(data, leader_epoch=0, now_ms=now_ms)
    return info.first_offset, info.last_offset, info.duplicate


def five_batches(log: Log) -> list[bytes]:
    """Sequences 0-2, 3-5, …, 12-14 at offsets 0-14, each batch with its own timestamp."""
    sent = [produced(3 * i, timestamp=1_000 + i) for i in range(5)]
    for i, data in enumerate(sent):
        assert lead(log, data) == (3 * i, 3 * i + 2, False)
    return sent


@pytest.mark.parametrize("back", [1, 2, 3, 4, 5])
def test_a_retry_of_any_of_the_last_five_batches_gets_its_original_offsets(
    open_log: LogOpener, back: int
) -> None:
    log = open_log(ROOMY)
    sent = five_batches(log)
    original = 5 - back
    info = log.append_as_leader(sent[original], leader_epoch=0, now_ms=5)
    assert (info.first_offset, info.last_offset) == (3 * original, 3 * original + 2)
    assert info.duplicate
    assert info.record_count == 0
    assert info.max_timestamp == 1_000 + original
    assert log.log_end_offset == 15
    assert offsets_of(log) == list(range(15)), "a consumer sees every record once"


def test_a_retry_older_than_the_last_five_batches_is_out_of_order(open_log: LogOpener) -> None:
    log = open_log(ROOMY)
    sent = five_batches(log)
    lead(log, produced(15))
    with pytest.raises(OutOfOrderSequence) as refused:
        lead(log, sent[0])
    assert refused.value.producer_id == PID
    assert log.log_end_offset == 18
    assert offsets_of(log) == list(range(18))


def test_a_gap_is_out_of_order_and_the_missing_batch_is_still_welcome(
    open_log: LogOpener,
) -> None:
    log = open_log(ROOMY)
    lead(log, produced(0))
    with pytest.raises(OutOfOrderSequence, match="last sequence is 2"):
        lead(log, produced(6))
    with pytest.raises(OutOfOrderSequence):
        lead(log, produced(1, 2))  # overlaps the last batch without being it
    assert log.log_end_offset == 3
    assert lead(log, produced(3)) == (3, 5, False)
    assert lead(log, produced(6)) == (6, 8, False)


def test_an_older_epoch_is_fenced_even_for_a_retry(open_log: LogOpener) -> None:
    log = open_log(ROOMY)
    first = produced(0, epoch=0)
    lead(log, first)
    lead(log, produced(0, epoch=1))
    with pytest.raises(InvalidProducerEpoch) as fenced:
        lead(log, first)
    assert fenced.value.offset == 6
    with pytest.raises(InvalidProducerEpoch):
        lead(log, produced(3, epoch=0))
    assert log.log_end_offset == 6


def test_a_new_epoch_starts_at_sequence_zero(open_log: LogOpener) -> None:
    log = open_log(ROOMY)
    lead(log, produced(0, epoch=0))
    lead(log, produced(3, epoch=0))
    with pytest.raises(OutOfOrderSequence, match="not 0"):
        lead(log, produced(6, epoch=1))
    assert lead(log, produced(0, epoch=1)) == (6, 8, False)
    assert lead(log, produced(3, epoch=1)) == (9, 11, False)
    assert lead(log, produced(0, epoch=1)) == (6, 8, True), "retries within the new epoch"


def test_sequences_wrap_from_the_largest_int32_to_zero(open_log: LogOpener) -> None:
    log = open_log(ROOMY)
    lead(log, produced(MAX_SEQUENCE - 2))  # last sequence 2^31-1
    assert lead(log, produced(0, 2)) == (3, 4, False)
    with pytest.raises(OutOfOrderSequence):
        lead(log, produced(MAX_SEQUENCE, 1))  # back across the wrap
    # A batch can straddle the wrap: 2^31-2, 2^31-1, 0.
    other = PID + 1
    lead(log, produced(MAX_SEQUENCE - 1, producer_id=other))
    assert lead(log, produced(1, producer_id=other)) == (8, 10, False)
    assert lead(log, produced(MAX_SEQUENCE - 1, producer_id=other)) == (5, 7, True)


def test_a_producer_this_partition_does_not_know_may_start_anywhere(open_log: LogOpener) -> None:
    """Kafka since 2.5 (KIP-360): no state for a producer id (new, expired, or its batches
    deleted by retention) means its first batch may carry any sequence; the next must follow."""
    log = open_log(ROOMY)
    assert lead(log, produced(42)) == (0, 2, False)
    with pytest.raises(OutOfOrderSequence):
        lead(log, produced(0))
    assert lead(log, produced(45)) == (3, 5, False)


def test_producers_are_checked_separately(open_log: LogOpener) -> None:
    log = open_log(ROOMY)
    a, b = produced(0, producer_id=1), produced(0, producer_id=2)
    assert lead(log, a) == (0, 2, False)
    assert lead(log, b) == (3, 5, False)
    assert lead(log, produced(3, producer_id=1)) == (6, 8, False)
    assert lead(log, b) == (3, 5, True)
    assert lead(log, a) == (0, 2, True)


def test_batches_without_a_producer_id_are_written_every_time(open_log: LogOpener) -> None:
    log = open_log(ROOMY)
    data = batch(3)
    assert lead(log, data) == (0, 2, False)
    assert lead(log, data) == (3, 5, False)
    assert log.producer_state.producers == {}


def test_several_batches_in_one_append_are_checked_in_order(open_log: LogOpener) -> None:
    log = open_log(ROOMY)
    lead(log, produced(0) + produced(3))
    assert offsets_of(log) == list(range(6))
    # A request holding a retry is answered with the retried batch and writes nothing.
    assert lead(log, produced(6) + produced(3)) == (3, 5, True)
    assert log.log_end_offset == 6
    # A gap between two batches of the request refuses all of it.
    with pytest.raises(OutOfOrderSequence):
        lead(log, produced(6) + produced(10))
    assert log.log_end_offset == 6
    assert lead(log, produced(6) + produced(9)) == (6, 11, False)


def test_a_follower_records_what_its_leader_wrote_without_checking(open_log: LogOpener) -> None:
    log = open_log(ROOMY)
    replicated = [
        produced(0, epoch=2, offset=0),
        produced(10, epoch=2, offset=3),  # a gap: the leader's state said otherwise
        produced(0, epoch=1, offset=6),  # an older epoch
        produced(0, epoch=2, producer_id=7, offset=9),
    ]
    for data in replicated:
        log.append_as_follower(data, now_ms=0)
    assert log.log_end_offset == 12
    # Promoted to leader, it answers retries and checks sequences from what it replicated.
    assert lead(log, replicated[2]) == (6, 8, True)
    with pytest.raises(InvalidProducerEpoch):
        lead(log, produced(3, epoch=0))
    assert lead(log, produced(3, epoch=1)) == (12, 14, False)


def test_truncation_rewinds_producer_state(open_log: LogOpener) -> None:
    log = open_log(ROOMY)
    sent = five_batches(log)
    log.truncate_to(9)
    assert log.log_end_offset == 9
    assert lead(log, sent[2]) == (6, 8, True), "still in the log"
    with pytest.raises(OutOfOrderSequence):
        lead(log, sent[4])
    assert lead(log, sent[3]) == (9, 11, False), "written again: the truncation removed it"


def test_truncation_below_a_snapshot_replays_from_an_older_one(open_log: LogOpener) -> None:
    log = open_log()  # small segments: a snapshot at every roll
    sent = [produced(3 * i) for i in range(30)]
    for data in sent:
        lead(log, data)
    assert len(log.segments) >= 4
    target = log.segments[-2].base_offset + 3
    log.truncate_to(target)
    assert all(offset <= target for offset in log.producer_state.snapshot_offsets)
    kept = log.log_end_offset // 3
    assert lead(log, sent[kept - 1]) == (3 * kept - 3, 3 * kept - 1, True)
    assert lead(log, sent[kept]) == (3 * kept, 3 * kept + 2, False)


def test_truncating_fully_forgets_every_producer(open_log: LogOpener) -> None:
    log = open_log()
    for i in range(20):
        lead(log, produced(3 * i))
    assert log.producer_state.snapshot_offsets
    log.truncate_fully_and_start_at(500, now_ms=0)
    assert log.producer_state.snapshot_offsets == []
    assert not list(log.directory.glob("*.snapshot"))
    assert lead(log, produced(1234)) == (500, 502, False)


def test_idle_producers_expire(open_log: LogOpener) -> None:
    log = open_log(ROOMY)
    lead(log, produced(0, producer_id=1, timestamp=1_000))
    lead(log, produced(0, producer_id=2, timestamp=5_000))
    expiration = log.producer_id_expiration_ms
    assert log.remove_expired_producers(1_000 + expiration - 1) == []
    assert log.remove_expired_producers(1_000 + expiration) == [1]
    # Forgotten, producer 1 may start again anywhere; producer 2 is still checked.
    assert lead(log, produced(77, producer_id=1)) == (6, 8, False)
    with pytest.raises(OutOfOrderSequence):
        lead(log, produced(77, producer_id=2))


def test_the_log_manager_expires_producers_from_its_tick(tmp_path: Path) -> None:
    manager = LogManager(
        [tmp_path],
        ROOMY,
        producer_id_expiration_ms=60_000,
        producer_id_expiration_check_interval_ms=10_000,
    )
    manager.startup(now_ms=0)
    log = manager.create_log("orders", 0, now_ms=0)
    lead(log, produced(0, timestamp=0))
    manager.tick(now_ms=9_999)  # before the check interval: nothing is looked at
    manager.tick(now_ms=60_000 - 1)  # checked, not yet idle long enough
    lead(log, produced(3, timestamp=0))
    manager.tick(now_ms=65_000)  # the check interval has not passed since the last check
    with pytest.raises(OutOfOrderSequence):
        lead(log, produced(50))
    manager.tick(now_ms=70_000)
    assert lead(log, produced(50)) == (6, 8, False)
    manager.shutdown(now_ms=70_000)
