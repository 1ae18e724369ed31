"""The replica manager's produce appends with their checks and writes on threads
(`ReplicaManager.append_offloaded`, ADR 0009), on real logs: a partition's appends keep their
turn even when the request holding it is cancelled mid-write, and a refused batch's bytes are
let go of at once, not when the cycle collector comes round."""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.aio import wait_for
from broker.metadata import MetadataImage, PartitionState
from broker.protocol import ErrorCode
from broker.replica import ReplicaManager
from broker.replica.appends import OFFLOAD_BYTES
from broker.replica.partition import Partition
from broker.storage import LogConfig, LogManager, PendingAppend
from tests.unit.storage.logs import batch

CONFIG = LogConfig(segment_bytes=64 << 20, max_message_bytes=8 << 20)


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[ReplicaManager]:
    logs = LogManager([tmp_path], CONFIG, background_flush=True)
    logs.startup(now_ms=0)
    manager = ReplicaManager(1, logs, MetadataImage(), lambda _: CONFIG, lambda: 1_000)
    log = logs.create_log("t", 0, now_ms=0)
    manager.partitions[("t", 0)] = Partition("t", 0, log, PartitionState((1,), (1,), 1, 0, 0), 1)
    yield manager
    logs.shutdown(now_ms=2_000)


def test_a_cancelled_append_keeps_the_partitions_turn_until_its_write_is_in(
    replicas: ReplicaManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request holding a large write is cancelled (a stopping server does that) while a
    small append waits behind it. The small one must wait for the write to be taken in, then
    append after it; the write itself is held at a gate (a fake slow disk)."""
    gate = threading.Event()
    write = PendingAppend.write

    def slow_write(pending: PendingAppend) -> None:
        gate.wait(10)
        write(pending)

    monkeypatch.setattr(PendingAppend, "write", slow_write)
    log = replicas.partitions[("t", 0)].log
    large = batch(1, value=b"L" * OFFLOAD_BYTES)

    async def scenario() -> tuple[int, int]:
        first = asyncio.create_task(replicas.append_offloaded("t", 0, large, 1))
        while not log.appending:
            await asyncio.sleep(0.005)
        second = asyncio.create_task(replicas.append_offloaded("t", 0, batch(1), 1))
        await asyncio.sleep(0.05)
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        assert not second.done(), "the small append went ahead of a write not yet taken in"
        gate.set()
        result = await wait_for(second, 10)
        assert result.error == ErrorCode.none, result
        assert result.info is not None
        return result.info.first_offset, log.log_end_offset

    assert asyncio.run(scenario()) == (1, 2)  # the cancelled batch is in, at offset 0


def test_a_refused_batch_is_let_go_of_at_once(replicas: ReplicaManager) -> None:
    """A large batch refused on the check thread (two hours ahead): once answered, nothing
    holds its bytes (the exception's traceback held the check's frames, which held them, in a
    cycle only the collector breaks: 30 refused 8 MiB produces grew a broker by 225 MiB)."""
    future = batch(1, timestamp=1_000 + 2 * 3600 * 1000, value=b"F" * OFFLOAD_BYTES)
    before = sys.getrefcount(future)
    gc.disable()
    try:
        result = asyncio.run(replicas.append_offloaded("t", 0, future, 1))
        held = sys.getrefcount(future) - before
    finally:
        gc.enable()
    assert result.error == ErrorCode.invalid_timestamp, result
    assert held == 0, f"{held} references to the refused batch outlive its answer"
