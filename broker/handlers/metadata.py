"""Metadata: the brokers a client should talk to, and the topics it asked about.

Brokers are advertised on the listener the client connected through, as Kafka does, so a
client on an internal listener never gets an external address.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from broker.protocol import ApiKey, ErrorCode, RequestBody, ResponseBody, build, response_module
from broker.server import RequestContext

from .context import NodeState

__all__ = ["Handler", "error_response"]

_ZERO = timedelta(0)


class Handler:
    def __init__(self, state: NodeState) -> None:
        self._state = state

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = context.header.api_version
        schema = response_module(ApiKey.METADATA, version)
        endpoint = self._state.advertised.get(context.listener)
        brokers: tuple[Any, ...] = ()
        if endpoint is not None:
            brokers = (
                build(
                    schema.MetadataResponseBroker,
                    node_id=self._state.config.node_id,
                    host=endpoint.host,
                    port=endpoint.port,
                    rack=self._state.config.broker_rack,
                ),
            )
        requested = request.topics or ()
        topics = tuple(
            build(
                schema.MetadataResponseTopic,
                error_code=ErrorCode.unknown_topic_or_partition,
                name=topic.name,
                topic_id=None,
                is_internal=False,
                partitions=(),
            )
            for topic in requested
        )
        response: ResponseBody = build(
            schema.MetadataResponse,
            throttle_time=_ZERO,
            brokers=brokers,
            cluster_id=self._state.cluster_id,
            controller_id=self._state.config.node_id,
            topics=topics,
        )
        return response


def error_response(request: RequestBody, error: ErrorCode) -> ResponseBody:
    """Every requested topic answered with `error`, and no brokers."""
    body: Any = request
    schema = response_module(ApiKey.METADATA, type(request).__version__)
    topics = tuple(
        build(
            schema.MetadataResponseTopic,
            error_code=error,
            name=topic.name,
            topic_id=None,
            partitions=(),
        )
        for topic in body.topics or ()
    )
    response: ResponseBody = build(
        schema.MetadataResponse, throttle_time=_ZERO, brokers=(), topics=topics
    )
    return response
