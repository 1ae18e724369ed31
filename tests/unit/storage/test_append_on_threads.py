"""An append whose write runs on another thread (`Log.start_append`, `PendingAppend`): it stores
exactly what the one-step append stores, nothing is readable before it is taken in, no other
append can slip in meanwhile, a write the disk cuts short leaves no torn batch, and a log
closed under it (topic deleted, log dir failed) is never written through a reused descriptor."""

from __future__ import annotations

import os
import resource
import struct
import threading

import google_crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.protocol import Codec
from broker.protocol.records import BATCH_HEADER_SIZE
from broker.storage import (
    AppendInfo,
    CorruptRecordError,
    InvalidTimestamp,
    LogConfig,
    LogDirFailure,
    LogOffline,
    PendingAppend,
    RecordTooLarge,
)

from .logs import LogOpener, batch, consume, offsets_of
from .test_disk_full import file_size_limit

ROOMY = LogConfig(segment_bytes=4096, index_interval_bytes=128)


def _on_a_thread(pending: PendingAppend) -> AppendInfo:
    writer = threading.Thread(target=pending.write)
    writer.start()
    writer.join()
    return pending.finish()


@settings(max_examples=30, deadline=None)
@given(split=st.lists(st.booleans(), min_size=14, max_size=30))
def test_two_step_appends_store_what_one_step_appends_store(
    tmp_path_factory: pytest.TempPathFactory, split: list[bool]
) -> None:
    """The same producer batches appended in one step or two (in any mix, across rolls) give
    the same offsets, the same AppendInfo and the same bytes to a consumer."""
    root = tmp_path_factory.mktemp("two-step")
    one_step, two_step = LogOpener(root / "a"), LogOpener(root / "b")
    plain, threaded = one_step(ROOMY), two_step(ROOMY)
    try:
        for number, on_thread in enumerate(split):
            records = batch(2, timestamp=1_000 + number, value=bytes([number]) * 150)
            expected = plain.append_as_leader(records, leader_epoch=3, now_ms=number)
            if on_thread:
                started = threaded.start_append(records, leader_epoch=3, now_ms=number)
                assert isinstance(started, PendingAppend)
                got = _on_a_thread(started)
            else:
                got = threaded.append_as_leader(records, leader_epoch=3, now_ms=number)
            assert got == expected
        assert consume(threaded) == consume(plain)
        assert len(threaded.segments) == len(plain.segments) > 1
    finally:
        one_step.close_leftovers()
        two_step.close_leftovers()


def test_nothing_is_readable_and_no_append_starts_until_the_write_is_taken_in(
    open_log: LogOpener,
) -> None:
    log = open_log(ROOMY)
    log.append_as_leader(batch(1), leader_epoch=0, now_ms=0)
    pending = log.start_append(batch(4), leader_epoch=0, now_ms=1)
    assert isinstance(pending, PendingAppend)
    busy = log.appending
    assert busy
    with pytest.raises(RuntimeError, match="already under way"):
        log.append_as_leader(batch(1), leader_epoch=0, now_ms=1)
    with pytest.raises(RuntimeError, match="already under way"):
        log.start_append(batch(1), leader_epoch=0, now_ms=1)
    pending.write()
    assert log.log_end_offset == 1  # written, not yet taken in: consumers do not see it
    assert offsets_of(log) == [0]
    info = pending.finish()
    assert (info.first_offset, info.last_offset) == (1, 4)
    assert not log.appending
    assert offsets_of(log) == [0, 1, 2, 3, 4]


def test_a_short_write_on_the_thread_leaves_no_torn_batch(open_log: LogOpener) -> None:
    log = open_log(ROOMY)
    log.append_as_leader(batch(2), leader_epoch=0, now_ms=0)
    stored = consume(log)
    size = log.active_segment.size
    pending = log.start_append(batch(3, value=b"x" * 400), leader_epoch=0, now_ms=1)
    assert isinstance(pending, PendingAppend)
    with file_size_limit(size + 100):
        pending.write()
    with pytest.raises(LogDirFailure, match=r"short write|too large"):
        pending.finish()
    assert os.path.getsize(log.active_segment.log_path) == size
    assert consume(log) == stored
    assert log.log_end_offset == 2


