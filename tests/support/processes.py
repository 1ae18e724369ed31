"""A process and everything it started, as /proc shows them: the ids, and their resident memory
(VmRSS) now or sampled on a thread while a test's load runs. A broker's tree holds its log
cleaner's worker and multiprocessing's resource tracker besides the broker itself."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

__all__ = ["ResidentMemory", "descendants", "resident_bytes"]


def _rss(pid: int) -> int:
    """VmRSS of one process in bytes; 0 once it has gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it, from the parent ids in /proc/*/stat (the kernels the
    suite runs on may lack /proc/<pid>/task/<tid>/children)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(entry.path, "stat").read_text()
                parent = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    found = [pid]
    for process in found:
        found.extend(children.get(process, ()))
    return found


def resident_bytes(pid: int) -> int:
    """VmRSS of `pid` and its descendants (the log cleaner's worker, multiprocessing's
    resource tracker) in bytes, now."""
    return sum(_rss(process) for process in descendants(pid))


class ResidentMemory:
    """The resident memory of a process and its descendants, sampled on a thread every
    `interval` seconds while the `with` block runs; the process tree is re-read every second,
    VmRSS at every sample. `peak` is the largest sum seen, `latest` the last one."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self._pid = pid
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)
        self.peak = 0
        self.latest = 0
        self.samples = 0

    def __enter__(self) -> ResidentMemory:
        self._record(resident_bytes(self._pid))
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self._record(resident_bytes(self._pid))

    def _record(self, value: int) -> None:
        self.latest = value
        self.peak = max(self.peak, value)
        self.samples += 1

    def _sample(self) -> None:
        tree: list[int] = []
        refreshed = 0.0
        while not self._stop.wait(self._interval):
            if time.monotonic() - refreshed >= 1.0:
                tree = descendants(self._pid)
                refreshed = time.monotonic()
            self._record(sum(_rss(process) for process in tree))
