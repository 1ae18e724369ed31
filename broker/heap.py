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
- **Every `rescan_s` (10 min), or once the frozen objects are twice as many as after the last
  rescan, they are put back** (`gc.unfreeze`), so the next full collection walks them all once
  and frees the cycles among them that died meanwhile (a deleted topic's partitions, a closed
  connection that had lived through a collection): frozen garbage is not lost, only freed
  later, one full walk every ten minutes replaces dozens a minute, and garbage that churns
  faster (connections that come and go) is bounded by the live heap, not by the time.
- **`settle`**, once the node serves: its start-up garbage is collected and what remains
  (modules, message classes, recovered logs) frozen at once.

Reference counting, which frees all garbage that is not a cycle, is untouched by this.
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
    """Freeze the survivors of each full collection; unfreeze every `rescan_s`, or when the
    frozen objects have doubled since the last time."""

    def __init__(
        self, *, rescan_s: float = RESCAN_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rescan_s = rescan_s
        self._clock = clock
        self._unfrozen_at = clock()
        self._frozen_after_rescan = 0
        """How many objects the first freeze after the last rescan froze (0: none yet)."""
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
        frozen = gc.get_freeze_count()
        grown = self._frozen_after_rescan and frozen >= 2 * self._frozen_after_rescan
        if now - self._unfrozen_at >= self.rescan_s or grown:
            self._unfrozen_at = now
            self._frozen_after_rescan = 0
            self.rescans += 1
            gc.unfreeze()  # the next full collection walks everything once
            return
        gc.freeze()
        if not self._frozen_after_rescan:
            self._frozen_after_rescan = gc.get_freeze_count()
