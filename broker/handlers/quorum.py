"""The controller listener's handlers: the metadata quorum's own requests (Vote,
BeginQuorumEpoch, EndQuorumEpoch, Fetch and FetchSnapshot of `__cluster_metadata`),
DescribeQuorum, which `kafka-metadata-quorum` sends, and the brokers' BrokerRegistration and
BrokerHeartbeat.

Client listeners have no handler for any of these but DescribeQuorum, which they forward to
the active controller as Kafka 4's brokers do (`kafka-metadata-quorum --bootstrap-server`); the
others are neither advertised nor served there: a client that sends one anyway has its
connection closed, as for any API a listener does not serve.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from broker.forwarding import BROKER_PRINCIPAL
from broker.kraft import MetadataService, NotController
from broker.metadata.brokers import Heartbeat, HeartbeatAnswer, Registration, RegistrationAnswer
from broker.metadata.elections import IsrChange
from broker.metadata.records import BrokerEndpoint
from broker.protocol import ApiKey, ErrorCode, MalformedInput, ResponseBody, build, response_module
from broker.quorum import METADATA_TOPIC
from broker.server import CloseConnection, Dispatcher, Handler, RequestContext

from . import api_versions
from .errors import error_response

__all__ = ["CONTROLLER_APIS", "build_controller_dispatcher"]

log = logging.getLogger(__name__)

CONTROLLER_APIS = frozenset(
    {
        ApiKey.API_VERSIONS,
        ApiKey.VOTE,
        ApiKey.BEGIN_QUORUM_EPOCH,
        ApiKey.END_QUORUM_EPOCH,
        ApiKey.FETCH,
        ApiKey.FETCH_SNAPSHOT,
        ApiKey.DESCRIBE_QUORUM,
        ApiKey.BROKER_REGISTRATION,
        ApiKey.BROKER_HEARTBEAT,
        ApiKey.ALTER_PARTITION,
        ApiKey.ALLOCATE_PRODUCER_IDS,
        ApiKey.DESCRIBE_CLUSTER,
        ApiKey.ENVELOPE,
    }
)
CONTROLLER_ENDPOINTS = 2
"""DescribeCluster's endpoint type for controllers (1: brokers)."""


class QuorumRequest:
    """A peer's quorum request, answered by the quorum driver."""

    def __init__(self, metadata: MetadataService) -> None:
        self._metadata = metadata

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        header = context.header
        try:
            return await self._metadata.driver.handle(header.api_key, header.api_version, request)
        except MalformedInput as exc:
            what = f"{type(request).__name__} from {context.client_address}"
            raise CloseConnection(f"{what}: {exc}") from None


class DescribeQuorum:
    """The quorum as its leader sees it: epoch, high watermark, each voter's and observer's
    log end offset and last fetch; NOT_LEADER_OR_FOLLOWER elsewhere (as in Kafka)."""

    def __init__(self, metadata: MetadataService) -> None:
        self._metadata = metadata

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        schema = response_module(ApiKey.DESCRIBE_QUORUM, context.header.api_version)
        driver = self._metadata.driver
        status = driver.status()
        leading = driver.is_active

        def replicas(progress: dict[int, tuple[int, int]]) -> tuple[Any, ...]:
            return tuple(
                build(
                    schema.ReplicaState,
                    replica_id=node,
                    replica_directory_id=None,
                    log_end_offset=end,
                    last_fetch_timestamp=fetched,
                    last_caught_up_timestamp=fetched if end >= status.high_watermark else -1,
                )
                for node, (end, fetched) in sorted(progress.items())
            )

        partition = build(
            schema.PartitionData,
            partition_index=0,
            error_code=ErrorCode.none if leading else ErrorCode.not_leader_or_follower,
            error_message=None,
            leader_id=-1 if status.leader is None else status.leader,
            leader_epoch=status.epoch,
            high_watermark=status.high_watermark,
            current_voters=replicas(status.voters) if leading else (),
            observers=replicas(status.observers) if leading else (),
        )
        names = self._metadata.config.controller_listener_names
        listener = names[0] if names else "CONTROLLER"
        nodes = tuple(  # v2+ (KIP-853); v0 and v1 have no Node
            build(
                schema.Node,
                node_id=voter,
                listeners=(
                    build(
                        schema.Listener,
                        name=listener,
                        host=host,
                        port=port,
                    ),
                ),
            )
            for voter, (host, port) in sorted(driver.voters.items())
            if hasattr(schema, "Node")
        )
        topic = build(schema.TopicData, topic_name=METADATA_TOPIC, partitions=(partition,))
        response: ResponseBody = build(
            schema.DescribeQuorumResponse,
            error_code=ErrorCode.none,
            error_message=None,
            topics=(topic,),
            nodes=nodes,
        )
        return response


