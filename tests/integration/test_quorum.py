"""Three `gregor broker` processes, each a broker and a voter of one KRaft metadata quorum on
loopback: they elect one leader, every node applies what it commits, and the quorum carries on
when its leader is killed or stopped, or a node falls behind the log start.

Every node registers as a broker with the active controller (BrokerRegistration), keeps its
session with heartbeats, is fenced when they stop and let go on SIGTERM; admin writes reaching
another node are forwarded to the active controller in an Envelope (KIP-590).
"""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import socket
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from broker.metadata.controller import PRODUCER_ID_BLOCK_SIZE
from broker.protocol import (
    ApiKey,
    ErrorCode,
    RequestHeader,
    decode_response,
    encode_request,
    request_type,
)
from tests.support.nodes import (
    RunningNode,
    start_node,
    start_quorum,
    wait_for_brokers,
    wait_listening,
)
from tests.support.requests import fill
from tests.support.wire import call, exchange

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAST_ELECTIONS = {
    "controller.quorum.election.timeout.ms": "300",
    "controller.quorum.fetch.timeout.ms": "600",
    "controller.quorum.election.backoff.max.ms": "300",
}


@dataclasses.dataclass(frozen=True)
class QuorumView:
    """DescribeQuorum as one node answers it."""

    node: int
    error: int
    leader: int
    epoch: int
    high_watermark: int
    voters: dict[int, int]
    """Voter → log end offset (on the leader's answer)."""


def describe_quorum(node: RunningNode, number: int) -> QuorumView:
    assert node.controller_port is not None
    body = fill(
        request_type(ApiKey.DESCRIBE_QUORUM, 2),
        {"topics": [{"topic_name": "__cluster_metadata", "partitions": [{"partition_index": 0}]}]},
    )
    response: Any = call(("localhost", node.controller_port), ApiKey.DESCRIBE_QUORUM, 2, body)
    partition = response.topics[0].partitions[0]
    return QuorumView(
        number,
        partition.error_code,
        partition.leader_id,
        partition.leader_epoch,
        partition.high_watermark,
        {v.replica_id: v.log_end_offset for v in partition.current_voters},
    )


def views(nodes: list[RunningNode | None]) -> list[QuorumView]:
    found = []
    for number, node in enumerate(nodes, start=1):
        if node is None or node.process.poll() is not None:
            continue
        try:
            found.append(describe_quorum(node, number))
        except OSError:
            continue
    return found


def wait_for_leader(
    nodes: list[RunningNode | None], *, not_in: tuple[int, ...] = (), timeout: float = 15.0
) -> QuorumView:
    """Until one node answers DescribeQuorum as leader (not one of `not_in`) and every other
    running node names it; its answer."""
    deadline = time.monotonic() + timeout
    seen: list[QuorumView] = []
    while time.monotonic() < deadline:
        seen = views(nodes)
        leaders = [v for v in seen if v.error == ErrorCode.none]
        if len(leaders) == 1 and leaders[0].node not in not_in:
            leader = leaders[0]
            if all((v.leader, v.epoch) == (leader.node, leader.epoch) for v in seen):
                return leader
        time.sleep(0.1)
    raise AssertionError(f"no single leader within {timeout} s: {seen}")


def metadata_of(node: RunningNode) -> Any:
    """One Metadata request to this node itself (a client library would ask whichever broker
    it learned of, which need not be this one): what its own image holds."""
    body = fill(request_type(ApiKey.METADATA, 12), {"topics": None})
    return call(("localhost", node.port), ApiKey.METADATA, 12, body)


def topics_on(node: RunningNode) -> set[str]:
    return {topic.name for topic in metadata_of(node).topics}


def create_topic(node: RunningNode, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)], operation_timeout=10)[name].result(timeout=30)


def lists_brokers(nodes: list[RunningNode], ids: set[int], timeout: float = 15.0) -> None:
    """Until each of `nodes` lists exactly the brokers `ids` (registered, unfenced)."""
    ports = {node.node_id: node.port for node in nodes}
    wait_for_brokers(ports, ids, timeout, {node.node_id: node.log for node in nodes})


