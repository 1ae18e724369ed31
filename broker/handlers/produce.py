"""Produce: record batches appended to partition logs, as they came (offsets patched in place).

acks=0 gets no response at all; if such a request fails, the connection is closed so the
client notices, as Kafka does. acks=1 and acks=all are answered once the batch is in the log
(and, for all, once the in-sync replicas have it — on one node, at once).

From v13 topics come by id (KIP-516), resolved through the metadata image; an unknown id is
answered UNKNOWN_TOPIC_ID. From v10 a NOT_LEADER_OR_FOLLOWER partition names its current leader
and the response that leader's endpoint (KIP-951). v11 and v12 differ from v10 only in errors
and in transactions (KIP-890), which Gregor does not serve.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from broker.metadata.image import INTERNAL_TOPICS
from broker.protocol import (
    ApiKey,
    Codec,
    ErrorCode,
    MalformedInput,
    ResponseBody,
    build,
    response_module,
)
from broker.protocol.records import read_batch_header
from broker.server import CloseConnection, RequestContext
from broker.storage import AppendInfo

from .context import NO_THROTTLE, NodeState

__all__ = ["Handler"]

FIRST_CURRENT_LEADER_VERSION = 10
FIRST_TOPIC_ID_VERSION = 13


class Handler:
    def __init__(self, state: NodeState) -> None:
        self._state = state
        self._replicas = state.replicas

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody | None:
        version = context.header.api_version
        schema = response_module(ApiKey.PRODUCE, version)
        acks = request.acks
        partition_type = schema.PartitionProduceResponse
        topics = []
        failed: list[str] = []
        endpoints: dict[int, Any] = {}
        for topic in request.topic_data:
            partitions = []
            if version >= FIRST_TOPIC_ID_VERSION:
                name = self._state.topic_name(topic.topic_id) if topic.topic_id else None
            else:
                name = topic.name
            for data in topic.partition_data:
                record_errors: tuple[Any, ...] = ()
                leader = None
                if acks not in (0, 1, -1):
                    error, message, info = ErrorCode.invalid_required_acks, None, None
                elif name is None:
                    error, message, info = ErrorCode.unknown_topic_id, None, None
                elif name in INTERNAL_TOPICS:
                    # The group coordinator appends to __consumer_offsets itself; a client's
                    # records there would be read back as group state.
                    error, info = ErrorCode.invalid_topic_exception, None
                    message = f"Cannot append to internal topic {name}"
                elif data.records is None:
                    error, message, info = ErrorCode.corrupt_message, "no records", None
                elif (refused := _refused_records(version, data.records)) is not None:
                    (error, message), info = refused, None
                else:
                    result = await self._replicas.append_offloaded(
                        name, data.index, data.records, acks
                    )
                    error, message, info = result.error, result.message, result.info
                    # Per-record errors exist from v8 (KIP-467); older clients get the code.
                    if result.batch_index is not None and version >= 8:
                        record_errors = (
                            build(
                                schema.BatchIndexAndErrorMessage,
                                batch_index=result.batch_index,
                                batch_index_error_message=message,
                            ),
                        )
                if error != ErrorCode.none:
                    failed.append(f"{name or topic.topic_id}-{data.index}: {error.name}")
                if (
                    error == ErrorCode.not_leader_or_follower
                    and name is not None
                    and version >= FIRST_CURRENT_LEADER_VERSION
                ):
                    found = self._state.current_leader(name, data.index, context.listener)
                    leader = build(
                        schema.LeaderIdAndEpoch,
                        leader_id=found.leader_id,
                        leader_epoch=found.leader_epoch,
                    )
                    if found.node is not None:
                        node_id, host, port, rack = found.node
                        endpoints[node_id] = build(
                            schema.NodeEndpoint, node_id=node_id, host=host, port=port, rack=rack
                        )
                partitions.append(
                    build(
                        partition_type,
                        index=data.index,
                        error_code=error,
                        base_offset=info.first_offset if info is not None else -1,
                        log_append_time=_append_time(info),
                        log_start_offset=info.log_start_offset if info is not None else -1,
                        record_errors=record_errors,
                        error_message=message,
                        **({} if leader is None else {"current_leader": leader}),
                    )
                )
            topics.append(
                build(
                    schema.TopicProduceResponse,
                    name=getattr(topic, "name", None),
                    topic_id=getattr(topic, "topic_id", None),
                    partition_responses=tuple(partitions),
                )
            )
        if acks == 0:
            if failed:
                raise CloseConnection(f"acks=0 produce failed: {', '.join(failed)}")
            return None
        response: ResponseBody = build(
            schema.ProduceResponse,
            responses=tuple(topics),
            throttle_time=NO_THROTTLE,
            node_endpoints=tuple(endpoints.values()),
        )
        return response


def _refused_records(version: int, records: bytes) -> tuple[ErrorCode, str] | None:
    """Kafka's checks of a partition's records before any append (`ProduceRequest.
    validateRecords`): exactly one batch, and zstd only from v7. A second batch would also take
    the append off the path that walks large and compressed batches on a thread."""
    try:
        header = read_batch_header(records)
    except MalformedInput:
        return None  # the append refuses it with the reason (CORRUPT_MESSAGE)
    if len(records) > header.size:
        return ErrorCode.invalid_record, (
            f"Produce requests with version {version} are only allowed to contain exactly one "
            "record batch per partition"
        )
    if version < 7 and header.codec is Codec.ZSTD:
        return ErrorCode.unsupported_compression_type, (
            f"Produce requests with version {version} are not allowed to use ZStandard compression"
        )
    return None


def _append_time(info: AppendInfo | None) -> datetime | None:
    """The broker time a LogAppendTime topic stamped the batch with (None: -1 on the wire)."""
    if info is None or info.log_append_time < 0:
        return None
    return datetime.fromtimestamp(info.log_append_time / 1000, UTC)
