"""The garbage collector, for a process that is one long-lived event loop.

`settle`, once the node serves: its start-up garbage is collected, and every object still
alive (modules, the protocol's message classes, the recovered logs' bookkeeping: some 100,000
objects) is frozen (`gc.freeze`), out of the collector's reach. They live as long as the
process; left in, every full collection walked them all on the event loop, 10 to 25 ms each
time.

What is not done (measured 2026-11-27, ADR 0010): freezing, at run time, what lives through
each full collection. With 10,000 partitions full collections took 100 to 400 ms every few
seconds (6 to 9 s of each node's loop in a four-minute `bench.partitions` run), and freezing
their survivors cut that to 0.1 to 0.4 s. But a request's objects that happen to be alive
during a collection and die later in a cycle (an abandoned parked fetch, a produce flood's
buffers) are then kept until the frozen objects are put back: CI's memory bounds failed (100
abandoned parked fetches per round grew the broker by 41.5 MiB over three rounds; a produce
flood's peak went 16 MiB past its bound). Putting them back on a timer or once they doubled
either kept the garbage for minutes or brought the long walks back. The cycles in the request
path come first; then freezing can be tried again.
"""

from __future__ import annotations

import gc

__all__ = ["settle"]


def settle() -> None:
    """Collect now and freeze what survives (the node has started)."""
    gc.collect()
    gc.freeze()
