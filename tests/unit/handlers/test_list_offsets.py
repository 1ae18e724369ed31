"""The ListOffsets handler's answer from a new leader whose high watermark has not caught up
with its epoch's start (`ReplicaManager.list_offset`): OFFSET_NOT_AVAILABLE from v5, and
LEADER_NOT_AVAILABLE before, which does not know that error (Kafka's ReplicaManager.fetchOffset);
both retriable, so clients ask again. EARLIEST is answered meanwhile. Through the handler, on a
real replica manager and log."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from broker.handlers.context import NodeState
from broker.handlers.list_offsets import Handler
from broker.metadata import MetadataImage, PartitionChanged, PartitionState
from broker.metadata.image import TopicState
from broker.protocol import ApiKey, ErrorCode, RequestHeader, request_type
from broker.protocol.messages import decode_request_body, encode_request_body
from broker.replica import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, ReplicaManager
from broker.server import RequestContext
from broker.storage import LogConfig, LogManager
from tests.support.requests import fill
from tests.unit.storage.logs import batch

TOPIC = TopicState("t", uuid.UUID(int=6))


@pytest.fixture
def new_leader(tmp_path: Path) -> Iterator[ReplicaManager]:
    """Node 2, which followed node 1 and has 3 records but not their high watermark, elected
    leader of t-0 with node 1 still in the ISR (it has not fetched from node 2 yet)."""
    config = LogConfig(segment_bytes=64 << 20)
    logs = LogManager([tmp_path], config)
    logs.startup(now_ms=0)
    replicas = ReplicaManager(2, logs, MetadataImage(), lambda _: config, lambda: 1_000)
    replicas.apply(PartitionChanged(TOPIC, 0, PartitionState((1, 2), (1, 2), 1, 0, 0)))
    partition = replicas.partitions[("t", 0)]
    assert replicas.append_from_leader(partition, batch(3, epoch=0), 0).error == ErrorCode.none
    replicas.apply(PartitionChanged(TOPIC, 0, PartitionState((1, 2), (1, 2), 2, 1, 1)))
    assert (partition.high_watermark, partition.leader_start_offset) == (0, 3)
    yield replicas
    logs.shutdown(now_ms=2_000)


def _list(replicas: ReplicaManager, version: int, timestamp: int) -> Any:
    values = {
        "replica_id": -1,
        "timeout": timedelta(seconds=10),
        "topics": [
            {
                "name": "t",
                "partitions": [
                    {"partition_index": 0, "current_leader_epoch": -1, "timestamp": timestamp}
                ],
            }
        ],
    }
    filled = fill(request_type(ApiKey.LIST_OFFSETS, version), values)
    body = decode_request_body(ApiKey.LIST_OFFSETS, version, encode_request_body(filled))
    context = RequestContext(RequestHeader(ApiKey.LIST_OFFSETS, version, 1, "unit"), "P", "")
    state = cast(NodeState, SimpleNamespace(replicas=replicas))
    response: Any = asyncio.run(Handler(state)(context, body))
    return response.topics[0].partitions[0]


@pytest.mark.parametrize("version", [5, 7, 10])
def test_latest_is_not_available_until_the_high_watermark_catches_up(
    new_leader: ReplicaManager, version: int
) -> None:
    answer = _list(new_leader, version, LATEST_TIMESTAMP)
    assert (answer.error_code, answer.offset) == (ErrorCode.offset_not_available, -1)
    # Node 1 fetches from 3 (it has what node 2 has): the high watermark is there.
    new_leader.follower_fetched(new_leader.partitions[("t", 0)], 1, 3)
    answer = _list(new_leader, version, LATEST_TIMESTAMP)
    assert (answer.error_code, answer.offset) == (ErrorCode.none, 3)


@pytest.mark.parametrize("version", [1, 4])
def test_versions_before_5_are_told_the_leader_is_not_available(
    new_leader: ReplicaManager, version: int
) -> None:
    assert _list(new_leader, version, LATEST_TIMESTAMP).error_code == (
        ErrorCode.leader_not_available
    )


def test_earliest_is_answered_meanwhile(new_leader: ReplicaManager) -> None:
    answer = _list(new_leader, 7, EARLIEST_TIMESTAMP)
    assert (answer.error_code, answer.offset) == (ErrorCode.none, 0)
