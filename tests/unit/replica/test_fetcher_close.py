"""A node's replica fetchers stop when it stops. On Python 3.11, `asyncio.wait_for` returned
the result of an event set in the same turn as the cancel and swallowed the cancellation: a
fetcher whose partitions changed just as the node shut down went on fetching into closed
logs, and the process never exited (the fault-injection run's SIGTERM that hung)."""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref
from pathlib import Path

import pytest

from broker.metadata import MetadataImage, PartitionChanged, PartitionState
from broker.replica.fetcher import FetcherSettings, ReplicaFetchers
from tests.unit.replica.test_replication import TOPIC, _manager


def _fetcher_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("replica-fetcher-")]


@pytest.mark.parametrize("turns", range(3))
def test_close_stops_a_fetcher_woken_in_the_same_turn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, turns: int
) -> None:
    """The fetcher waits for its partitions to change (its leader has no endpoint yet); they
    change, and the node closes the fetchers `turns` turns of the loop later, before the
    fetcher has run again (the wakeup passes through two of them on its way)."""
    asyncio.run(_close_after_wakeup(tmp_path, caplog, turns))


def test_a_fetcher_without_its_leaders_endpoint_waits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Told of a change while its leader has no endpoint, the fetcher looks again after the
    backoff; it used to look again at once, forever, and starve the event loop."""

    async def scenario() -> None:
        follower, logs = _manager(tmp_path / "follower", 2)
        follower.apply(PartitionChanged(TOPIC, 0, PartitionState((1, 2), (1, 2), 1, 0, 0)))
        image = MetadataImage()
        settings = FetcherSettings(2, "cluster", "INTERNAL", backoff_ms=100)
        fetchers = ReplicaFetchers(settings, follower, lambda: image)
        try:
            with caplog.at_level(logging.WARNING, logger="broker.replica.fetcher"):
                fetchers.update()
                await asyncio.sleep(0.01)
                for fetcher in fetchers._fetchers.values():
                    fetcher.changed.set()
                await asyncio.sleep(0.35)
            looks = caplog.text.count("has no INTERNAL endpoint")
            # About one per 100 ms backoff (fewer on a busy machine); the spin it replaced
            # looked thousands of times.
            assert 1 <= looks <= 6, looks
        finally:
            await fetchers.close()
            logs.shutdown(now_ms=2_000)

    asyncio.run(scenario())


async def _close_after_wakeup(tmp_path: Path, caplog: pytest.LogCaptureFixture, turns: int) -> None:
    follower, logs = _manager(tmp_path / "follower", 2)
    follower.apply(PartitionChanged(TOPIC, 0, PartitionState((1, 2), (1, 2), 1, 0, 0)))
    image = MetadataImage()
    image.topics[TOPIC.name] = TOPIC
    fetchers = ReplicaFetchers(FetcherSettings(2, "cluster", "INTERNAL"), follower, lambda: image)
    try:
        fetchers.update()
        await asyncio.sleep(0.01)  # the fetcher found no endpoint and waits
        (task,) = _fetcher_tasks()
        for fetcher in fetchers._fetchers.values():
            fetcher.changed.set()
        for _ in range(turns):
            await asyncio.sleep(0)  # the wakeup at each stage of its way to the fetcher
        with caplog.at_level(logging.WARNING, logger="broker.replica.fetcher"):
            await asyncio.wait([asyncio.ensure_future(fetchers.close())], timeout=2)
        assert task.done(), "the fetcher went on after close"
        assert "did not stop" not in caplog.text
    finally:
        for task in _fetcher_tasks():
            task.cancel()
        logs.shutdown(now_ms=2_000)


def test_a_stopped_fetcher_is_freed_without_the_collector(tmp_path: Path) -> None:
    """The partition's leader moves, so the fetcher from the old one stops. A node freezes
    what lives through a full collection (broker/heap.py): were the stopped fetcher (with an
    entry for each partition it read) in a cycle with its task, it would stay until the
    frozen objects are put back, minutes later. Reference counting alone must free it."""

    async def scenario() -> None:
        follower, logs = _manager(tmp_path / "follower", 2)
        follower.apply(PartitionChanged(TOPIC, 0, PartitionState((1, 2), (1, 2), 1, 0, 0)))
        image = MetadataImage()
        fetchers = ReplicaFetchers(
            FetcherSettings(2, "cluster", "INTERNAL", backoff_ms=100), follower, lambda: image
        )
        try:
            fetchers.update()
            await asyncio.sleep(0.05)
            # What only the fetcher holds (its own class has no weak references).
            (old,) = [weakref.ref(f.changed) for f in fetchers._fetchers.values()]
            follower.apply(PartitionChanged(TOPIC, 0, PartitionState((3, 2), (3, 2), 3, 1, 1)))
            fetchers.update()
            for _ in range(20):
                await asyncio.sleep(0.01)
            assert 3 in fetchers._fetchers, "no fetcher from the new leader"
            assert old() is None, "the stopped fetcher is kept until the collector runs"
        finally:
            await fetchers.close()
            logs.shutdown(now_ms=2_000)

    gc.disable()
    try:
        asyncio.run(scenario())
    finally:
        gc.enable()
