"""The log cleaner's driver: rounds compacted in a worker process of its own, so that the event
loop serving clients never decodes a record for compaction; a worker that dies is replaced,
and one that dies twice on the same partition makes it uncleanable."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.compaction import CleanerDied, CleanerWorker, run_cleaner
from broker.protocol.records import Record, build_batch
from broker.storage import CorruptRecordError, Log, LogConfig, LogManager
from broker.storage.cleaner import compact, plan_clean

COMPACTED = LogConfig(
    segment_bytes=64 * 1024,
    cleanup_policy=frozenset({"compact"}),
    min_cleanable_dirty_ratio=0.01,
    file_delete_delay_ms=0,
)


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[LogManager]:
    logs = LogManager([tmp_path], COMPACTED)
    logs.startup(now_ms=0)
    yield logs
    logs.shutdown(now_ms=0)


def _fill(manager: LogManager, topic: str, records: int, keys: int = 10) -> Log:
    log = manager.create_log(topic, 0, now_ms=0)
    for start in range(0, records, 100):
        batch = build_batch(
            [Record(i, 1_000, b"k%d" % ((start + i) % keys), b"v" * 200) for i in range(100)]
        )
        log.append_as_leader(batch, leader_epoch=0, now_ms=0)
    return log


def test_a_round_is_compacted_in_another_process_with_the_same_result(
    manager: LogManager,
) -> None:
    log = _fill(manager, "compacted", 2_000)
    job = plan_clean(log, None, 0)
    worker = CleanerWorker()
    try:
        elsewhere = asyncio.run(worker.compact(job))
        assert worker.pid is not None
        assert worker.pid != os.getpid()
    finally:
        worker.close()
    for group in elsewhere.groups:  # what the worker wrote, removed to compact again here
        for cleaned in log.directory.glob(f"{group.base_offsets[0]:020d}.*.cleaned"):
            cleaned.unlink()

    assert elsewhere == compact(job)
    assert elsewhere.records_removed > 1_700  # all but the active segment's and the latest


def test_the_workers_error_comes_back_and_the_worker_serves_on(manager: LogManager) -> None:
    log = _fill(manager, "broken", 2_000)
    with open(log.segments[0].log_path, "r+b") as damaged:
        damaged.seek(61)  # the first record's length, now past the batch's end
        damaged.write(b"\xfe\x7f")
    good = _fill(manager, "good", 2_000)
    worker = CleanerWorker()

    async def both() -> None:
        with pytest.raises(CorruptRecordError, match=r"broken-0.*cannot be compacted"):
            await worker.compact(plan_clean(log, None, 0))
        pid = worker.pid
        assert (await worker.compact(plan_clean(good, None, 0))).records_removed > 0
        assert worker.pid == pid

    try:
        asyncio.run(both())
    finally:
        worker.close()


def test_a_worker_killed_mid_round_is_reported_and_replaced(manager: LogManager) -> None:
    log = _fill(manager, "compacted", 20_000, keys=20_000)
    job = plan_clean(log, None, 0)
    worker = CleanerWorker()

    async def kill_then_again() -> None:
        round_ = asyncio.ensure_future(worker.compact(job))
        while worker.pid is None:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # started and busy (or still starting: either way, killed)
        killed = worker.pid
        os.kill(killed, signal.SIGKILL)
        with pytest.raises(CleanerDied, match="exit code -9"):
            await round_
        for leftover in log.directory.glob("*.cleaned"):  # as the next load would
            leftover.unlink()
        assert (await worker.compact(job)).groups
        assert worker.pid not in (None, killed)

    try:
        asyncio.run(kill_then_again())
    finally:
        worker.close()


def test_the_cleaner_task_cleans_and_kills_its_worker_when_cancelled(
    manager: LogManager,
) -> None:
    log = _fill(manager, "compacted", 2_000)
    worker = CleanerWorker()

    def closed_bytes() -> int:
        return log.size_in_bytes - log.active_segment.size

    before = closed_bytes()

    async def clean_then_stop() -> None:
        task = asyncio.ensure_future(
            run_cleaner(manager, lambda: 0, dict, backoff_ms=10, worker=worker)
        )
        deadline = time.monotonic() + 30
        while closed_bytes() >= before / 10 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        pid = worker.pid
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert pid is not None
        assert worker.pid is None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

    asyncio.run(clean_then_stop())
    assert closed_bytes() < before / 10
    assert manager.cleaning is None


def test_a_partition_that_kills_the_worker_twice_is_uncleanable(
    manager: LogManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fake worker death (the worker's `compact` replaced by one that raises CleanerDied):
    an out-of-memory kill cannot be caused reliably here."""
    _fill(manager, "compacted", 2_000)
    worker = CleanerWorker()
    deaths = 0

    async def dies(job: object) -> None:
        nonlocal deaths
        deaths += 1
        raise CleanerDied("the log cleaner worker ended (exit code -9)")

    monkeypatch.setattr(worker, "compact", dies)
    planned_after = 0  # rounds planned once the partition is uncleanable
    plan_cleaning = manager.plan_cleaning

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal planned_after
        if ("compacted", 0) in manager.uncleanable:
            planned_after += 1
        return plan_cleaning(*args, **kwargs)

    monkeypatch.setattr(manager, "plan_cleaning", counted)

    async def rounds() -> None:
        task = asyncio.ensure_future(
            run_cleaner(manager, lambda: 0, dict, backoff_ms=10, worker=worker)
        )
        # Rounds counted, not waited for: each of the three would have taken the partition
        # (the only dirty one) again, and a third death, had it not been left out.
        deadline = time.monotonic() + 10
        while planned_after < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert planned_after >= 3
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(rounds())
    assert deaths == 2
    assert "exit code -9" in manager.uncleanable[("compacted", 0)]
