"""Replication throttles (KIP-73): the bytes a leader sends to, and a follower fetches for,
replicas that are catching up (a reassignment's new replicas) are held to a rate, so that a
move does not starve the clients and the in-sync followers.

What is throttled: on the leader, partitions that `leader.replication.throttled.replicas`
lists with this broker's id (`partition:broker` pairs, or `*` for all); on the follower, those
`follower.replication.throttled.replicas` lists with its id. Only replicas out of the ISR are
held back: the in-sync ones always replicate. The rates are the brokers' dynamic
`leader.replication.throttled.rate` and `follower.replication.throttled.rate`, in bytes per
second, measured as Kafka's quotas measure them: over 11 one-second samples, and never over
less than 10 seconds (`replication.quota.window.num`, `.window.size.seconds`), so that one
fetch of a megabyte does not count as a megabyte per millisecond.
"""

from __future__ import annotations

import functools

__all__ = ["ALL_PARTITIONS", "ReplicationQuota", "throttled_partitions"]

WINDOW_NUM = 11
"""`replication.quota.window.num`'s default."""
WINDOW_S = 1.0
"""`replication.quota.window.size.seconds`'s default."""

ALL_PARTITIONS: frozenset[int] = frozenset({-1})
"""`throttled_partitions` of `*`: every partition of the topic."""


class ReplicationQuota:
    """Bytes per second over a sliding window of samples; `limit` None: unthrottled."""

    def __init__(self, limit: float | None = None) -> None:
        self.limit = limit
        self._samples: list[tuple[float, int]] = []
        """(start of the sample's second, bytes recorded in it), oldest first."""

    def record(self, size: int, now: float) -> None:
        if size <= 0:
            return
        start = now - now % WINDOW_S
        if self._samples and self._samples[-1][0] == start:
            self._samples[-1] = (start, self._samples[-1][1] + size)
        else:
            self._samples.append((start, size))
        self._expire(now)

    def rate(self, now: float) -> float:
        """Bytes per second over the samples kept, as Kafka's `Rate` (elapsed from the oldest
        sample's start, at least `WINDOW_NUM - 1` windows)."""
        self._expire(now)
        if not self._samples:
            return 0.0
        elapsed = max(now - self._samples[0][0], (WINDOW_NUM - 1) * WINDOW_S)
        return sum(size for _, size in self._samples) / elapsed

    def exceeded(self, now: float) -> bool:
        return self.limit is not None and self.rate(now) > self.limit

    def _expire(self, now: float) -> None:
        oldest = now - WINDOW_NUM * WINDOW_S
        while self._samples and self._samples[0][0] <= oldest:
            self._samples.pop(0)


@functools.lru_cache(maxsize=1024)
def throttled_partitions(value: str | None, broker_id: int) -> frozenset[int]:
    """The partitions a `*.replication.throttled.replicas` value throttles on `broker_id`:
    those listed with it (`0:1,1:2`), `ALL_PARTITIONS` for `*`, none for an empty value. The
    value was checked when it was set (`broker.metadata.configs`)."""
    if not value or not value.strip():
        return frozenset()
    if value.strip() == "*":
        return ALL_PARTITIONS
    found = set()
    for pair in value.split(","):
        partition, _, broker = pair.strip().partition(":")
        if broker.strip() == str(broker_id):
            found.add(int(partition))
    return frozenset(found)
