"""The Fetch handler's answer to a fetch that names a replica: only the broker itself, with its
current epoch (ReplicaState's ReplicaEpoch, KIP-903), is served as a follower. Any other such
fetch, a stale epoch, none (-1) or a version before 15, is answered NOT_LEADER_OR_FOLLOWER
for every partition, reads nothing, and leaves the leader's high watermark and ISR as they
were. Through the handler, on a real replica manager and log and a real metadata image."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from broker.handlers.context import NodeState
from broker.handlers.fetch import Handler
from broker.metadata import MetadataImage, PartitionChanged, PartitionState
from broker.metadata.image import TopicState
from broker.metadata.records import BrokerEndpoint, RegisterBrokerRecord, UnfenceBrokerRecord
from broker.protocol import ApiKey, ErrorCode, RequestHeader, build, request_type
from broker.protocol.messages import decode_request_body, encode_request_body, request_module
from broker.replica import ReplicaManager
from broker.replica.partition import Partition
from broker.server import RequestContext
from broker.storage import LogConfig, LogManager
from tests.support.requests import fill
from tests.unit.storage.logs import batch

CONFIG_BYTES = 1 << 20
TOPIC = TopicState("t", uuid.UUID(int=5))


class Leader:
    """Node 1 leading t-0 (replicas 1, 2, 3) with 3 records, brokers 1-3 registered."""

    def __init__(self, directory: Path, isr: tuple[int, ...]) -> None:
        config = LogConfig(segment_bytes=64 << 20)
        self.image = MetadataImage()
        offsets = itertools.count(20)
        for broker_id in (1, 2, 3):
            epoch = next(offsets)
            endpoint = BrokerEndpoint("PLAINTEXT", "localhost", 9090 + broker_id, 0)
            self.image.apply(
                RegisterBrokerRecord(broker_id, uuid.uuid4(), epoch, (endpoint,)), epoch
            )
            self.image.apply(UnfenceBrokerRecord(broker_id, epoch), next(offsets))
        self.logs = LogManager([directory], config)
        self.logs.startup(now_ms=0)
        self.replicas = ReplicaManager(1, self.logs, self.image, lambda _: config, lambda: 1_000)
        self.replicas.apply(PartitionChanged(TOPIC, 0, PartitionState((1, 2, 3), isr, 1, 0, 0)))
        self.isr_asked: list[tuple[int, ...]] = []
        self.replicas.on_isr_change = lambda _, wanted: self.isr_asked.append(wanted)
        assert self.replicas.append("t", 0, batch(3), acks=-1).error == ErrorCode.none
        state = SimpleNamespace(
            config=SimpleNamespace(
                max_incremental_fetch_session_cache_slots=1000, replica_lag_time_max_ms=30_000
            ),
            replicas=self.replicas,
            metadata=SimpleNamespace(image=self.image),
            topic_name=lambda topic_id: "t" if topic_id == TOPIC.topic_id else None,
        )
        self.handler = Handler(cast(NodeState, state))

    @property
    def partition(self) -> Partition:
        return self.replicas.partitions[("t", 0)]

    def epoch(self, broker_id: int) -> int:
        return self.image.brokers[broker_id].epoch

    def fetch(
        self, replica_id: int, replica_epoch: int, *, version: int = 17, topic_id: Any = None
    ) -> Any:
        """The partition's answer to a Fetch from offset 3 (this log's end) naming the
        replica; v12 has ReplicaId and no epoch."""
        partition = {
            "partition": 0,
            "current_leader_epoch": 0,
            "fetch_offset": 3,
            "last_fetched_epoch": -1,
            "log_start_offset": 0,
            "partition_max_bytes": CONFIG_BYTES,
        }
        values: dict[str, Any] = {
            "replica_id": replica_id,
            "max_wait": timedelta(0),
            "min_bytes": 0,
            "max_bytes": CONFIG_BYTES,
            "session_epoch": -1,
            "topics": [
                {"topic": "t", "topic_id": topic_id or TOPIC.topic_id, "partitions": [partition]}
            ],
            "forgotten_topics_data": [],
            "rack_id": "",
        }
        if version >= 15:  # a tagged struct, which `fill` leaves alone
            values["replica_state"] = build(
                request_module(ApiKey.FETCH, version).ReplicaState,
                replica_id=replica_id,
                replica_epoch=replica_epoch,
            )
        filled = fill(request_type(ApiKey.FETCH, version), values)
        body = decode_request_body(ApiKey.FETCH, version, encode_request_body(filled))
        context = RequestContext(RequestHeader(ApiKey.FETCH, version, 1, "unit"), "PLAINTEXT", "")
        response = asyncio.run(self.handler(context, body))
        return response.responses[0].partitions[0]


@pytest.fixture
def in_sync(tmp_path: Path) -> Iterator[Leader]:
    """Every replica in the ISR; replica 3 has fetched up to 3, replica 2 not at all."""
    leader = Leader(tmp_path, (1, 2, 3))
    leader.replicas.follower_fetched(leader.partition, 3, 3)
    yield leader
    leader.logs.shutdown(now_ms=2_000)


@pytest.fixture
def out_of_sync(tmp_path: Path) -> Iterator[Leader]:
    """Replica 2 is out of the ISR (1, 3); replica 3 has fetched up to 3."""
    leader = Leader(tmp_path, (1, 3))
    leader.replicas.follower_fetched(leader.partition, 3, 3)
    yield leader
    leader.logs.shutdown(now_ms=2_000)


def _refused(answer: Any) -> None:
    assert answer.error_code == ErrorCode.not_leader_or_follower
    assert (answer.high_watermark, answer.log_start_offset) == (-1, -1)
    assert not answer.records


def test_a_stale_epoch_does_not_move_the_high_watermark(in_sync: Leader) -> None:
    assert in_sync.partition.high_watermark == 0  # replica 2 has not fetched
    _refused(in_sync.fetch(2, in_sync.epoch(2) - 1))
    assert in_sync.partition.high_watermark == 0
    assert 2 not in in_sync.partition.follower_ends
    # The broker itself, with its epoch, moves it.
    answer = in_sync.fetch(2, in_sync.epoch(2))
    assert (answer.error_code, answer.high_watermark) == (ErrorCode.none, 3)


def test_a_fetch_without_an_epoch_is_refused_at_every_version(in_sync: Leader) -> None:
    _refused(in_sync.fetch(2, -1))
    _refused(in_sync.fetch(2, -1, version=12))  # ReplicaId, before ReplicaState
    _refused(in_sync.fetch(2, in_sync.epoch(2) + 1))  # a guess past it
    assert in_sync.partition.high_watermark == 0
    assert in_sync.partition.follower_ends == {3: 3}


def test_a_stale_epoch_does_not_join_the_isr(out_of_sync: Leader) -> None:
    _refused(out_of_sync.fetch(2, 0))
    assert out_of_sync.isr_asked == []
    # Caught up, with its epoch: the leader asks the controller to take it in.
    assert out_of_sync.fetch(2, out_of_sync.epoch(2)).error_code == ErrorCode.none
    assert out_of_sync.isr_asked == [(1, 2, 3)]


def test_a_consumer_fetch_is_not_a_replicas(in_sync: Leader) -> None:
    """Replica id -1 reads up to the high watermark, whatever the epoch field says."""
    answer = in_sync.fetch(-1, -1)
    assert (answer.error_code, answer.high_watermark) == (ErrorCode.none, 0)


def test_a_refused_fetch_of_an_unknown_topic_id_says_so(in_sync: Leader) -> None:
    answer = in_sync.fetch(2, 0, topic_id=uuid.UUID(int=99))
    assert answer.error_code == ErrorCode.unknown_topic_id
