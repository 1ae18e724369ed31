"""Partition replication, on three combined nodes (broker and controller each) and on three
dedicated controllers with three broker-only nodes (every scenario runs on both): followers copy
their leaders' logs with replica fetches, acks=all is answered once every in-sync replica has
the batch, only a partition's leader takes produce and consumer fetches, and a follower that
was down catches up from where its log ends.

Driven by confluent-kafka with `acks=all` and idempotence, as the issue's scenarios are. A leader
that is stopped or killed hands its partitions to the next in-sync replica; a follower that
stops fetching leaves the ISR and returns once it has caught up. When the active controller
dies, another voter takes over and admin requests work again within seconds.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ElectionType,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.cimpl import NewTopic

from broker.protocol import ApiKey, ErrorCode, request_type
from broker.protocol.records import Record, build_batch
from tests.integration.clients import QUIET
from tests.support.nodes import (
    Cluster,
    RunningNode,
    start_cluster,
    wait_listening,
)
from tests.support.requests import fill
from tests.support.wire import call, now_ms, produce_values

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAST = {
    "controller.quorum.election.timeout.ms": "300",
    "controller.quorum.fetch.timeout.ms": "600",
    "controller.quorum.election.backoff.max.ms": "300",
    "replica.fetch.backoff.ms": "200",
}


TOPOLOGIES = ["combined", "dedicated"]
"""Three combined nodes; or three dedicated controllers and broker-only nodes."""


def _start(
    tmp: Path,
    topology: str,
    settings: dict[str, str],
    brokers: int = 3,
    each: dict[int, dict[str, str]] | None = None,
) -> Cluster:
    """`brokers` brokers (ids 1..N) once all are registered: combined nodes, or broker-only
    nodes with three dedicated controllers."""
    controllers = 0 if topology == "combined" else 3
    return start_cluster(tmp, brokers, controllers, settings, each=each)


@pytest.fixture(params=TOPOLOGIES)
def topology(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module", params=TOPOLOGIES)
def cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[list[RunningNode]]:
    """A cluster shared by the tests that leave it as they found it: its three brokers."""
    running = _start(tmp_path_factory.mktemp("replication"), str(request.param), FAST)
    try:
        yield running.brokers
    finally:
        running.kill()


def _bootstrap(nodes: list[RunningNode]) -> str:
    return ",".join(node.bootstrap for node in nodes)


def _create(nodes: list[RunningNode], name: str, partitions: int, configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": _bootstrap(nodes), **QUIET})
    future = admin.create_topics(
        [NewTopic(name, partitions, 3, config=configs)], operation_timeout=10
    )[name]
    future.result(timeout=30)
    # Every node has applied it (its partitions, with their leaders) before clients use it:
    # asked of each node itself (a client library would ask whichever broker it likes).
    deadline = time.monotonic() + 15
    for node in nodes:
        while _partitions_on(node, name) != partitions:
            assert time.monotonic() < deadline, f"{name} did not reach {node.bootstrap}"
            time.sleep(0.1)


def _partitions_on(node: RunningNode, topic: str) -> int:
    """How many partitions of `topic` this node's own metadata has (with a leader)."""
    body = fill(request_type(ApiKey.METADATA, 12), {"topics": None})
    answer = call(("localhost", node.port), ApiKey.METADATA, 12, body)
    for found in answer.topics:
        if found.name == topic and found.error_code == ErrorCode.none:
            return sum(1 for p in found.partitions if p.leader_id >= 0)
    return 0


def _isr_on(node: RunningNode, topic: str, partition: int) -> set[int]:
    """The partition's ISR in this node's own metadata."""
    body = fill(request_type(ApiKey.METADATA, 12), {"topics": None})
    answer = call(("localhost", node.port), ApiKey.METADATA, 12, body)
    for found in answer.topics:
        if found.name == topic:
            for state in found.partitions:
                if state.partition_index == partition:
                    return set(state.isr_nodes)
    return set()


def _leaders(nodes: list[RunningNode], topic: str, timeout: float = 15.0) -> dict[int, int]:
    """Each partition's leader, as the cluster's metadata has it once every partition has
    one."""
    admin = AdminClient({"bootstrap.servers": _bootstrap(nodes), **QUIET})
    deadline = time.monotonic() + timeout
    while True:
        described = admin.list_topics(topic, timeout=10).topics[topic]
        found = {index: p.leader for index, p in described.partitions.items()}
        if found and all(leader >= 0 for leader in found.values()):
            return found
        assert time.monotonic() < deadline, f"{topic}: {described.error}, leaders {found}"
        time.sleep(0.2)


