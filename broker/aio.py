"""Event-loop helpers the standard library gets wrong on Python 3.11.

`asyncio.wait_for` on 3.11 loses a cancellation when the awaited thing completes in the same
turn of the loop as the cancel: it returns the result, and the task that was cancelled goes on
as if nothing happened. A replica fetcher whose partitions changed just as the node stopped
kept fetching into closed logs, and the process never exited (asyncio.run waited for it).
`asyncio.timeout` has no such window, so the project uses it, through `wait_for` below;
`asyncio.wait_for` is banned by the linter.

`report_slow_callbacks` is a diagnostic: it logs each turn of the event loop that held the
loop longer than a threshold, with the task it ran and where that task stopped (asyncio's
own debug mode does the same, but slows every coroutine down with its bookkeeping), and each
garbage collection that long (it stops the loop as well, wherever it happens to run). The node
turns it on when `GREGOR_SLOW_CALLBACK_MS` is set.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["report_slow_callbacks", "wait_for"]

log = logging.getLogger(__name__)

_ASYNCIO = os.path.dirname(asyncio.__file__)

T = TypeVar("T")


async def wait_for(awaitable: Awaitable[T], timeout: float | None) -> T:
    """`awaitable`'s result, or TimeoutError after `timeout` seconds (None: no limit).

    On a timeout the awaitable is cancelled, as with `asyncio.wait_for`; a cancellation of the
    caller always propagates, even when the awaitable has just completed."""
    async with asyncio.timeout(timeout):
        return await awaitable


def report_slow_callbacks(threshold_ms: float) -> None:
    """From now on, log (WARNING) every event-loop callback of this process that runs for
    `threshold_ms` or longer: the callback, or the task and the line it stopped at; and every
    garbage collection that takes as long."""
    threshold = threshold_ms / 1000
    run = asyncio.events.Handle._run

    def timed(handle: asyncio.Handle) -> None:
        started = time.perf_counter()
        run(handle)
        took = time.perf_counter() - started
        if took >= threshold:
            log.warning("the event loop was held %.0f ms by %s", took * 1000, _describe(handle))

    asyncio.events.Handle._run = timed  # type: ignore[method-assign,assignment]
    started: list[float] = []

    def collection(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif started:
            took = time.perf_counter() - started.pop()
            if took >= threshold:
                log.warning(
                    "garbage collection of generation %d took %.0f ms (%d objects freed, %d "
                    "frozen)",
                    info["generation"],
                    took * 1000,
                    info["collected"],
                    gc.get_freeze_count(),
                )

    gc.callbacks.append(collection)


def _describe(handle: asyncio.Handle) -> str:
    callback: Any = getattr(handle, "_callback", None)
    task = getattr(callback, "__self__", None)
    if not isinstance(task, asyncio.Task):
        return repr(handle)
    coro: Any = task.get_coro()
    where = ""
    frame = getattr(coro, "cr_frame", None)
    while frame is not None:  # down the awaits to the innermost coroutine that stopped
        if not frame.f_code.co_filename.startswith(_ASYNCIO):
            where = f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})"
        awaited = getattr(coro, "cr_await", None)
        if awaited is None or getattr(awaited, "cr_frame", None) is None:
            break
        coro, frame = awaited, awaited.cr_frame
    name = getattr(task.get_coro(), "__qualname__", "?")
    return f"task {task.get_name()!r} ({name}), stopped at {where or 'its end'}"
