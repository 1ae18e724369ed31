"""Storage benchmark: Gregor's partition log against the raw system calls underneath it.

    python -m bench.storage [--megabytes N] [--dir DIR] [--rounds R] [--read-passes P]
                            [--segment-megabytes S] [--drain splice|copy] [--profile]

Append: the same record batches go once through `Log.append_as_leader`, one call per batch as
one produce request per batch would, then `Log.flush`; and once through `os.write` of the same
bytes in the same chunks to a plain file in the same directory, then `os.fsync`. Both sides
therefore end with every byte on disk. A batch holds 16 uncompressed records of 1 KiB random
values: 16,589 bytes (Kafka's default `batch.size=16384` would close it one record earlier).
Building the batches is not timed, nor is opening or closing the files.

`segment.bytes` is 128 MiB rather than Kafka's 1 GiB so that the default 512 MiB run rolls four
times: a broker pays for a roll (fsync of the closed segment, three new files) every
`segment.bytes`, and with 1 GiB this run would never see one. That charges rolls to Gregor
eight times as often per byte as the default would.

Read: consumer-like sequential fetches of 1 MiB, `Log.read(offset, 1 MiB)` then `os.sendfile`
of the slice to a loopback TCP socket, against `os.sendfile` of the same segment files in 1 MiB
chunks to the same kind of socket. The data is in the page cache for both (it was just
written, and each side makes an untimed pass first), so this compares code paths, not the disk.

The two sides alternate in every round (which one goes first alternates too) and each figure
is the median over the rounds, because a small VM is noisy. The output ends with the two lines
`append_vs_raw=<ratio>` and `sendfile_vs_raw=<ratio>`, ratios of the medians. This is a
measurement, never a pass/fail test.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import cProfile
import fcntl
import functools
import io
import multiprocessing
import os
import pstats
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from broker.protocol.records import Record, build_batch
from broker.storage import Log, LogConfig

RECORD_BYTES = 1024
RECORDS_PER_BATCH = 16
FETCH_BYTES = 1024 * 1024
MIB = 1024 * 1024
MB = 1_000_000
PARTITION_DIR = "bench-0"
LEADER_EPOCH = 0
_COUNT = struct.Struct(">q")


# -- the payload -----------------------------------------------------------------------------


def build_payload(total_bytes: int, first_timestamp: int) -> list[bytes]:
    """Producer batches adding up to at least `total_bytes`, every byte of every value random
    so that nothing on the way could take a shortcut. Each batch is one millisecond newer than
    the previous, so the time index grows with the offset index, as on a live partition."""
    batches: list[bytes] = []
    size = 0
    while size < total_bytes:
        timestamp = first_timestamp + len(batches)
        batch = build_batch(
            [
                Record(offset=i, timestamp=timestamp, key=None, value=os.urandom(RECORD_BYTES))
                for i in range(RECORDS_PER_BATCH)
            ]
        )
        batches.append(batch)
        size += len(batch)
    return batches


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# -- append ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppendTiming:
    write_seconds: float
    """Every batch handed to the OS (page cache)."""
    fsync_seconds: float
    """Then on disk."""

    @property
    def seconds(self) -> float:
        return self.write_seconds + self.fsync_seconds


def append_gregor(directory: Path, batches: Sequence[bytes], config: LogConfig) -> AppendTiming:
    """One `append_as_leader` per batch, then `flush`: the produce path of a leader with
    acks=all-style durability forced at the end, so the disk work matches the raw side."""
    clock = now_ms()
    log = Log(directory / PARTITION_DIR, config, now_ms=clock)
    try:
        start = time.perf_counter()
        for batch in batches:
            log.append_as_leader(batch, leader_epoch=LEADER_EPOCH, now_ms=clock)
        written = time.perf_counter()
        log.flush(clock)
        done = time.perf_counter()
    finally:
        log.close(clock)
    return AppendTiming(written - start, done - written)


def append_raw(path: Path, batches: Sequence[bytes]) -> AppendTiming:
    """The same bytes in the same chunks with `os.write`, then one `os.fsync`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        start = time.perf_counter()
        for batch in batches:
            if os.write(fd, batch) != len(batch):
                raise OSError(f"short write to {path}")
        written = time.perf_counter()
        os.fsync(fd)
        done = time.perf_counter()
    finally:
        os.close(fd)
    return AppendTiming(written - start, done - written)


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    # Let the journal commit the deletion now rather than during the next measurement.
    os.sync()


# -- read ------------------------------------------------------------------------------------