def _producer(
    nodes: list[RunningNode], acks: str = "all"
) -> tuple[Producer, list[Any], Callable[[Any, Any], None]]:
    """A confluent-kafka producer (idempotent with acks=all), the list of delivery errors, and
    the delivery callback that fills it."""
    producer = Producer(
        {
            "bootstrap.servers": _bootstrap(nodes),
            "acks": acks,
            "enable.idempotence": acks == "all",
            "linger.ms": 5,
            **QUIET,
        }
    )
    failures: list[Any] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(error)

    return producer, failures, delivered


def _produce(nodes: list[RunningNode], topic: str, count: int, *, acks: str = "all") -> None:
    producer, failures, delivered = _producer(nodes, acks)
    for i in range(count):
        producer.produce(topic, key=b"k%d" % (i % 7), value=b"v%d" % i, on_delivery=delivered)
        if i % 1000 == 999:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert failures == []


def _read(nodes: list[RunningNode], topic: str, partitions: int, count: int) -> list[bytes]:
    """Every record's value, from offset 0 of each partition (partition by partition)."""
    by_partition = _read_partitions(nodes, topic, partitions, count)
    return [value for values in by_partition.values() for value in values]


def _read_partitions(
    nodes: list[RunningNode], topic: str, partitions: int, count: int
) -> dict[int, list[bytes]]:
    """Each partition's values in offset order, read until `count` in all, plus whatever a
    further short poll finds (there should be none)."""
    consumer = Consumer(
        {
            "bootstrap.servers": _bootstrap(nodes),
            "group.id": "unused",
            "enable.auto.commit": False,
            **QUIET,
        }
    )
    got: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        seen = 0
        deadline = time.monotonic() + 60
        while seen < count and time.monotonic() < deadline:
            for message in consumer.consume(500, timeout=0.5):
                if message.error() is None:
                    got[message.partition() or 0].append(message.value() or b"")
                    seen += 1
        # Nothing beyond: a short further poll finds no more records.
        for message in consumer.consume(100, timeout=1.0):
            if message.error() is None:
                got[message.partition() or 0].append(message.value() or b"")
        return got
    finally:
        consumer.close()


def _segments(node: RunningNode, topic: str, partition: int) -> bytes:
    """A replica's log as it is on disk: its segment files, in order, concatenated."""
    directory = Path(str(node.config.parent)) / "logs" / f"{topic}-{partition}"
    return b"".join(path.read_bytes() for path in sorted(directory.glob("*.log")))


