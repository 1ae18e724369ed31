"""A replica fetch that is not the follower's own, on the wire, against three combined Gregor
nodes and three Apache Kafka 4.3 nodes (the Kafka run proves the scenario).

A follower is paused (SIGSTOP): it stays registered and in the ISR, so the leader's high
watermark stops where that follower last fetched from while acks=1 writes go on. A client then
sends a hand-built Fetch v17 naming the paused broker in ReplicaState, from the leader's log
end:

- with a stale broker epoch (0: every registration's epoch is a later metadata offset), both
  answer NOT_LEADER_OR_FOLLOWER and the high watermark stays (KIP-903; Kafka's
  `Replica.updateFetchStateOrThrow`);
- with no epoch (-1), Kafka takes the fetch as the follower's (it leaves forged replica fetches
  to its ClusterAction ACL) and the high watermark moves past records the paused follower does
  not have; Gregor, which has no authorizer, refuses it as well.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from broker.protocol import ApiKey, ErrorCode, build, request_type
from broker.protocol.messages import request_module
from broker.protocol.records import Record, build_batch
from tests.support.clusters import ThreeNodes, active_controller, shared_three_nodes
from tests.support.requests import fill
from tests.support.wire import call, now_ms, produce_values, topic_metadata

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SETTINGS = {
    "auto.leader.rebalance.enable": "false",
    "broker.session.timeout.ms": "30000",
}
"""Leaders stay put; a paused follower stays registered (and unfenced) while the scenario runs,
as it does in the ISR (`replica.lag.time.max.ms`, 30 s)."""
TOPIC = "forged-fetches"
MiB = 1 << 20


cluster = shared_three_nodes(SETTINGS)


def _wait(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as exc:  # a node that is electing answers with errors
            last = exc
        else:
            if last:
                return last
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")


def _address(cluster: ThreeNodes) -> tuple[str, int]:
    host, port = cluster.bootstrap.split(",")[0].rsplit(":", 1)
    return host, int(port)


def _in_sync(cluster: ThreeNodes) -> Any:
    """The topic's metadata once its partition has a leader and all three replicas in sync, as
    the leader itself sees it: a node's metadata can be ahead of the leader's, which then still
    refuses writes with NOT_LEADER_OR_FOLLOWER."""
    metadata = topic_metadata(_address(cluster), TOPIC)
    partition = metadata.topics[0].partitions[0]
    if partition.error_code != ErrorCode.none or sorted(partition.isr_nodes) != [1, 2, 3]:
        return None
    leader = next(b for b in metadata.brokers if b.node_id == partition.leader_id)
    own = topic_metadata((leader.host, leader.port), TOPIC).topics[0].partitions[0]
    if own.leader_id != partition.leader_id or own.leader_epoch != partition.leader_epoch:
        return None
    return metadata


def _latest(leader: tuple[str, int]) -> int:
    """The leader's answer to ListOffsets v7 (LATEST): its high watermark."""
    values = {
        "replica_id": -1,
        "topics": [
            {
                "name": TOPIC,
                "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": -1}],
            }
        ],
    }
    body = fill(request_type(ApiKey.LIST_OFFSETS, 7), values)
    answer = call(leader, ApiKey.LIST_OFFSETS, 7, body).topics[0].partitions[0]
    assert answer.error_code == ErrorCode.none, answer
    return int(answer.offset)


def _produce(leader: tuple[str, int], count: int, acks: int) -> int:
    batch = build_batch([Record(i, now_ms(), None, b"v%d" % i) for i in range(count)])
    values = produce_values(TOPIC, batch) | {"acks": acks}
    body = fill(request_type(ApiKey.PRODUCE, 9), values)
    answer = call(leader, ApiKey.PRODUCE, 9, body).responses[0].partition_responses[0]
    assert answer.error_code == ErrorCode.none, answer
    return int(answer.base_offset) + count


def _first_produce(leader: tuple[str, int], count: int) -> int:
    """`_produce` with acks=all, again while the leader answers NOT_LEADER_OR_FOLLOWER (nothing
    is written then): Kafka's leader serves its new metadata a moment before its replica manager
    takes the lead."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return _produce(leader, count, acks=-1)
        except AssertionError as refused:
            if "not_leader_or_follower" not in str(refused) or time.monotonic() > deadline:
                raise
        time.sleep(0.25)


def _forged_fetch(
    leader: tuple[str, int], topic_id: uuid.UUID, replica_id: int, epoch: int, offset: int
) -> Any:
    """A Fetch v17 naming `replica_id` with `epoch` in ReplicaState, from `offset`."""
    schema = request_module(ApiKey.FETCH, 17)
    values = {
        "replica_state": build(schema.ReplicaState, replica_id=replica_id, replica_epoch=epoch),
        "max_wait": timedelta(0),
        "min_bytes": 0,
        "max_bytes": MiB,
        "session_epoch": -1,
        "topics": [
            {
                "topic_id": topic_id,
                "partitions": [
                    {
                        "partition": 0,
                        "current_leader_epoch": -1,
                        "fetch_offset": offset,
                        "last_fetched_epoch": -1,
                        "log_start_offset": 0,
                        "partition_max_bytes": MiB,
                    }
                ],
            }
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }
    body = fill(request_type(ApiKey.FETCH, 17), values)
    return call(leader, ApiKey.FETCH, 17, body).responses[0].partitions[0]


def test_a_replica_fetch_with_a_stale_epoch_does_not_move_the_high_watermark(
    cluster: ThreeNodes,
) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, 1, 3)]).values():
        future.result(30)
    metadata = _wait("all three replicas in sync", lambda: _in_sync(cluster))
    partition = metadata.topics[0].partitions[0]
    brokers = {b.node_id: (b.host, b.port) for b in metadata.brokers}
    leader = brokers[partition.leader_id]
    # Not the active controller, if it can be helped: a paused controller stalls what is
    # forwarded to it, and the next one fences it once its session runs out.
    controller = active_controller(leader)
    followers = [r for r in partition.replica_nodes if r != partition.leader_id]
    follower = next((r for r in followers if r != controller), followers[0])
    topic_id = metadata.topics[0].topic_id

    end = _first_produce(leader, 3)
    _wait("the high watermark at 3", lambda: _latest(leader) == end == 3)
    cluster.pause(follower)
    try:
        end = _produce(leader, 2, acks=1)
        assert end == 5
        time.sleep(1)  # the other follower has fetched the 2 records by now
        held = _latest(leader)
        # the paused follower holds it (the partition as the cluster sees it, should not)
        assert held == 3, topic_metadata(leader, TOPIC).topics[0].partitions[0]

        stale = _forged_fetch(leader, topic_id, follower, 0, end)
        assert stale.error_code == ErrorCode.not_leader_or_follower
        assert not stale.records
        assert _latest(leader) == 3

        unsaid = _forged_fetch(leader, topic_id, follower, -1, end)
        if cluster.kind == "kafka":
            # Kafka takes -1 unchecked: a client moved the high watermark past records the
            # paused follower does not have.
            assert unsaid.error_code == ErrorCode.none
            assert _latest(leader) == 5
        else:
            assert unsaid.error_code == ErrorCode.not_leader_or_follower
            assert _latest(leader) == 3
    finally:
        cluster.resume(follower)
    # The follower itself, fetching again, moves it.
    _wait("the high watermark at 5 once the follower fetches", lambda: _latest(leader) == 5)
