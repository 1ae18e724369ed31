"""Recovery after a crash: every complete, valid batch is kept and nothing else — a torn tail,
garbage after the last batch, a corrupt batch and everything after it go; the recovery point
says where scanning starts; the leader-epoch checkpoint follows what is kept."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from broker.protocol import Codec
from broker.storage import LogConfig
from broker.storage.epochs import CHECKPOINT_NAME

from .logs import LogOpener, abandon, batch, consume, fill, headers, offsets_of, records_of

REPO = Path(__file__).resolve().parents[3]
FIRST_LOG = "00000000000000000000.log"


def _three_epochs(open_log: LogOpener) -> tuple[list[bytes], bytes, str]:
    """Three batches of epochs 0, 1, 2 (offsets 0-2, 3-5, 6-8) written by Gregor: the batches,
    the `.log` file and the leader-epoch checkpoint it left."""
    log = open_log(directory=open_log.directory.parent / "source-0")
    log.append_as_leader(batch(3), leader_epoch=0, now_ms=0)
    log.append_as_leader(batch(3, codec=Codec.GZIP), leader_epoch=1, now_ms=0)
    log.append_as_leader(batch(3, value=b"w" * 30), leader_epoch=2, now_ms=0)
    stored = consume(log)
    log.close(now_ms=1)
    return (
        stored,
        (log.directory / FIRST_LOG).read_bytes(),
        (log.directory / CHECKPOINT_NAME).read_text(),
    )


def test_a_torn_tail_at_any_byte_keeps_every_complete_batch_before_it(
    open_log: LogOpener,
) -> None:
    stored, data, checkpoint = _three_epochs(open_log)
    ends = [0, len(stored[0]), len(stored[0]) + len(stored[1]), len(data)]
    for cut in range(len(data) + 1):
        directory = open_log.directory.parent / f"cut{cut}-0"
        directory.mkdir()
        (directory / FIRST_LOG).write_bytes(data[:cut])
        (directory / CHECKPOINT_NAME).write_text(checkpoint)

        log = open_log(directory=directory, clean_shutdown=False)
        complete = max(i for i, end in enumerate(ends) if end <= cut)
        assert log.log_end_offset == 3 * complete, f"cut at byte {cut}"
        assert consume(log) == stored[:complete], f"cut at byte {cut}"
        assert log.recovered_bytes == cut - ends[complete]
        assert (directory / FIRST_LOG).stat().st_size == ends[complete]
        assert log.epochs.entries() == [(0, 0), (1, 3), (2, 6)][:complete]
        abandon(log)  # no fsync needed: the next cut starts afresh


GARBAGE = {
    "zeros": bytes(100),
    "ones": b"\xff" * 100,
    "random": random.Random(7).randbytes(300),
    "a-few-header-bytes": batch(3)[:14],
    "a-valid-batch-going-backwards": batch(3),  # offsets 0-2 again, with a valid CRC
    "a-length-past-the-end": (10**6).to_bytes(8, "big") + (5000).to_bytes(4, "big") + bytes(60),
}


@pytest.mark.parametrize("garbage", GARBAGE.values(), ids=GARBAGE.keys())
def test_garbage_after_the_last_batch_is_cut_and_nothing_else(
    open_log: LogOpener, garbage: bytes
) -> None:
    log = open_log()
    fill(log, 4)
    stored = consume(log)
    abandon(log)
    with open(open_log.directory / FIRST_LOG, "ab") as out:
        out.write(garbage)

    log = open_log(clean_shutdown=False)
    assert log.log_end_offset == 12
    assert consume(log) == stored
    assert log.recovered_bytes == len(garbage)
    log.append_as_leader(batch(1), leader_epoch=0, now_ms=1)
    assert offsets_of(log) == list(range(13))
    log.close(now_ms=2)


@pytest.mark.parametrize("garbage", GARBAGE.values(), ids=GARBAGE.keys())
def test_a_torn_tail_is_cut_even_after_a_clean_shutdown(
    open_log: LogOpener, garbage: bytes
) -> None:
    """A full disk used to leave part of a batch behind while the node still wrote its
    clean-shutdown marker; the next start trusted the marker and counted the torn batch, so the
    log end offset jumped past records that could never be fetched. The tail after the last
    index entry is always checked."""
    log = open_log()
    fill(log, 4)
    stored = consume(log)
    log.close(now_ms=1)
    with open(open_log.directory / FIRST_LOG, "ab") as out:
        out.write(garbage)

    log = open_log(clean_shutdown=True)
    assert log.log_end_offset == 12
    assert consume(log) == stored
    assert (open_log.directory / FIRST_LOG).stat().st_size == sum(len(b) for b in stored)
    log.append_as_leader(batch(1), leader_epoch=0, now_ms=2)
    assert offsets_of(log) == list(range(13))
    log.close(now_ms=3)


# Bytes of a batch to corrupt (see broker.protocol.records for the layout).
CORRUPTIONS = {
    "length": 8,
    "magic": 16,
    "crc": 18,
    "attributes": 22,
    "last-offset-delta": 26,
    "max-timestamp": 40,
    "records-count": 60,
    "record-payload": 70,
    "last-byte": -1,
}


@pytest.mark.parametrize("where", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
@pytest.mark.parametrize("damaged", [0, 2], ids=["first-batch", "third-batch"])
def test_a_corrupt_batch_in_the_active_segment_goes_with_everything_after_it(
    open_log: LogOpener, where: int, damaged: int
) -> None:
    log = open_log()
    fill(log, 5)
    stored = consume(log)
    abandon(log)
    start = sum(len(b) for b in stored[:damaged])
    position = start + where if where >= 0 else start + len(stored[damaged]) + where
    with open(open_log.directory / FIRST_LOG, "r+b") as out:
        out.seek(position)
        byte = out.read(1)[0]
        out.seek(position)
        out.write(bytes([byte ^ 0x10]))

    log = open_log(clean_shutdown=False)
    assert log.log_end_offset == 3 * damaged
    assert consume(log) == stored[:damaged]
    assert (open_log.directory / FIRST_LOG).stat().st_size == start
    log.append_as_leader(batch(1), leader_epoch=0, now_ms=1)
    assert offsets_of(log) == list(range(3 * damaged + 1))
    log.close(now_ms=1)


def test_what_recovery_keeps_is_fsynced_before_it_is_served(
    open_log: LogOpener, fsyncs: list[Path]
) -> None:
    log = open_log()
    fill(log, 3)
    abandon(log)
    with open(open_log.directory / FIRST_LOG, "ab") as out:
        out.write(bytes(30))
    assert fsyncs == []
    log = open_log(clean_shutdown=False)
    assert log.recovered_bytes == 30
    assert open_log.directory / FIRST_LOG in fsyncs
    log.close(now_ms=1)


def _corrupt_middle_of(path: Path, batch_size: int) -> int:
    """Flip a payload byte of the second batch of a segment; return where that batch starts."""
    with open(path, "r+b") as damaged:
        damaged.seek(batch_size + 70)
        byte = damaged.read(1)[0]
        damaged.seek(batch_size + 70)
        damaged.write(bytes([byte ^ 0x01]))
    return batch_size


def test_a_corrupt_batch_past_the_recovery_point_drops_every_later_segment(
    open_log: LogOpener,
) -> None:
    log = open_log()
    for epoch in range(4):
        fill(log, 8, epoch=epoch)
    bases = [segment.base_offset for segment in log.segments]
    assert len(bases) >= 3
    second = log.segments[1]
    batch_size = len(consume(log)[0])
    abandon(log)
    cut_at = _corrupt_middle_of(second.log_path, batch_size)

    log = open_log(clean_shutdown=False, recovery_point=bases[1])
    # The second segment keeps its first batch; it is now the active segment, and last.
    assert [segment.base_offset for segment in log.segments] == bases[:2]
    assert log.log_end_offset == bases[1] + 3
    assert offsets_of(log) == list(range(bases[1] + 3))
    assert second.log_path.stat().st_size == cut_at
    assert [p.name for p in sorted(open_log.directory.glob("*.log"))] == [
        f"{base:020d}.log" for base in bases[:2]
    ]
    for base in bases[2:]:
        assert not list(open_log.directory.glob(f"{base:020d}.*"))
    # Epochs that started in the dropped data are forgotten (each epoch wrote 24 records).
    assert log.epochs.entries() == [(e, 24 * e) for e in range(4) if 24 * e < log.log_end_offset]
    assert len(log.epochs.entries()) < 4
    log.close(now_ms=1)


def test_segments_below_the_recovery_point_are_trusted_the_rest_scanned(
    open_log: LogOpener,
) -> None:
    """As in Kafka: what was fsynced (below the recovery point) is not scanned again."""
    log = open_log()
    fill(log, 30)
    bases = [segment.base_offset for segment in log.segments]
    assert len(bases) >= 3
    end = log.log_end_offset
    batch_size = len(consume(log)[0])
    abandon(log)
    first_log = open_log.directory / FIRST_LOG
    _corrupt_middle_of(first_log, batch_size)
    size = first_log.stat().st_size
    with open(log.active_segment.log_path, "ab") as out:
        out.write(batch(3)[:50])

    trusting = open_log(clean_shutdown=False, recovery_point=bases[1])
    assert trusting.log_end_offset == end
    assert trusting.recovered_bytes == 50
    assert first_log.stat().st_size == size  # not scanned, so not cut
    assert trusting.recovery_point == end
    abandon(trusting)

    scanning = open_log(clean_shutdown=False, recovery_point=0)
    assert scanning.log_end_offset == 3
    assert first_log.stat().st_size == batch_size
    assert len(scanning.segments) == 1
    scanning.close(now_ms=1)


def test_the_leader_epoch_checkpoint_survives_restarts(open_log: LogOpener) -> None:
    log = open_log()
    for epoch in (0, 2, 5):
        fill(log, 2, epoch=epoch)
    log.close(now_ms=1)

    log = open_log()
    assert log.epochs.entries() == [(0, 0), (2, 6), (5, 12)]
    assert log.end_offset_for_epoch(2) == (2, 12)
    abandon(log)

    log = open_log(clean_shutdown=False)
    assert log.epochs.entries() == [(0, 0), (2, 6), (5, 12)]
    assert [h.partition_leader_epoch for h in headers(consume(log))] == [0, 0, 2, 2, 5, 5]
    log.close(now_ms=2)


def test_a_killed_process_loses_no_appended_batch(open_log: LogOpener) -> None:
    """A child process appends and dies without closing anything: its index writes still in
    Python's buffers are lost, the batches (written with pwritev) are not."""
    config = LogConfig(segment_bytes=2048, index_interval_bytes=100)
    script = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from broker.storage import Log, LogConfig
        from tests.unit.storage.logs import batch
        config = LogConfig(segment_bytes=2048, index_interval_bytes=100)
        log = Log(Path({str(open_log.directory)!r}), config, now_ms=0)
        for i in range(25):
            log.append_as_leader(batch(3, value=bytes([i]) * 20), leader_epoch=i // 10, now_ms=0)
        os.pwrite(log.active_segment.fd, batch(3)[:70], log.active_segment.size)
        os._exit(0)
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=REPO)
    files = os.listdir(open_log.directory)
    assert len([name for name in files if name.endswith(".log")]) > 1

    log = open_log(config, clean_shutdown=False)
    assert log.log_end_offset == 75
    assert log.recovered_bytes == 70
    values = [r.value for r in records_of(consume(log))][::3]
    assert values == [bytes([i]) * 20 for i in range(25)]
    assert log.epochs.entries() == [(0, 0), (1, 30), (2, 60)]
    log.close(now_ms=1)


def test_epochs_missing_from_the_checkpoint_are_taken_from_the_batches(
    open_log: LogOpener,
) -> None:
    """A new epoch's checkpoint is written on the flush thread, after the batches of that
    epoch may already be in the file: after a crash, the epochs past the recovery point come
    from the batches, or a follower's divergence would be judged against a history that
    misses them."""
    stored, data, _ = _three_epochs(open_log)
    directory = open_log.directory.parent / "unwritten-0"
    directory.mkdir()
    (directory / FIRST_LOG).write_bytes(data)
    (directory / CHECKPOINT_NAME).write_text("0\n1\n0 0\n")  # epoch 0 only: 1 and 2 not landed

    log = open_log(directory=directory, clean_shutdown=False)
    assert consume(log) == stored
    assert log.epochs.entries() == [(0, 0), (1, 3), (2, 6)]
    assert log.end_offset_for_epoch(1) == (1, 6)
    log.close(now_ms=2)
