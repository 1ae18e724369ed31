"""A seeded simulation of replication down to the bytes: three brokers, each a real
`ReplicaManager` on a real `LogManager` in a log dir of its own, and the controller's pure
functions deciding the metadata (`test_replica_simulation.py` says what it checks).

There is no network and no Raft. The metadata log is a list of records the active controller
appends to; each running broker applies it in order to its own `MetadataImage` and hands every
change to its replica manager, as `broker/node.py` wires them, sometimes only part of the way
(a broker behind the metadata). A follower fetches as the replica fetcher does, through the
fetcher's own `_request` and `_take` (divergence truncation and out-of-range handling
included); the leader answers as the Fetch handler does, with `read_for_follower`; request and
answer cross as Fetch v17 bytes, encoded and decoded by the protocol's own codecs. A leader's
ISR change goes to the controller's `alter_isr` as `IsrSender` sends it. Brokers stop cleanly
(controlled shutdown, then `LogManager.shutdown`), crash (files closed unflushed, no checkpoint
written, then recovery; see `LOST_DISKS` for a crash that loses the disk too), start again as
node.py starts them (formatting an empty log dir), register as new processes with the
controller (their directory id, and the broker epoch of their clean shutdown), and serve once
unfenced. The controller's functions get each topic's `min.insync.replicas` and
`unclean.leader.election.enable`, as broker/kraft.py resolves them.

What it must never do: reach into a log to change it (only the broker's code does), or decide
anything the controller's functions did not.
"""

from __future__ import annotations

import itertools
import random
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from broker.metadata import (
    MetadataImage,
    MetadataRecord,
    PartitionChanged,
    PartitionState,
    QuorumController,
    TopicRequest,
)
from broker.metadata.brokers import (
    BrokerSessions,
    Heartbeat,
    HeartbeatAnswer,
    Registration,
    heartbeat,
    register,
)
from broker.metadata.brokers import fence as fence_brokers
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
from broker.metadata.records import BrokerEndpoint, PartitionChangeRecord
from broker.protocol import ApiKey, ErrorCode, RequestHeader
from broker.protocol.fetch import FetchPartition, FetchResponse, FetchTopic, encode_fetch_response
from broker.protocol.messages import decode_request, decode_response, encode_request
from broker.protocol.records import (
    Record,
    build_batch,
    iter_batches,
    read_batch_header,
    validate_batch,
)
from broker.replica import LATEST_TIMESTAMP, FetcherSettings, FetchResult, ReplicaFetchers
from broker.replica import ReplicaManager as Replicas
from broker.replica.fetcher import FETCH_VERSION, _Fetcher
from broker.replica.partition import Partition
from broker.storage import Log, LogConfig, LogManager
from broker.storage.meta_properties import load_or_format
from tests.unit.storage.logs import abandon

LOST_DISKS = True
"""On: half the crashes also lose the broker's whole log dir (wiped and made again, empty).
The next start formats it with a new directory id and finds no clean-shutdown marker, so the
broker registers as one that may have lost records, and the controller takes it out of every
ISR and ELR (KIP-966, KIP-858). Acknowledged records survive that wherever they were on two
replicas at least: topics with `min.insync.replicas=2`, whose high watermark stands still
while the ISR is smaller, and whose replicas that left the ISR stay eligible leaders. Where
the only in-sync replica loses its disk (`min.insync.replicas=1`, or one replica), its
records go with it, and the partition has a leader again only through an unclean election:
the balanced recovery of its last known leader, ElectLeaders(UNCLEAN), or
`unclean.leader.election.enable`; `_unclean` notes each, which excuses exactly what leaders
of earlier epochs acknowledged.

A follower that truncates below its high watermark lowers it too (seed 532 found it kept
it, and leading later acknowledged records no follower had)."""

EXCUSE_LATEST_BEFORE_CAUGHT_UP = False
"""Known bug (issue 25): a new leader answered ListOffsets(LATEST) with the high watermark it
learned as a follower, below the one its predecessor answered. The fix (OFFSET_NOT_AVAILABLE
until the high watermark reaches the start of the leader's epoch) is in `offsets.list_offset`,
so the check is strict. Turned on, a LATEST that goes back is excused exactly where the fix
would not answer (high watermark below `leader_start_offset`), and nowhere else."""

EXCUSE_DELETES_UNDONE_BY_ELR = False
"""Off: a DeleteRecords waits for fenced eligible leader replicas too
(`LeaderReplication.low_watermark`), since one may lead without rejoining the ISR (seed 69
found one serving deleted records). On, records served below an acknowledged DeleteRecords
by a leader that the low watermark left out as fenced and that the ELR elected since are
excused, and nothing else."""

CLUSTER_ID = "replica-sim"
BROKERS = (1, 2, 3)
TOPICS = ("orders", "clicks")
STEP_MS = 100
SESSION_TIMEOUT_MS = 1_000
"""Ten steps without a heartbeat and the controller fences the broker."""
REPLICA_LAG_MS = 1_500
"""`replica.lag.time.max.ms`: fifteen steps without catching up and a follower leaves the ISR."""
REQUEST_STEPS = 30
"""How long an acks=all produce or a DeleteRecords waits (`request.timeout.ms`), in steps."""
START_MS = 1_700_000_000_000

Key = tuple[uuid.UUID, int]
"""A partition of one incarnation of a topic: (topic id, index)."""


