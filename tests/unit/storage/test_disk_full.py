"""A write the disk cuts short, as a full disk does: the kernel's file size limit
(RLIMIT_FSIZE, with SIGXFSZ ignored) makes `pwritev` write part of a batch and stop, exactly
the short write ENOSPC gives, without a filesystem to fill. The append fails with
`LogDirFailure`, the partial batch is cut off at once, and nothing acknowledged is lost."""

from __future__ import annotations

import contextlib
import resource
import signal
from collections.abc import Iterator

import pytest

from broker.storage import LogConfig, LogDirFailure

from .logs import LogOpener, batch, consume, fill, offsets_of

FIRST_LOG = "00000000000000000000.log"
ROOMY = LogConfig(segment_bytes=1 << 20, index_interval_bytes=128)


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


@pytest.mark.parametrize("batches", [1, 3], ids=["one-batch", "three-batches"])
def test_a_short_write_leaves_no_torn_batch(open_log: LogOpener, batches: int) -> None:
    log = open_log(ROOMY)
    fill(log, 4)
    stored = consume(log)
    size = (open_log.directory / FIRST_LOG).stat().st_size
    payload = b"".join(batch(3, value=b"x" * 200) for _ in range(batches))
    with file_size_limit(size + 150), pytest.raises(LogDirFailure, match=r"short write|large"):
        log.append_as_leader(payload, leader_epoch=0, now_ms=1)
    assert (open_log.directory / FIRST_LOG).stat().st_size == size
    assert log.log_end_offset == 12
    assert consume(log) == stored
    log.close(now_ms=2)

    again = open_log(ROOMY, clean_shutdown=False)
    assert offsets_of(again) == list(range(12))
    again.append_as_leader(batch(1), leader_epoch=0, now_ms=3)
    assert offsets_of(again) == list(range(13))
    again.close(now_ms=4)
