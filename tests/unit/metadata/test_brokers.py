"""The active controller's rules for brokers (KIP-631): a broker registers fenced with its
registration's offset as its epoch, is unfenced only once it has caught up with the log, is
fenced when its heartbeats stop or it asks, and is let go on a controlled shutdown; another
process with the same node id is refused while the first one lives."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from broker.metadata.brokers import (
    METADATA_VERSION,
    BrokerSessions,
    Heartbeat,
    Registration,
    fence,
    heartbeat,
    register,
    unregister,
)
from broker.metadata.controller import QuorumController, TopicRequest
from broker.metadata.image import MetadataImage
from broker.metadata.records import (
    BrokerEndpoint,
    BrokerRegistrationChangeRecord,
    FenceBrokerRecord,
    MetadataRecord,
    RegisterBrokerRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
    decode_record,
    encode_record,
)
from broker.protocol import ErrorCode

CLUSTER = "cluster-1"
SESSION_MS = 9000
LISTENERS = (BrokerEndpoint("PLAINTEXT", "localhost", 9092, 0),)


class Cluster:
    """An image with the records applied at consecutive offsets, as the log commits them."""

    def __init__(self) -> None:
        self.image = MetadataImage()
        self.sessions = BrokerSessions(SESSION_MS)
        self.next_offset = 0

    def commit(self, records: Sequence[MetadataRecord]) -> None:
        for record in records:
            self.image.apply(decode_record(encode_record(record)), self.next_offset)
            self.next_offset += 1

    def register(self, broker_id: int, now: int, incarnation: uuid.UUID | None = None) -> int:
        request = Registration(broker_id, incarnation or uuid.uuid4(), CLUSTER, LISTENERS, "r1")
        records, answer = register(
            self.image,
            self.sessions,
            request,
            cluster_id=CLUSTER,
            next_offset=self.next_offset,
            now_ms=now,
        )
        assert answer.error == ErrorCode.none, answer
        self.commit(records)
        return answer.broker_epoch

    def register_live(self, broker_id: int) -> int:
        """Register the broker and unfence it, as its first heartbeat after catching up does."""
        epoch = self.register(broker_id, now=0)
        request = Heartbeat(broker_id, epoch, epoch)
        self.commit(heartbeat(self.image, self.sessions, request, now_ms=0)[0])
        return epoch

    def shut_down(self, broker_id: int, epoch: int) -> None:
        """A controlled shutdown to its end (SIGTERM): the broker asks, applies the records
        that fence it, and is let go."""
        request = Heartbeat(broker_id, epoch, self.next_offset - 1, want_shut_down=True)
        records, _ = heartbeat(
            self.image, self.sessions, request, now_ms=0, next_offset=self.next_offset
        )
        self.commit(records)
        caught_up = Heartbeat(broker_id, epoch, self.next_offset - 1, want_shut_down=True)
        assert heartbeat(self.image, self.sessions, caught_up, now_ms=0)[1].should_shut_down


def test_a_broker_registers_fenced_with_its_registrations_offset_as_epoch() -> None:
    cluster = Cluster()
    epoch = cluster.register(1, now=0)
    assert cluster.image.features == {"metadata.version": METADATA_VERSION}
    assert epoch == 1  # after the metadata.version record that formats the cluster
    broker = cluster.image.brokers[1]
    assert (broker.epoch, broker.fenced, broker.rack) == (1, True, "r1")
    assert cluster.image.live_brokers == []
    assert cluster.register(2, now=0) == 2  # no second metadata.version


def test_it_is_unfenced_only_once_it_has_caught_up_with_the_log() -> None:
    cluster = Cluster()
    epoch = cluster.register(1, now=0)
    records, answer = heartbeat(
        cluster.image, cluster.sessions, Heartbeat(1, epoch, epoch - 1), now_ms=10
    )
    assert (records, answer.is_caught_up, answer.is_fenced) == ([], False, True)
    records, answer = heartbeat(
        cluster.image, cluster.sessions, Heartbeat(1, epoch, epoch), now_ms=20
    )
    assert records == [UnfenceBrokerRecord(1, epoch)]
    assert (answer.is_caught_up, answer.is_fenced) == (True, False)
    cluster.commit(records)
    assert [b.broker_id for b in cluster.image.live_brokers] == [1]


def test_a_heartbeat_of_another_epoch_is_stale() -> None:
    cluster = Cluster()
    epoch = cluster.register(1, now=0)
    _, answer = heartbeat(cluster.image, cluster.sessions, Heartbeat(1, epoch + 7, 99), now_ms=1)
    assert answer.error == ErrorCode.stale_broker_epoch
    _, answer = heartbeat(cluster.image, cluster.sessions, Heartbeat(5, 0, 99), now_ms=1)
    assert answer.error == ErrorCode.stale_broker_epoch


def test_another_process_with_the_same_node_id_waits_for_the_first_ones_session() -> None:
    cluster = Cluster()
    first = uuid.uuid4()
    epoch = cluster.register(1, now=0, incarnation=first)
    # The same process again (a retry after a lost answer): the same epoch, no new record.
    again = Registration(1, first, CLUSTER, LISTENERS)
    records, answer = register(
        cluster.image, cluster.sessions, again, cluster_id=CLUSTER, next_offset=9, now_ms=5
    )
    assert (records, answer.broker_epoch) == ([], epoch)
    other = Registration(1, uuid.uuid4(), CLUSTER, LISTENERS)
    records, answer = register(
        cluster.image, cluster.sessions, other, cluster_id=CLUSTER, next_offset=9, now_ms=100
    )
    assert answer.error == ErrorCode.duplicate_broker_registration
    assert "node id 1" in (answer.message or "")
    assert records == []
    # Once the first one's session ran out, the new process replaces it.
    records, answer = register(
        cluster.image,
        cluster.sessions,
        other,
        cluster_id=CLUSTER,
        next_offset=9,
        now_ms=5 + SESSION_MS,
    )
    assert answer.error == ErrorCode.none
    assert answer.broker_epoch == 9


def test_a_broker_of_another_cluster_is_refused_by_name() -> None:
    cluster = Cluster()
    request = Registration(1, uuid.uuid4(), "elsewhere", LISTENERS)
    records, answer = register(
        cluster.image, cluster.sessions, request, cluster_id=CLUSTER, next_offset=0, now_ms=0
    )
    assert (records, answer.error) == ([], ErrorCode.inconsistent_cluster_id)
    assert "elsewhere" in (answer.message or "")


def test_brokers_whose_heartbeats_stop_are_fenced() -> None:
    cluster = Cluster()
    epochs = {}
    for broker_id in (1, 2):
        epoch = epochs[broker_id] = cluster.register(broker_id, now=0)
        records, _ = heartbeat(
            cluster.image, cluster.sessions, Heartbeat(broker_id, epoch, epoch), now_ms=0
        )
        cluster.commit(records)
    beat = Heartbeat(2, epochs[2], cluster.next_offset - 1)
    assert heartbeat(cluster.image, cluster.sessions, beat, now_ms=SESSION_MS - 1)[1].error == 0
    expired = cluster.sessions.expired(cluster.image, SESSION_MS)
    assert expired == [1]
    records = fence(cluster.image, expired)
    assert records == [FenceBrokerRecord(1, epochs[1])]
    cluster.commit(records)
    assert [b.broker_id for b in cluster.image.live_brokers] == [2]
    # A controller that has just become active gives every unfenced broker a whole session,
    # but a new process of its own node: that one may register again at once.
    cluster.sessions.start(cluster.image, now_ms=50_000, restarted=2)
    assert cluster.sessions.alive(2, 50_000) is False
    again = Registration(2, uuid.uuid4(), CLUSTER, LISTENERS)
    _, answer = register(
        cluster.image, cluster.sessions, again, cluster_id=CLUSTER, next_offset=99, now_ms=50_001
    )
    assert (answer.error, answer.broker_epoch) == (ErrorCode.none, 99)


def test_a_controlled_shutdown_fences_the_broker_and_lets_it_go() -> None:
    cluster = Cluster()
    epoch = cluster.register(1, now=0)
    cluster.commit(heartbeat(cluster.image, cluster.sessions, Heartbeat(1, epoch, 9), now_ms=1)[0])
    request = Heartbeat(1, epoch, cluster.next_offset - 1, want_shut_down=True)
    records, answer = heartbeat(
        cluster.image, cluster.sessions, request, now_ms=2, next_offset=cluster.next_offset
    )
    assert records == [BrokerRegistrationChangeRecord(1, epoch, fenced=1, in_controlled_shutdown=1)]
    # It goes once it has applied its own shutdown (it still answers its clients till then).
    assert not answer.should_shut_down
    cluster.commit(records)
    broker = cluster.image.brokers[1]
    assert (broker.fenced, broker.in_controlled_shutdown) == (True, True)
    caught_up = Heartbeat(1, epoch, cluster.next_offset - 1, want_shut_down=True)
    records, answer = heartbeat(cluster.image, cluster.sessions, caught_up, now_ms=3)
    assert (records, answer.should_shut_down) == ([], True)
    # A controller that became active since waits for everything it has committed.
    cluster.sessions.shutdown_offsets.clear()
    records, answer = heartbeat(cluster.image, cluster.sessions, request, now_ms=3)
    assert (records, answer.should_shut_down) == ([], False)
    records, answer = heartbeat(cluster.image, cluster.sessions, caught_up, now_ms=3)
    assert (records, answer.should_shut_down) == ([], True)
    # Its next process registers at once: a clean shutdown ended its session.
    again = Registration(1, uuid.uuid4(), CLUSTER, LISTENERS)
    _, registered = register(
        cluster.image, cluster.sessions, again, cluster_id=CLUSTER, next_offset=50, now_ms=4
    )
    assert (registered.error, registered.broker_epoch) == (ErrorCode.none, 50)


def test_a_snapshot_keeps_a_brokers_fencing_and_shutdown_state() -> None:
    cluster = Cluster()
    epoch = cluster.register(1, now=0)
    cluster.commit([BrokerRegistrationChangeRecord(1, epoch, fenced=1, in_controlled_shutdown=1)])
    rebuilt = MetadataImage()
    rebuilt.load(cluster.image.snapshot_records(), cluster.next_offset - 1)
    assert rebuilt.brokers == cluster.image.brokers
    cluster.commit([UnregisterBrokerRecord(1, epoch)])
    assert cluster.image.brokers == {}
    assert cluster.image.registration(1) is None


def test_unfenced_brokers_take_replicated_topics() -> None:
    cluster = Cluster()
    for broker_id in (1, 2, 3):
        epoch = cluster.register(broker_id, now=0)
        cluster.commit(
            heartbeat(
                cluster.image, cluster.sessions, Heartbeat(broker_id, epoch, epoch), now_ms=0
            )[0]
        )
    controller = QuorumController(cluster.image, num_partitions=3, replication_factor=1)
    records, results = controller.create_topics(
        [
            TopicRequest("replicated", replication_factor=3),
            TopicRequest("too-many", replication_factor=4),
        ]
    )
    assert [r.error for r in results] == [ErrorCode.none, ErrorCode.invalid_replication_factor]
    assert "only 3 broker(s) are registered" in (results[1].message or "")
    cluster.commit(records)
    partitions = cluster.image.topics["replicated"].partitions.values()
    assert all(sorted(p.replicas) == [1, 2, 3] == sorted(p.isr) for p in partitions)
    # Leaders are spread over the three brokers.
    assert sorted(p.leader for p in partitions) == [1, 2, 3]
    assert isinstance(cluster.image.registration(1), RegisterBrokerRecord)


def test_a_change_for_an_earlier_registration_changes_nothing() -> None:
    """A fence or unregistration written for a process that has been replaced since must not
    touch its successor's registration."""
    cluster = Cluster()
    old = cluster.register(1, now=0)
    cluster.commit([FenceBrokerRecord(1, old)])
    cluster.sessions.end(1)
    new = cluster.register(1, now=1)
    cluster.commit(heartbeat(cluster.image, cluster.sessions, Heartbeat(1, new, new), now_ms=2)[0])
    cluster.commit(
        [
            FenceBrokerRecord(1, old),
            BrokerRegistrationChangeRecord(1, old, fenced=1, in_controlled_shutdown=1),
            UnregisterBrokerRecord(1, old),
        ]
    )
    broker = cluster.image.brokers[1]
    assert (broker.epoch, broker.fenced, broker.in_controlled_shutdown) == (new, False, False)