class SafetyViolation(AssertionError):
    """A property a user relies on does not hold; the message names the step and the trace."""


@dataclass
class _Process:
    """One broker process: its logs, its image of the metadata, its replica manager."""

    broker_id: int
    incarnation: uuid.UUID
    logs: LogManager
    image: MetadataImage
    replicas: Replicas
    fetchers: ReplicaFetchers
    directory_id: uuid.UUID
    """Its log dir's directory id (`meta.properties`), which it registers."""
    applied: int = 0
    """Metadata records applied to `image`."""
    epoch: int = -1
    """The broker epoch its registration was given; -1 until the controller accepts it."""
    following: dict[int, _Fetcher] = field(default_factory=dict)
    """The replica fetcher of each leader this broker follows partitions of."""
    in_flight: dict[int, tuple[dict[Any, Partition], Any]] = field(default_factory=dict)
    """A fetch answer held up on the way back (leader → what was asked, the answer)."""
    isr_requests: list[tuple[Partition, tuple[int, ...], IsrChange]] = field(default_factory=list)
    """AlterPartition requests on their way to the controller."""
    silent_until: int = 0
    """A slow broker: no heartbeats before this step."""
    shutting_down: bool = False
    serving: bool = False
    """Answers clients and other brokers' fetches: from its first unfenced heartbeat on, as
    node.py serves its listeners once `BrokerLifecycle.start` returns. Before, a process on
    an empty disk could still be the leader the metadata names (its predecessor's session
    has not run out yet), and must not be taken for it."""


@dataclass
class _Produce:
    process: _Process
    partition: Partition
    key: Key
    leader_epoch: int
    end: int
    records: list[tuple[int, bytes]]
    deadline: int


@dataclass
class _Delete:
    process: _Process
    partition: Partition
    key: Key
    leader_epoch: int
    offset: int
    deadline: int


