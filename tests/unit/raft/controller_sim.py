"""A seeded simulation of the controller over a faulty metadata quorum: `sim.py`'s network
and Raft nodes, with the controller's records as the entries and a `MetadataImage` as each
node's state machine (`test_controller_simulation.py` says what it checks).

A node decides as `MetadataService` does: only while it is the active controller (it leads,
and its high watermark has passed the start of its epoch, so it has applied every entry of
earlier ones: `QuorumDriver.is_active`), one decision at a time (the last one committed and
applied), against its own image, with the controller's pure functions. The workload, drawn
from the seed: broker processes registering, heartbeating until unfenced, asking to be fenced
or to shut down, dying and coming back as new processes; brokers fenced when their sessions
run out; topics created, deleted and given partitions; configs altered; ISRs shrunk and
expanded by partition leaders; elections and reassignments; producer id blocks. Every node
applies what it commits as `MetadataService.apply` does, and writes and loads snapshots of its
image as `MetadataService.snapshot` and `load` do; a committed record that no controller
deciding on the whole committed state would write fails the run.
"""

from __future__ import annotations

import pickle
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from broker.metadata import (
    BROKER_RESOURCE,
    TOPIC_RESOURCE,
    ConfigOp,
    MetadataImage,
    MetadataRecord,
    PartitionState,
    QuorumController,
    TopicRequest,
)
from broker.metadata.brokers import (
    BrokerSessions,
    Heartbeat,
    Registration,
    fence,
    heartbeat,
    register,
    unregister,
)
from broker.metadata.controller import PRODUCER_ID_BLOCK_SIZE
from broker.metadata.elections import (
    NO_LEADER,
    PREFERRED,
    UNCLEAN,
    IsrChange,
    alter_isr,
    elect_leaders,
    elect_unclean,
    rebalance,
)
from broker.metadata.reassignments import Reassignment, alter_reassignments
from broker.metadata.records import (
    BrokerEndpoint,
    PartitionChangeRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    TopicRecord,
    decode_record,
    encode_record,
)
from broker.quorum.driver import proposal_parts
from broker.raft import Entry, RaftNode, Role, Snapshot

from .sim import Simulation

DECIDE_EVERY_MS = 50
SESSION_TIMEOUT_MS = 3_000
"""A broker's turn comes every second or so: a session runs out after a few missed turns."""

CLUSTER_ID = "simulated"
BROKERS = (1, 2, 3, 4, 5)
TOPICS = ("orders", "payments", "clicks", "audit", "audit.log", "audit_log")
"""Few enough to be created again after a deletion; two collide ('.' vs '_')."""

TOPIC_CONFIGS: tuple[Mapping[str, str | None], ...] = (
    {},
    {},
    {"cleanup.policy": "compact"},
    {"min.insync.replicas": "2"},
    {"unclean.leader.election.enable": "true"},
)
CONFIG_OPS = (
    ConfigOp("retention.ms", 0, "3600000"),
    ConfigOp("min.insync.replicas", 0, "2"),
    ConfigOp("cleanup.policy", 2, "compact"),
    ConfigOp("unclean.leader.election.enable", 0, "true"),
    ConfigOp("unclean.leader.election.enable", 1, None),
)


# -- the state machine: MetadataService.apply, with what no controller may write -------------


def replay(image: MetadataImage, offset: int, payload: bytes) -> None:
    """Apply the committed record at `offset` as `MetadataService.apply` does; raises if it
    does not apply, or if a controller deciding on the whole committed state (this image)
    would never have written it."""
    record = decode_record(payload)
    problem = _unwritable(image, offset, record)
    if problem is not None:
        raise AssertionError(f"{problem}: {record}")
    image.apply(record, offset)
    if isinstance(record, PartitionRecord | PartitionChangeRecord):
        topic = image.topics_by_id[record.topic_id]
        problem = _partition_problem(topic.partitions[record.partition_id])
        if problem is not None:
            raise AssertionError(f"{topic.name}-{record.partition_id} {problem}: {record}")


