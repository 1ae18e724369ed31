"""What the operator learns from a real cluster's nodes before it restarts one: which voter
leads the metadata quorum, read from the voters' own metrics (a rolling restart leaves that
one last). What the planner does with it is in tests/unit/operator/test_planner.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gregor_operator.kafka import active_controller
from tests.support.nodes import describe_quorum, free_port, start_cluster

pytestmark = [pytest.mark.integration]


def test_the_voters_metrics_name_the_quorums_leader_as_it_moves(tmp_path: Path) -> None:
    metrics = {node_id: free_port() for node_id in (2, 3, 4)}
    cluster = start_cluster(
        tmp_path,
        brokers=1,
        controllers=3,
        each={i: {"gregor.metrics.listener": f"http://127.0.0.1:{p}"} for i, p in metrics.items()},
    )
    addresses = {f"controller-{i}": f"127.0.0.1:{port}" for i, port in metrics.items()}
    try:
        ports = [node.port for node in cluster.controllers]
        leader = describe_quorum(ports).leader_id
        assert active_controller(addresses) == f"controller-{leader}"

        cluster.node(leader).kill()  # the others elect a new leader; its address stays listed
        alive = [node.port for node in cluster.controllers if node.node_id != leader]
        deadline = time.monotonic() + 20
        while True:
            successor = describe_quorum(alive).leader_id
            named = active_controller(addresses)
            if successor != leader and named == f"controller-{successor}":
                break
            assert time.monotonic() < deadline, (leader, successor, named)
            time.sleep(0.2)
    finally:
        cluster.kill()
    assert active_controller(addresses) is None  # nobody answers: the roll goes by ordinal