class ReplicaSimulation:
    def __init__(
        self,
        seed: int,
        root: Path,
        *,
        lost_disks: bool = LOST_DISKS,
        excuse_deletes_undone_by_elr: bool = EXCUSE_DELETES_UNDONE_BY_ELR,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.root = root
        self.lost_disks = lost_disks
        self.excuse_deletes_undone_by_elr = excuse_deletes_undone_by_elr
        self.step = 0
        self.now = START_MS
        self.trace: list[str] = []
        self.config = LogConfig(segment_bytes=self.rng.choice((2048, 8192, 1 << 20)))
        self.max_bytes = self.rng.choice((300, 1_000, 1 << 20))
        """Per partition in a replica fetch: small ones end answers inside a batch."""
        # -- the controller
        self.records: list[MetadataRecord] = []
        self.image = MetadataImage()
        self.sessions = BrokerSessions(SESSION_TIMEOUT_MS)
        # -- the brokers
        self.processes: dict[int, _Process | None] = dict.fromkeys(BROKERS)
        self.correlation = itertools.count()
        # -- what the clients were told
        self.sequence = itertools.count()
        self.produced: dict[int, tuple[Key, list[bytes]]] = {}
        """Every batch produced, by its CRC (which covers its records, each with a value of
        its own, but not the offsets and epoch the leader gives it): the partition
        incarnation it went to, and its values."""
        self.acked: dict[Key, dict[int, tuple[bytes, int]]] = {}
        """Acknowledged records: offset → (value, the leader epoch that acknowledged it)."""
        self.deleted_to: dict[Key, int] = {}
        """The highest DeleteRecords offset a leader accepted: the log start users asked for."""
        self.deletes_acked: dict[Key, list[tuple[int, int, frozenset[int]]]] = {}
        """Acknowledged DeleteRecords: (offset, the leader epoch that acknowledged it, the
        replicas its low watermark left out as fenced)."""
        self.latest: dict[Key, tuple[int, int]] = {}
        """The highest ListOffsets(LATEST) answered, and the leader epoch that answered it."""
        self.unclean: dict[Key, int] = {}
        """The leader epoch of each partition's latest unclean election (`_unclean`): what
        leaders of earlier epochs acknowledged may be lost, even an acknowledgement that came
        after it from a leader that had not learned of it yet."""
        self.elr_elected: dict[Key, dict[int, int]] = {}
        """Per partition, each replica's latest election from the ELR, by its leader epoch."""
        self.deletes_excused = 0
        """Records served below an acknowledged DeleteRecords, excused as the known bug."""
        self.produces: list[_Produce] = []
        self.deletes: list[_Delete] = []
        self.counts: dict[str, int] = {}
        self.latest_excused = 0
        """ListOffsets(LATEST) answers that went back, excused as the known bug."""

    # -- running ------------------------------------------------------------------------------

    def run(self, steps: int) -> None:
        try:
            for broker_id in BROKERS:
                self._start(broker_id)
            while self.image.usable_broker_ids() != set(BROKERS):
                self._background()  # registered, caught up, unfenced
            self._create_topic()
            self._create_topic()
            self._background()
            for _ in range(steps):
                self.step += 1
                self.now += STEP_MS
                action = self._choose()
                self.counts[action.__name__] = self.counts.get(action.__name__, 0) + 1
                action()
                self._background()
                self.check()
        finally:
            self.close()

    def _choose(self) -> Callable[[], None]:
        down = [b for b, p in self.processes.items() if p is None]
        actions: list[tuple[float, Callable[[], None]]] = [
            (30, self._produce),
            (35, self._fetch),
            (3, self._delete_records),
            (2 if len(down) < 2 else 0, self._stop),
            (2 if len(down) < 2 else 0, self._crash),
            (8 if down else 0, self._restart),
            (1, self._slow_broker),
            (1.5 if down else 0.3, self._recreate_topic),
            (0.5, self._create_topic),
            (1, self._preferred_election),
            (0.5, self._unclean_election),
        ]
        weights = [weight for weight, _ in actions]
        return self.rng.choices([action for _, action in actions], weights)[0]

    def fail(self, message: str) -> NoReturn:
        recent = "\n  ".join(self.trace[-25:])
        raise SafetyViolation(
            f"seed {self.seed}, step {self.step}: {message}\n  last steps:\n  {recent}"
        )

    def note(self, what: str) -> None:
        self.trace.append(f"[{self.step}] {what}")

    def close(self) -> None:
        for broker_id, process in self.processes.items():
            if process is not None:
                process.logs.shutdown(self.now)
                self.processes[broker_id] = None
        self._drop_in_flight()

    # -- the controller -----------------------------------------------------------------------

    def propose(self, records: Sequence[MetadataRecord]) -> None:
        """The active controller commits `records`: elections from outside the ISR (unclean
        ones, and those from the ELR) are noted as they go, with the leader epoch they
        start."""
        for record in records:
            old = None
            if isinstance(record, PartitionChangeRecord) and record.leader >= 0:
                old = self.image.topics_by_id[record.topic_id].partitions[record.partition_id]
            self.image.apply(record, len(self.records))
            self.records.append(record)
            if isinstance(record, PartitionChangeRecord) and old is not None:
                self._elected(record, old)

    def _elected(self, record: PartitionChangeRecord, old: PartitionState) -> None:
        topic = self.image.topics_by_id[record.topic_id]
        key = (record.topic_id, record.partition_id)
        epoch = topic.partitions[record.partition_id].leader_epoch
        why = _unclean(old, record.leader)
        if why is not None:
            self.unclean[key] = epoch
            self.note(
                f"unclean election ({why}): {topic.name}-{record.partition_id} to {record.leader}"
            )
        elif record.leader not in old.isr and record.leader != old.leader:
            self.elr_elected.setdefault(key, {})[record.leader] = epoch

    def unclean_allowed(self, topic: str) -> bool:
        """`unclean.leader.election.enable` as the controller resolves it (`kraft.py`): the
        topic's setting, else false."""
        value = self.image.topic_config(topic).get("unclean.leader.election.enable", "false")
        return value == "true"

    def min_isr(self, topic: str) -> int:
        """`min.insync.replicas` as the controller resolves it for eligible leader replicas
        (`kraft.py`'s `controller_min_isr`): the topic's setting, else 1. The brokers' replica
        managers read the same topic config from their own images."""
        return int(self.image.topic_config(topic).get("min.insync.replicas", "1"))

    def _controller(self) -> QuorumController:
        return QuorumController(
            self.image,
            num_partitions=1,
            replication_factor=3,
            new_topic_id=lambda: uuid.UUID(int=self.rng.getrandbits(128), version=4),
        )

    def _create_topic(self) -> None:
        missing = [name for name in TOPICS if name not in self.image.topics]
        if not missing:
            return
        name = self.rng.choice(missing)
        replication_factor = self.rng.choices((1, 2, 3), (1, 3, 6))[0]
        # Two thirds of the replicated topics keep acknowledged records on two replicas at
        # least, which is what lets them survive a lost disk; the others (and those of one
        # replica) may lose records with the disk of their only in-sync replica.
        min_isr = 1 if replication_factor == 1 else self.rng.choices((1, 2), (1, 2))[0]
        configs = {"min.insync.replicas": str(min_isr)}
        if self.rng.random() < 0.2:
            configs["unclean.leader.election.enable"] = "true"
        request = TopicRequest(
            name,
            num_partitions=self.rng.randint(1, 2),
            replication_factor=replication_factor,
            configs=configs,
        )
        records, results = self._controller().create_topics([request])
        self.propose(records)
        self.note(f"create {name}: {results[0].error.name} {results[0].topic_id} {configs}")

    def _recreate_topic(self) -> None:
        """A topic deleted and created again (most often while a broker is down)."""
        if not self.image.topics:
            self._create_topic()
            return
        name = self.rng.choice(sorted(self.image.topics))
        records, _ = self._controller().delete_topics([name])
        self.propose(records)
        down = [b for b, p in self.processes.items() if p is None]
        self.note(f"delete {name} (down: {down})")
        self._create_topic()

    def _preferred_election(self) -> None:
        if self.rng.random() < 0.5:
            records, _ = elect_leaders(self.image, PREFERRED, None)
        else:
            records = rebalance(self.image)
        self.propose(records)
        self.note(f"preferred elections: {len(records)}")

    def _unclean_election(self) -> None:
        """ElectLeaders(UNCLEAN) for a partition without a leader, as an operator asks it; or
        the controller's periodic unclean elections, for topics that allow them."""
        if self.rng.random() < 0.3:
            records = elect_unclean(self.image, self.unclean_allowed)
            self.propose(records)
            self.note(f"periodic unclean elections: {len(records)}")
            return
        leaderless = [
            (name, index)
            for name, topic in sorted(self.image.topics.items())
            for index, state in sorted(topic.partitions.items())
            if state.leader == NO_LEADER
        ]
        if not leaderless:
            return
        name, index = self.rng.choice(leaderless)
        records, results = elect_leaders(self.image, UNCLEAN, [(name, [index])])
        self.propose(records)
        self.note(f"unclean election asked for {name}-{index}: {results[0].error.name}")

    def _heartbeats(self) -> None:
        """Every running broker that is not slow heartbeats (registering first if it must);
        sessions that ran out are fenced."""
        for broker_id, process in self.processes.items():
            if process is None or process.shutting_down or self.step < process.silent_until:
                continue
            if process.epoch < 0:
                self._register(process)
                continue
            beat = Heartbeat(broker_id, process.epoch, metadata_offset=process.image.offset)
            records, answer = self._heartbeat(beat)
            self.propose(records)
            if not answer.is_fenced and not process.serving:
                process.serving = True
                self.note(f"broker {broker_id} serves")
            if answer.error == ErrorCode.stale_broker_epoch:
                process.epoch = -1  # replaced or unregistered: it registers again
        expired = self.sessions.expired(self.image, self.now)
        if expired:
            self.propose(fence_brokers(self.image, expired, self.unclean_allowed, self.min_isr))
            self.note(f"fenced {expired}: sessions ran out")

    def _heartbeat(self, beat: Heartbeat) -> tuple[list[MetadataRecord], HeartbeatAnswer]:
        return heartbeat(
            self.image,
            self.sessions,
            beat,
            now_ms=self.now,
            unclean=self.unclean_allowed,
            next_offset=len(self.records),
            min_isr=self.min_isr,
        )

    def _register(self, process: _Process) -> None:
        request = Registration(
            process.broker_id,
            process.incarnation,
            CLUSTER_ID,
            (BrokerEndpoint("PLAINTEXT", "localhost", 9090 + process.broker_id, 0),),
            # As the node says it: its log dir's directory id (a wiped dir has a new one,
            # KIP-858), and the epoch its clean-shutdown marker names, -1 after a crash or
            # with a lost disk (KIP-966).
            log_dirs=(process.directory_id,),
            previous_broker_epoch=process.logs.previous_broker_epoch,
        )
        records, answer = register(
            self.image,
            self.sessions,
            request,
            cluster_id=CLUSTER_ID,
            next_offset=len(self.records),
            now_ms=self.now,
            unclean=self.unclean_allowed,
            min_isr=self.min_isr,
        )
        self.propose(records)
        if answer.error == ErrorCode.none:
            process.epoch = answer.broker_epoch

    def _deliver_isr_requests(self) -> None:
        """AlterPartition as `IsrSender` sends it: while it is still the partition's pending
        change; a refusal lets the leader ask again."""
        for process in self._running():
            waiting = []
            for partition, wanted, change in process.isr_requests:
                if self.rng.random() < 0.4:
                    waiting.append((partition, wanted, change))
                    continue
                if partition.pending_isr != wanted or (
                    partition.pending_since_epoch != change.partition_epoch
                ):
                    continue
                records, error, answers = alter_isr(
                    self.image, process.broker_id, process.epoch, [change], self.min_isr
                )
                self.propose(records)
                error = answers[0].error if answers else error
                self.note(f"broker {process.broker_id} asks ISR {wanted}: {error.name}")
                if error not in (ErrorCode.none, ErrorCode.new_leader_elected):
                    process.replicas.isr_change_failed(partition, wanted)
            process.isr_requests = waiting

    # -- the brokers --------------------------------------------------------------------------

    def _running(self) -> list[_Process]:
        return [p for p in self.processes.values() if p is not None]

    def _start(self, broker_id: int) -> None:
        """As `Node.start`: load the logs, replay the metadata, apply every partition it
        holds, set strays aside, then follow the image's changes; it registers next."""
        directory = self.root / f"broker-{broker_id}"
        # `gregor format --ignore-formatted`, then the start's checks: an empty dir (the first
        # start, or a lost disk taken as a new one) is formatted and gets a new directory id.
        identity = load_or_format([directory], broker_id, CLUSTER_ID, new_cluster_id=CLUSTER_ID)
        logs = LogManager([directory], self.config, checkpoint_interval_ms=5_000)
        logs.startup(now_ms=self.now)
        image = MetadataImage()
        for offset, record in enumerate(self.records):
            image.apply(record, offset)
        replicas = Replicas(
            broker_id,
            logs,
            image,
            lambda _topic: self.config,
            lambda: self.now,
            steady_ms=lambda: self.now,
        )
        replicas.replica_lag_time_max_ms = REPLICA_LAG_MS
        for topic in image.topics.values():
            for index, state in topic.partitions.items():
                replicas.apply(PartitionChanged(topic, index, state))
        replicas.remove_strays()
        settings = FetcherSettings(
            node_id=broker_id,
            cluster_id=CLUSTER_ID,
            listener="PLAINTEXT",
            max_bytes=self.max_bytes,
            backoff_ms=0,
        )
        process = _Process(
            broker_id,
            uuid.UUID(int=self.rng.getrandbits(128), version=4),
            logs,
            image,
            replicas,
            ReplicaFetchers(settings, replicas, lambda: image),
            identity.directory_ids[directory],
            applied=len(self.records),
        )
        replicas.on_isr_change = lambda partition, wanted: self._ask_isr(process, partition, wanted)
        self.processes[broker_id] = process
        self._register(process)
        self.note(f"broker {broker_id} starts (strays set aside: {logs.strays})")

    def _ask_isr(self, process: _Process, partition: Partition, wanted: tuple[int, ...]) -> None:
        """`IsrSender.__call__`: the change against the epochs the leader decided it on."""
        image = process.image
        topic = image.topics.get(partition.topic)
        if topic is None:
            return
        change = IsrChange(
            topic.topic_id,
            partition.index,
            partition.leader_epoch,
            partition.pending_since_epoch,
            tuple(
                (member, image.brokers[member].epoch if member in image.brokers else -1)
                for member in wanted
            ),
        )
        process.isr_requests.append((partition, wanted, change))

    def _catch_up(self, process: _Process, upto: int) -> None:
        """The broker applies the metadata log up to `upto`, each change to its replicas."""
        for offset in range(process.applied, upto):
            change = process.image.apply(self.records[offset], offset)
            if change is not None:
                process.replicas.apply(change)
        process.applied = max(process.applied, upto)

    def _stop(self) -> None:
        """Controlled shutdown: the controller moves the broker's leaderships away, the broker
        applies that, then closes its logs cleanly."""
        running = self._running()
        if not running:
            return
        process = self.rng.choice(running)
        if process.epoch >= 0:
            beat = Heartbeat(
                process.broker_id, process.epoch, process.image.offset, want_shut_down=True
            )
            records, _ = self._heartbeat(beat)
            self.propose(records)
            self._catch_up(process, len(self.records))
            beat = Heartbeat(
                process.broker_id, process.epoch, process.image.offset, want_shut_down=True
            )
            records, answer = self._heartbeat(beat)
            self.propose(records)
            if not answer.should_shut_down:
                self.fail(f"broker {process.broker_id} caught up but may not shut down")
        process.logs.shutdown(self.now, broker_epoch=process.epoch)
        self.processes[process.broker_id] = None
        self.note(f"broker {process.broker_id} stops cleanly")

    def _crash(self) -> None:
        """The process dies: its files are closed as the kernel closes them (what was written
        stays, nothing is flushed or checkpointed), and with `lost_disks` now and then the
        whole log dir is gone too."""
        running = self._running()
        if not running:
            return
        process = self.rng.choice(running)
        for _, log in process.logs:
            abandon(log)
        process.logs.unlock()
        self.processes[process.broker_id] = None
        lost = self.lost_disks and self.rng.random() < 0.5
        if lost:
            directory = self.root / f"broker-{process.broker_id}"
            shutil.rmtree(directory)
            directory.mkdir()
        self.note(f"broker {process.broker_id} crashes{' and loses its disk' if lost else ''}")

    def _restart(self) -> None:
        down = [b for b, p in self.processes.items() if p is None]
        if down:
            self._start(self.rng.choice(down))

    def _slow_broker(self) -> None:
        running = self._running()
        if running:
            process = self.rng.choice(running)
            process.silent_until = self.step + self.rng.randint(5, 15)
            self.note(f"broker {process.broker_id} stops heartbeating for a while")

    # -- clients ------------------------------------------------------------------------------

    def _led(self) -> list[tuple[str, int, _Process, Partition]]:
        """Partitions whose leader, as the controller has it, runs, serves and knows it leads
        (in that epoch, of that topic incarnation): what a client with fresh metadata talks
        to."""
        found = []
        for name, topic in sorted(self.image.topics.items()):
            for index, state in sorted(topic.partitions.items()):
                process = self.processes.get(state.leader)
                if process is None or not process.serving:
                    continue
                known = process.image.topics.get(name)
                partition = process.replicas.partitions.get((name, index))
                if (
                    known is None
                    or known.topic_id != topic.topic_id
                    or partition is None
                    or not partition.is_leader
                    or partition.leader_epoch != state.leader_epoch
                ):
                    continue
                found.append((name, index, process, partition))
        return found

    def _key(self, process: _Process, name: str, index: int) -> Key:
        return (process.image.topics[name].topic_id, index)

    def _produce(self) -> None:
        """acks=all to the leader a client with fresh metadata would pick."""
        choices = [
            (name, index, state.leader)
            for name, topic in sorted(self.image.topics.items())
            for index, state in sorted(topic.partitions.items())
        ]
        if not choices:
            return
        name, index, leader = self.rng.choice(choices)
        process = self.processes.get(leader)
        if process is None or not process.serving or name not in process.image.topics:
            return
        key = self._key(process, name, index)
        values = [b"%d" % next(self.sequence) for _ in range(self.rng.randint(1, 3))]
        batch = build_batch([Record(i, self.now, None, v) for i, v in enumerate(values)])
        result = process.replicas.append(name, index, batch, acks=-1)
        if result.error != ErrorCode.none or result.info is None:
            return
        partition = process.replicas.partitions[(name, index)]
        if partition.log.topic_id not in (None, key[0]):
            self.fail(f"{name}-{index} on broker {leader} appends to the log of {key[0]}")
        first = result.info.first_offset
        records = [(first + i, v) for i, v in enumerate(values)]
        self.produced[read_batch_header(batch).crc] = (key, values)
        self.produces.append(
            _Produce(
                process,
                partition,
                key,
                partition.leader_epoch,
                result.info.last_offset + 1,
                records,
                self.step + REQUEST_STEPS,
            )
        )

    def _delete_records(self) -> None:
        led = self._led()
        if not led:
            return
        name, index, process, partition = self.rng.choice(led)
        start, high_watermark = partition.log.log_start_offset, partition.high_watermark
        if high_watermark <= start:
            return
        offset = self.rng.randint(start + 1, high_watermark)
        error, _ = process.replicas.delete_records(name, index, offset)
        self.note(f"DeleteRecords {name}-{index} to {offset} on {process.broker_id}: {error.name}")
        if error != ErrorCode.none:
            return
        key = self._key(process, name, index)
        self.deleted_to[key] = max(self.deleted_to.get(key, 0), offset)
        self.deletes.append(
            _Delete(
                process, partition, key, partition.leader_epoch, offset, self.step + REQUEST_STEPS
            )
        )

    def _answers(self) -> None:
        """acks=all produces and DeleteRecords learn their answer as `wait_for_replication`
        and `wait_for_low_watermark` would give it: a leader that moved (or died) fails them."""
        produces = []
        for produce in self.produces:
            leading = self._still_leads(produce.process, produce.partition, produce.leader_epoch)
            if not leading or self.step > produce.deadline:
                continue
            partition = produce.partition
            answer = produce.process.replicas.replicated_now(
                partition.topic, partition.index, produce.end
            )
            if answer is None:
                produces.append(produce)
            elif answer == ErrorCode.none:
                acked = self.acked.setdefault(produce.key, {})
                for offset, value in produce.records:
                    acked[offset] = (value, produce.leader_epoch)
                self.note(
                    f"acked {partition.topic}-{partition.index} "
                    f"{[o for o, _ in produce.records]} on {produce.process.broker_id}"
                )
        self.produces = produces
        deletes = []
        for delete in self.deletes:
            leading = self._still_leads(delete.process, delete.partition, delete.leader_epoch)
            if not leading or self.step > delete.deadline:
                continue
            if delete.process.replicas.low_watermark(delete.partition) >= delete.offset:
                brokers = delete.process.image.brokers
                fenced = frozenset(
                    r
                    for r in delete.partition.state.replicas
                    if r not in brokers or brokers[r].fenced
                )
                self.deletes_acked.setdefault(delete.key, []).append(
                    (delete.offset, delete.leader_epoch, fenced)
                )
                self.note(f"DeleteRecords to {delete.offset} acknowledged")
            else:
                deletes.append(delete)
        self.deletes = deletes

    def _still_leads(self, process: _Process, partition: Partition, leader_epoch: int) -> bool:
        return (
            self.processes.get(process.broker_id) is process
            and process.replicas.partitions.get((partition.topic, partition.index)) is partition
            and partition.is_leader
            and partition.leader_epoch == leader_epoch
        )

    # -- replication --------------------------------------------------------------------------

    def _fetch(self) -> None:
        """A round of replica fetches: every running follower, from each leader it follows."""
        for follower in self._running():
            self._fetch_round(follower)

    def _fetch_round(self, follower: _Process) -> None:
        """As `ReplicaFetchers`: a fetcher per leader (`update`), one request at a time each
        (`_request`), its answer taken in (`_take`); an answer may be lost or held up."""
        wanted: dict[int, set[tuple[str, int]]] = {}
        for key, partition in follower.replicas.followed().items():
            wanted.setdefault(partition.state.leader, set()).add(key)
        follower.following = {
            leader: follower.following.get(leader) or _Fetcher(leader) for leader in wanted
        }
        for leader_id, keys in sorted(wanted.items()):
            fetcher = follower.following[leader_id]
            fetcher.partitions = keys
            held = follower.in_flight.pop(leader_id, None)
            if held is not None:
                follower.fetchers._take(fetcher, *held)
                continue
            leader = self.processes.get(leader_id)
            if leader is None or not leader.serving:
                continue  # unreachable
            asked = follower.fetchers._request(fetcher)
            if asked is None:
                continue
            body, sent = asked
            response = self._serve_fetch(leader, body)
            fate = self.rng.random()
            if fate < 0.05:
                self.note(f"the answer of {leader_id} to {follower.broker_id}'s fetch is lost")
                continue
            if fate < 0.15:
                self.note(f"the answer of {leader_id} to {follower.broker_id}'s fetch is held up")
                follower.in_flight[leader_id] = (sent, response)
                continue
            follower.fetchers._take(fetcher, sent, response)
        for leader_id in list(follower.in_flight):
            if leader_id not in wanted:
                del follower.in_flight[leader_id]

    def _serve_fetch(self, leader: _Process, body: Any) -> Any:
        """The leader's Fetch handler for a replica fetch, with the request and the answer as
        Fetch v17 bytes on the way."""
        header = RequestHeader(ApiKey.FETCH, FETCH_VERSION, next(self.correlation), "sim")
        request: Any = decode_request(encode_request(header, body)[4:]).body
        replica_id = request.replica_state.replica_id
        replicas = leader.replicas
        known = replica_id in leader.image.brokers
        budget, total = request.max_bytes, 0
        topics = []
        for topic in request.topics:
            found = leader.image.topics_by_id.get(topic.topic_id)
            answers = []
            for wanted in topic.partitions:
                if not known:
                    result = FetchResult(ErrorCode.not_leader_or_follower)
                elif found is None:
                    result = FetchResult(ErrorCode.unknown_topic_id)
                else:
                    result = replicas.read_for_follower(
                        found.name,
                        wanted.partition,
                        replica_id,
                        wanted.fetch_offset,
                        max(min(wanted.partition_max_bytes, budget), 0),
                        min_one_batch=total == 0,
                        current_leader_epoch=wanted.current_leader_epoch,
                        last_fetched_epoch=wanted.last_fetched_epoch,
                        log_start_offset=wanted.log_start_offset,
                    )
                if result.records is not None:
                    total += result.records.size
                    budget -= result.records.size
                answers.append(
                    FetchPartition(
                        partition_index=wanted.partition,
                        error_code=result.error,
                        high_watermark=result.high_watermark,
                        last_stable_offset=result.high_watermark,
                        log_start_offset=result.log_start_offset,
                        records=b"" if result.records is None else result.records.read(),
                        diverging_epoch=result.diverging_epoch,
                    )
                )
            topics.append(FetchTopic(found.name if found else "", tuple(answers), topic.topic_id))
        response = FetchResponse(0, ErrorCode.none, 0, tuple(topics))
        frame = b"".join(
            part if isinstance(part, bytes) else part.read()
            for part in encode_fetch_response(header.correlation_id, FETCH_VERSION, response)
        )
        return decode_response(ApiKey.FETCH, FETCH_VERSION, frame[4:])[1]

    def _drop_in_flight(self) -> None:
        for process in self._running():
            process.in_flight.clear()

    # -- every step ---------------------------------------------------------------------------

    def _background(self) -> None:
        """What goes on between two steps: AlterPartition requests reach the controller,
        brokers heartbeat (and are fenced when they stop), the metadata reaches the brokers
        (one now and then only part of the way), leaders check their ISRs, logs do their
        periodic work, and waiting requests learn their answers."""
        self._deliver_isr_requests()
        self._heartbeats()
        for process in self._running():
            end = len(self.records)
            if self.rng.random() < 0.2:
                end = self.rng.randint(process.applied, end)
            self._catch_up(process, end)
        for process in self._running():
            process.replicas.check_isr()
            process.logs.tick(self.now)
        self._answers()

    # -- the properties -----------------------------------------------------------------------

    def check(self) -> None:
        for name, index, process, partition in self._led():
            self._check_partition(name, index, process, partition)

    def _check_partition(
        self, name: str, index: int, process: _Process, partition: Partition
    ) -> None:
        key = self._key(process, name, index)
        where = f"{name}-{index} (topic id {key[0]}) led by broker {process.broker_id}"
        log_ = partition.log
        start, high_watermark = log_.log_start_offset, partition.high_watermark
        readable = self._consume(process.replicas, name, index, partition, where)
        tail = _bytes(log_, high_watermark, log_.log_end_offset)
        present = {offset: (value, origin) for offset, value, origin in readable}
        for offset, value, origin in self._records(tail, high_watermark, where):
            present[offset] = (value, origin)
        # (4) no stray log is served: every record came from a produce to this incarnation.
        for offset, (value, origin) in sorted(present.items()):
            if origin != key:
                self.fail(
                    f"{where} holds at offset {offset} the record {value!r} produced to "
                    f"{origin}, not to this incarnation"
                )
        # (1) no acknowledged record is lost.
        caught_up = high_watermark >= partition.leader_start_offset
        readable_at = {offset: value for offset, value, _ in readable}
        for offset, (value, at) in sorted(self.acked.get(key, {}).items()):
            if offset < self.deleted_to.get(key, 0) or self.unclean.get(key, -1) > at:
                continue
            if present.get(offset, (None,))[0] != value:
                self.fail(
                    f"{where} lost the acknowledged record {value!r} at offset {offset} "
                    f"(log start {start}, high watermark {high_watermark}, log end "
                    f"{log_.log_end_offset}; it has {present.get(offset, (None,))[0]!r} there)"
                )
            if caught_up and readable_at.get(offset) != value:
                self.fail(
                    f"{where} does not serve the acknowledged record {value!r} at offset "
                    f"{offset} (high watermark {high_watermark}, its epoch started at "
                    f"{partition.leader_start_offset})"
                )
        # (2) no deleted record reappears.
        for offset, at, fenced in self.deletes_acked.get(key, []):
            if self.unclean.get(key, -1) > at:
                continue
            below = [o for o, _, _ in readable if o < offset]
            elected = self.elr_elected.get(key, {}).get(process.broker_id, -1)
            if (
                below
                and self.excuse_deletes_undone_by_elr
                and process.broker_id in fenced
                and elected > at
            ):
                self.deletes_excused += 1
                self.note(f"{where} serves {below[:5]} below DeleteRecords {offset} (known bug)")
            elif below:
                self.fail(
                    f"{where} serves offsets {below[:5]} below the acknowledged DeleteRecords "
                    f"offset {offset} (log start {start})"
                )
        # (3) ListOffsets(LATEST) never goes back.
        answer = process.replicas.list_offset(
            name, index, LATEST_TIMESTAMP, current_leader_epoch=partition.leader_epoch
        )
        if answer.error == ErrorCode.none:
            best, at = self.latest.get(key, (-1, -1))
            if answer.offset >= best or self.unclean.get(key, -1) > at:
                self.latest[key] = (answer.offset, partition.leader_epoch)
            elif EXCUSE_LATEST_BEFORE_CAUGHT_UP and not caught_up:
                self.latest_excused += 1
                self.note(f"{where} answers LATEST {answer.offset} after {best} (known bug)")
            else:
                self.fail(
                    f"{where} answers ListOffsets(LATEST) {answer.offset}, after {best} was "
                    f"answered (its epoch started at {partition.leader_start_offset})"
                )
        elif answer.error != ErrorCode.offset_not_available:
            self.fail(f"{where} answers ListOffsets(LATEST) with {answer.error.name}")
        # (5) caught-up replicas hold the same bytes below the high watermark.
        for replica in partition.state.replicas:
            self._check_same_bytes(name, index, process, partition, replica, where)

    def _consume(
        self, replicas: Replicas, name: str, index: int, partition: Partition, where: str
    ) -> list[tuple[int, bytes, Key]]:
        """Every record a consumer reads from the log start, through `ReplicaManager.read`."""
        found: list[tuple[int, bytes, Key]] = []
        offset = first = partition.log.log_start_offset
        while True:
            result = replicas.read(
                name, index, offset, 1 << 20, min_one_batch=True,
                current_leader_epoch=partition.leader_epoch,
            )  # fmt: skip
            if result.error != ErrorCode.none:
                self.fail(f"{where} refuses a consumer's read at {offset}: {result.error.name}")
            if result.records is None:
                return found
            data = result.records.read()
            progress = offset
            for position, header in iter_batches(data, allow_partial_tail=True):
                found.extend(self._records(data[position : position + header.size], first, where))
                offset = header.next_offset
            if offset <= progress:
                self.fail(f"{where}: a consumer's read at {progress} makes no progress")

    def _records(self, data: bytes, first: int, where: str) -> list[tuple[int, bytes, Key]]:
        """The records of whole batches from `first` on, each with the partition incarnation
        it was produced to, known by its batch's CRC (checked against the batch's bytes)."""
        found = []
        for position, header in iter_batches(data):
            try:
                validate_batch(data, position)
            except Exception as exc:
                self.fail(f"{where} holds a damaged batch at {header.base_offset}: {exc}")
            produced = self.produced.get(header.crc)
            if produced is None or len(produced[1]) != header.records_count:
                self.fail(f"{where} holds a batch nobody produced at {header.base_offset}")
            key, values = produced
            for delta, value in enumerate(values):
                if header.base_offset + delta >= first:
                    found.append((header.base_offset + delta, value, key))
        return found

    def _check_same_bytes(
        self,
        name: str,
        index: int,
        leader: _Process,
        partition: Partition,
        replica: int,
        where: str,
    ) -> None:
        follower = self.processes.get(replica)
        if follower is None or follower is leader:
            return
        mine = follower.replicas.partitions.get((name, index))
        end = partition.log.log_end_offset
        if (
            mine is None
            or mine.log.topic_id != partition.log.topic_id
            or partition.follower_ends.get(replica) != end
            or mine.log.log_end_offset != end
        ):
            return
        start = max(partition.log.log_start_offset, mine.log.log_start_offset)
        high_watermark = partition.high_watermark
        ours, theirs = (
            _bytes(partition.log, start, high_watermark),
            _bytes(mine.log, start, high_watermark),
        )
        if ours != theirs:
            self.fail(
                f"{where}: broker {replica} caught up to {end} but its log differs below the "
                f"high watermark {high_watermark} (from {start}): "
                f"{_batch_list(ours)} vs {_batch_list(theirs)}"
            )


def _unclean(old: PartitionState, leader: int) -> str | None:
    """Why electing `leader` for a partition that was `old` is unclean in Kafka's sense, or
    None if it is clean: a leader from the ISR, or from the ELR once the ISR is empty, has
    every committed record (KIP-966). Any other is unclean: the last known leader with the
    ISR and the ELR both empty (balanced recovery, which Kafka marks unclean and gives an ISR
    of that leader alone: it may have lost its disk, or records it had not flushed), and any
    live replica, as an operator's ElectLeaders(UNCLEAN) or `unclean.leader.election.enable`
    chooses it."""
    if leader == old.leader or leader in old.isr or (not old.isr and leader in old.elr):
        return None
    if not old.isr and not old.elr and old.last_known_elr == (leader,):
        return "balanced recovery of the last known leader"
    return "a replica outside the ISR and the ELR"


def _bytes(log: Log, start: int, end: int) -> bytes:
    """The log's whole batches from the one holding `start` to those before `end`, as stored."""
    parts = []
    offset = max(start, log.log_start_offset)
    while offset < end:
        chunk = log.read(offset, 1 << 30, max_offset=end)
        if chunk is None:
            break
        data = chunk.read()
        size = 0
        for position, header in iter_batches(data, allow_partial_tail=True):
            size = position + header.size
            offset = header.next_offset
        parts.append(data[:size])
        if size == 0:
            break
    return b"".join(parts)


def _batch_list(data: bytes) -> list[tuple[int, int, int]]:
    """(base offset, last offset, leader epoch) of each batch: what a difference looks like."""
    return [
        (header.base_offset, header.last_offset, header.partition_leader_epoch)
        for _, header in iter_batches(data)
    ]
