"""ListConfigResources (KIP-1142; ListClientMetricsResources until Kafka 4.1): the resources a
client may describe or alter configs of, from this node's metadata image, as Kafka 4.3 lists
them (`KafkaApis.handleListConfigResources`):

- v0 is the old ListClientMetricsResources: client-metrics resources only, without types;
- v1 takes the types wanted; none means all that Kafka lists: topics, brokers, broker loggers,
  groups and client metrics. A type outside those is UNSUPPORTED_VERSION, with nothing listed;
- groups and client metrics are those with configs set; brokers, and broker loggers (one per
  broker), are the brokers registered with the client's listener, fenced ones included; topics
  are every topic in the image. Kafka's order: groups, client metrics, broker loggers,
  brokers, topics.

Gregor stores configs of topics and brokers only, so no group or client-metrics resource is
ever listed. Broker loggers are listed as Kafka lists them, though DescribeConfigs does not
describe them here yet.
"""

from __future__ import annotations

from typing import Any

from broker.metadata.image import BROKER_RESOURCE, TOPIC_RESOURCE
from broker.protocol import ApiKey, ErrorCode, ResponseBody, build, response_module
from broker.server import RequestContext

from .context import NO_THROTTLE, NodeState
from .metadata import registered_brokers

__all__ = [
    "BROKER_LOGGER_RESOURCE",
    "CLIENT_METRICS_RESOURCE",
    "GROUP_RESOURCE",
    "ListConfigResources",
]

BROKER_LOGGER_RESOURCE = 8
CLIENT_METRICS_RESOURCE = 16
GROUP_RESOURCE = 32
LISTED_TYPES = frozenset(
    {
        TOPIC_RESOURCE,
        BROKER_RESOURCE,
        BROKER_LOGGER_RESOURCE,
        CLIENT_METRICS_RESOURCE,
        GROUP_RESOURCE,
    }
)
"""What v1 lists, and lists all of when no type is asked for (Kafka's `supportedResourceTypes`)."""


class ListConfigResources:
    def __init__(self, state: NodeState) -> None:
        self._state = state

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = context.header.api_version
        schema = response_module(ApiKey.LIST_CONFIG_RESOURCES, version)
        supported = LISTED_TYPES if version >= 1 else frozenset({CLIENT_METRICS_RESOURCE})
        wanted = set(getattr(request, "resource_types", ()) or supported)
        error = ErrorCode.none
        listed: list[tuple[int, str]] = []
        if not wanted <= supported:
            error = ErrorCode.unsupported_version
        else:
            listed = self._listed(wanted, context.listener)
        response: ResponseBody = build(
            schema.ListConfigResourcesResponse,
            throttle_time=NO_THROTTLE,
            error_code=error,
            config_resources=tuple(
                build(schema.ConfigResource, resource_name=name, resource_type=kind)
                for kind, name in listed
            ),
        )
        return response

    def _listed(self, wanted: set[int], listener: str) -> list[tuple[int, str]]:
        image = self._state.metadata.image
        listed: list[tuple[int, str]] = []
        for kind in (GROUP_RESOURCE, CLIENT_METRICS_RESOURCE):
            if kind in wanted:
                listed += sorted(
                    (kind, name)
                    for (t, name), configs in image.configs.items()
                    if t == kind and configs
                )
        brokers = [str(b[0]) for b in registered_brokers(self._state, listener, with_fenced=True)]
        for kind in (BROKER_LOGGER_RESOURCE, BROKER_RESOURCE):
            if kind in wanted:
                listed += [(kind, broker_id) for broker_id in brokers]
        if TOPIC_RESOURCE in wanted:
            listed += [(TOPIC_RESOURCE, name) for name in sorted(image.topics)]
        return listed
