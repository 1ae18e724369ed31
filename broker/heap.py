"""The garbage collector, tuned for a process that is one long-lived event loop.

CPython's cyclic collector stops the whole process while it walks the objects of the
generations it collects, and a full collection (the oldest generation) walks every tracked
object the process holds. A node with ten thousand partitions holds hundreds of thousands
(the metadata image, each partition's log, segments, indexes and replica state), and as they
were created and others came and went, full collections ran every few seconds and took 100 to
400 ms each: 6 to 9 s of each node's event loop in a four-minute run of `bench.partitions`,
each one a stall of every client, fetcher and quorum peer of the node.

The policy (`HeapPolicy.install`), as Python servers with big heaps do:
- **What has lived through a full collection is frozen** (`gc.freeze`): it is out of the
  collector's reach, so the next full collection walks only what was allocated since the
  last one. The node's working set is walked about once, not every few seconds.
- **Every `rescan_s` (10 min) the frozen objects are put back** (`gc.unfreeze`), so the next
  full collection walks them all once and frees the cycles among them that died meanwhile (a
  deleted topic's partitions, a closed connection that had lived long): frozen garbage is not
  lost, only freed later, and one full walk every ten minutes replaces dozens a minute.
- **`settle`**, once the node serves: its start-up garbage is collected and what remains
  (modules, message classes, recovered logs) frozen at once.

Reference counting, which frees all garbage that is not a cycle, is untouched by this. What
it costs: a cycle that lived through a full collection and then died is freed up to
`rescan_s` later. So the request path makes no cycles that die with a request or a
connection: a connection lets go of its serving task once it ends (the task's exception,
a CancelledError too, holds the task's frame and so the connection, with all a parked
request held), and so do a stopped replica fetcher and a closed peer connection
(`tests/unit/server/test_connection.py` and `tests/unit/replica/test_fetcher_close.py`
check it with the collector off). Counted with the collector saving what it found
(2026-11-27): over the hostile-client, many-partition, replication, disk-identity, group and
compaction suites, what a node leaves to the collector is its start-up garbage and asyncio's
own transport of each closed connection (a handful of small objects). Before, 100 abandoned
parked Fetches of 300 partitions left 300,000 objects in cycles, and frozen, CI's memory
bounds failed (2026-11-27: +41.5 MiB over three rounds).

Rescanning sooner, once the frozen objects had doubled, was tried: with 10,000 partitions
the heap doubles several times as they are created and as a restarted node loads them, and
each rescan is a full walk of it; the slow collections came back (16 to 26 per node in a
`bench.partitions` run, 3 to 5 s of each loop, against 1 or 2 and 0.1 to 0.3 s with the time
alone).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

__all__ = ["RESCAN_S", "HeapPolicy"]

_OLDEST = 2
"""CPython's oldest generation: collecting it is a full collection."""
RESCAN_S = 600.0
"""How often the frozen objects go back to the collector, for one full walk."""


class HeapPolicy:
    """Freeze the survivors of each full collection; unfreeze every `rescan_s`."""

    def __init__(
        self, *, rescan_s: float = RESCAN_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rescan_s = rescan_s
        self._clock = clock
        self._unfrozen_at = clock()
        self.rescans = 0
        """How many times the frozen objects were put back."""

    def install(self) -> None:
        gc.callbacks.append(self._collected)

    def uninstall(self) -> None:
        if self._collected in gc.callbacks:
            gc.callbacks.remove(self._collected)

    def settle(self) -> None:
        """Collect now and freeze what survives (the node has started)."""
        gc.collect()
        gc.freeze()

    def _collected(self, phase: str, info: dict[str, int]) -> None:
        if phase != "stop" or info["generation"] != _OLDEST:
            return
        now = self._clock()
        if now - self._unfrozen_at >= self.rescan_s:
            self._unfrozen_at = now
            self.rescans += 1
            gc.unfreeze()  # the next full collection walks everything once
        else:
            gc.freeze()
