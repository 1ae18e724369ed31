"""`kafka-metadata-quorum --bootstrap-controller` (Apache Kafka 4.3.1's tool) against Gregor's
quorum of three voters and against Apache Kafka's own single voter: `describe --status` names
the leader, its epoch and every voter, and `describe --replication` has one leader row and a
follower row per other voter, all caught up. The Kafka run proves the scenario and the parsing
right."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from broker.protocol import ApiKey, ErrorCode, request_type
from tests.support.kafka_dist import run_kafka, run_tool
from tests.support.nodes import start_quorum
from tests.support.requests import fill
from tests.support.wire import call

pytestmark = [pytest.mark.integration, pytest.mark.slow]

METADATA_QUORUM_COMMAND = "org.apache.kafka.tools.MetadataQuorumCommand"


@pytest.fixture(scope="module", params=["gregor", "kafka"])
def controllers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, set[int]]]:
    """(bootstrap controller address, voter ids) of a running quorum."""
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "kafka":
        with run_kafka(tmp) as kafka:
            yield f"localhost:{kafka.controller_port}", {1}
        return
    nodes = start_quorum(tmp, 3)
    try:
        yield f"localhost:{nodes[0].controller_port}", {1, 2, 3}
    finally:
        for node in nodes:
            node.kill()


def metadata_quorum(address: str, *args: str) -> str:
    result = run_tool(METADATA_QUORUM_COMMAND, "--bootstrap-controller", address, *args)
    return result.stdout


def test_describe_status_names_the_leader_and_every_voter(
    controllers: tuple[str, set[int]],
) -> None:
    address, voters = controllers
    status = dict(
        line.split(":", 1) for line in metadata_quorum(address, "describe", "--status").splitlines()
    )
    status = {key.strip(): value.strip() for key, value in status.items()}
    assert int(status["LeaderId"]) in voters
    assert int(status["LeaderEpoch"]) >= 1
    assert int(status["HighWatermark"]) >= 1
    assert status["ClusterId"]
    assert {int(i) for i in re.findall(r'"id": (\d+)', status["CurrentVoters"])} == voters


def test_describe_replication_has_the_leader_and_its_followers_caught_up(
    controllers: tuple[str, set[int]],
) -> None:
    address, voters = controllers
    deadline = time.monotonic() + 15
    while True:
        lines = metadata_quorum(address, "describe", "--replication").splitlines()
        header = lines[0].split()
        rows = [dict(zip(header, line.split(), strict=False)) for line in lines[1:] if line]
        caught_up = all(row["Lag"] == "0" for row in rows)
        if caught_up or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert {int(row["NodeId"]) for row in rows} == voters
    statuses = [row["Status"] for row in rows]
    assert (statuses.count("Leader"), statuses.count("Follower")) == (1, len(voters) - 1)
    assert caught_up, rows


def test_a_controller_listener_describes_controllers_not_brokers(
    controllers: tuple[str, set[int]],
) -> None:
    host, port = controllers[0].split(":")
    for endpoint_type, error in ((2, ErrorCode.none), (1, ErrorCode.mismatched_endpoint_type)):
        body = fill(
            request_type(ApiKey.DESCRIBE_CLUSTER, 1),
            {"endpoint_type": endpoint_type, "include_cluster_authorized_operations": False},
        )
        response: Any = call((host, int(port)), ApiKey.DESCRIBE_CLUSTER, 1, body)
        assert response.error_code == error
        if error == ErrorCode.none:
            assert {b.broker_id for b in response.brokers} == controllers[1]
            assert response.controller_id in controllers[1]