def drain(listener: socket.socket, mode: str) -> None:
    """The consumer's side, in its own process: read each connection to its end, then answer
    with the byte count, so a transfer is timed until the last byte has arrived.

    `splice` moves the received pages to /dev/null through a pipe without copying them, so
    the receiver costs little and the sender — the code under test — sets the pace. `copy`
    copies every byte into a buffer, as a consumer does; loopback TCP with a copying reader
    tops out well below what either sender can do, which hides most of the difference."""
    buffer = memoryview(bytearray(4 * MIB))
    sink = os.open(os.devnull, os.O_WRONLY)
    pipe_out, pipe_in = os.pipe()
    with contextlib.suppress(OSError):
        fcntl.fcntl(pipe_in, fcntl.F_SETPIPE_SZ, MIB)
    while True:
        connection, _ = listener.accept()
        with connection:
            total = 0
            if mode == "copy":
                while received := connection.recv_into(buffer):
                    total += received
            else:
                while received := os.splice(connection.fileno(), pipe_in, MIB):
                    total += received
                    while received:
                        received -= os.splice(pipe_out, sink, received)
            connection.sendall(_COUNT.pack(total))


@contextlib.contextmanager
def drainer(mode: str) -> Iterator[tuple[str, int]]:
    """A draining process on a loopback port; yields the address to connect to.

    A process rather than a thread: a thread would take the GIL back after each read and slow
    down whichever side does more Python work per fetch — Gregor's — for a reason that has
    nothing to do with storage. Neither process is pinned: on this 2-vCPU VM, pinning them to
    different CPUs halved loopback throughput for both sides (cross-CPU wake-ups)."""
    listener = socket.create_server(("127.0.0.1", 0))
    address: tuple[str, int] = listener.getsockname()
    process = multiprocessing.get_context("fork").Process(
        target=drain, args=(listener, mode), daemon=True
    )
    process.start()
    listener.close()
    try:
        yield address
    finally:
        process.terminate()
        process.join()


def sendfile_all(socket_fd: int, file_fd: int, position: int, size: int) -> None:
    while size:
        sent = os.sendfile(socket_fd, file_fd, position, size)
        if sent == 0:
            raise EOFError(f"file {file_fd} ended before byte {position + size}")
        position += sent
        size -= sent


@dataclass(frozen=True, slots=True)
class Transfer:
    seconds: float
    """From the first byte sent until the drainer has counted the last one."""
    sender_cpu_seconds: float
    """CPU time of this (the sending) process meanwhile: user and system."""


def timed_transfer(address: tuple[str, int], send: Callable[[int], int]) -> Transfer:
    """Connect, let `send` write to the socket (it returns the bytes sent), wait for the
    drainer's count and check it."""
    with socket.create_connection(address) as sock:
        start, start_cpu = time.perf_counter(), time.process_time()
        sent = send(sock.fileno())
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while len(answer) < _COUNT.size:
            chunk = sock.recv(_COUNT.size - len(answer))
            if not chunk:
                raise EOFError("the drainer closed without a count")
            answer += chunk
        elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    (received,) = _COUNT.unpack(answer)
    if received != sent:
        raise RuntimeError(f"sent {sent} bytes but the drainer received {received}")
    return Transfer(elapsed, cpu)


class GregorReader:
    """Consumer-like fetches through `Log.read`.

    After each fetch the next one starts at the first batch the slice did not hold whole,
    as a consumer does (a 1 MiB slice usually ends inside a batch, which the next fetch sends
    again, as Kafka's do). A real consumer learns that offset by parsing what it received, on
    its own side; here the answer comes from a table of batch ends built before timing, so the
    sender pays only for what a broker does per fetch: `Log.read` and `sendfile`.
    """

    def __init__(self, log: Log) -> None:
        self.log = log
        self.sent = 0
        self._ends: dict[int, list[int]] = {}
        self._next_offsets: dict[int, list[int]] = {}
        for segment, position, header in log.batches():
            self._ends.setdefault(segment.fd, []).append(position + header.size)
            self._next_offsets.setdefault(segment.fd, []).append(header.next_offset)

    def send(self, socket_fd: int, passes: int) -> int:
        """Read the whole log `passes` times; returns the bytes sent."""
        sent = 0
        end = self.log.log_end_offset
        for _ in range(passes):
            offset = self.log.log_start_offset
            while offset < end:
                piece = self.log.read(offset, FETCH_BYTES, max_offset=end)
                if piece is None:
                    break
                sendfile_all(socket_fd, piece.fd, piece.position, piece.size)
                sent += piece.size
                ends = self._ends[piece.fd]
                offset = self._next_offsets[piece.fd][
                    bisect.bisect_right(ends, piece.position + piece.size) - 1
                ]
        self.sent = sent
        return sent