def test_a_log_closed_during_the_write_is_not_written_through_a_reused_descriptor(
    open_log: LogOpener, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The topic is deleted (its segments closed) while the batch is on its way: the write
    goes to the deleted file through the append's own descriptor, never to whatever file the
    kernel handed the segment's old descriptor number to, and taking it in fails."""
    log = open_log(ROOMY)
    log.append_as_leader(batch(1), leader_epoch=0, now_ms=0)
    pending = log.start_append(batch(3, value=b"y" * 300), leader_epoch=0, now_ms=1)
    assert isinstance(pending, PendingAppend)
    old_fd = log.active_segment.fd
    for segment in log.segments:
        segment.close()
    bystander = tmp_path_factory.mktemp("other") / "bystander"
    fd = os.open(bystander, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        assert fd == old_fd  # the lowest free number: the segment's old one
        pending.write()
        assert os.fstat(fd).st_size == 0
    finally:
        os.close(fd)
    with pytest.raises(LogOffline, match="closed while a batch was being written"):
        pending.finish()
    assert not log.appending


def _corrupt_zstd_batch_signed(timestamp: int) -> bytes:
    """A zstd batch whose compressed records are garbage but whose CRC is right for them: only
    decompressing it shows it is corrupt."""
    data = bytearray(batch(50, timestamp=timestamp, codec=Codec.ZSTD))
    data[BATCH_HEADER_SIZE + 8] ^= 0xFF
    struct.pack_into(">I", data, 17, google_crc32c.value(bytes(data[21:])))
    return bytes(data)


@pytest.mark.parametrize("on_thread", [False, True], ids=["one-step", "two-step"])
def test_a_future_batch_is_refused_from_its_header_before_it_is_decompressed(
    open_log: LogOpener, on_thread: bool
) -> None:
    """The header's max timestamp is checked before the record walk decompresses anything: a
    batch two hours ahead is INVALID_TIMESTAMP even when its records would not decompress (a
    few hundred bytes of zstd can take seconds to decompress and walk)."""
    log = open_log(ROOMY)
    now = 1_700_000_000_000
    future = _corrupt_zstd_batch_signed(now + 2 * 3600 * 1000)

    def refused() -> None:
        if on_thread:
            log.precheck(future, now)
        else:
            log.append_as_leader(future, leader_epoch=0, now_ms=now)

    with pytest.raises(InvalidTimestamp, match="out of range"):
        refused()
    with pytest.raises(CorruptRecordError):
        log.precheck(_corrupt_zstd_batch_signed(now), now)
    assert log.log_end_offset == 0


def test_an_oversized_batch_is_refused_before_it_is_read_through(open_log: LogOpener) -> None:
    """Sizes first, as Kafka's validation: a batch over `max.message.bytes` is too large
    whatever its CRC and records (corrupt ones here), on both paths."""
    log = open_log(LogConfig(segment_bytes=1 << 20, max_message_bytes=200))
    oversized = _corrupt_zstd_batch_signed(1_700_000_000_000)
    assert len(oversized) > 200
    with pytest.raises(RecordTooLarge):
        log.precheck(oversized, 1_700_000_000_000)
    with pytest.raises(RecordTooLarge):
        log.append_as_leader(oversized, leader_epoch=0, now_ms=1_700_000_000_000)


def test_without_a_descriptor_to_spare_the_write_happens_at_once(open_log: LogOpener) -> None:
    """Out of descriptors (the process's limit lowered to the lowest free one, a real EMFILE):
    the write cannot get a descriptor of its own for its thread, so it happens in the caller's
    thread as a one-step append does, instead of calling the disk failed."""
    log = open_log(ROOMY)
    log.append_as_leader(batch(1), leader_epoch=0, now_ms=0)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = next(fd for fd in range(soft) if not os.path.exists(f"/proc/self/fd/{fd}"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
    try:
        started = log.start_append(batch(2), leader_epoch=0, now_ms=1)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert isinstance(started, AppendInfo), started
    assert (started.first_offset, started.last_offset) == (1, 2)
    assert not log.appending
    assert offsets_of(log) == [0, 1, 2]
