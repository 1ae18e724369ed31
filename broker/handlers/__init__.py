"""API handlers, one module per API family: a decoded request and a context in, a response
body out. Handlers hold no sockets; they read and change the node's state."""

from __future__ import annotations

from broker.protocol import ApiKey, ErrorCode
from broker.quorum import NotController
from broker.server import Dispatcher, Handler
from broker.storage import LogOffline, StorageError

from . import (
    api_versions,
    cluster,
    config_resources,
    configs,
    elections,
    fetch,
    groups,
    list_offsets,
    metadata,
    produce,
    reassignments,
    topic_partitions,
    topics,
)
from .context import NodeState
from .errors import error_response
from .producer_ids import InitProducerId
from .quorum import DescribeQuorum

__all__ = ["HANDLED_APIS", "NodeState", "build_dispatcher", "classify_error"]

HANDLED_APIS: frozenset[ApiKey] = frozenset(
    {
        ApiKey.PRODUCE,
        ApiKey.FETCH,
        ApiKey.LIST_OFFSETS,
        ApiKey.METADATA,
        ApiKey.OFFSET_COMMIT,
        ApiKey.OFFSET_FETCH,
        ApiKey.FIND_COORDINATOR,
        ApiKey.JOIN_GROUP,
        ApiKey.HEARTBEAT,
        ApiKey.LEAVE_GROUP,
        ApiKey.SYNC_GROUP,
        ApiKey.DESCRIBE_GROUPS,
        ApiKey.LIST_GROUPS,
        ApiKey.API_VERSIONS,
        ApiKey.CREATE_TOPICS,
        ApiKey.DELETE_TOPICS,
        ApiKey.DELETE_RECORDS,
        ApiKey.INIT_PRODUCER_ID,
        ApiKey.DESCRIBE_CONFIGS,
        ApiKey.ALTER_CONFIGS,
        ApiKey.DESCRIBE_LOG_DIRS,
        ApiKey.CREATE_PARTITIONS,
        ApiKey.DELETE_GROUPS,
        ApiKey.INCREMENTAL_ALTER_CONFIGS,
        ApiKey.OFFSET_DELETE,
        ApiKey.DESCRIBE_CLUSTER,
        ApiKey.ELECT_LEADERS,
        ApiKey.ALTER_PARTITION_REASSIGNMENTS,
        ApiKey.LIST_PARTITION_REASSIGNMENTS,
        ApiKey.UNREGISTER_BROKER,
        ApiKey.DESCRIBE_QUORUM,
        ApiKey.LIST_CONFIG_RESOURCES,
        ApiKey.DESCRIBE_TOPIC_PARTITIONS,
    }
)
"""The APIs a node has handlers for, known without a node: `gregor api-versions` prints their
advertisement. `build_dispatcher` refuses to build a dispatcher whose handlers differ."""


def classify_error(exc: Exception) -> ErrorCode:
    """A log dir that failed under a handler is the client's KAFKA_STORAGE_ERROR (retriable: a
    replica elsewhere may serve it), an admin write on a node that is not the active controller
    NOT_CONTROLLER (retriable), anything else our bug: UNKNOWN_SERVER_ERROR."""
    if isinstance(exc, NotController):
        return ErrorCode.not_controller
    if isinstance(exc, StorageError | LogOffline | OSError):
        return ErrorCode.kafka_storage_error
    return ErrorCode.unknown_server_error


def build_dispatcher(state: NodeState) -> Dispatcher:
    """Every handler the node has; ApiVersions advertises exactly these APIs."""
    handlers: dict[int, Handler] = {}
    dispatcher = Dispatcher(
        handlers,
        error_responders={ApiKey.METADATA: metadata.error_response},
        fallback=error_response,
        classify=classify_error,
    )
    handlers[ApiKey.API_VERSIONS] = api_versions.Handler(lambda: dispatcher.handled_api_keys)
    handlers[ApiKey.METADATA] = metadata.Handler(state)
    handlers[ApiKey.DESCRIBE_TOPIC_PARTITIONS] = topic_partitions.DescribeTopicPartitions(state)
    handlers[ApiKey.PRODUCE] = produce.Handler(state)
    handlers[ApiKey.FETCH] = fetch.Handler(state)
    handlers[ApiKey.LIST_OFFSETS] = list_offsets.Handler(state)
    handlers[ApiKey.CREATE_TOPICS] = topics.CreateTopics(state)
    handlers[ApiKey.DELETE_TOPICS] = topics.DeleteTopics(state)
    handlers[ApiKey.CREATE_PARTITIONS] = topics.CreatePartitions(state)
    handlers[ApiKey.DESCRIBE_CONFIGS] = configs.DescribeConfigs(state)
    alter = handlers[ApiKey.ALTER_CONFIGS] = configs.AlterConfigs(state)
    incremental = handlers[ApiKey.INCREMENTAL_ALTER_CONFIGS] = configs.IncrementalAlterConfigs(
        state
    )
    # A broker's own configs are changed through that broker: checked before forwarding.
    dispatcher.forward_checks[ApiKey.ALTER_CONFIGS] = alter.before_forwarding
    dispatcher.forward_checks[ApiKey.INCREMENTAL_ALTER_CONFIGS] = incremental.before_forwarding
    handlers[ApiKey.DESCRIBE_CLUSTER] = cluster.DescribeCluster(state)
    handlers[ApiKey.UNREGISTER_BROKER] = cluster.UnregisterBroker(state)
    handlers[ApiKey.DESCRIBE_LOG_DIRS] = cluster.DescribeLogDirs(state)
    handlers[ApiKey.LIST_CONFIG_RESOURCES] = config_resources.ListConfigResources(state)
    # Forwarded to the active controller (FORWARDED_APIS), which answers from its quorum
    # driver with this same handler; answered here when this node is it, or none is reachable.
    handlers[ApiKey.DESCRIBE_QUORUM] = DescribeQuorum(state.metadata)
    handlers[ApiKey.DELETE_RECORDS] = cluster.DeleteRecords(state)
    handlers[ApiKey.INIT_PRODUCER_ID] = InitProducerId(state)
    handlers[ApiKey.ELECT_LEADERS] = elections.ElectLeaders(state)
    handlers[ApiKey.ALTER_PARTITION_REASSIGNMENTS] = reassignments.AlterPartitionReassignments(
        state
    )
    handlers[ApiKey.LIST_PARTITION_REASSIGNMENTS] = reassignments.ListPartitionReassignments(state)
    error_responders = groups.register(handlers, state.groups, state)
    dispatcher.register(handlers, error_responders)
    if dispatcher.handled_api_keys != HANDLED_APIS:
        raise AssertionError(
            f"HANDLED_APIS is out of date: handlers for {sorted(dispatcher.handled_api_keys)}"
        )
    return dispatcher
