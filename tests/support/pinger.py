"""A well-behaved client beside a hostile load: ApiVersions round trips from a process of its own.

What it owns: the pinger process and the latency figures of its samples. The pinger is spawned,
so nothing in the test process (load generators, sampler threads, the GIL) delays its requests.
It sends ApiVersions v3 on one connection, one request at a time, one due every 10 ms, and times
each from when it was *due*: when the broker stalls, the requests that fell due meanwhile are
sent as soon as the previous one is answered and count as having waited since their due time,
so a 2 s stall weighs as the 200 requests a client would have waited on, not as one sample (no
coordinated omission). A request the broker does not answer (closed connection, no answer
within `ANSWER_TIMEOUT_S`) is a failure and the pinger reconnects. `bench/responsiveness.py`
measures the same way for Gregor against Kafka; tests never import bench/.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import multiprocessing.connection
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from broker.protocol import ApiKey, RequestHeader, build, encode_request, request_type
from tests.support.wire import exchange

__all__ = ["PING_INTERVAL_S", "Latency", "Sample", "latency", "pinging"]

PING_INTERVAL_S = 0.010
ANSWER_TIMEOUT_S = 10.0
"""A round trip slower than this is a failure, not a sample: the broker has stopped serving."""
_START_TIMEOUT_S = 30.0
"""Spawning a Python process and importing the codec takes about a second on an idle machine."""


@dataclass(frozen=True, slots=True)
class Sample:
    due: float
    """`time.monotonic()` when the request was due (system-wide on Linux, so comparable)."""
    seconds: float
    """From `due` until the answer arrived (or the failure was noticed)."""
    answered: bool


@dataclass(frozen=True, slots=True)
class Latency:
    round_trips: int
    failures: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    def __str__(self) -> str:
        return (
            f"p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms, max {self.max_ms:.1f} ms "
            f"over {self.round_trips} round trips ({self.failures} failed)"
        )


def _percentile(ascending: Sequence[float], fraction: float) -> float:
    """Nearest rank: the smallest value with at least `fraction` of the values at or below."""
    if not ascending:
        return 0.0
    rank = max(1, math.ceil(round(fraction * len(ascending), 9)))
    return ascending[min(rank, len(ascending)) - 1]


def latency(samples: Sequence[Sample]) -> Latency:
    milliseconds = sorted(sample.seconds * 1000 for sample in samples)
    return Latency(
        round_trips=len(samples),
        failures=sum(1 for sample in samples if not sample.answered),
        p50_ms=_percentile(milliseconds, 0.50),
        p99_ms=_percentile(milliseconds, 0.99),
        max_ms=milliseconds[-1] if milliseconds else 0.0,
    )


# -- the pinger process ----------------------------------------------------------------------------


def _round_trip(sock: socket.socket, frame: bytes) -> None:
    if exchange(sock, frame) is None:
        raise ConnectionError("the broker closed the pinger's connection")


def _ping(host: str, port: int, control: multiprocessing.connection.Connection) -> None:
    """Warm up with one untimed round trip, say "ready", then ping on schedule until `control`
    receives anything. Requests that fell due before then and were not sent yet (the broker
    was slow) are still sent and timed, so that a stall at the end counts in full; after a
    failure among them, the rest count as failed. Then send back the samples as (due, seconds,
    answered) tuples."""
    body = build(
        request_type(ApiKey.API_VERSIONS, 3),
        client_software_name="gregor-tests-pinger",
        client_software_version="1",
    )
    correlation_ids = iter(range(1, 1 << 31))
    sock: socket.socket | None = None
    samples: list[tuple[float, float, bool]] = []

    def ping(due: float) -> bool:
        nonlocal sock
        header = RequestHeader(ApiKey.API_VERSIONS, 3, next(correlation_ids), "pinger")
        try:
            sock = sock or socket.create_connection((host, port), ANSWER_TIMEOUT_S)
            _round_trip(sock, encode_request(header, body))
        except OSError:
            if sock is not None:
                sock.close()
            sock = None
            samples.append((due, time.monotonic() - due, False))
            return False
        samples.append((due, time.monotonic() - due, True))
        return True

    try:
        ping(time.monotonic())
        if not samples[0][2]:
            raise ConnectionError(f"the pinger could not reach {host}:{port}")
        samples.clear()
        control.send("ready")
        due = time.monotonic()
        while not control.poll(max(0.0, due - time.monotonic())):
            ping(due)
            due += PING_INTERVAL_S
        stopped = time.monotonic()
        while due <= stopped and ping(due):
            due += PING_INTERVAL_S
        failed = time.monotonic()
        while (due := due + PING_INTERVAL_S) <= stopped:
            samples.append((due, failed - due, False))
    finally:
        if sock is not None:
            sock.close()
    control.send(samples)


@contextlib.contextmanager
def pinging(port: int, host: str = "localhost") -> Iterator[list[Sample]]:
    """Ping the broker for the block; the yielded list holds the samples once the block ends.
    The block starts only once the pinger has had its first answer."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=_ping, args=(host, port, theirs), name="pinger")
    process.start()
    theirs.close()  # so that a pinger which dies is seen as end of file, not as silence
    samples: list[Sample] = []
    try:
        if not ours.poll(_START_TIMEOUT_S):
            raise RuntimeError(f"the pinger was not answered within {_START_TIMEOUT_S} s")
        assert ours.recv() == "ready"
        yield samples
        ours.send("stop")
        if not ours.poll(ANSWER_TIMEOUT_S + 5):
            raise RuntimeError("the pinger did not report its samples")
        samples.extend(Sample(*sample) for sample in ours.recv())
        process.join(5)
    finally:
        # Still running only when the block or the pinger failed: its samples are not wanted.
        if process.is_alive():
            process.kill()
        process.join()
        process.close()
        ours.close()
