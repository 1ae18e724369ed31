"""The Produce handler's answer to a batch refused for some of its records, on the wire: from v8
every invalid record is listed in `record_errors` by its index in the batch (KIP-467), so that
librdkafka fails those records and not the whole batch as invalid; before v8 only the code
says it. The batches go through a real replica manager and log, so the answer is what the
storage layer's validation decided."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from broker.handlers.context import NodeState
from broker.handlers.produce import Handler
from broker.metadata import MetadataImage, PartitionState
from broker.protocol import ApiKey, ErrorCode, RequestHeader, request_type
from broker.protocol.messages import decode_response, encode_request
from broker.protocol.records import Record, build_batch
from broker.replica import ReplicaManager
from broker.replica.partition import Partition
from broker.server import Dispatcher
from broker.storage import LogConfig, LogManager
from tests.support.requests import fill

NOW = 1_700_000_000_000
HOUR = 3_600_000
COMPACTED = "profiles"
KEYLESS = "Compacted topic cannot accept message without key in topic partition"


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[ReplicaManager]:
    config = LogConfig(cleanup_policy=frozenset({"compact"}))
    logs = LogManager([tmp_path], config)
    logs.startup(now_ms=NOW)
    manager = ReplicaManager(1, logs, MetadataImage(), lambda _: config, lambda: NOW)
    log = logs.create_log(COMPACTED, 0, now_ms=NOW, config=config)
    state = PartitionState((1,), (1,), 1, 0, 0)
    manager.partitions[(COMPACTED, 0)] = Partition(COMPACTED, 0, log, state, 1)
    yield manager
    logs.shutdown(now_ms=NOW)


def _produce(replicas: ReplicaManager, batch: bytes, version: int) -> Any:
    """The partition's answer to a Produce (acks=1) of `batch`, through the dispatcher."""
    state = cast(NodeState, SimpleNamespace(replicas=replicas))
    dispatcher = Dispatcher({ApiKey.PRODUCE: Handler(state)})
    values = {
        "transactional_id": None,
        "acks": 1,
        "timeout": timedelta(seconds=10),
        "topic_data": [{"name": COMPACTED, "partition_data": [{"index": 0, "records": batch}]}],
    }
    body = fill(request_type(ApiKey.PRODUCE, version), values)
    frame = encode_request(RequestHeader(ApiKey.PRODUCE, version, 7, "unit"), body)[4:]
    answer = asyncio.run(dispatcher.dispatch(frame, "PLAINTEXT", "127.0.0.1:1"))
    assert isinstance(answer, bytes)
    response: Any
    _, response = decode_response(ApiKey.PRODUCE, version, answer[4:])
    return response.responses[0].partition_responses[0]


def _keyed(keys: list[bytes | None], timestamps: list[int] | None = None) -> bytes:
    stamps = timestamps or [NOW] * len(keys)
    return build_batch(
        [Record(i, ts, key, b"v") for i, (key, ts) in enumerate(zip(keys, stamps, strict=True))]
    )


def test_every_invalid_record_is_listed(replicas: ReplicaManager) -> None:
    """Kafka 4.3's answer to this batch, 3 keyless records of 5 on a compacted topic."""
    answer = _produce(replicas, _keyed([b"a", None, None, b"d", None]), version=9)
    assert answer.error_code == ErrorCode.invalid_record
    assert [(e.batch_index, e.batch_index_error_message) for e in answer.record_errors] == [
        (1, KEYLESS),
        (2, KEYLESS),
        (4, KEYLESS),
    ]
    assert answer.error_message.startswith(
        "One or more records have been rejected due to 3 record errors in total"
    )
    assert answer.base_offset == -1
    assert replicas.partitions[(COMPACTED, 0)].log.log_end_offset == 0


def test_late_and_keyless_records_are_listed_under_invalid_timestamp(
    replicas: ReplicaManager,
) -> None:
    late = NOW + 2 * HOUR
    answer = _produce(replicas, _keyed([None, b"b", b"c"], [NOW, NOW, late]), version=9)
    assert answer.error_code == ErrorCode.invalid_timestamp
    assert answer.error_message == "One or more records have been rejected due to invalid timestamp"
    (keyless, timestamp) = [
        (e.batch_index, e.batch_index_error_message) for e in answer.record_errors
    ]
    assert keyless == (0, KEYLESS)
    assert timestamp[0] == 2
    assert timestamp[1].startswith(f"Timestamp {late} of message with offset 2 is out of range")


def test_before_v8_only_the_code_says_it(replicas: ReplicaManager) -> None:
    answer = _produce(replicas, _keyed([b"a", None, None]), version=7)
    assert answer.error_code == ErrorCode.invalid_record
    assert not hasattr(answer, "record_errors") or answer.record_errors == ()