def test_an_unregistered_broker_leaves_the_cluster_and_its_partitions() -> None:
    cluster = Cluster()
    epochs = {broker_id: cluster.register(broker_id, now=0) for broker_id in (1, 2, 3)}
    for broker_id, epoch in epochs.items():
        cluster.commit(
            heartbeat(cluster.image, cluster.sessions, Heartbeat(broker_id, epoch, 9), now_ms=1)[0]
        )
    controller = QuorumController(cluster.image, num_partitions=3, replication_factor=3)
    records, _ = controller.create_topics([TopicRequest("t")])
    cluster.commit(records)

    records, error, message = unregister(cluster.image, cluster.sessions, 3)
    assert (error, message) == (ErrorCode.none, None)
    cluster.commit(records)
    assert set(cluster.image.brokers) == {1, 2}
    assert cluster.image.registration(3) is None
    for state in cluster.image.topics["t"].partitions.values():
        assert state.leader in (1, 2)
        assert 3 not in state.isr
    # Its session ended with it: a new process under its id registers at once.
    assert not cluster.sessions.alive(3, 2)

    assert unregister(cluster.image, cluster.sessions, 3) == (
        [],
        ErrorCode.broker_id_not_registered,
        "Broker ID 3 is not currently registered",
    )


def test_a_cleanly_stopped_broker_stays_registered_and_fenced_until_it_is_unregistered() -> None:
    """As in Kafka (issue 25): a controlled shutdown fences a broker, it does not remove it.
    A manual assignment may still name it, out of the ISR; its next process registers anew
    and is unfenced once caught up; only UnregisterBroker removes it."""
    cluster = Cluster()
    epochs = {broker_id: cluster.register_live(broker_id) for broker_id in (1, 2, 3)}
    cluster.shut_down(3, epochs[3])
    stopped = cluster.image.brokers[3]
    assert (stopped.epoch, stopped.fenced) == (epochs[3], True)
    assert cluster.image.registration(3) is not None
    assert 3 not in [b.broker_id for b in cluster.image.live_brokers]  # Metadata lists it not
    rebuilt = MetadataImage()
    rebuilt.load(cluster.image.snapshot_records(), cluster.next_offset - 1)
    assert rebuilt.brokers[3] == stopped

    controller = QuorumController(cluster.image, num_partitions=1, replication_factor=1)
    records, [result] = controller.create_topics([TopicRequest("kept", assignments={0: [1, 2, 3]})])
    assert (result.error, result.message) == (ErrorCode.none, None)
    cluster.commit(records)
    kept = cluster.image.topics["kept"].partitions[0]
    assert (kept.replicas, kept.isr, kept.leader) == ((1, 2, 3), (1, 2), 1)

    # Its next process registers at once with a new epoch, and is unfenced once caught up.
    epoch = cluster.register(3, now=4)
    assert epoch > epochs[3]
    assert (cluster.image.brokers[3].epoch, cluster.image.brokers[3].fenced) == (epoch, True)
    request = Heartbeat(3, epoch, cluster.next_offset - 1)
    cluster.commit(heartbeat(cluster.image, cluster.sessions, request, now_ms=5)[0])
    assert not cluster.image.brokers[3].fenced

    cluster.shut_down(3, epoch)
    records, error, _ = unregister(cluster.image, cluster.sessions, 3)
    assert error == ErrorCode.none
    cluster.commit(records)
    assert 3 not in cluster.image.brokers
    _, [refused] = controller.create_topics([TopicRequest("gone", assignments={0: [1, 2, 3]})])
    assert (refused.error, refused.message) == (
        ErrorCode.invalid_replica_assignment,
        "The manual partition assignment includes broker 3, but no such broker is registered.",
    )


