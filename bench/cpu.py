"""CPU time of broker processes, from /proc: what a benchmark divides by the bytes it moved, so
that a comparison holds per core and not only on a machine where the load generator starves
one of the brokers."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["CpuMeter", "cpu_seconds"]

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds the process has used so far, all its threads (and any
    children it waited for) included."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # Fields after the command name, which is in parentheses and may hold spaces.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return (utime + stime + cutime + cstime) / _TICKS


class CpuMeter:
    """CPU seconds each of some processes uses between `start` and `stop`."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = tuple(pids)
        self._started: tuple[float, ...] = ()
        self.used: tuple[float, ...] = ()
        """CPU seconds per process, in `pids` order, once stopped."""

    def start(self) -> None:
        self._started = tuple(cpu_seconds(pid) for pid in self.pids)

    def stop(self) -> tuple[float, ...]:
        self.used = tuple(
            cpu_seconds(pid) - before for pid, before in zip(self.pids, self._started, strict=True)
        )
        return self.used

    def per_gb(self, moved_bytes: int) -> tuple[float, ...]:
        """CPU seconds per gigabyte (10^9 bytes) moved, per process."""
        return tuple(used / (moved_bytes / 1e9) for used in self.used)
