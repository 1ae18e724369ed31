"""The log dirs of a broker: locking, clean and unclean restarts, checkpoints, offline
partitions, deferred deletion."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.protocol.records import Record, build_batch
from broker.storage import Log, LogConfig, LogManager, LogOffline, StorageError
from broker.storage.checkpoints import read_offset_checkpoint
from broker.storage.cleaner import CleaningAborted, compact
from broker.storage.files import fsync_dir
from broker.storage.manager import CLEAN_SHUTDOWN_FILE

REPO = Path(__file__).resolve().parents[3]
CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=512, file_delete_delay_ms=1000)


def _batch(n: int = 3, timestamp: int = 1_000) -> bytes:
    return build_batch([Record(i, timestamp, b"key", b"x" * 200) for i in range(n)])


def _crash_after(log_dir: Path, script: str) -> None:
    """Run `script` against a LogManager `manager` in a child process that then dies without
    shutting down: buffers unflushed, locks released by the kernel, as after a SIGKILL."""
    code = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from broker.storage import LogManager\n"
        "from tests.unit.storage.test_manager import CONFIG, _batch\n"
        f"manager = LogManager([Path({str(log_dir)!r})], CONFIG)\n"
        "manager.startup(now_ms=0)\n"
        f"{script}\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def _manager(*dirs: Path) -> LogManager:
    manager = LogManager(list(dirs), CONFIG)
    manager.startup(now_ms=0)
    return manager


def test_a_second_process_cannot_use_a_locked_log_dir(tmp_path: Path) -> None:
    """As in Kafka, a broker refuses to start on a log dir another broker holds."""
    first = _manager(tmp_path)
    second = LogManager([tmp_path], CONFIG)
    with pytest.raises(StorageError, match="in use by another process"):
        second.startup(now_ms=0)
    first.shutdown(now_ms=1)


def test_clean_restart_keeps_every_record_and_consumes_the_marker(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    log = manager.create_log("orders", 0, now_ms=0)
    for _ in range(20):
        log.append_as_leader(_batch(), leader_epoch=0, now_ms=1)
    manager.shutdown(now_ms=2)
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    assert read_offset_checkpoint(tmp_path / "recovery-point-offset-checkpoint") == {
        ("orders", 0): 60
    }

    again = _manager(tmp_path)
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    assert again.get_log("orders", 0).log_end_offset == 60
    again.shutdown(now_ms=3)


def test_unclean_restart_recovers_a_torn_tail(tmp_path: Path) -> None:
    _crash_after(
        tmp_path,
        "log = manager.create_log('orders', 0, now_ms=0)\n"
        "for _ in range(4):\n"
        "    log.append_as_leader(_batch(), leader_epoch=0, now_ms=1)\n"
        # The process dies halfway through writing a fifth batch.
        "with open(log.active_segment.log_path, 'ab') as out:\n"
        "    out.write(_batch()[:100])\n",
    )
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()

    again = _manager(tmp_path)
    recovered = again.get_log("orders", 0)
    assert recovered.log_end_offset == 12
    assert recovered.recovered_bytes == 100
    again.shutdown(now_ms=2)


def test_loading_counts_the_partitions_and_names_the_dirs_it_recovers(tmp_path: Path) -> None:
    """What a node's `/v1/state` reports while it loads: how many logs of how many, and
    which dirs lacked a clean-shutdown marker (their logs' tails are checked)."""
    _crash_after(
        tmp_path,
        "for p in range(3):\n"
        "    manager.create_log('orders', p, now_ms=0).append_as_leader(\n"
        "        _batch(), leader_epoch=0, now_ms=1)\n",
    )
    (tmp_path / "orders-9.0123abcd-delete").mkdir()  # a deleted log, removed, not loaded
    again = _manager(tmp_path)
    assert (again.loading.loaded, again.loading.total) == (3, 3)
    assert again.loading.recovering == (str(tmp_path),)
    again.shutdown(now_ms=2)
    clean = _manager(tmp_path)
    assert (clean.loading.loaded, clean.loading.total, clean.loading.recovering) == (3, 3, ())
    clean.shutdown(now_ms=3)


def test_a_partition_that_cannot_load_is_offline_and_the_rest_serve(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    manager.create_log("good", 0, now_ms=0).append_as_leader(_batch(), leader_epoch=0, now_ms=0)
    manager.create_log("bad", 0, now_ms=0)
    manager.shutdown(now_ms=1)
    (tmp_path / "bad-0" / "leader-epoch-checkpoint").write_text("0\n2\nnot numbers\n")

    again = _manager(tmp_path)
    assert again.get_log("good", 0).log_end_offset == 3
    assert ("bad", 0) in again.offline
    assert "bad-0" in again.offline[("bad", 0)]
    with pytest.raises(LogOffline, match="bad-0 is offline"):
        again.get_log("bad", 0)
    again.shutdown(now_ms=2)


def test_partitions_spread_over_log_dirs_and_reload_from_each(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    manager = _manager(*dirs)
    for partition in range(4):
        manager.create_log("t", partition, now_ms=0)
    assert {manager.log_dir_of("t", p) for p in range(4)} == set(dirs)
    manager.shutdown(now_ms=1)
    again = _manager(*dirs)
    assert sorted(again.logs) == [("t", p) for p in range(4)]
    again.shutdown(now_ms=2)


def test_retention_renames_then_removes_after_the_delete_delay(tmp_path: Path) -> None:
    config = LogConfig(
        segment_bytes=2048, retention_ms=10_000, file_delete_delay_ms=1_000, index_interval_bytes=1
    )
    manager = LogManager([tmp_path], config, retention_check_interval_ms=15_000)
    manager.startup(now_ms=0)
    log = manager.create_log("t", 0, now_ms=0)
    for i in range(12):
        log.append_as_leader(_batch(timestamp=i), leader_epoch=0, now_ms=i)
    segments_before = len(log.segments)
    assert segments_before > 2

    # Past retention.ms, but retention runs every log.retention.check.interval.ms only.
    manager.tick(now_ms=14_999)
    assert len(log.segments) == segments_before
    manager.tick(now_ms=20_000)
    assert len(log.segments) == 1
    deleted = sorted(p.name for p in (tmp_path / "t-0").glob("*.deleted"))
    assert len(deleted) == 3 * (segments_before - 1)
    assert log.log_start_offset == log.active_segment.base_offset

    manager.tick(now_ms=20_999)
    assert list((tmp_path / "t-0").glob("*.deleted"))
    manager.tick(now_ms=21_000)
    assert not list((tmp_path / "t-0").glob("*.deleted"))
    manager.shutdown(now_ms=21_001)


def test_deleted_partition_directory_goes_after_the_delay(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    manager.create_log("gone", 0, now_ms=0).append_as_leader(_batch(), leader_epoch=0, now_ms=0)
    manager.delete_log("gone", 0, now_ms=10)
    assert not (tmp_path / "gone-0").exists()
    [renamed] = [p for p in tmp_path.iterdir() if p.name.endswith("-delete")]
    assert renamed.name.startswith("gone-0.")
    manager.tick(now_ms=10 + CONFIG.file_delete_delay_ms)
    assert not renamed.exists()
    manager.shutdown(now_ms=2_000)


def test_delete_records_is_checkpointed_at_once(tmp_path: Path) -> None:
    _crash_after(
        tmp_path,
        "log = manager.create_log('t', 0, now_ms=0)\n"
        "for _ in range(3):\n"
        "    log.append_as_leader(_batch(), leader_epoch=0, now_ms=0)\n"
        "assert manager.delete_records('t', 0, 4) == 4\n",
    )
    assert read_offset_checkpoint(tmp_path / "log-start-offset-checkpoint") == {("t", 0): 4}
    again = _manager(tmp_path)
    assert again.get_log("t", 0).log_start_offset == 4
    again.shutdown(now_ms=1)


def test_the_cleaner_compacts_the_filthiest_log_and_remembers_where_it_stopped(
    tmp_path: Path,
) -> None:
    compacted = LogConfig(
        segment_bytes=2048,
        cleanup_policy=frozenset({"compact"}),
        min_cleanable_dirty_ratio=0.1,
        file_delete_delay_ms=0,
    )
    manager = LogManager([tmp_path], CONFIG)
    manager.startup(now_ms=0)
    log = manager.create_log("__consumer_offsets", 0, now_ms=0, config=compacted)
    plain = manager.create_log("events", 0, now_ms=0)
    for round_ in range(10):
        for record_key in (b"a", b"b"):
            batch = build_batch([Record(0, 1_000 + round_, record_key, b"v%d" % round_ * 50)])
            log.append_as_leader(batch, leader_epoch=0, now_ms=round_)
            plain.append_as_leader(batch, leader_epoch=0, now_ms=round_)
    before = log.size_in_bytes

    chosen = manager.clean_filthiest(now_ms=100)
    assert chosen is not None
    key, result = chosen
    assert key == ("__consumer_offsets", 0)
    assert log.size_in_bytes < before
    assert result.first_dirty_offset > 0
    manager.tick(now_ms=101)  # removes the retired segments
    assert not list((tmp_path / "__consumer_offsets-0").glob("*.deleted"))
    manager.shutdown(now_ms=102)

    checkpoint = read_offset_checkpoint(tmp_path / "cleaner-offset-checkpoint")
    assert checkpoint == {("__consumer_offsets", 0): result.first_dirty_offset}
    again = LogManager([tmp_path], CONFIG)
    again.startup(now_ms=200, configs={"__consumer_offsets": compacted})
    # Nothing new is dirty: the next round has nothing to do.
    assert again.clean_filthiest(now_ms=201) is None
    again.shutdown(now_ms=202)


# -- compaction rounds, as the node runs them (plan here, compact elsewhere, swap here) -------

COMPACT_DELETE = LogConfig(
    segment_bytes=2048,
    cleanup_policy=frozenset({"compact", "delete"}),
    min_cleanable_dirty_ratio=0.01,
    retention_ms=10_000,
    file_delete_delay_ms=0,
)


def _dirty(
    manager: LogManager, topic: str, batches: int = 12, config: LogConfig = COMPACT_DELETE
) -> Log:
    log = manager.create_log(topic, 0, now_ms=0, config=config)
    for i in range(batches):
        batch = build_batch([Record(0, i, b"k%d" % (i % 2), b"v" * 300)])
        log.append_as_leader(batch, leader_epoch=0, now_ms=i)
    return log


def test_retention_waits_for_a_round_on_the_same_log(tmp_path: Path) -> None:
    """As Kafka's cleaner manager: segments a round is reading are not deleted under it."""
    manager = LogManager([tmp_path], CONFIG, retention_check_interval_ms=1)
    manager.startup(now_ms=0)
    log = _dirty(manager, "compacted")
    round_ = manager.plan_cleaning(now_ms=100)
    assert round_ is not None
    segments = len(log.segments)

    manager.tick(now_ms=60_000)  # far past retention.ms
    assert len(log.segments) == segments
    for directory in manager.swap_cleaned(round_, compact(round_.job), now_ms=60_000):
        fsync_dir(directory)
    manager.end_cleaning(round_)
    manager.tick(now_ms=60_001)
    assert len(log.segments) == 1
    manager.shutdown(now_ms=60_002)


def test_a_partition_that_cannot_be_decoded_is_uncleanable_and_the_others_are_cleaned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manager = _manager(tmp_path)
    broken = _dirty(manager, "broken", batches=30)
    good = _dirty(manager, "good", batches=12)
    first = broken.segments[0]
    with open(first.log_path, "r+b") as damaged:  # the first record's length, past the batch
        damaged.seek(61)
        damaged.write(b"\xfe\x7f")

    assert manager.clean_filthiest(now_ms=100) is None  # broken-0 is the filthiest: it fails
    assert ("broken", 0) in manager.uncleanable
    assert "cannot be compacted" in manager.uncleanable[("broken", 0)]
    assert "broken-0 is uncleanable" in caplog.text
    before = good.size_in_bytes
    chosen = manager.clean_filthiest(now_ms=101)
    assert chosen is not None
    assert chosen[0] == ("good", 0)
    assert good.size_in_bytes < before
    assert manager.clean_filthiest(now_ms=102) is None  # broken-0 is not retried
    assert caplog.text.count("broken-0 is uncleanable") == 1
    # A partition created again under the same name starts cleanable.
    manager.delete_log("broken", 0, now_ms=103)
    assert ("broken", 0) not in manager.uncleanable
    manager.shutdown(now_ms=104)


def test_a_topic_deleted_during_a_round_aborts_it_and_its_directory_waits(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    _dirty(manager, "compacted")
    round_ = manager.plan_cleaning(now_ms=100)
    assert round_ is not None
    compaction = compact(round_.job)
    manager.delete_log("compacted", 0, now_ms=100)
    (deleted,) = tmp_path.glob("compacted-0.*-delete")

    manager.tick(now_ms=200)  # past file.delete.delay.ms, but the round still reads it
    assert deleted.exists()
    with pytest.raises(CleaningAborted):
        list(manager.swap_cleaned(round_, compaction, now_ms=200))
    manager.end_cleaning(round_)
    manager.tick(now_ms=201)
    assert not deleted.exists()
    assert read_offset_checkpoint(tmp_path / "cleaner-offset-checkpoint") == {}
    manager.shutdown(now_ms=202)


# -- rolled segments are fsynced off the caller's thread ---------------------------------------


def _tick_until(manager: LogManager, done: Callable[[], bool], now_ms: int) -> None:
    """Tick (taking in what the flush thread finished) until `done`, for up to 10 s; whether
    it came true is left to the caller's assertions."""
    deadline = time.monotonic() + 10
    while not done() and time.monotonic() < deadline:
        manager.tick(now_ms=now_ms)
        time.sleep(0.01)


def _record_fsyncs(
    monkeypatch: pytest.MonkeyPatch, fail_on_flush_thread: bool = False
) -> list[tuple[str, str]]:
    """Every fsync as (thread name, file name). `fail_on_flush_thread` fakes a disk that fails
    fsync with EIO there: a real one cannot be made to fail on cue here."""
    seen: list[tuple[str, str]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        thread = threading.current_thread().name
        seen.append((thread, Path(os.readlink(f"/proc/self/fd/{fd}")).name))
        if fail_on_flush_thread and thread.startswith("log-flush"):
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def test_a_roll_leaves_the_old_segments_fsync_to_the_flush_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = LogManager([tmp_path], CONFIG, background_flush=True)
    manager.startup(now_ms=0)
    log = manager.create_log("t", 0, now_ms=0)
    log.append_as_leader(_batch(), leader_epoch=0, now_ms=0)
    seen = _record_fsyncs(monkeypatch)

    rolled = log.active_segment.log_path.name
    log.roll(now_ms=1)
    _tick_until(manager, lambda: log.recovery_point > 0, now_ms=2)

    assert log.recovery_point == 3
    assert [thread for thread, name in seen if name == rolled] == ["log-flush_0"]
    manager.shutdown(now_ms=3)


def test_a_failed_background_fsync_takes_the_log_dir_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = LogManager([tmp_path], CONFIG, background_flush=True)
    manager.startup(now_ms=0)
    log = manager.create_log("t", 0, now_ms=0)
    log.append_as_leader(_batch(), leader_epoch=0, now_ms=0)
    _settle(manager, log)  # epoch 0's checkpoint is on disk
    _record_fsyncs(monkeypatch, fail_on_flush_thread=True)

    log.roll(now_ms=1)
    _tick_until(manager, lambda: ("t", 0) in manager.offline, now_ms=2)

    assert "fsync of a rolled segment" in manager.offline[("t", 0)]
    assert tmp_path in manager.offline_dirs
    assert log.recovery_point == 0
    manager.shutdown(now_ms=3)
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()


def _retained_log(tmp_path: Path) -> tuple[LogManager, Log]:
    """A log of six segments of 2 batches over a retention of three, checked every 50 ms."""
    config = LogConfig(segment_bytes=600, retention_bytes=1800, file_delete_delay_ms=0)
    manager = LogManager([tmp_path], config, background_flush=True, retention_check_interval_ms=50)
    manager.startup(now_ms=0)
    log = manager.create_log("t", 0, now_ms=0)
    for n in range(12):
        log.append_as_leader(_batch(1), leader_epoch=0, now_ms=n)
    return manager, log


def _epoch_checkpoint(log: Log) -> list[str]:
    return (log.directory / "leader-epoch-checkpoint").read_text().split("\n")[2:-1]


def _settle(manager: LogManager, log: Log) -> None:
    """Wait for everything queued on the flush thread so far (it runs in order), then let a
    tick take the finished writes in."""
    assert log.flusher is not None
    log.flusher.submit(lambda: None).result(timeout=10)
    manager.tick(now_ms=90)


def test_retention_writes_the_leader_epoch_checkpoint_on_the_flush_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention moves the log start once per deleted segment: the leader-epoch checkpoint it
    rewrites is fsynced on the flush thread, not on the caller's (the event loop)."""
    manager, log = _retained_log(tmp_path)
    try:
        seen = _record_fsyncs(monkeypatch)
        manager.tick(now_ms=100)
        start = log.log_start_offset
        assert start > 0
        _settle(manager, log)
        # Once, or once more when the flush thread finished the first write before retention
        # asked again (as it does on a fast disk): never on the caller's thread.
        threads = [t for t, name in seen if name.startswith("leader-epoch")]
        assert set(threads) == {"log-flush_0"}, threads
        assert _epoch_checkpoint(log) == [f"0 {start}"]
    finally:
        manager.shutdown(now_ms=104)


def test_retention_removes_producer_snapshots_on_the_deletion_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The producer snapshots below the new log start go with their segments, unlinked on the
    deletion thread: under a produce flood an unlink on the event loop waited 60 ms and more
    for the disk's journal. Those at or above the log start stay."""
    manager, log = _retained_log(tmp_path)
    removed: list[tuple[str, str]] = []
    unlink = Path.unlink

    def spy(path: Path, missing_ok: bool = False) -> None:
        if path.suffix == ".snapshot":
            removed.append((threading.current_thread().name, path.name))
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", spy)
    manager.tick(now_ms=100)
    start = log.log_start_offset
    assert start > 0

    def below_start() -> list[str]:
        return [p.name for p in log.directory.glob("*.snapshot") if int(p.stem) < start]

    _tick_until(manager, lambda: not below_start(), now_ms=101)
    assert not below_start()
    assert removed
    assert {thread for thread, _ in removed} == {"log-delete_0"}
    assert any(int(p.stem) >= start for p in log.directory.glob("*.snapshot"))
    manager.shutdown(now_ms=104)


def test_a_queued_epoch_checkpoint_never_overwrites_a_newer_one(tmp_path: Path) -> None:
    """Retention's checkpoint waits on the flush thread (held here behind a gate) while a new
    leader epoch is written at once: the older write, landing last, must not undo it."""
    manager, log = _retained_log(tmp_path)
    assert log.flusher is not None
    gate = threading.Event()
    log.flusher.submit(gate.wait)
    manager.tick(now_ms=100)  # retention's checkpoint: queued behind the gate
    start = log.log_start_offset
    log.append_as_leader(_batch(1), leader_epoch=1, now_ms=101)  # written at once
    gate.set()
    _settle(manager, log)
    assert _epoch_checkpoint(log) == [f"0 {start}", "1 12"]
    manager.shutdown(now_ms=104)


def test_flush_messages_fsyncs_on_the_flush_thread_and_says_when_it_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`flush.messages=1`: each append's fsync runs on the flush thread, not the caller's (the
    event loop), and `flushing` is the future a produce waits on before it is answered; the
    recovery point moves once it is done."""
    manager = LogManager([tmp_path], LogConfig(flush_messages=1), background_flush=True)
    manager.startup(now_ms=0)
    log = manager.create_log("t", 0, now_ms=0)
    seen = _record_fsyncs(monkeypatch)
    log.append_as_leader(_batch(3), leader_epoch=0, now_ms=1)
    flushing = log.flushing
    assert flushing is not None
    flushing.result(timeout=10)
    assert {t for t, name in seen if name.endswith(".log")} == {"log-flush_0"}
    manager.tick(now_ms=2)
    assert log.recovery_point == 3
    manager.shutdown(now_ms=3)


def test_periodic_checkpoints_are_written_on_the_flush_thread_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = LogManager([tmp_path], CONFIG, background_flush=True, checkpoint_interval_ms=10)
    manager.startup(now_ms=0)
    log = manager.create_log("t", 0, now_ms=0)
    seen = _record_fsyncs(monkeypatch)

    for i in range(3):
        log.append_as_leader(_batch(), leader_epoch=0, now_ms=i)
        log.flush(now_ms=i)
        manager.tick(now_ms=100 * (i + 1))  # each tick queues a checkpoint of the new point
    manager.delete_records("t", 0, 2)  # answered once its checkpoint is on disk

    dir_checkpoints = ("recovery-point", "log-start", "cleaner")
    checkpoint_fsyncs = [t for t, name in seen if name.startswith(dir_checkpoints)]
    assert checkpoint_fsyncs
    assert set(checkpoint_fsyncs) == {"log-flush_0"}
    assert read_offset_checkpoint(tmp_path / "log-start-offset-checkpoint") == {("t", 0): 2}
    assert read_offset_checkpoint(tmp_path / "recovery-point-offset-checkpoint") == {("t", 0): 9}
    manager.shutdown(now_ms=1_000)


def test_a_new_leader_epoch_is_written_on_the_flush_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader election writes the partition's leader-epoch checkpoint: its fsyncs run on
    the flush thread, not on the caller's (the event loop, which a controlled shutdown moving
    thousands of leaders held for seconds)."""
    manager = LogManager([tmp_path], CONFIG, background_flush=True)
    manager.startup(now_ms=0)
    log = manager.create_log("t", 0, now_ms=0)
    log.append_as_leader(_batch(2), leader_epoch=0, now_ms=1)
    _settle(manager, log)
    seen = _record_fsyncs(monkeypatch)
    log.epochs.assign(1, log.log_end_offset)
    assert not [name for _, name in seen if name.startswith("leader-epoch")]
    _settle(manager, log)
    assert [t for t, name in seen if name.startswith("leader-epoch")] == ["log-flush_0"]
    assert _epoch_checkpoint(log) == ["0 0", "1 2"]
    manager.shutdown(now_ms=104)


def test_a_checkpoint_that_failed_at_shutdown_leaves_no_clean_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last leader-epoch checkpoint fails on the flush thread as the node stops (a disk
    that fails fsync with EIO, faked): the log dir is not marked clean, so the next start
    recovers it and takes the epoch from the batches."""
    manager = LogManager([tmp_path], CONFIG, background_flush=True)
    manager.startup(now_ms=0)
    log = manager.create_log("t", 0, now_ms=0)
    log.append_as_leader(_batch(), leader_epoch=0, now_ms=0)
    _settle(manager, log)
    _record_fsyncs(monkeypatch, fail_on_flush_thread=True)
    log.epochs.assign(1, log.log_end_offset)
    manager.shutdown(now_ms=3)
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
