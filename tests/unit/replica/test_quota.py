"""Replication throttles: the rate measured as Kafka's quotas measure it, and which
partitions a `*.replication.throttled.replicas` value throttles on a broker."""

from __future__ import annotations

from broker.replica.quota import ALL_PARTITIONS, ReplicationQuota, throttled_partitions


def test_a_burst_counts_over_ten_seconds_at_least_and_expires_after_eleven() -> None:
    quota = ReplicationQuota(limit=50_000)
    assert not quota.exceeded(100.0)
    quota.record(1_000_000, 100.2)
    # One megabyte at once is 100 kB/s over the ten seconds a rate is never measured under.
    assert quota.rate(100.3) == 100_000
    assert quota.exceeded(100.3)
    assert quota.exceeded(110.9)
    # Its one-second sample leaves the window of eleven: the follower may fetch again.
    assert quota.rate(111.0) == 0
    assert not quota.exceeded(111.0)


def test_samples_add_up_over_the_window_and_no_limit_is_never_exceeded() -> None:
    quota = ReplicationQuota()
    for second in range(20):
        quota.record(10_000, 1000.0 + second)
    # Eleven samples kept, from the start of the oldest (second 9) to now (19.5): 10.5 s.
    assert quota.rate(1019.5) == 110_000 / 10.5
    assert not quota.exceeded(1019.5)
    quota.limit = 10_000
    assert quota.exceeded(1019.5)


def test_throttled_partitions_are_those_listed_with_this_broker() -> None:
    assert throttled_partitions("0:1,1:2, 2 : 1", 1) == {0, 2}
    assert throttled_partitions("0:1,1:2", 2) == {1}
    assert throttled_partitions("0:1,1:2", 3) == frozenset()
    assert throttled_partitions(" * ", 3) is ALL_PARTITIONS
    assert throttled_partitions("", 1) == frozenset()
    assert throttled_partitions(None, 1) == frozenset()