class BrokerRegistration:
    """A broker registers with the active controller (KIP-631)."""

    def __init__(self, metadata: MetadataService) -> None:
        self._metadata = metadata

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = context.header.api_version
        schema = response_module(ApiKey.BROKER_REGISTRATION, version)
        registration = Registration(
            broker_id=request.broker_id,
            incarnation_id=request.incarnation_id,
            cluster_id=request.cluster_id,
            listeners=tuple(
                BrokerEndpoint(lst.name, lst.host, lst.port, lst.security_protocol)
                for lst in request.listeners
            ),
            rack=request.rack,
            log_dirs=tuple(getattr(request, "log_dirs", ())),
            previous_broker_epoch=getattr(request, "previous_broker_epoch", -1),
        )
        try:
            answer = await self._metadata.register(registration)
        except NotController:
            answer = RegistrationAnswer(ErrorCode.not_controller)
        if answer.error != ErrorCode.none:
            log.warning(
                "refused to register broker %d from %s: %s",
                request.broker_id,
                context.client_address,
                answer.message or answer.error.name,
            )
        response: ResponseBody = build(
            schema.BrokerRegistrationResponse,
            throttle_time=timedelta(0),
            error_code=answer.error,
            broker_epoch=answer.broker_epoch,
        )
        return response


class BrokerHeartbeat:
    """A registered broker's heartbeat to the active controller (KIP-631)."""

    def __init__(self, metadata: MetadataService) -> None:
        self._metadata = metadata

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        schema = response_module(ApiKey.BROKER_HEARTBEAT, context.header.api_version)
        beat = Heartbeat(
            request.broker_id,
            request.broker_epoch,
            request.current_metadata_offset,
            want_fence=bool(request.want_fence),
            want_shut_down=bool(request.want_shut_down),
        )
        try:
            answer = await self._metadata.heartbeat(beat)
        except NotController:
            answer = HeartbeatAnswer(ErrorCode.not_controller)
        response: ResponseBody = build(
            schema.BrokerHeartbeatResponse,
            throttle_time=timedelta(0),
            error_code=answer.error,
            is_caught_up=answer.is_caught_up,
            is_fenced=answer.is_fenced,
            should_shut_down=answer.should_shut_down,
        )
        return response


class DescribeControllers:
    """DescribeCluster on the controller listener (KIP-919): the controllers, for an admin
    client given `bootstrap.controllers` (`kafka-metadata-quorum --bootstrap-controller`).
    Brokers are described on the broker listeners only, as in Kafka."""

    def __init__(self, metadata: MetadataService, cluster_id: str) -> None:
        self._metadata = metadata
        self._cluster_id = cluster_id

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        schema = response_module(ApiKey.DESCRIBE_CLUSTER, context.header.api_version)
        endpoint_type = getattr(request, "endpoint_type", 1)
        driver = self._metadata.driver
        if endpoint_type != CONTROLLER_ENDPOINTS:
            response: ResponseBody = build(
                schema.DescribeClusterResponse,
                throttle_time=timedelta(0),
                error_code=ErrorCode.mismatched_endpoint_type,
                error_message="The request was sent to an endpoint of type CONTROLLER, but we "
                "wanted an endpoint of type BROKER",
                endpoint_type=endpoint_type,
                cluster_id=self._cluster_id,
                controller_id=-1,
                brokers=(),
                cluster_authorized_operations=-2147483648,
            )
            return response
        leader = driver.leader
        controllers = tuple(
            build(
                schema.DescribeClusterBroker,
                broker_id=voter,
                host=host,
                port=port,
                rack=None,
                is_fenced=False,
            )
            for voter, (host, port) in sorted(driver.voters.items())
        )
        response = build(
            schema.DescribeClusterResponse,
            throttle_time=timedelta(0),
            error_code=ErrorCode.none,
            error_message=None,
            endpoint_type=CONTROLLER_ENDPOINTS,
            cluster_id=self._cluster_id,
            controller_id=-1 if leader is None else leader,
            brokers=controllers,
            cluster_authorized_operations=-2147483648,
        )
        return response


