"""The log cleaner's driver: compaction rounds off the serving event loop.

Compacting is Python-bound (every record of the dirty range is decoded, twice), so a round
done on the event loop stops the broker for as long as it takes: seconds for tens of
megabytes. Here each round is split as `LogManager` lays it out: the loop plans it and swaps
its result in (both quick), while `cleaner.compact` runs in a worker process of its own, at a
lower CPU priority than the broker (`CLEANER_NICENESS`), and the directory fsyncs of the swap
run on a thread. One worker and one round at a time, as Kafka's default
`log.cleaner.threads=1`.

The worker is a `multiprocessing` spawn child (a fresh interpreter: nothing of the broker's
event loop, sockets or threads is inherited). It is started on the first round and kept; a
worker that dies (killed, out of memory) is started afresh on the next round, and a partition
whose round killed it twice in a row is marked uncleanable. When the node stops, the worker is
killed: a round cut short leaves only `.cleaned` files, which the next load discards.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
from collections.abc import Callable

from broker.storage import LogManager
from broker.storage.cleaner import CleanJob, Compaction, compact
from broker.storage.files import fsync_dir
from broker.storage.manager import TopicPartition

__all__ = ["CLEANER_NICENESS", "CleanerDied", "CleanerWorker", "run_cleaner"]

log = logging.getLogger(__name__)

CLEANER_NICENESS = 10
"""How much lower the worker's CPU priority is than the broker's (nice(2) increment): on a
busy machine the broker's answers come before compaction, which only has to keep up over
minutes."""

WORKER_DEATHS_BEFORE_UNCLEANABLE = 2


class CleanerDied(Exception):
    """The worker process ended in the middle of a round (killed, out of memory)."""


def _serve(conn: multiprocessing.connection.Connection, niceness: int) -> None:
    """The worker's main: compact each job received, send back the result or the error."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the broker, which kills us.
    with contextlib.suppress(OSError):
        os.nice(niceness)
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return  # The broker is gone.
        reply: tuple[str, object]
        try:
            reply = ("ok", compact(job))
        except Exception as exc:  # every failure goes back to the broker
            reply = ("error", exc)
        try:
            conn.send(reply)
        except (TypeError, AttributeError, ValueError) as exc:  # an unpicklable error
            conn.send(("error", RuntimeError(f"{type(reply[1]).__name__}: {reply[1]} ({exc})")))


class CleanerWorker:
    """A worker process that runs `cleaner.compact`, one job at a time."""

    def __init__(self, *, niceness: int = CLEANER_NICENESS) -> None:
        self.niceness = niceness
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: multiprocessing.connection.Connection | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def _start(self) -> multiprocessing.connection.Connection:
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        process = context.Process(
            target=_serve, args=(theirs, self.niceness), name="gregor-log-cleaner", daemon=True
        )
        process.start()
        theirs.close()  # so that the worker sees EOF when the broker goes
        self._process, self._conn = process, ours
        log.info("log cleaner worker started (pid %d)", process.pid)
        return ours

    async def compact(self, job: CleanJob) -> Compaction:
        """`cleaner.compact(job)` in the worker; its exception if it raised one, CleanerDied if
        the worker ended meanwhile."""
        conn = self._conn
        if conn is None or self._process is None or not self._process.is_alive():
            self.close()
            conn = self._start()
        loop = asyncio.get_running_loop()
        try:
            kind, value = await loop.run_in_executor(None, _exchange, conn, job)
        except (EOFError, OSError) as exc:
            code = None
            if self._process is not None:
                # Its end of the pipe closes as it dies: wait (off the loop) for it to be reaped.
                await loop.run_in_executor(None, self._process.join, 5)
                code = self._process.exitcode
            self.close()
            raise CleanerDied(f"the log cleaner worker ended (exit code {code}): {exc}") from None
        if kind == "error":
            assert isinstance(value, BaseException)
            raise value
        assert isinstance(value, Compaction)
        return value

    def close(self) -> None:
        """Kill the worker (a round in progress is abandoned) and wait for it."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if process is not None:
            if process.is_alive():
                process.kill()
            process.join(timeout=5)
        if conn is not None:
            conn.close()


def _exchange(conn: multiprocessing.connection.Connection, job: CleanJob) -> tuple[str, object]:
    conn.send(job)
    reply: tuple[str, object] = conn.recv()
    return reply


async def run_cleaner(
    logs: LogManager,
    clock: Callable[[], int],
    high_watermarks: Callable[[], dict[TopicPartition, int]],
    *,
    backoff_ms: int,
    worker: CleanerWorker | None = None,
) -> None:
    """Clean the filthiest compacted log every `log.cleaner.backoff.ms` until cancelled; the
    worker is killed when this ends."""
    worker = worker or CleanerWorker()
    deaths: dict[TopicPartition, int] = {}
    try:
        while True:
            await asyncio.sleep(backoff_ms / 1000)
            round_ = logs.plan_cleaning(clock(), high_watermarks=high_watermarks())
            if round_ is None:
                continue
            job = round_.job
            log.info(
                "cleaning %s-%d: offsets %d to %d, %d bytes dirty",
                *round_.key,
                job.first_dirty_offset,
                job.first_uncleanable_offset,
                job.cleanable_bytes,
            )
            try:
                compaction = await worker.compact(job)
                for directory in logs.swap_cleaned(round_, compaction, clock()):
                    await asyncio.to_thread(fsync_dir, directory)
                deaths.pop(round_.key, None)
                result = round_.result
                if result is not None and result.bytes_before:
                    log.info(
                        "cleaned %s-%d: %d of %d records removed, %d bytes → %d bytes",
                        *round_.key,
                        result.records_removed,
                        result.records_read,
                        result.bytes_before,
                        result.bytes_after,
                    )
            except CleanerDied as exc:
                deaths[round_.key] = deaths.get(round_.key, 0) + 1
                log.warning("cleaning %s-%d: %s", *round_.key, exc)
                if deaths[round_.key] >= WORKER_DEATHS_BEFORE_UNCLEANABLE:
                    logs.cleaning_failed(round_, exc)
            except Exception as exc:  # the manager decides what it means
                logs.cleaning_failed(round_, exc)
            finally:
                logs.end_cleaning(round_)
    finally:
        worker.close()
