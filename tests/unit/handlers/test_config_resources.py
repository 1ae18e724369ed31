"""ListConfigResources (KIP-1142) from a metadata image, at both versions: v0 lists
client-metrics resources only (it was ListClientMetricsResources); v1 the types asked for, all
of Kafka's five when none is, in Kafka's order, and UNSUPPORTED_VERSION for any other type.
Requests and responses go through the codec."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any, cast

import pytest

from broker.handlers.config_resources import (
    BROKER_LOGGER_RESOURCE,
    CLIENT_METRICS_RESOURCE,
    GROUP_RESOURCE,
    ListConfigResources,
)
from broker.handlers.context import NodeState
from broker.metadata import MetadataImage
from broker.metadata.image import BROKER_RESOURCE, TOPIC_RESOURCE, BrokerState, TopicState
from broker.protocol import ApiKey, ErrorCode, RequestHeader, request_type
from broker.protocol.messages import (
    decode_request_body,
    decode_response_body,
    encode_request_body,
    encode_response_body,
)
from broker.server import RequestContext
from tests.support.requests import fill

LISTENER = "PLAINTEXT"


def _image() -> MetadataImage:
    """Brokers 1 (live), 2 (fenced), 3 (not on the client's listener); topics "b" and "a";
    a group's and a client-metrics resource's configs, and a group whose configs were all
    removed."""
    image = MetadataImage()
    for broker_id, fenced, listener in ((1, False, LISTENER), (2, True, LISTENER),
                                        (3, False, "OTHER")):  # fmt: skip
        image.brokers[broker_id] = BrokerState(
            broker_id, 1, {listener: ("localhost", 9090 + broker_id)}, None, fenced
        )
    for number, name in enumerate(("b", "a"), start=1):
        image.topics[name] = TopicState(name, uuid.UUID(int=number))
    image.configs[(TOPIC_RESOURCE, "a")] = {"retention.ms": "1000"}
    image.configs[(BROKER_RESOURCE, "1")] = {"log.retention.ms": "1000"}
    image.configs[(GROUP_RESOURCE, "readers")] = {"consumer.session.timeout.ms": "50000"}
    image.configs[(GROUP_RESOURCE, "emptied")] = {}
    image.configs[(CLIENT_METRICS_RESOURCE, "all-metrics")] = {"interval.ms": "1000"}
    return image


def _list(version: int, types: list[int]) -> Any:
    filled = fill(request_type(ApiKey.LIST_CONFIG_RESOURCES, version), {"resource_types": types})
    body = decode_request_body(ApiKey.LIST_CONFIG_RESOURCES, version, encode_request_body(filled))
    header = RequestHeader(ApiKey.LIST_CONFIG_RESOURCES, version, 1, "unit")
    state = cast(NodeState, SimpleNamespace(metadata=SimpleNamespace(image=_image())))
    response = asyncio.run(ListConfigResources(state)(RequestContext(header, LISTENER, ""), body))
    return decode_response_body(
        ApiKey.LIST_CONFIG_RESOURCES, version, encode_response_body(response)
    )


def _listed(response: Any) -> list[tuple[int, str]]:
    return [(r.resource_type, r.resource_name) for r in response.config_resources]


def test_v1_with_no_type_lists_all_five_in_kafka_s_order() -> None:
    response = _list(1, [])
    assert response.error_code == ErrorCode.none
    assert _listed(response) == [
        (GROUP_RESOURCE, "readers"),
        (CLIENT_METRICS_RESOURCE, "all-metrics"),
        # Every broker registered with the client's listener, fenced or not.
        (BROKER_LOGGER_RESOURCE, "1"),
        (BROKER_LOGGER_RESOURCE, "2"),
        (BROKER_RESOURCE, "1"),
        (BROKER_RESOURCE, "2"),
        (TOPIC_RESOURCE, "a"),
        (TOPIC_RESOURCE, "b"),
    ]


def test_v1_lists_the_types_asked_for() -> None:
    response = _list(1, [TOPIC_RESOURCE, GROUP_RESOURCE])
    assert _listed(response) == [
        (GROUP_RESOURCE, "readers"),
        (TOPIC_RESOURCE, "a"),
        (TOPIC_RESOURCE, "b"),
    ]


@pytest.mark.parametrize("types", [[1], [TOPIC_RESOURCE, 64]], ids=["unknown", "one unknown"])
def test_v1_refuses_a_type_kafka_does_not_list(types: list[int]) -> None:
    response = _list(1, types)
    assert (response.error_code, response.config_resources) == (ErrorCode.unsupported_version, ())


def test_v0_lists_client_metrics_resources_only() -> None:
    response = _list(0, [])
    assert response.error_code == ErrorCode.none
    assert [r.resource_name for r in response.config_resources] == ["all-metrics"]