def wait_for_topics(node: RunningNode, names: set[str], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    found: set[str] = set()
    while time.monotonic() < deadline:
        found = topics_on(node)
        if names <= found:
            return
        time.sleep(0.1)
    raise AssertionError(f"{node.bootstrap} lists {sorted(found)}, not all of {sorted(names)}")


@pytest.fixture
def quorum(tmp_path: Path) -> Iterator[list[RunningNode]]:
    nodes = start_quorum(tmp_path, 3, FAST_ELECTIONS)
    try:
        yield nodes
    finally:
        for node in nodes:
            if node.process.poll() is None:
                node.kill()


def test_three_voters_elect_one_leader_and_every_node_applies_what_it_commits(
    quorum: list[RunningNode],
) -> None:
    leader = wait_for_leader(list(quorum))
    assert set(leader.voters) == {1, 2, 3}
    create_topic(quorum[leader.node - 1], "orders")
    # Committed on a majority, applied by every node: each one's metadata lists the topic.
    for node in quorum:
        wait_for_topics(node, {"orders"})
    # Every voter's log reaches the leader's high watermark.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        now = describe_quorum(quorum[leader.node - 1], leader.node)
        if all(end >= now.high_watermark for end in now.voters.values()):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"voters did not catch up: {now}")
    # Every node names itself as the controller, as Kafka's brokers name a live broker...
    for number, node in enumerate(quorum, start=1):
        assert metadata_of(node).controller_id == number
    # ...and one that is not it forwards them there (KIP-590) rather than refusing them.
    follower = next(n for i, n in enumerate(quorum, start=1) if i != leader.node)
    body = fill(
        request_type(ApiKey.CREATE_TOPICS, 7),
        {
            "topics": [{"name": "elsewhere", "num_partitions": 2, "replication_factor": 1}],
            "timeout": timedelta(seconds=5),
        },
    )
    response: Any = call(("localhost", follower.port), ApiKey.CREATE_TOPICS, 7, body)
    created = response.topics[0]
    assert (created.error_code, created.num_partitions) == (ErrorCode.none, 2)
    for node in quorum:
        wait_for_topics(node, {"orders", "elsewhere"})
    # A client's refusal comes back as the controller gave it, message included.
    again: Any = call(("localhost", follower.port), ApiKey.CREATE_TOPICS, 7, body)
    assert again.topics[0].error_code == ErrorCode.topic_already_exists
    assert "already exists" in again.topics[0].error_message
    # An idempotent producer's id comes from a block the controller gave the node it asks
    # (AllocateProducerIds): every node has its own, so no id is ever handed out twice.
    init = fill(request_type(ApiKey.INIT_PRODUCER_ID, 4), {"transactional_id": None})
    ids = []
    for node in (*quorum, follower):
        for _ in range(2):
            answer: Any = call(("localhost", node.port), ApiKey.INIT_PRODUCER_ID, 4, init)
            assert (answer.error_code, answer.producer_epoch) == (ErrorCode.none, 0)
            ids.append(answer.producer_id)
    assert len(set(ids)) == len(ids)
    assert all(i >= 0 for i in ids)
    assert len({i // PRODUCER_ID_BLOCK_SIZE for i in ids}) == 3  # one block per node
    # The controller hands blocks only to a broker registered with the epoch it names.
    stale = fill(
        request_type(ApiKey.ALLOCATE_PRODUCER_IDS, 0), {"broker_id": 2, "broker_epoch": 10**9}
    )
    leader_node = quorum[leader.node - 1]
    assert leader_node.controller_port is not None
    refused: Any = call(
        ("localhost", leader_node.controller_port), ApiKey.ALLOCATE_PRODUCER_IDS, 0, stale
    )
    assert refused.error_code == ErrorCode.stale_broker_epoch
    assert refused.producer_id_len == 0
    # A node that has used up its block goes on with the next: a thousand more, all new.
    more = []
    with socket.create_connection(("localhost", follower.port), timeout=10) as sock:
        for number in range(PRODUCER_ID_BLOCK_SIZE):
            header = RequestHeader(ApiKey.INIT_PRODUCER_ID, 4, number, "many-producers")
            response = exchange(sock, encode_request(header, init))
            assert response is not None
            got: Any = decode_response(ApiKey.INIT_PRODUCER_ID, 4, response)[1]
            assert got.error_code == ErrorCode.none
            more.append(got.producer_id)
    assert len(set(ids + more)) == len(ids) + len(more)
    assert len({i // PRODUCER_ID_BLOCK_SIZE for i in more}) == 2


def test_a_killed_leader_is_replaced_and_catches_up_when_it_returns(
    quorum: list[RunningNode],
) -> None:
    first = wait_for_leader(list(quorum))
    create_topic(quorum[first.node - 1], "before")
    killed = quorum[first.node - 1]
    killed.kill()
    running: list[RunningNode | None] = [None if n is killed else n for n in quorum]
    started = time.monotonic()
    second = wait_for_leader(running, not_in=(first.node,), timeout=10)
    assert second.epoch > first.epoch
    elected_in = time.monotonic() - started
    # The new leader commits: topic creation works again.
    create_topic(quorum[second.node - 1], "after")
    killed.restart()
    wait_listening(killed, timeout=30)
    wait_for_topics(killed, {"before", "after"})
    assert wait_for_leader(list(quorum)).epoch >= second.epoch
    print(f"new leader elected {elected_in:.2f} s after the SIGKILL")


def test_a_voter_restarted_at_a_higher_epoch_than_the_leaders_rejoins(
    quorum: list[RunningNode],
) -> None:
    """A voter that campaigned while nobody heard it comes back at an epoch above the
    leader's: it refuses the leader's fetches as stale and is refused pre-votes while the
    leader lives. The leader's repeated BeginQuorumEpoch draws its epoch out (Kafka's
    FENCED_LEADER_EPOCH answer), an election follows, and the voter takes part again."""
    first = wait_for_leader(list(quorum))
    follower = next(n for n in quorum if n.node_id != first.node)
    follower.kill()
    (state,) = follower.config.parent.rglob("quorum-state")
    recorded = json.loads(state.read_text())
    recorded |= {"leaderEpoch": first.epoch + 1, "votedId": follower.node_id, "leaderId": -1}
    state.write_text(json.dumps(recorded))
    create_topic(quorum[first.node - 1], "while-away")
    follower.restart()
    wait_listening(follower, timeout=30)
    leader = wait_for_leader(list(quorum), timeout=20)
    assert leader.epoch > first.epoch + 1
    create_topic(quorum[leader.node - 1], "after")
    wait_for_topics(follower, {"while-away", "after"})


def test_a_stopped_leader_hands_over_at_once(tmp_path: Path) -> None:
    """SIGTERM: the leader resigns (EndQuorumEpoch), so the voters elect another without
    waiting out the fetch timeout, ten seconds here."""
    slow_to_notice = FAST_ELECTIONS | {"controller.quorum.fetch.timeout.ms": "10000"}
    quorum = start_quorum(tmp_path, 3, slow_to_notice)
    try:
        _hand_over(quorum)
    finally:
        for node in quorum:
            if node.process.poll() is None:
                node.kill()


def _hand_over(quorum: list[RunningNode]) -> None:
    first = wait_for_leader(list(quorum))
    stopped = quorum[first.node - 1]
    started = time.monotonic()
    stopped.process.send_signal(signal.SIGTERM)
    running: list[RunningNode | None] = [None if n is stopped else n for n in quorum]
    second = wait_for_leader(running, not_in=(first.node,), timeout=5)
    handed_over = time.monotonic() - started
    assert second.epoch > first.epoch
    assert stopped.process.wait(20) == 0, stopped.log_tail()
    create_topic(quorum[second.node - 1], "after-handover")
    # The active controller's own broker is let go in process before the node resigns.
    assert f"the controller let broker {first.node} shut down" in stopped.log_tail(100_000)
    assert f"node {first.node} resigns" in stopped.log_tail(100_000)
    print(f"handed over {handed_over:.2f} s after SIGTERM")


def test_a_node_behind_the_log_start_catches_up_from_a_snapshot(tmp_path: Path) -> None:
    extra = FAST_ELECTIONS | {"metadata.log.max.record.bytes.between.snapshots": "1"}
    nodes = start_quorum(tmp_path, 3, extra)
    try:
        leader = wait_for_leader(list(nodes))
        behind = next(i for i in (1, 2, 3) if i != leader.node)
        own = tmp_path / f"node-{behind}" / "logs" / "__cluster_metadata-0"
        had = {path.name for path in own.glob("*.checkpoint")}
        assert nodes[behind - 1].stop() == 0
        leading = nodes[leader.node - 1]
        names = {f"t{i}" for i in range(5)}
        for name in sorted(names):
            create_topic(leading, name)
        metadata_dir = tmp_path / f"node-{leader.node}" / "logs" / "__cluster_metadata-0"
        assert list(metadata_dir.glob("*.checkpoint")), "the leader wrote no snapshot"
        nodes[behind - 1].restart()
        wait_listening(nodes[behind - 1], timeout=30)
        wait_for_topics(nodes[behind - 1], names)
        fetched = {path.name for path in own.glob("*.checkpoint")} - had
        assert fetched, "the node did not install a snapshot of the leader's"
        assert "installed snapshot" in nodes[behind - 1].log_tail(100_000)
    finally:
        for node in nodes:
            if node.process.poll() is None:
                node.kill()


def test_a_node_of_another_cluster_is_refused_by_the_quorum(tmp_path: Path) -> None:
    nodes = start_quorum(tmp_path, 3, FAST_ELECTIONS, cluster_ids={3: "AnotherClusterXXXXXXXXX"})
    try:
        # Two voters of three are a majority: the cluster works without the stranger...
        leader = wait_for_leader([*nodes[:2], None])
        assert leader.node in (1, 2)
        create_topic(nodes[leader.node - 1], "orders")
        # ...which is refused, says why, and never serves clients an image it could not get.
        stranger = nodes[2]
        deadline = time.monotonic() + 15
        while "belongs to another cluster" not in stranger.log_tail(100_000):
            assert time.monotonic() < deadline, stranger.log_tail()
            time.sleep(0.1)
        assert stranger.process.poll() is None
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("localhost", stranger.port), 1).close()
    finally:
        for node in nodes:
            if node.process.poll() is None:
                node.kill()


def test_a_node_waiting_for_its_quorum_stops_on_sigterm(tmp_path: Path) -> None:
    """One voter of three, the others never started: it waits for a quorum before serving,
    and a SIGTERM meanwhile stops it cleanly (Kubernetes deleting a pod that cannot start)."""
    nodes = start_quorum(tmp_path, 3, FAST_ELECTIONS, spawn={1})
    alone = nodes[0]
    try:
        time.sleep(2)
        assert alone.process.poll() is None
        assert alone.stop(timeout=15) == 0, alone.log_tail()
        assert "before it served" in alone.log_tail()
    finally:
        if alone.process.poll() is None:
            alone.kill()


LIFECYCLE = FAST_ELECTIONS | {
    "broker.heartbeat.interval.ms": "300",
    "broker.session.timeout.ms": "3000",
}


def test_every_node_registers_and_a_silent_one_is_fenced_until_it_returns(
    tmp_path: Path,
) -> None:
    nodes = start_quorum(tmp_path, 3, LIFECYCLE)
    try:
        leader = wait_for_leader(list(nodes))
        lists_brokers(nodes, {1, 2, 3})
        # A follower's process dies: after its session (3 s) the others stop naming it.
        silent = next(i for i in (1, 2, 3) if i != leader.node)
        nodes[silent - 1].kill()
        lists_brokers([nodes[leader.node - 1]], {1, 2, 3} - {silent})
        logs = "".join(node.log_tail(100_000) for node in nodes)
        assert re.search(rf"fencing brokers \[[0-9, ]*\b{silent}\b", logs), "not fenced for it"
        # Back, as a new process of the same node: registered and unfenced again.
        nodes[silent - 1].restart()
        wait_listening(nodes[silent - 1], timeout=30)
        lists_brokers(nodes, {1, 2, 3})
    finally:
        for node in nodes:
            if node.process.poll() is None:
                node.kill()


def test_a_stopped_broker_is_let_go_at_once(tmp_path: Path) -> None:
    """SIGTERM is a controlled shutdown: the controller fences the broker when it asks, not
    after its session (a minute here)."""
    nodes = start_quorum(tmp_path, 3, FAST_ELECTIONS | {"broker.session.timeout.ms": "60000"})
    try:
        leader = wait_for_leader(list(nodes))
        lists_brokers([nodes[leader.node - 1]], {1, 2, 3})
        leaving = next(i for i in (1, 2, 3) if i != leader.node)
        assert nodes[leaving - 1].stop() == 0
        let_go = f"the controller let broker {leaving} shut down"
        assert let_go in nodes[leaving - 1].log_tail(100_000)
        lists_brokers([nodes[leader.node - 1]], {1, 2, 3} - {leaving}, timeout=5)
    finally:
        for node in nodes:
            if node.process.poll() is None:
                node.kill()


def test_a_single_node_killed_registers_again_at_once(tmp_path: Path) -> None:
    """The node is its own controller: its previous process is known dead (the log dirs are
    locked to this one), so its registration has no session to wait out."""
    node = start_node(tmp_path)
    try:
        node.kill()
        node.restart()
        wait_listening(node)
        log = node.log_tail(100_000)
        assert log.count("broker 1 registered with epoch") == 2
        assert "waits for the session of its previous process" not in log
    finally:
        if node.process.poll() is None:
            node.kill()


def test_a_broker_has_the_controller_create_the_offsets_topic_clients_may_not(
    quorum: list[RunningNode],
) -> None:
    leader = wait_for_leader(list(quorum))
    follower = next(n for i, n in enumerate(quorum, start=1) if i != leader.node)
    # A client may not create it, even through a broker that forwards the request...
    body = fill(
        request_type(ApiKey.CREATE_TOPICS, 7),
        {
            "topics": [
                {"name": "__consumer_offsets", "num_partitions": 1, "replication_factor": 1}
            ],
            "timeout": timedelta(seconds=5),
        },
    )
    refused: Any = call(("localhost", follower.port), ApiKey.CREATE_TOPICS, 7, body)
    assert refused.topics[0].error_code == ErrorCode.invalid_request
    # ...but the first group request to any broker has the controller create it.
    find = fill(request_type(ApiKey.FIND_COORDINATOR, 3), {"key": "g", "key_type": 0})
    call(("localhost", follower.port), ApiKey.FIND_COORDINATOR, 3, find)
    for node in quorum:
        wait_for_topics(node, {"__consumer_offsets"})
