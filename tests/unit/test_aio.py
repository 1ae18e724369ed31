"""`broker.aio.report_slow_callbacks`: a turn of the event loop held past the threshold is
logged with the task that held it and where that task stopped; quick turns are not. So is a
garbage collection past the threshold (it holds the loop as well)."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Iterator

import pytest

from broker.aio import report_slow_callbacks

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The loop's callbacks and the collector's, as they were."""
    monkeypatch.setattr(asyncio.events.Handle, "_run", asyncio.events.Handle._run)
    callbacks = list(gc.callbacks)
    yield
    gc.callbacks[:] = callbacks


async def _hold(seconds: float) -> None:
    time.sleep(seconds)  # the loop is held: nothing else runs
    await asyncio.sleep(0)


def test_a_held_loop_is_reported_with_its_task(caplog: pytest.LogCaptureFixture) -> None:
    report_slow_callbacks(30)

    async def main() -> None:
        await asyncio.create_task(_hold(0.001), name="quick")
        await asyncio.create_task(_hold(0.06), name="slow")

    with caplog.at_level(logging.WARNING, logger="broker.aio"):
        asyncio.run(main())
    reported = [r.getMessage() for r in caplog.records]
    assert len(reported) == 1, reported
    assert "task 'slow' (_hold)" in reported[0]
    assert "test_aio.py" in reported[0]  # where it stopped
    held = int(reported[0].split("held ")[1].split(" ms")[0])
    assert held >= 60


def test_a_long_garbage_collection_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    report_slow_callbacks(0)  # every collection is long enough
    with caplog.at_level(logging.WARNING, logger="broker.aio"):
        gc.collect()
    reported = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("garbage collection of generation 2 took") for m in reported)
