"""Event-loop helpers the standard library gets wrong on Python 3.11.

`asyncio.wait_for` on 3.11 loses a cancellation when the awaited thing completes in the same
turn of the loop as the cancel: it returns the result, and the task that was cancelled goes on
as if nothing happened. A replica fetcher whose partitions changed just as the node stopped
kept fetching into closed logs, and the process never exited (asyncio.run waited for it).
`asyncio.timeout` has no such window, so the project uses it, through `wait_for` below;
`asyncio.wait_for` is banned by the linter.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["wait_for"]

T = TypeVar("T")


async def wait_for(awaitable: Awaitable[T], timeout: float | None) -> T:
    """`awaitable`'s result, or TimeoutError after `timeout` seconds (None: no limit).

    On a timeout the awaitable is cancelled, as with `asyncio.wait_for`; a cancellation of the
    caller always propagates, even when the awaitable has just completed."""
    async with asyncio.timeout(timeout):
        return await awaitable