class Envelope:
    """A request a broker forwarded (KIP-590): the client's frame is handled here by the
    client listeners' handlers, never forwarded again, and its response frame goes back
    whole."""

    def __init__(self, client: Callable[[], Dispatcher | None]) -> None:
        self._client = client

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        schema = response_module(ApiKey.ENVELOPE, context.header.api_version)
        client = self._client()
        data: bytes | None = None
        error = ErrorCode.none
        if client is None:
            error = ErrorCode.not_controller  # still starting: the broker retries
        else:
            try:
                frame = await client.dispatch(
                    request.request_data,
                    "envelope",
                    context.client_address,
                    forward=False,
                    from_broker=request.request_principal == BROKER_PRINCIPAL,
                )
            except CloseConnection as exc:
                log.warning("forwarded request from %s refused: %s", context.client_address, exc)
                frame, error = None, ErrorCode.invalid_request
            if isinstance(frame, bytes | bytearray):
                data = bytes(frame[4:])  # without its size: the broker frames it again
            elif frame is not None:
                error = ErrorCode.invalid_request  # a Fetch: never forwarded
        response: ResponseBody = build(
            schema.EnvelopeResponse, response_data=data, error_code=error
        )
        return response


class AlterPartition:
    """A partition leader asks the active controller to change its ISR (KIP-497, KIP-903)."""

    def __init__(self, metadata: MetadataService) -> None:
        self._metadata = metadata

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = context.header.api_version
        schema = response_module(ApiKey.ALTER_PARTITION, version)
        changes = [
            IsrChange(
                topic.topic_id,
                partition.partition_index,
                partition.leader_epoch,
                partition.partition_epoch,
                tuple((m.broker_id, m.broker_epoch) for m in partition.new_isr_with_epochs)
                if version >= 3
                else tuple((m, -1) for m in partition.new_isr),
            )
            for topic in request.topics
            for partition in topic.partitions
        ]
        try:
            error, answers = await self._metadata.alter_isr(
                request.broker_id, request.broker_epoch, changes
            )
        except NotController:
            error, answers = ErrorCode.not_controller, []
        by_topic: dict[Any, list[Any]] = {}
        for change, answer in zip(changes, answers, strict=False):
            by_topic.setdefault(change.topic_id, []).append(
                build(
                    schema.PartitionData,
                    partition_index=change.partition,
                    error_code=answer.error,
                    leader_id=answer.leader,
                    leader_epoch=answer.leader_epoch,
                    isr=answer.isr,
                    leader_recovery_state=0,
                    partition_epoch=answer.partition_epoch,
                )
            )
        response: ResponseBody = build(
            schema.AlterPartitionResponse,
            throttle_time=timedelta(0),
            error_code=error,
            topics=tuple(
                build(schema.TopicData, topic_id=topic_id, partitions=tuple(partitions))
                for topic_id, partitions in by_topic.items()
            ),
        )
        return response


class AllocateProducerIds:
    """A broker asks the active controller for a block of producer ids (KIP-730)."""

    def __init__(self, metadata: MetadataService) -> None:
        self._metadata = metadata

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        schema = response_module(ApiKey.ALLOCATE_PRODUCER_IDS, context.header.api_version)
        try:
            error, block = await self._metadata.allocate_producer_ids(
                request.broker_id, request.broker_epoch
            )
        except NotController:
            error, block = ErrorCode.not_controller, range(0)
        response: ResponseBody = build(
            schema.AllocateProducerIdsResponse,
            throttle_time=timedelta(0),
            error_code=error,
            producer_id_start=block.start if block else -1,
            producer_id_len=len(block),
        )
        return response


def build_controller_dispatcher(
    metadata: MetadataService, cluster_id: str, client: Callable[[], Dispatcher | None]
) -> Dispatcher:
    """The controller listener's handlers; ApiVersions advertises exactly these."""
    handlers: dict[int, Handler] = {}
    dispatcher = Dispatcher(handlers, fallback=error_response)
    handlers[ApiKey.API_VERSIONS] = api_versions.Handler(lambda: dispatcher.handled_api_keys)
    quorum = QuorumRequest(metadata)
    for key in (
        ApiKey.VOTE,
        ApiKey.BEGIN_QUORUM_EPOCH,
        ApiKey.END_QUORUM_EPOCH,
        ApiKey.FETCH,
        ApiKey.FETCH_SNAPSHOT,
    ):
        handlers[key] = quorum
    handlers[ApiKey.DESCRIBE_QUORUM] = DescribeQuorum(metadata)
    handlers[ApiKey.BROKER_REGISTRATION] = BrokerRegistration(metadata)
    handlers[ApiKey.BROKER_HEARTBEAT] = BrokerHeartbeat(metadata)
    handlers[ApiKey.ALTER_PARTITION] = AlterPartition(metadata)
    handlers[ApiKey.ALLOCATE_PRODUCER_IDS] = AllocateProducerIds(metadata)
    handlers[ApiKey.DESCRIBE_CLUSTER] = DescribeControllers(metadata, cluster_id)
    handlers[ApiKey.ENVELOPE] = Envelope(client)
    dispatcher.register(handlers)
    if dispatcher.handled_api_keys != CONTROLLER_APIS:
        raise AssertionError("CONTROLLER_APIS is out of date")
    return dispatcher
