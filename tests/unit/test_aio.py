"""`broker.aio.report_slow_callbacks`: a turn of the event loop held past the threshold is
logged with the task that held it and where that task stopped; quick turns are not."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from broker.aio import report_slow_callbacks

pytestmark = pytest.mark.unit


async def _hold(seconds: float) -> None:
    time.sleep(seconds)  # the loop is held: nothing else runs
    await asyncio.sleep(0)


def test_a_held_loop_is_reported_with_its_task(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(asyncio.events.Handle, "_run", asyncio.events.Handle._run)
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
