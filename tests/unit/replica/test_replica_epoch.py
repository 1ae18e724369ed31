"""A replica fetch is a broker's only with that broker's current epoch (KIP-903's ReplicaEpoch,
checked against the registration in the leader's metadata image): an earlier process of the
broker, a fetch that says no epoch (-1, or a version before 15) and an id no broker has are all
refused NOT_LEADER_OR_FOLLOWER. On a real replica manager and metadata image, no network; the
Fetch handler's use of it (nothing read, the high watermark and the ISR left alone) is in
tests/unit/handlers/test_replica_fetch.py."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.metadata import MetadataImage
from broker.metadata.records import (
    BrokerEndpoint,
    FenceBrokerRecord,
    RegisterBrokerRecord,
    UnfenceBrokerRecord,
)
from broker.protocol import ErrorCode
from broker.replica import ReplicaManager
from broker.storage import LogConfig, LogManager

CONFIG = LogConfig(segment_bytes=64 << 20)
REFUSED = ErrorCode.not_leader_or_follower


class Cluster:
    """Brokers 1-3 registered and unfenced in one image, and node 1's replica manager."""

    def __init__(self, directory: Path) -> None:
        self.image = MetadataImage()
        self.offsets = itertools.count(10)
        for broker_id in (1, 2, 3):
            self.register(broker_id)
        self.logs = LogManager([directory], CONFIG)
        self.logs.startup(now_ms=0)
        self.leader = ReplicaManager(1, self.logs, self.image, lambda _: CONFIG, lambda: 1_000)

    def register(self, broker_id: int) -> int:
        """A (new) registration of `broker_id`, unfenced; its epoch, the record's offset as the
        controller gives it."""
        epoch = next(self.offsets)
        endpoint = BrokerEndpoint("PLAINTEXT", "localhost", 9090 + broker_id, 0)
        record = RegisterBrokerRecord(broker_id, uuid.uuid4(), epoch, (endpoint,))
        self.image.apply(record, epoch)
        self.image.apply(UnfenceBrokerRecord(broker_id, epoch), next(self.offsets))
        return epoch

    def epoch(self, broker_id: int) -> int:
        return self.image.brokers[broker_id].epoch


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path)
    yield made
    made.logs.shutdown(now_ms=2_000)


def test_a_replica_fetch_is_the_brokers_only_with_its_current_epoch(cluster: Cluster) -> None:
    epoch = cluster.epoch(2)
    assert cluster.leader.replica_fetch_error(2, epoch) is None
    # Kafka refuses an older epoch too (Replica.updateFetchStateOrThrow).
    assert cluster.leader.replica_fetch_error(2, epoch - 1) == REFUSED
    assert cluster.leader.replica_fetch_error(2, 0) == REFUSED
    # Stricter than Kafka, which takes these: a newer epoch (a guess), and none at all (-1,
    # as a fetch below v15 says it).
    assert cluster.leader.replica_fetch_error(2, epoch + 1) == REFUSED
    assert cluster.leader.replica_fetch_error(2, -1) == REFUSED
    # Another broker's epoch is not this one's.
    assert cluster.leader.replica_fetch_error(2, cluster.epoch(3)) == REFUSED


def test_a_broker_id_that_no_broker_has_is_refused(cluster: Cluster) -> None:
    assert cluster.leader.replica_fetch_error(7, cluster.epoch(2)) == REFUSED
    assert cluster.leader.replica_fetch_error(7, -1) == REFUSED


def test_a_broker_registered_again_is_refused_its_previous_processs_epoch(
    cluster: Cluster,
) -> None:
    before = cluster.epoch(2)
    after = cluster.register(2)  # restarted: a new process, a new epoch
    assert after != before
    assert cluster.leader.replica_fetch_error(2, before) == REFUSED
    assert cluster.leader.replica_fetch_error(2, after) is None


def test_a_fenced_broker_still_fetches_with_its_epoch(cluster: Cluster) -> None:
    """As in Kafka, a fenced broker catches up by fetching; it does not join an ISR until it is
    unfenced (`_isr_eligible`)."""
    epoch = cluster.epoch(2)
    cluster.image.apply(FenceBrokerRecord(2, epoch), next(cluster.offsets))
    assert cluster.image.brokers[2].fenced
    assert cluster.leader.replica_fetch_error(2, epoch) is None