def _unwritable(image: MetadataImage, offset: int, record: MetadataRecord) -> str | None:
    if isinstance(record, TopicRecord):
        if record.name in image.topics:
            return "a second topic of that name"
        if record.topic_id in image.topics_by_id:
            return "a second topic of that id"
    if isinstance(record, PartitionRecord):
        topic = image.topics_by_id.get(record.topic_id)
        if topic is not None and record.partition_id in topic.partitions:
            return "a partition created twice"
    if isinstance(record, RegisterBrokerRecord) and record.broker_epoch != offset:
        return f"a broker epoch that is not the offset {offset} of its registration"
    if (
        isinstance(record, ProducerIdsRecord)
        and record.next_producer_id - PRODUCER_ID_BLOCK_SIZE < image.next_producer_id
    ):
        return f"a producer id block overlapping those below {image.next_producer_id}"
    return None


def _partition_problem(state: PartitionState) -> str | None:
    if len(set(state.replicas)) != len(state.replicas):
        return "has a replica twice"
    if not set(state.isr) <= set(state.replicas):
        return "has an ISR not within its replicas"
    if not state.isr and state.leader != NO_LEADER:
        return "has a leader and an empty ISR"
    if state.leader != NO_LEADER and state.leader not in state.isr:
        return "has a leader out of its ISR"
    if not set(state.elr) <= set(state.replicas) or set(state.elr) & set(state.isr):
        return "has eligible leader replicas out of its replicas or in its ISR"
    if not state.isr and not state.elr and not state.last_known_elr and state.leader == NO_LEADER:
        # Some replica must be known to hold every committed record (KIP-966), unless an
        # unclean shutdown took it out, and then the last leader is remembered.
        return "has no ISR, no eligible leader and no last known leader"
    if not set(state.adding) | set(state.removing) <= set(state.replicas):
        return "reassigns replicas it does not have"
    return None


def image_problem(image: MetadataImage) -> str | None:
    by_id = {topic.topic_id: topic for topic in image.topics.values()}
    if by_id != image.topics_by_id:
        return "topic names and ids are not one to one"
    for topic in image.topics.values():
        if not topic.partitions:
            return f"topic {topic.name} has no partition"
        for index, state in topic.partitions.items():
            problem = _partition_problem(state)
            if problem is not None:
                return f"{topic.name}-{index} {problem}"
    return None


def encoded(image: MetadataImage) -> list[bytes]:
    """The image as `MetadataService.snapshot` writes it."""
    return [encode_record(record) for record in image.snapshot_records()]


def _unclean(image: MetadataImage) -> Callable[[str], bool]:
    """`unclean.leader.election.enable` as `MetadataService.unclean_allowed` resolves it: the
    topic's, then every broker's dynamic default (no server.properties here), else false."""
    cluster = image.configs.get((BROKER_RESOURCE, ""), {})

    def allowed(topic: str) -> bool:
        for configs in (image.topic_config(topic), cluster):
            value = configs.get("unclean.leader.election.enable")
            if value is not None:
                return value.strip().lower() == "true"
        return False

    return allowed


# -- the simulation ---------------------------------------------------------------------------


@dataclass
class _Process:
    """A broker process of the workload: it registers as this incarnation."""

    incarnation: uuid.UUID
    running: bool = True
    shutting_down: bool = False


Decision = Callable[[MetadataImage, BrokerSessions], Sequence[MetadataRecord]]


