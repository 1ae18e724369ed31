"""DescribeQuorum, on the controller listener and (issue 25) the client listeners too, where
it is forwarded to the active controller as Kafka 4's brokers forward it: every version
encodes, v2 with the voters' endpoints; a node that does not lead the quorum answers
NOT_LEADER_OR_FOLLOWER without replicas."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest

from broker.forwarding import FORWARDED_APIS
from broker.handlers import HANDLED_APIS
from broker.handlers.quorum import DescribeQuorum
from broker.kraft import MetadataService
from broker.protocol import SUPPORTED, ApiKey, ErrorCode, RequestHeader, request_type
from broker.protocol.messages import (
    decode_request_body,
    decode_response_body,
    encode_request_body,
    encode_response_body,
)
from broker.server import RequestContext
from tests.support.requests import TEMPLATES, fill


def _metadata(leading: bool) -> MetadataService:
    status = SimpleNamespace(
        leader=1,
        epoch=3,
        high_watermark=40,
        voters={1: (40, 1_000), 2: (40, 990), 3: (12, 500)},
        observers={4: (40, 995)},
    )
    driver = SimpleNamespace(
        status=lambda: status,
        is_active=leading,
        voters={1: ("localhost", 19092), 2: ("localhost", 19093), 3: ("localhost", 19094)},
    )
    config = SimpleNamespace(controller_listener_names=["CONTROLLER"])
    return cast(MetadataService, SimpleNamespace(driver=driver, config=config))


def _describe(version: int, leading: bool) -> Any:
    api = ApiKey.DESCRIBE_QUORUM
    filled = fill(request_type(api, version), TEMPLATES[api](version, None))  # type: ignore[arg-type]
    body = decode_request_body(api, version, encode_request_body(filled))
    context = RequestContext(RequestHeader(api, version, 1, "unit"), "PLAINTEXT", "")
    response = asyncio.run(DescribeQuorum(_metadata(leading))(context, body))
    return decode_response_body(api, version, encode_response_body(response))


def test_served_on_the_client_listeners_and_forwarded() -> None:
    assert ApiKey.DESCRIBE_QUORUM in HANDLED_APIS
    assert ApiKey.DESCRIBE_QUORUM in FORWARDED_APIS


@pytest.mark.parametrize("version", list(SUPPORTED[ApiKey.DESCRIBE_QUORUM]))
def test_the_leader_describes_every_voter_and_observer(version: int) -> None:
    response = _describe(version, leading=True)
    ((partition,),) = [t.partitions for t in response.topics]
    assert (partition.error_code, partition.leader_id, partition.leader_epoch) == (
        ErrorCode.none, 1, 3
    )  # fmt: skip
    assert partition.high_watermark == 40
    assert [(v.replica_id, v.log_end_offset) for v in partition.current_voters] == [
        (1, 40), (2, 40), (3, 12)
    ]  # fmt: skip
    assert [o.replica_id for o in partition.observers] == [4]
    if version >= 2:
        assert [(n.node_id, n.listeners[0].port) for n in response.nodes] == [
            (1, 19092), (2, 19093), (3, 19094)
        ]  # fmt: skip


def test_elsewhere_it_is_not_leader_or_follower() -> None:
    response = _describe(2, leading=False)
    ((partition,),) = [t.partitions for t in response.topics]
    assert partition.error_code == ErrorCode.not_leader_or_follower
    assert (partition.current_voters, partition.observers) == ((), ())
