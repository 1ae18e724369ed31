"""Produce: record batches appended to partition logs, as they came (offsets patched in place).

acks=0 gets no response at all; if such a request fails, the connection is closed so the
client notices, as Kafka does. acks=1 is answered once the batch is in the leader's log; acks=all
once every in-sync replica has it too (the high watermark passed it), or REQUEST_TIMED_OUT after
the request's timeout. Only the partition's leader appends: a follower answers
NOT_LEADER_OR_FOLLOWER.

From v13 topics come by id (KIP-516), resolved through the metadata image; an unknown id is
answered UNKNOWN_TOPIC_ID. From v10 a NOT_LEADER_OR_FOLLOWER partition names its current leader
and the response that leader's endpoint (KIP-951). v11 and v12 differ from v10 only in errors
and in transactions (KIP-890), which Gregor does not serve.
"""

from __future__ import annotations

import asyncio
import dataclasses
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
        failed: list[str] = []
        endpoints: dict[int, Any] = {}
        outcomes: list[tuple[Any, str | None, list[_Outcome]]] = []
        for topic in request.topic_data:
            if version >= FIRST_TOPIC_ID_VERSION:
                name = self._state.topic_name(topic.topic_id) if topic.topic_id else None
            else:
                name = topic.name
            partitions = []
            for data in topic.partition_data:
                partitions.append(await self._append(schema, version, acks, name, data))
            outcomes.append((topic, name, partitions))
        if acks == -1:
            await self._replicated(outcomes, request.timeout.total_seconds())
        topics = []
        for topic, name, partitions in outcomes:
            answers = []
            for outcome in partitions:
                error, info = outcome.error, outcome.info
                if error != ErrorCode.none:
                    failed.append(f"{name or topic.topic_id}-{outcome.index}: {error.name}")
                leader = None
                if (
                    error == ErrorCode.not_leader_or_follower
                    and name is not None
                    and version >= FIRST_CURRENT_LEADER_VERSION
                ):
                    found = self._state.current_leader(name, outcome.index, context.listener)
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
                answers.append(
                    build(
                        schema.PartitionProduceResponse,
                        index=outcome.index,
                        error_code=error,
                        base_offset=info.first_offset if info is not None else -1,
                        log_append_time=_append_time(info),
                        log_start_offset=info.log_start_offset if info is not None else -1,
                        record_errors=outcome.record_errors,
                        error_message=outcome.message,
                        **({} if leader is None else {"current_leader": leader}),
                    )
                )
            topics.append(
                build(
                    schema.TopicProduceResponse,
                    name=getattr(topic, "name", None),
                    topic_id=getattr(topic, "topic_id", None),
                    partition_responses=tuple(answers),
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

    async def _append(
        self, schema: Any, version: int, acks: int, name: str | None, data: Any
    ) -> _Outcome:
        if acks not in (0, 1, -1):
            return _Outcome(data.index, ErrorCode.invalid_required_acks)
        if name is None:
            return _Outcome(data.index, ErrorCode.unknown_topic_id)
        if name in INTERNAL_TOPICS:
            # The group coordinator appends to __consumer_offsets itself; a client's records
            # there would be read back as group state.
            return _Outcome(
                data.index,
                ErrorCode.invalid_topic_exception,
                f"Cannot append to internal topic {name}",
            )
        if data.records is None:
            return _Outcome(data.index, ErrorCode.corrupt_message, "no records")
        refused = _refused_records(version, data.records)
        if refused is not None:
            return _Outcome(data.index, *refused)
        result = await self._replicas.append_offloaded(name, data.index, data.records, acks)
        outcome = _Outcome(data.index, result.error, result.message, result.info, topic=name)
        # Per-record errors exist from v8 (KIP-467): every invalid record of the batch, so
        # that a client fails those and not the others; older clients get the code.
        if result.record_errors and version >= 8:
            outcome.record_errors = tuple(
                build(
                    schema.BatchIndexAndErrorMessage,
                    batch_index=batch_index,
                    batch_index_error_message=message,
                )
                for batch_index, message in result.record_errors
            )
        return outcome

    async def _replicated(
        self, outcomes: list[tuple[Any, str | None, list[_Outcome]]], timeout: float
    ) -> None:
        """acks=all: every appended partition is answered once its in-sync replicas have the
        batch (all waited for at once, within the request's timeout)."""
        appended = [
            outcome
            for _, _, partitions in outcomes
            for outcome in partitions
            if outcome.error == ErrorCode.none and outcome.info is not None and outcome.topic
        ]
        waiting = []
        for outcome in appended:
            end = outcome.info.last_offset + 1 if outcome.info else 0
            # Most answers are known at once (one replica, or quick followers): no task.
            now = self._replicas.replicated_now(outcome.topic or "", outcome.index, end)
            if now is None:
                waiting.append((outcome, end))
            elif now != ErrorCode.none:
                outcome.error, outcome.info = now, None
        if not waiting:
            return
        errors = await asyncio.gather(
            *(
                self._replicas.wait_for_replication(o.topic or "", o.index, end, timeout)
                for o, end in waiting
            )
        )
        for (outcome, _), error in zip(waiting, errors, strict=True):
            if error != ErrorCode.none:
                outcome.error = error
                outcome.info = None


@dataclasses.dataclass(slots=True)
class _Outcome:
    """One partition's produce, from its append to its answer."""

    index: int
    error: ErrorCode
    message: str | None = None
    info: AppendInfo | None = None
    record_errors: tuple[Any, ...] = ()
    topic: str | None = None


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