class ControllerSimulation(Simulation):
    """Raft nodes whose entries are the records of the controller's decisions."""

    def __init__(self, seed: int, *, voters: int, observers: int) -> None:
        self.images: dict[int, MetadataImage] = {}
        """Each node's state machine (the entries it applied are the simulation's, to check)."""
        self.sessions: dict[int, tuple[int, BrokerSessions]] = {}
        """The active controller's broker sessions and the epoch it started them in: its
        memory, never in the log."""
        super().__init__(seed, voters=voters, observers=observers, snapshot_every=10)
        self.part_bytes = 64 + seed % 3 * 96
        """A non-atomic decision's most bytes per proposal: small, so that the few partitions
        here are split too (64: about one record each)."""
        self.racks = seed % 2 == 1
        self.processes = {broker_id: _Process(self._new_id()) for broker_id in BROKERS}
        self.decisions = 0
        self._admin: list[tuple[float, Decision]] = [
            (3, self._create_topics),
            (1, self._delete_topic),
            (1, self._create_partitions),
            (2, self._alter_configs),
            (1, self._allocate_producer_ids),
            (4, self._alter_isr),
            (1.5, self._elect),
            (2, self._reassign),
            (0.3, self._unregister),
        ]

    # -- the state machine ------------------------------------------------------------------

    def snapshot_data(self, node: int) -> bytes:
        """The image as `MetadataService.snapshot` writes it, and the entries applied, which
        only the simulation's own checks read."""
        return pickle.dumps((tuple(self.applied[node]), encoded(self.images[node])))

    def restore(self, node: int, snapshot: Snapshot | None) -> None:
        """A fresh image, loaded as `MetadataService.load` loads a snapshot."""
        image = MetadataImage()
        self.images[node] = image
        if snapshot is None:
            self.applied[node] = []
            return
        entries, payloads = pickle.loads(snapshot.data)
        self.applied[node] = list(entries)
        try:
            image.load([decode_record(p) for p in payloads], snapshot.id.end_offset - 1)
        except Exception as exc:
            self._fail(f"node {node} cannot load snapshot {snapshot.id}: {exc!r}")
        problem = image_problem(image)
        if problem is not None:
            self._fail(f"node {node} loads snapshot {snapshot.id}, where {problem}")

    def applied_to(self, node: int, offset: int, entries: Sequence[Entry]) -> None:
        image = self.images[node]
        for at, entry in enumerate(entries, offset):
            if entry.control:
                continue
            try:
                replay(image, at, entry.payload)
            except Exception as exc:
                self._fail(f"node {node} applies the record committed at {at}: {exc!r}")
        # Every commit leaves a consistent image (a decision written in parts, each part).
        problem = image_problem(image)
        if problem is not None:
            self._fail(f"node {node} commits to {offset + len(entries)}, where {problem}")

    def crash(self, node: int) -> None:
        super().crash(node)
        self.sessions.pop(node, None)

    # -- the active controller --------------------------------------------------------------

    def propose(self) -> None:
        """Each node that is the active controller takes one decision."""
        for node in self.live():
            if self._is_active(node):
                self._decide(node)

    def _is_active(self, node: RaftNode) -> bool:
        """`QuorumDriver.is_active` (it leads, and its high watermark has passed the start of
        its epoch: it has applied every entry of earlier ones), and its last decision is
        committed and applied (`MetadataService` holds its lock until then)."""
        committed = node.high_watermark
        return (
            node.role is Role.LEADER
            and committed > node.epoch_start
            and len(self.applied[node.id]) == committed == node.log.end_offset
        )

    def _decide(self, node: RaftNode) -> None:
        """One decision on the node's own image, proposed as `MetadataService._propose_at`
        proposes it: the records one entry each, the first at the offset the decision was
        told (a registration's epoch is that offset). The fencer's turn comes when a session
        has run out; otherwise brokers and admins alternate."""
        image = self.images[node.id]
        started, sessions = self.sessions.get(node.id, (-1, None))
        if sessions is None or started != node.epoch:
            sessions = BrokerSessions(SESSION_TIMEOUT_MS)
            sessions.start(image, self.now)
            self.sessions[node.id] = (node.epoch, sessions)
        first = node.log.end_offset
        self.decisions += 1
        expired = sessions.expired(image, self.now)
        atomic = True
        try:
            if expired and self.rng.random() < 0.5:
                records: Sequence[MetadataRecord] = fence(image, expired, _unclean(image))
                atomic = False
            elif self.decisions % 2:
                records = self._broker_turn(image, sessions, first)
                # Heartbeats' decisions are written in parts, registrations whole.
                atomic = bool(records) and isinstance(records[0], RegisterBrokerRecord)
            elif not image.topics:
                records = self._create_topics(image, sessions)
            else:
                weights, decisions = zip(*self._admin, strict=True)
                decide = self.rng.choices(decisions, weights)[0]
                records = decide(image, sessions)
        except Exception as exc:
            self._fail(f"node {node.id}'s controller fails to decide: {exc!r}")
        if records:
            payloads = [encode_record(record) for record in records]
            # As `QuorumDriver.propose(atomic=...)`: a part may commit without the next.
            parts = (payloads,) if atomic else list(proposal_parts(payloads, self.part_bytes))
            at = node.propose_parts(parts, self.now)
            if at != first:
                self._fail(f"node {node.id} decided for offset {first}, proposed at {at}")
            self.carry_out(node)

    def _new_id(self) -> uuid.UUID:
        return uuid.UUID(int=self.rng.getrandbits(128), version=4)

    # -- the workload: brokers -----------------------------------------------------------

    def _broker_turn(
        self, image: MetadataImage, sessions: BrokerSessions, next_offset: int
    ) -> Sequence[MetadataRecord]:
        """The brokers take turns: a process registers until the image holds its
        registration, then heartbeats (now and then behind on the metadata, asking to be
        fenced or to shut down); one may die unnoticed while the network is faulty, and a
        stopped one comes back as a new process."""
        broker_id = BROKERS[self.decisions // 2 % len(BROKERS)]
        process = self.processes[broker_id]
        if not process.running:
            if self.rng.random() < 0.3:
                self.processes[broker_id] = _Process(self._new_id())
            return []
        if self.faults.crash_every_ms and self.rng.random() < 0.03:
            process.running = False
            return []
        unclean = _unclean(image)
        registered = image.registration(broker_id)
        if registered is None or registered.incarnation_id != process.incarnation:
            request = Registration(
                broker_id,
                process.incarnation,
                CLUSTER_ID,
                (BrokerEndpoint("PLAINTEXT", f"broker-{broker_id}", 9092, 0),),
                rack=f"rack-{broker_id % 2}" if self.racks else None,
            )
            records, _ = register(
                image,
                sessions,
                request,
                cluster_id=CLUSTER_ID,
                next_offset=next_offset,
                now_ms=self.now,
                unclean=unclean,
            )
            return records
        process.shutting_down = process.shutting_down or self.rng.random() < 0.02
        beat = Heartbeat(
            broker_id,
            registered.broker_epoch,
            metadata_offset=image.offset if self.rng.random() < 0.9 else -1,
            want_fence=self.rng.random() < 0.02,
            want_shut_down=process.shutting_down,
        )
        records, answer = heartbeat(
            image, sessions, beat, now_ms=self.now, unclean=unclean, next_offset=next_offset
        )
        if answer.should_shut_down:
            process.running = False
        return records

    def _unregister(self, image: MetadataImage, sessions: BrokerSessions) -> list[MetadataRecord]:
        if not image.brokers:
            return []
        broker_id = self.rng.choice(sorted(image.brokers))
        records, _, _ = unregister(image, sessions, broker_id, _unclean(image))
        return records

    # -- the workload: an admin's requests and a partition leader's -----------------------------

    def _controller(self, image: MetadataImage) -> QuorumController:
        return QuorumController(
            image, num_partitions=1, replication_factor=1, new_topic_id=self._new_id
        )

    def _create_topics(
        self, image: MetadataImage, _sessions: BrokerSessions
    ) -> list[MetadataRecord]:
        names = self.rng.sample(TOPICS, 1 if self.rng.random() < 0.8 else 2)
        requests = [
            TopicRequest(
                name,
                num_partitions=self.rng.randint(1, 4),
                replication_factor=self.rng.randint(1, 3),
                configs=self.rng.choice(TOPIC_CONFIGS),
            )
            for name in names
        ]
        records, _ = self._controller(image).create_topics(requests)
        return records

    def _delete_topic(
        self, image: MetadataImage, _sessions: BrokerSessions
    ) -> list[MetadataRecord]:
        topic = image.topics[self.rng.choice(sorted(image.topics))]
        controller = self._controller(image)
        if self.rng.random() < 0.5:
            records, _ = controller.delete_topics([topic.name])
        else:
            records, _ = controller.delete_topics([], [topic.topic_id])
        return records

    def _create_partitions(
        self, image: MetadataImage, _sessions: BrokerSessions
    ) -> list[MetadataRecord]:
        name = self.rng.choice(sorted(image.topics))
        count = len(image.topics[name].partitions) + self.rng.randint(0, 2)
        records, _ = self._controller(image).create_partitions_all([(name, count, None)])
        return records

    def _alter_configs(
        self, image: MetadataImage, _sessions: BrokerSessions
    ) -> list[MetadataRecord]:
        if self.rng.random() < 0.2:
            value = self.rng.choice(("true", "false", None))
            resource, name = BROKER_RESOURCE, ""
            ops = [ConfigOp("unclean.leader.election.enable", 1 if value is None else 0, value)]
        else:
            resource, name = TOPIC_RESOURCE, self.rng.choice(sorted(image.topics))
            ops = [self.rng.choice(CONFIG_OPS)]
        replace = self.rng.random() < 0.2
        records, _ = self._controller(image).alter_configs(resource, name, ops, replace=replace)
        return records

    def _allocate_producer_ids(
        self, image: MetadataImage, _sessions: BrokerSessions
    ) -> list[MetadataRecord]:
        """As `MetadataService.allocate_producer_ids`, for a broker of the epoch it has."""
        if not image.brokers:
            return []
        broker = image.brokers[self.rng.choice(sorted(image.brokers))]
        records, _ = self._controller(image).allocate_producer_ids(broker.broker_id, broker.epoch)
        return records

    def _alter_isr(
        self, image: MetadataImage, _sessions: BrokerSessions
    ) -> Sequence[PartitionChangeRecord]:
        """A partition's leader drops a follower from its ISR or adds a replica to it, with
        the epochs it knows (now and then a partition epoch it has missed an update of)."""
        led = [
            (topic.topic_id, index, state)
            for topic in sorted(image.topics.values(), key=lambda topic: topic.name)
            for index, state in sorted(topic.partitions.items())
            if state.leader in image.brokers
        ]
        if not led:
            return []
        topic_id, index, state = self.rng.choice(led)
        outside = [r for r in state.replicas if r not in state.isr]
        followers = [r for r in state.isr if r != state.leader]
        if outside and (not followers or self.rng.random() < 0.5):
            isr = (*state.isr, self.rng.choice(outside))
        elif followers:
            dropped = self.rng.choice(followers)
            isr = tuple(r for r in state.isr if r != dropped)
        else:
            return []
        epochs = {b.broker_id: b.epoch for b in image.brokers.values()}
        missed = 1 if self.rng.random() < 0.1 else 0
        change = IsrChange(
            topic_id,
            index,
            state.leader_epoch,
            state.partition_epoch - missed,
            tuple((member, epochs.get(member, -1)) for member in isr),
        )
        leader = image.brokers[state.leader]
        records, _, _ = alter_isr(image, leader.broker_id, leader.epoch, [change])
        return records

    def _elect(
        self, image: MetadataImage, _sessions: BrokerSessions
    ) -> Sequence[PartitionChangeRecord]:
        """ElectLeaders, preferred or unclean, and the controller's own periodic elections."""
        kind = self.rng.randrange(4)
        if kind == 0:
            records, _ = elect_leaders(image, PREFERRED, None)
        elif kind == 1:
            records, _ = elect_leaders(image, UNCLEAN, None)
        elif kind == 2:
            records = rebalance(image)
        else:
            records = elect_unclean(image, _unclean(image))
        return records

    def _reassign(
        self, image: MetadataImage, _sessions: BrokerSessions
    ) -> Sequence[PartitionChangeRecord]:
        name = self.rng.choice(sorted(image.topics))
        index, state = self.rng.choice(sorted(image.topics[name].partitions.items()))
        brokers = sorted(image.brokers)
        target: tuple[int, ...] | None = None
        if not (state.reassigning and self.rng.random() < 0.3):
            if not brokers:
                return []
            target = tuple(self.rng.sample(brokers, self.rng.randint(1, min(3, len(brokers)))))
        records, _ = alter_reassignments(image, [Reassignment(name, index, target)])
        return records