def _three_brokers_and_a_topic(partitions: int) -> tuple[Cluster, dict[int, int]]:
    cluster = Cluster()
    epochs = {broker_id: cluster.register_live(broker_id) for broker_id in (1, 2, 3)}
    controller = QuorumController(cluster.image, num_partitions=partitions, replication_factor=3)
    records, _ = controller.create_topics([TopicRequest("many")])
    cluster.commit(records)
    return cluster, epochs


def _led_or_in_sync(cluster: Cluster, broker_id: int) -> int:
    partitions = cluster.image.topics["many"].partitions.values()
    return sum(1 for p in partitions if p.leader == broker_id or broker_id in p.isr)


def test_a_controlled_shutdown_committed_in_part_is_finished_by_the_next_controller() -> None:
    """The decision is written in parts (`atomic=False`); a controller elected after only the
    first part committed moves what is left and lets the broker go only after that."""
    cluster, epochs = _three_brokers_and_a_topic(60)
    request = Heartbeat(1, epochs[1], cluster.next_offset - 1, want_shut_down=True)
    records, _ = heartbeat(
        cluster.image, cluster.sessions, request, now_ms=1, next_offset=cluster.next_offset
    )
    assert isinstance(records[-1], BrokerRegistrationChangeRecord)
    cluster.commit(records[:20])  # the first part only; then the controller is gone
    assert _led_or_in_sync(cluster, 1) == 40
    assert not cluster.image.brokers[1].in_controlled_shutdown
    cluster.sessions = BrokerSessions(SESSION_MS)  # the next controller's
    caught_up = Heartbeat(1, epochs[1], cluster.next_offset - 1, want_shut_down=True)
    records, answer = heartbeat(
        cluster.image, cluster.sessions, caught_up, now_ms=2, next_offset=cluster.next_offset
    )
    assert not answer.should_shut_down
    assert len(records) == 41
    cluster.commit(records)
    assert _led_or_in_sync(cluster, 1) == 0
    broker = cluster.image.brokers[1]
    assert (broker.fenced, broker.in_controlled_shutdown) == (True, True)
    done = Heartbeat(1, epochs[1], cluster.next_offset - 1, want_shut_down=True)
    records, answer = heartbeat(cluster.image, cluster.sessions, done, now_ms=3)
    assert (records, answer.should_shut_down) == ([], True)


def test_a_fence_committed_in_part_is_decided_again() -> None:
    cluster, epochs = _three_brokers_and_a_topic(60)
    records = fence(cluster.image, [2])
    assert records[-1] == FenceBrokerRecord(2, epochs[2])
    cluster.commit(records[:20])
    assert [b.broker_id for b in cluster.image.live_brokers] == [1, 2, 3]
    assert cluster.sessions.expired(cluster.image, SESSION_MS) == [1, 2, 3]  # still expired
    records = fence(cluster.image, [2])
    assert len(records) == 41
    cluster.commit(records)
    assert [b.broker_id for b in cluster.image.live_brokers] == [1, 3]
    assert _led_or_in_sync(cluster, 2) == 0