class RawReader:
    """`sendfile` of the same segment files in 1 MiB chunks, each from its own fd."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self._files = [(os.open(path, os.O_RDONLY), path.stat().st_size) for path in paths]

    def send(self, socket_fd: int, passes: int) -> int:
        sent = 0
        for _ in range(passes):
            for fd, size in self._files:
                position = 0
                while position < size:
                    chunk = min(FETCH_BYTES, size - position)
                    sendfile_all(socket_fd, fd, position, chunk)
                    position += chunk
                sent += size
        return sent

    def close(self) -> None:
        for fd, _ in self._files:
            os.close(fd)


# -- the run ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Options:
    megabytes: int
    directory: Path
    rounds: int
    read_passes: int
    segment_megabytes: int
    drain: str
    profile: bool


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.storage",
        description="Gregor's log append and sendfile read against raw write and sendfile.",
    )
    parser.add_argument(
        "--megabytes", type=int, default=512, help="MiB of batches to append (default 512)"
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path("var/bench"),
        help="directory on the disk to measure; a temporary directory is made inside it and "
        "removed at the end (default var/bench)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument(
        "--read-passes",
        type=int,
        default=8,
        help="times the whole log is read in one read measurement (default 8)",
    )
    parser.add_argument(
        "--segment-megabytes",
        type=int,
        default=128,
        help="segment.bytes in MiB (default 128, so the default run rolls four times)",
    )
    parser.add_argument(
        "--drain",
        choices=("splice", "copy"),
        default="splice",
        help="how the receiving process drains the socket: splice to /dev/null, so the "
        "sender sets the pace (default), or copy into memory as a consumer does",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the measurements, profile one more Gregor append with cProfile",
    )
    args = parser.parse_args(argv)
    for name in ("megabytes", "rounds", "read_passes", "segment_megabytes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return Options(
        megabytes=args.megabytes,
        directory=args.dir,
        rounds=args.rounds,
        read_passes=args.read_passes,
        segment_megabytes=args.segment_megabytes,
        drain=args.drain,
        profile=args.profile,
    )


def rate(total_bytes: int, seconds: float) -> float:
    return total_bytes / seconds / MB


def print_table(title: str, rows: Sequence[tuple[float, float]], notes: Sequence[str]) -> float:
    """Rows of (Gregor MB/s, raw MB/s); returns the ratio of the medians."""
    print(f"\n{title}")
    print(f"  {'':8} {'Gregor MB/s':>12} {'raw MB/s':>12} {'ratio':>7}")
    for i, ((gregor, raw), note) in enumerate(zip(rows, notes, strict=True), start=1):
        print(f"  round {i:<2} {gregor:12.1f} {raw:12.1f} {gregor / raw:7.2f}   {note}")
    gregor_median = statistics.median(g for g, _ in rows)
    raw_median = statistics.median(r for _, r in rows)
    ratio = gregor_median / raw_median
    print(f"  {'median':8} {gregor_median:12.1f} {raw_median:12.1f} {ratio:7.2f}")
    return ratio


class Appends:
    """Runs one side at a time, each into a new file or directory under `workdir`.

    The previous run's files are removed just before the next run, never earlier: this VM
    hands free memory back to its host (virtio-balloon free page reporting) within seconds,
    and memory touched again after that costs several times more — up to 1.5 s more for
    512 MiB of page cache. Recycling the pages at once gives both sides the warm page cache
    that any long-running host has.
    """

    def __init__(self, workdir: Path, batches: Sequence[bytes], config: LogConfig) -> None:
        self.workdir = workdir
        self.batches = batches
        self.config = config
        self._last: Path | None = None
        self._runs = 0

    def next_path(self, side: str) -> Path:
        if self._last is not None:
            remove(self._last)
        self._runs += 1
        self._last = self.workdir / f"{side}-{self._runs}"
        return self._last

    def gregor(self) -> AppendTiming:
        return append_gregor(self.next_path("gregor"), self.batches, self.config)

    def raw(self) -> AppendTiming:
        return append_raw(self.next_path("raw"), self.batches)

    def log_for_reads(self) -> Path:
        """A Gregor log left in place (and in the page cache) for the read benchmark."""
        self.gregor()
        assert self._last is not None
        return self._last / PARTITION_DIR


def run_appends(appends: Appends, options: Options) -> float:
    """Alternate both sides over the rounds after an untimed run of each; returns the ratio."""
    total = sum(len(batch) for batch in appends.batches)
    appends.gregor()
    appends.raw()
    rows: list[tuple[float, float]] = []
    notes: list[str] = []
    for round_number in range(options.rounds):
        order = ("gregor", "raw") if round_number % 2 == 0 else ("raw", "gregor")
        timings = {side: appends.gregor() if side == "gregor" else appends.raw() for side in order}
        gregor, raw = timings["gregor"], timings["raw"]
        rows.append((rate(total, gregor.seconds), rate(total, raw.seconds)))
        notes.append(
            f"write+fsync s: Gregor {gregor.write_seconds:.2f}+{gregor.fsync_seconds:.2f}, "
            f"raw {raw.write_seconds:.2f}+{raw.fsync_seconds:.2f} ({order[0]} first)"
        )
    return print_table(
        f"append: {len(appends.batches)} batches, {total / MB:.1f} MB, write + fsync "
        "(Gregor's write time includes the fsync of each segment it rolls)",
        rows,
        notes,
    )


def run_reads(
    options: Options, log_dir: Path, config: LogConfig, address: tuple[str, int]
) -> float:
    clock = now_ms()
    log = Log(log_dir, config, now_ms=clock)
    raw = RawReader([segment.log_path for segment in log.segments])
    gregor = GregorReader(log)
    total = log.size_in_bytes * options.read_passes
    rows: list[tuple[float, float]] = []
    notes: list[str] = []
    try:
        # Untimed passes: page cache warm for both, TCP and the drainer up to speed.
        timed_transfer(address, functools.partial(raw.send, passes=1))
        timed_transfer(address, functools.partial(gregor.send, passes=1))
        resent = gregor.sent / log.size_in_bytes - 1
        for round_number in range(options.rounds):
            transfers: dict[str, Transfer] = {}
            order = ("gregor", "raw") if round_number % 2 == 0 else ("raw", "gregor")
            for side in order:
                reader: GregorReader | RawReader = gregor if side == "gregor" else raw
                transfers[side] = timed_transfer(
                    address, functools.partial(reader.send, passes=options.read_passes)
                )
            g, r = transfers["gregor"], transfers["raw"]
            rows.append((rate(total, g.seconds), rate(total, r.seconds)))
            notes.append(
                f"sender CPU s: Gregor {g.sender_cpu_seconds:.2f} of {g.seconds:.2f}, "
                f"raw {r.sender_cpu_seconds:.2f} of {r.seconds:.2f} ({order[0]} first)"
            )
    finally:
        raw.close()
        log.close(clock)
    ratio = print_table(
        f"sendfile read: {len(log.segments)} segments, {total / MB:.1f} MB "
        f"({options.read_passes} passes), {FETCH_BYTES // 1024} KiB fetches, page cache",
        rows,
        notes,
    )
    print(
        f"  (MB/s count log bytes; Gregor's fetches also resend the batch cut at the end of "
        f"each slice: {resent:.1%} more bytes on the wire)"
    )
    return ratio


def profile_append(appends: Appends) -> None:
    """cProfile of one more Gregor append run, top functions by own time."""
    clock = now_ms()
    log = Log(appends.next_path("profile") / PARTITION_DIR, appends.config, now_ms=clock)
    profiler = cProfile.Profile()
    try:
        profiler.enable()
        for batch in appends.batches:
            log.append_as_leader(batch, leader_epoch=LEADER_EPOCH, now_ms=clock)
        log.flush(clock)
        profiler.disable()
    finally:
        log.close(clock)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(15)
    print("\nprofile of one more Gregor append run (cProfile, by own time):")
    print(out.getvalue().rstrip())


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    total = options.megabytes * MIB
    options.directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(options.directory).free
    # One Gregor log and one raw file at a time, plus room for the indexes and some margin.
    needed = 2 * total + 256 * MIB
    if free < needed:
        print(
            f"{options.directory}: {free // MIB} MiB free, {needed // MIB} needed", file=sys.stderr
        )
        return 1
    config = LogConfig(segment_bytes=options.segment_megabytes * MIB)
    print(
        f"Gregor storage benchmark: {options.megabytes} MiB, {RECORDS_PER_BATCH} records of "
        f"{RECORD_BYTES} B a batch, segment.bytes={options.segment_megabytes} MiB, "
        f"{options.rounds} rounds, in {options.directory.resolve()}"
    )
    # The drainer starts before the payload exists, so it forks a small process.
    with drainer(options.drain) as address:
        started = time.perf_counter()
        batches = build_payload(total, now_ms())
        print(
            f"built {len(batches)} batches of {len(batches[0])} B in "
            f"{time.perf_counter() - started:.1f} s (not timed)"
        )
        workdir = Path(tempfile.mkdtemp(prefix="storage-", dir=options.directory))
        try:
            appends = Appends(workdir, batches, config)
            append_ratio = run_appends(appends, options)
            read_ratio = run_reads(options, appends.log_for_reads(), config, address)
            if options.profile:
                profile_append(appends)
        finally:
            remove(workdir)
    print(f"append_vs_raw={append_ratio:.2f}")
    print(f"sendfile_vs_raw={read_ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
