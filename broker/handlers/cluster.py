"""DescribeCluster, DescribeLogDirs, DeleteRecords: what the cluster and its disks hold."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from broker.protocol import ApiKey, ErrorCode, ResponseBody, build, response_module
from broker.server import BUILT_OFF_LOOP_ENTRIES, BuiltOffLoop, RequestContext

from .context import AUTHORIZED_OPERATIONS_OMITTED, CLUSTER_OPERATIONS, NO_THROTTLE, NodeState
from .metadata import registered_brokers

__all__ = ["DeleteRecords", "DescribeCluster", "DescribeLogDirs", "UnregisterBroker"]


class DescribeCluster:
    def __init__(self, state: NodeState) -> None:
        self._state = state

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        schema = response_module(ApiKey.DESCRIBE_CLUSTER, context.header.api_version)
        endpoint_type = getattr(request, "endpoint_type", 1)
        if endpoint_type != 1:
            response: ResponseBody = build(
                schema.DescribeClusterResponse,
                throttle_time=NO_THROTTLE,
                error_code=ErrorCode.unsupported_endpoint_type,
                error_message="Only brokers are described (endpoint type 1)",
                endpoint_type=endpoint_type,
                cluster_id=self._state.cluster_id,
                controller_id=-1,
                brokers=(),
                cluster_authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
            )
            return response
        # v2 (KIP-1073): fenced brokers too when asked, each marked; before, live ones only.
        with_fenced = getattr(request, "include_fenced_brokers", False)
        brokers = tuple(
            build(schema.DescribeClusterBroker, broker_id=i, host=h, port=p, rack=r, is_fenced=f)
            for i, h, p, r, f in registered_brokers(self._state, context.listener, with_fenced)
        )
        response = build(
            schema.DescribeClusterResponse,
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.none,
            error_message=None,
            endpoint_type=1,
            cluster_id=self._state.cluster_id,
            controller_id=self._state.controller_id,
            brokers=brokers,
            cluster_authorized_operations=CLUSTER_OPERATIONS
            if getattr(request, "include_cluster_authorized_operations", False)
            else AUTHORIZED_OPERATIONS_OMITTED,
        )
        return response


class DescribeLogDirs:
    def __init__(self, state: NodeState) -> None:
        self._state = state

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody | BuiltOffLoop:
        schema = response_module(ApiKey.DESCRIBE_LOG_DIRS, context.header.api_version)
        logs = self._state.replicas.logs
        wanted: dict[str, set[int]] | None = None
        if request.topics is not None:
            wanted = {t.topic: set(t.partitions) for t in request.topics}
        # Per log dir: None if offline, else its partitions' (topic, index, size) and its
        # (total, usable) bytes, as they are now; the answer is built from these alone.
        found: dict[Path, list[tuple[str, int, int]] | None] = {}
        usage: dict[Path, tuple[int, int]] = {}
        for log_dir in logs.log_dirs:
            if log_dir in logs.offline_dirs:
                found[log_dir] = None
                continue
            found[log_dir] = []
            disk = os.statvfs(log_dir)
            usage[log_dir] = (disk.f_blocks * disk.f_frsize, disk.f_bavail * disk.f_frsize)
        for (topic, index), log_ in logs:
            if wanted is not None and index not in wanted.get(topic, ()):
                continue
            hosted = found.get(logs.log_dir_of(topic, index))
            if hosted is not None:
                hosted.append((topic, index, log_.size_in_bytes))

        def answer() -> ResponseBody:
            response: ResponseBody = build(
                schema.DescribeLogDirsResponse,
                throttle_time=NO_THROTTLE,
                error_code=ErrorCode.none,
                results=tuple(
                    _log_dir_result(schema, log_dir, hosted, usage.get(log_dir, (0, 0)))
                    for log_dir, hosted in found.items()
                ),
            )
            return response

        entries = sum(len(hosted) for hosted in found.values() if hosted is not None)
        return BuiltOffLoop(answer) if entries >= BUILT_OFF_LOOP_ENTRIES else answer()


def _log_dir_result(
    schema: Any, log_dir: Path, hosted: list[tuple[str, int, int]] | None, usage: tuple[int, int]
) -> Any:
    if hosted is None:
        return build(
            schema.DescribeLogDirsResult,
            error_code=ErrorCode.kafka_storage_error,
            log_dir=str(log_dir),
            topics=(),
        )
    by_topic: dict[str, list[Any]] = {}
    for topic, index, size in hosted:
        by_topic.setdefault(topic, []).append(
            build(
                schema.DescribeLogDirsPartition,
                partition_index=index,
                partition_size=size,
                offset_lag=0,
                is_future_key=False,
            )
        )
    return build(
        schema.DescribeLogDirsResult,
        error_code=ErrorCode.none,
        log_dir=str(log_dir),
        topics=tuple(
            build(schema.DescribeLogDirsTopic, name=name, partitions=tuple(parts))
            for name, parts in sorted(by_topic.items())
        ),
        total_bytes=usage[0],
        usable_bytes=usage[1],
        # v5 (KIP-1066): a cordoned dir takes no new partitions; Gregor has no
        # `cordoned.log.dirs`, so none is.
        is_cordoned=False,
    )


class DeleteRecords:
    def __init__(self, state: NodeState) -> None:
        self._replicas = state.replicas

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        """Each leader's log start moves at once; the answer comes once every live replica's
        has followed (Kafka's DelayedDeleteRecords), or at the request's timeout with
        REQUEST_TIMED_OUT, so a leader lost right after never brings the records back."""
        schema = response_module(ApiKey.DELETE_RECORDS, context.header.api_version)
        timeout = max(request.timeout.total_seconds(), 0.0)
        waits = []
        for topic in request.topics:
            for wanted in topic.partitions:
                index = wanted.partition_index
                error, start = self._replicas.delete_records(topic.name, index, wanted.offset)
                waits.append(self._replicated(topic.name, index, error, start, timeout))
        answers = iter(await asyncio.gather(*waits))
        topics = []
        for topic in request.topics:
            partitions = []
            for wanted in topic.partitions:
                error, low_watermark = next(answers)
                partitions.append(
                    build(
                        schema.DeleteRecordsPartitionResult,
                        partition_index=wanted.partition_index,
                        low_watermark=low_watermark,
                        error_code=error,
                    )
                )
            topics.append(
                build(
                    schema.DeleteRecordsTopicResult, name=topic.name, partitions=tuple(partitions)
                )
            )
        response: ResponseBody = build(
            schema.DeleteRecordsResponse, throttle_time=NO_THROTTLE, topics=tuple(topics)
        )
        return response

    async def _replicated(
        self, topic: str, index: int, error: ErrorCode, start: int, timeout: float
    ) -> tuple[ErrorCode, int]:
        if error != ErrorCode.none:
            return error, -1
        return await self._replicas.wait_for_low_watermark(topic, index, start, timeout)


class UnregisterBroker:
    """UnregisterBroker (`kafka-cluster unregister`, Admin.unregisterBroker): a broker removed
    for good, decided by the active controller (brokers forward it there)."""

    def __init__(self, state: NodeState) -> None:
        self._state = state

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        schema = response_module(ApiKey.UNREGISTER_BROKER, context.header.api_version)
        error, message = await self._state.metadata.unregister(request.broker_id)
        response: ResponseBody = build(
            schema.UnregisterBrokerResponse,
            throttle_time=NO_THROTTLE,
            error_code=error,
            error_message=message,
        )
        return response