def _wait_for_equal_logs(
    nodes: list[RunningNode], topic: str, partitions: int, timeout: float = 30.0
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        copies = [[_segments(node, topic, p) for node in nodes] for p in range(partitions)]
        if all(len(set(replicas)) == 1 and replicas[0] for replicas in copies):
            return
        if time.monotonic() > deadline:
            sizes = [[len(c) for c in replicas] for replicas in copies]
            raise AssertionError(f"the replicas' logs differ (bytes per partition): {sizes}")
        time.sleep(0.2)


def test_acks_all_writes_are_on_every_replica_and_read_back_once(
    cluster: list[RunningNode],
) -> None:
    _create(cluster, "replicated", 4, {"min.insync.replicas": "2"})
    assert set(_leaders(cluster, "replicated").values()) <= {1, 2, 3}

    _produce(cluster, "replicated", 6000)

    values = _read(cluster, "replicated", 4, 6000)
    assert sorted(values) == sorted(b"v%d" % i for i in range(6000))
    # Every replica holds the same bytes: followers copy the leader's batches as they are.
    _wait_for_equal_logs(cluster, "replicated", 4)


def test_a_follower_refuses_produce_and_consumer_fetches_and_names_the_leader(
    cluster: list[RunningNode],
) -> None:
    """Produce goes to the leader only. A consumer's fetch without client metadata (before
    v11) too; from v11 a follower serves it up to its high watermark, as Kafka's followers do
    (KIP-392: tests/integration/test_follower_fetching.py)."""
    _create(cluster, "led", 1, {})
    leader = _leaders(cluster, "led")[0]
    follower = next(node for i, node in enumerate(cluster, 1) if i != leader)
    batch = build_batch([Record(0, now_ms(), b"k", b"x")])

    body = fill(request_type(ApiKey.PRODUCE, 10), produce_values("led", batch))
    answer = call(("localhost", follower.port), ApiKey.PRODUCE, 10, body)
    partition = answer.responses[0].partition_responses[0]
    assert partition.error_code == ErrorCode.not_leader_or_follower
    assert partition.current_leader.leader_id == leader

    for version, error in ((10, ErrorCode.not_leader_or_follower), (12, ErrorCode.none)):
        fetch = fill(
            request_type(ApiKey.FETCH, version),
            {
                "replica_id": -1,
                "max_wait": timedelta(0),
                "min_bytes": 0,
                "max_bytes": 1 << 20,
                "isolation_level": 0,
                "topics": [
                    {
                        "topic": "led",
                        "partitions": [
                            {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}
                        ],
                    }
                ],
            },
        )
        fetched = call(("localhost", follower.port), ApiKey.FETCH, version, fetch)
        assert fetched.responses[0].partitions[0].error_code == error, version


def test_a_follower_killed_and_restarted_catches_up_with_its_leader(
    cluster: list[RunningNode],
) -> None:
    _create(cluster, "catch-up", 2, {})
    _produce(cluster, "catch-up", 1000)
    _wait_for_equal_logs(cluster, "catch-up", 2)
    leaders = set(_leaders(cluster, "catch-up").values())
    down = next(node for i, node in enumerate(cluster, 1) if i not in leaders)

    down.kill()
    _produce([n for n in cluster if n is not down], "catch-up", 2000, acks="1")
    down.restart()
    wait_listening(down, timeout=30)

    _wait_for_equal_logs(cluster, "catch-up", 2)
    values = _read(cluster, "catch-up", 2, 3000)
    assert len(values) == 3000
    # Whether or not its broker was fenced meanwhile, it is back in every ISR.
    _wait_for_isrs(cluster, "catch-up", lambda isr: isr == {1, 2, 3}, "the follower rejoins")


RECORDS = 30_000
"""Scenarios (a) and (b): how many records are produced while a leader is stopped."""
FAILOVER = FAST | {
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    "leader.imbalance.check.interval.seconds": "1",
}


def _produce_while(nodes: list[RunningNode], topic: str, count: int, during: Any) -> list[Any]:
    """Produce `count` records (acks=all, idempotent), calling `during()` a third of the way
    in; the delivery errors."""
    producer, failures, delivered = _producer(nodes)
    for i in range(count):
        producer.produce(topic, value=b"v%d" % i, on_delivery=delivered)
        if i % 200 == 199:
            producer.poll(0)
            time.sleep(0.02)  # a steady stream, so the stop lands in the middle of it
        if i == count // 3:
            producer.flush(30)
            during()
    assert producer.flush(90) == 0
    return failures


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_a_leader_stopped_mid_produce_loses_no_acknowledged_record(
    tmp_path: Path, topology: str, how: str
) -> None:
    """Scenarios (a), (b) and (d). SIGTERM: a controlled shutdown moves the node's leaderships
    first, and producers see no error. SIGKILL: the node's session runs out, it is fenced and
    the next in-sync replica leads; every record the producer was told is written is read back
    exactly once. Restarted, the node catches up, rejoins the ISRs, and gets its preferred
    leaderships back."""
    running = _start(tmp_path, topology, FAILOVER)
    nodes = running.brokers
    try:
        _create(nodes, "moving", 3, {"min.insync.replicas": "2"})
        victim = nodes[_leaders(nodes, "moving")[0] - 1]
        survivors = [node for node in nodes if node is not victim]

        def stop() -> None:
            if how == "sigterm":
                assert victim.stop() == 0
            else:
                victim.kill()

        failures = _produce_while(nodes, "moving", RECORDS, stop)

        assert failures == []
        by_partition = _read_partitions(survivors, "moving", 3, RECORDS)
        values = [value for values in by_partition.values() for value in values]
        # Exactly once each, and in the order produced within each partition.
        assert sorted(values) == sorted(b"v%d" % i for i in range(RECORDS))
        for partition, found in by_partition.items():
            numbers = [int(value[1:]) for value in found]
            assert numbers == sorted(numbers), f"partition {partition} is out of order"
        assert set(_leaders(survivors, "moving").values()) <= {
            i for i, node in enumerate(nodes, 1) if node is not victim
        }

        # Scenario (d): back after a while, it cuts any tail it wrote that the new leaders
        # never had, copies what they took meanwhile and rejoins every ISR...
        victim.restart()
        wait_listening(victim, timeout=30)
        _wait_for_isrs(nodes, "moving", lambda isr: isr == {1, 2, 3}, "it rejoins every ISR")
        _wait_for_equal_logs(nodes, "moving", 3)
        # ...and leads its preferred partitions again (auto.leader.rebalance.enable, checked
        # every second here).
        preferred = _preferred_leaders(nodes, "moving")
        deadline = time.monotonic() + 15
        while (leaders := _leaders(nodes, "moving")) != preferred:
            assert time.monotonic() < deadline, f"leaders {leaders}, preferred {preferred}"
            time.sleep(0.2)
        assert len(_read(nodes, "moving", 3, RECORDS)) == RECORDS
    finally:
        running.kill()


def _preferred_leaders(nodes: list[RunningNode], topic: str) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": _bootstrap(nodes), **QUIET})
    found = admin.list_topics(topic, timeout=10).topics[topic].partitions
    return {index: partition.replicas[0] for index, partition in found.items()}


def _isrs(nodes: list[RunningNode], topic: str) -> dict[int, set[int]]:
    admin = AdminClient({"bootstrap.servers": _bootstrap(nodes), **QUIET})
    found = admin.list_topics(topic, timeout=10).topics[topic].partitions
    return {index: set(partition.isrs) for index, partition in found.items()}


def _wait_for_isrs(
    nodes: list[RunningNode], topic: str, check: Any, what: str, timeout: float = 30.0
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        isrs = _isrs(nodes, topic)
        if all(check(isr) for isr in isrs.values()):
            return
        assert time.monotonic() < deadline, f"{what}: ISRs are {isrs}"
        time.sleep(0.2)


def test_a_stopped_follower_leaves_the_isr_and_returns_once_it_catches_up(
    tmp_path: Path, topology: str
) -> None:
    """SIGSTOP: the follower stops fetching but its broker keeps its registration for a while;
    after `replica.lag.time.max.ms` its leader drops it from the ISR (AlterPartition), and
    acks=all writes go on with `min.insync.replicas=2`. After SIGCONT it catches up and its
    leader adds it back."""
    running = _start(
        tmp_path,
        topology,
        FAST | {"replica.lag.time.max.ms": "1500", "broker.session.timeout.ms": "60000"},
    )
    nodes = running.brokers
    try:
        _create(nodes, "lagging", 1, {"min.insync.replicas": "2"})
        leader = _leaders(nodes, "lagging")[0]
        controller = _active_controller(running)
        number = next(i for i in (1, 2, 3) if i not in (leader, controller))
        stopped = nodes[number - 1]
        _produce(nodes, "lagging", 500)

        stopped.process.send_signal(signal.SIGSTOP)
        try:
            _produce(nodes, "lagging", 500)  # waits for the ISR to shrink, then goes on
            # Every node learns of the smaller ISR a metadata fetch after its leader.
            _wait_for_isrs(nodes, "lagging", lambda isr: number not in isr, "it leaves the ISR")
        finally:
            stopped.process.send_signal(signal.SIGCONT)

        _wait_for_isrs(nodes, "lagging", lambda isr: isr == {1, 2, 3}, "the follower rejoins")
        _wait_for_equal_logs(nodes, "lagging", 1)
    finally:
        running.kill()


def test_a_group_and_its_committed_offsets_survive_the_loss_of_its_coordinator(
    tmp_path: Path, topology: str
) -> None:
    """The coordinator is the leader of the group's `__consumer_offsets` partition (RF 3):
    a commit is answered once the ISR has it, and when that node is killed the next leader
    loads the group from its own copy, so the group resumes where it committed."""
    running = _start(tmp_path, topology, FAILOVER | {"offsets.topic.replication.factor": "3"})
    nodes = running.brokers
    try:
        _create(nodes, "orders", 3, {"min.insync.replicas": "2"})
        _produce(nodes, "orders", 300)

        def consumer(bootstrap: list[RunningNode]) -> Consumer:
            group = Consumer(
                {
                    "bootstrap.servers": _bootstrap(bootstrap),
                    "group.id": "billing",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    **QUIET,
                }
            )
            group.subscribe(["orders"])
            return group

        first = consumer(nodes)
        seen: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(seen) < 150 and time.monotonic() < deadline:
            message = first.poll(0.5)
            if message is not None and message.error() is None:
                seen.append(message.value() or b"")
        assert len(seen) >= 150
        first.commit(asynchronous=False)
        first.close()

        admin = AdminClient({"bootstrap.servers": _bootstrap(nodes), **QUIET})
        described = admin.describe_consumer_groups(["billing"])["billing"].result(timeout=10)
        coordinator = described.coordinator.id
        nodes[coordinator - 1].kill()
        survivors = [n for i, n in enumerate(nodes, 1) if i != coordinator]

        second = consumer(survivors)
        rest: list[bytes] = []
        deadline = time.monotonic() + 90
        while len(seen) + len(rest) < 300 and time.monotonic() < deadline:
            message = second.poll(0.5)
            if message is not None and message.error() is None:
                rest.append(message.value() or b"")
        second.close()
        # Resumed at the committed offsets: every record once, none of the first read again.
        assert sorted(seen + rest) == sorted(b"v%d" % i for i in range(300))
    finally:
        running.kill()


def test_acks_all_below_min_insync_replicas_is_refused_and_nothing_is_written(
    tmp_path: Path, topology: str
) -> None:
    """Scenario (f), with `min.insync.replicas=2` from server.properties (no topic override):
    both followers of a partition die, their brokers are fenced, the ISR is the leader alone,
    and acks=all produce gets NOT_ENOUGH_REPLICAS with nothing appended. Five combined nodes
    (or three dedicated controllers), so the quorum outlives the two."""
    brokers = 5 if topology == "combined" else 3
    running = _start(tmp_path, topology, FAILOVER | {"min.insync.replicas": "2"}, brokers)
    nodes = running.brokers
    try:
        _create(nodes, "guarded", 1, {})
        _produce(nodes, "guarded", 10)
        admin = AdminClient({"bootstrap.servers": _bootstrap(nodes), **QUIET})
        described = admin.list_topics("guarded", timeout=10).topics["guarded"].partitions[0]
        leader = described.leader
        for follower in set(described.replicas) - {leader}:
            nodes[follower - 1].kill()
        alive = [n for i, n in enumerate(nodes, 1) if n.process.poll() is None]
        _wait_for_isrs(alive, "guarded", lambda isr: isr == {leader}, "the ISR shrinks")
        # The leader itself must have applied it: until then it takes acks=all writes with
        # the ISR it had, and a write it appends then is refused only after the append
        # (NOT_ENOUGH_REPLICAS_AFTER_APPEND), its records left in the log, as in Kafka.
        deadline = time.monotonic() + 15
        while _isr_on(nodes[leader - 1], "guarded", 0) != {leader}:
            assert time.monotonic() < deadline, "the leader did not apply its smaller ISR"
            time.sleep(0.1)

        producer = Producer(
            {
                "bootstrap.servers": _bootstrap(alive),
                "acks": "all",
                "message.timeout.ms": 3000,
                **QUIET,
            }
        )
        errors: list[Any] = []
        for i in range(5):
            producer.produce(
                "guarded", value=b"refused %d" % i, on_delivery=lambda e, _m: errors.append(e)
            )
        producer.flush(20)
        assert len(errors) == 5
        assert all(e is not None for e in errors)
        assert {e.code() for e in errors} <= {
            KafkaError.NOT_ENOUGH_REPLICAS,
            KafkaError._MSG_TIMED_OUT,  # retried NOT_ENOUGH_REPLICAS until the timeout
        }
        values = _read(alive, "guarded", 1, 10)
        assert sorted(values) == sorted(b"v%d" % i for i in range(10))  # nothing more
    finally:
        running.kill()


def test_replicas_spread_over_three_racks(tmp_path: Path, topology: str) -> None:
    """Scenario (h): six brokers on three racks; every RF-3 partition has a replica in each
    rack, and leaders are spread over all six brokers."""
    racks = {i: {"broker.rack": f"rack-{(i - 1) % 3}"} for i in range(1, 7)}
    running = _start(tmp_path, topology, FAST, 6, each=racks)
    nodes = running.brokers
    try:
        _create(nodes, "spread", 12, {})
        admin = AdminClient({"bootstrap.servers": _bootstrap(nodes), **QUIET})
        partitions = admin.list_topics("spread", timeout=10).topics["spread"].partitions
        for partition in partitions.values():
            assert {racks[r]["broker.rack"] for r in partition.replicas} == {
                "rack-0",
                "rack-1",
                "rack-2",
            }
        leaders = [p.leader for p in partitions.values()]
        assert sorted(leaders) == sorted(list(range(1, 7)) * 2)
    finally:
        running.kill()


def _active_controller(cluster: Cluster) -> int:
    """The quorum's leader, as it answers DescribeQuorum itself on its controller listener."""
    body = fill(
        request_type(ApiKey.DESCRIBE_QUORUM, 2),
        {"topics": [{"topic_name": "__cluster_metadata", "partitions": [{"partition_index": 0}]}]},
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        for node in cluster.controllers:
            if node.process.poll() is not None:
                continue
            assert node.controller_port is not None
            try:
                answer = call(("localhost", node.controller_port), ApiKey.DESCRIBE_QUORUM, 2, body)
            except OSError:
                continue
            partition = answer.topics[0].partitions[0]
            if partition.error_code == ErrorCode.none and partition.leader_id == node.node_id:
                return node.node_id
        time.sleep(0.1)
    raise AssertionError("no voter answers DescribeQuorum as the leader")


def test_topics_are_created_within_ten_seconds_of_killing_the_active_controller(
    tmp_path: Path, topology: str
) -> None:
    """Scenario (c), with Kafka's default quorum timeouts: the active controller is SIGKILLed
    (with combined nodes, a broker dies with it); another voter is elected and a client's
    CreateTopics, sent to the brokers still running and forwarded, succeeds again within
    10 s of the kill."""
    running = _start(tmp_path, topology, {})
    try:
        active = _active_controller(running)
        running.node(active).kill()
        killed_at = time.monotonic()
        alive = [b for b in running.brokers if b.process.poll() is None]
        admin = AdminClient({"bootstrap.servers": _bootstrap(alive), **QUIET})
        attempts: list[str] = []
        while True:
            future = admin.create_topics([NewTopic("after", 3, 2)], operation_timeout=5)
            try:
                future["after"].result(timeout=10)
                break
            except KafkaException as exc:
                error = exc.args[0]
                if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    break  # an earlier attempt was committed, its answer lost with the leader
                attempts.append(error.name())
            assert time.monotonic() - killed_at < 10, f"still refused after 10 s: {attempts}"
            time.sleep(0.2)
        elapsed = time.monotonic() - killed_at
        refusals = f"{len(attempts)} refusals: {sorted(set(attempts))}"
        assert elapsed < 10, f"created {elapsed:.1f} s after the kill ({refusals})"
        assert _active_controller(running) != active
        for broker in alive:
            deadline = time.monotonic() + 10
            while _partitions_on(broker, "after") != 3:
                assert time.monotonic() < deadline, f"'after' did not reach {broker.bootstrap}"
                time.sleep(0.1)
        print(f"{topology}: topic created {elapsed:.2f} s after the kill ({refusals})")
    finally:
        running.kill()


def _alter_broker_configs(
    node: RunningNode, changes: list[tuple[str, str | None]], name: str
) -> list[tuple[str, ErrorCode, str | None]]:
    """IncrementalAlterConfigs sent to `node`: `name` set (or deleted, for None) on each
    broker resource of `changes`; (resource name, error, message) per resource."""
    body = fill(
        request_type(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1),
        {
            "resources": [
                {
                    "resource_type": 4,
                    "resource_name": resource,
                    "configs": [
                        {
                            "name": name,
                            "config_operation": 0 if value is not None else 1,
                            "value": value,
                        }
                    ],
                }
                for resource, value in changes
            ],
            "validate_only": False,
        },
    )
    answer = call(("localhost", node.port), ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, body)
    return [(r.resource_name, r.error_code, r.error_message) for r in answer.responses]


def _broker_config(node: RunningNode, broker_id: int, name: str) -> str | None:
    body = fill(
        request_type(ApiKey.DESCRIBE_CONFIGS, 4),
        {
            "resources": [
                {"resource_type": 4, "resource_name": str(broker_id), "configuration_keys": [name]}
            ],
            "include_synonyms": False,
            "include_documentation": False,
        },
    )
    answer = call(("localhost", node.port), ApiKey.DESCRIBE_CONFIGS, 4, body)
    found = [c.value for c in answer.results[0].configs if c.name == name]
    return found[0] if found else None


def test_broker_configs_are_changed_through_their_own_broker_whichever_leads_the_quorum(
    cluster: list[RunningNode],
) -> None:
    """Kafka's clients send a broker's configs to that broker, which forwards them to the
    active controller: each broker takes its own (wherever the quorum's leader is) and
    refuses, by name, another broker's in the same request, whose other resources still go
    through."""
    name = "leader.replication.throttled.rate"
    try:
        for node in cluster:
            own, other = str(node.node_id), str(node.node_id % 3 + 1)
            answers = _alter_broker_configs(
                node, [(other, "7"), (own, f"{node.node_id}000"), ("x", "7")], name
            )
            assert answers == [
                (
                    other,
                    ErrorCode.invalid_request,
                    f"Unexpected broker id, expected {own}, but received {other}",
                ),
                (own, ErrorCode.none, None),
                (
                    "x",
                    ErrorCode.invalid_request,
                    "Node id must be an integer, but it is: x",
                ),
            ]
        for node in cluster:
            deadline = time.monotonic() + 10
            while _broker_config(node, node.node_id, name) != f"{node.node_id}000":
                assert time.monotonic() < deadline, f"{name} of {node.node_id} not set"
                time.sleep(0.1)
    finally:
        for node in cluster:
            _alter_broker_configs(node, [(str(node.node_id), None)], name)


def _produce_values(nodes: list[RunningNode], topic: str, values: list[bytes]) -> None:
    producer, failures, delivered = _producer(nodes)
    for value in values:
        producer.produce(topic, value=value, on_delivery=delivered)
    assert producer.flush(60) == 0
    assert failures == []


def _leader_on(node: RunningNode, topic: str) -> int:
    """Partition 0's leader in this node's own metadata (-1: none)."""
    body = fill(request_type(ApiKey.METADATA, 12), {"topics": None})
    answer = call(("localhost", node.port), ApiKey.METADATA, 12, body)
    found = next(t for t in answer.topics if t.name == topic)
    return int(found.partitions[0].leader_id)


def _wait_for_leader_on(node: RunningNode, topic: str, leader: int) -> None:
    deadline = time.monotonic() + 15
    while (found := _leader_on(node, topic)) != leader:
        assert time.monotonic() < deadline, f"{topic} is led by {found}, not {leader}"
        time.sleep(0.1)


def test_unclean_elections_happen_only_where_allowed_and_lose_only_what_was_not_replicated(
    tmp_path: Path,
) -> None:
    """Replicas 1 and 2: broker 2 goes, records are written to 1 alone, then 1 goes too. When
    2 returns, a topic with `unclean.leader.election.enable` gets it as its leader at once,
    without the records only 1 had; a topic without stays leaderless (1 alone has everything)
    until an operator asks for an unclean election. When 1 returns it drops what the new
    leader does not have and joins the ISR again. (Dedicated controllers, so that the quorum
    stays up with two brokers down.)"""
    running = _start(tmp_path, "dedicated", FAST)
    one, two, three = (running.broker(i) for i in (1, 2, 3))
    topics = {"clean-only": {}, "unclean-ok": {"unclean.leader.election.enable": "true"}}
    first = [b"first-%d" % i for i in range(10)]
    try:
        admin = AdminClient({"bootstrap.servers": three.bootstrap, **QUIET})
        futures = admin.create_topics(
            [
                NewTopic(name, num_partitions=1, replica_assignment=[[1, 2]], config=c)
                for name, c in topics.items()
            ]
        )
        for future in futures.values():
            future.result(timeout=30)
        for name in topics:
            _wait_for_isrs([three], name, lambda isr: isr == {1, 2}, "both in sync")
            _produce_values([three], name, first)

        assert two.stop() == 0  # a controlled shutdown takes it out of the ISRs
        for name in topics:
            _wait_for_isrs([three], name, lambda isr: isr == {1}, "2 leaves the ISR")
            _produce_values([three], name, [b"only-on-1-%d" % i for i in range(5)])
        # The last in-sync replica: leaderless, its ISR empty and 1 its eligible leader
        # replica (KIP-966, as Kafka 4.1+ has it; the Metadata API shows the empty ISR).
        assert one.stop() == 0
        two.restart()
        wait_listening(two, timeout=30)

        # Allowed: broker 2 leads at once, with what it had.
        _wait_for_leader_on(three, "unclean-ok", 2)
        assert _read([two, three], "unclean-ok", 1, len(first)) == first
        # Not allowed: no leader, whatever the wait.
        time.sleep(3)
        assert _leader_on(three, "clean-only") == -1
        assert _isr_on(three, "clean-only", 0) == set()
        # Until the operator chooses to lose what only 1 had.
        elected = admin.elect_leaders(ElectionType.UNCLEAN, [TopicPartition("clean-only", 0)])
        assert list(elected.result(timeout=30).values()) == [None]
        _wait_for_leader_on(three, "clean-only", 2)
        assert _read([two, three], "clean-only", 1, len(first)) == first

        after = [b"after-%d" % i for i in range(5)]
        for name in topics:
            _produce_values([two, three], name, after)
        one.restart()
        wait_listening(one, timeout=30)
        for name in topics:
            _wait_for_isrs([three], name, lambda isr: isr == {1, 2}, "1 rejoins")
            _wait_for_equal_logs([one, two], name, 1)
            assert _read([one, two, three], name, 1, len(first) + 5) == first + after
    finally:
        running.kill()


def _reassign(node: RunningNode, topic: str, replicas: list[int] | None) -> Any:
    body = fill(
        request_type(ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0),
        {
            "timeout": timedelta(seconds=30),
            "topics": [
                {"name": topic, "partitions": [{"partition_index": 0, "replicas": replicas}]}
            ],
        },
    )
    answer = call(("localhost", node.port), ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0, body)
    return answer.responses[0].partitions[0]


def _reassigning(node: RunningNode) -> dict[str, tuple[list[int], list[int], list[int]]]:
    """ListPartitionReassignments: topic → (replicas, adding, removing) of its partition 0."""
    body = fill(
        request_type(ApiKey.LIST_PARTITION_REASSIGNMENTS, 0),
        {"timeout": timedelta(seconds=30), "topics": None},
    )
    answer = call(("localhost", node.port), ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, body)
    assert answer.error_code == ErrorCode.none
    return {
        topic.name: (list(p.replicas), list(p.adding_replicas), list(p.removing_replicas))
        for topic in answer.topics
        for p in topic.partitions
        if p.partition_index == 0
    }


def _throttle(nodes: list[RunningNode], topic: str, rate: str | None, moving: str) -> None:
    """The throttles kafka-reassign-partitions sets: every broker's rates, and the replicas
    of `topic` that send (`0:1,...`) and that fetch (`moving`); None clears them."""
    admin = AdminClient({"bootstrap.servers": _bootstrap(nodes), **QUIET})
    operation = AlterConfigOpType.SET if rate is not None else AlterConfigOpType.DELETE
    resources = [
        ConfigResource(
            ConfigResource.Type.BROKER,
            str(node.node_id),
            incremental_configs=[
                ConfigEntry(name, rate, incremental_operation=operation)
                for name in (
                    "leader.replication.throttled.rate",
                    "follower.replication.throttled.rate",
                )
            ],
        )
        for node in nodes
    ]
    resources.append(
        ConfigResource(
            ConfigResource.Type.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry(
                    "leader.replication.throttled.replicas",
                    "0:1,0:2,0:3" if rate is not None else None,
                    incremental_operation=operation,
                ),
                ConfigEntry(
                    "follower.replication.throttled.replicas",
                    moving if rate is not None else None,
                    incremental_operation=operation,
                ),
            ],
        )
    )
    for resource in resources:  # librdkafka sends one broker's configs per request
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(timeout=30)


def test_a_throttled_reassignment_under_load_loses_no_acknowledged_record(
    tmp_path: Path, topology: str
) -> None:
    """Scenario (g): a partition moves from brokers 1-3 to 2-4 under a replication throttle
    while an idempotent acks=all producer writes to it (RF 3, min.insync.replicas=2):
    ListPartitionReassignments reports the move while the throttle holds broker 4 back and
    until it has caught up, the old replica then goes (and leadership with it), and every
    acknowledged record is read back once, in order."""
    running = _start(tmp_path, topology, FAST, brokers=4)
    nodes = running.brokers
    try:
        admin = AdminClient({"bootstrap.servers": _bootstrap(nodes), **QUIET})
        created = admin.create_topics(
            [
                NewTopic(
                    "reassigned",
                    num_partitions=1,
                    replica_assignment=[[1, 2, 3]],
                    config={"min.insync.replicas": "2"},
                )
            ]
        )
        created["reassigned"].result(timeout=30)
        _wait_for_isrs(nodes, "reassigned", lambda isr: isr == {1, 2, 3}, "in sync")
        _produce_values(nodes, "reassigned", [b"%d" % i + b"." * 1000 for i in range(3000)])
        # 3 MB to copy at 100 kB/s, measured over 10 s at least: a megabyte at a time, 11 s
        # apart, while an unthrottled copy takes well under a second.
        _throttle(nodes, "reassigned", "100000", "0:4")

        def move() -> None:
            answer = _reassign(nodes[0], "reassigned", [2, 3, 4])
            assert answer.error_code == ErrorCode.none, answer
            assert _reassigning(nodes[3]) == {"reassigned": ([2, 3, 4, 1], [4], [1])}

        producer, failures, delivered = _producer(nodes)
        total = 3000 + RECORDS
        for i in range(3000, total):
            producer.produce("reassigned", value=b"%d" % i, on_delivery=delivered)
            if i % 200 == 199:
                producer.poll(0)
                time.sleep(0.02)
            if i == 3000 + RECORDS // 3:
                move()
        assert producer.flush(90) == 0
        assert failures == []
        # The throttle holds the new replica back; lifted, the move completes.
        assert _reassigning(nodes[2]) == {"reassigned": ([2, 3, 4, 1], [4], [1])}
        _throttle(nodes, "reassigned", None, "")
        deadline = time.monotonic() + 60
        while _reassigning(nodes[0]):
            assert time.monotonic() < deadline, f"still moving: {_reassigning(nodes[0])}"
            time.sleep(0.5)
        # Every broker learns the new assignment a metadata fetch after the controller.
        for node in nodes:
            deadline = time.monotonic() + 10
            while True:
                one = AdminClient({"bootstrap.servers": node.bootstrap, **QUIET})
                found = one.list_topics("reassigned", timeout=10).topics["reassigned"]
                partition = found.partitions[0]
                if list(partition.replicas) == [2, 3, 4] and partition.leader in (2, 3, 4):
                    break
                assert time.monotonic() < deadline, f"{node.bootstrap}: {partition}"
                time.sleep(0.1)
        _wait_for_isrs(nodes, "reassigned", lambda isr: isr == {2, 3, 4}, "the new ISR")
        _wait_for_equal_logs(nodes[1:], "reassigned", 1)
        values = _read(nodes, "reassigned", 1, total)
        numbers = [int(value.rstrip(b".")) for value in values]
        assert numbers == list(range(total))
    finally:
        running.kill()
