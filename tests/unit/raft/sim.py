"""A seeded simulation of a metadata quorum: Raft nodes on a network that drops, duplicates,
delays (and so reorders) messages, cuts links, and crashes and restarts nodes from their disks.

Everything random comes from one seed, so a schedule replays exactly. After every step the
simulation checks Raft's safety properties and fails with the seed and the time:
- at most one leader per epoch;
- an entry once committed (below some node's high watermark) is never changed or lost:
  every node's committed prefix is a prefix of one history;
- a node's disk holds exactly its log, and its election state before it sends what depends on
  it (a vote, an acknowledgement).

Each node's state machine is the list of entries it applied. Now and then a node snapshots it
(`take_snapshot`, every `snapshot_every` entries or so), so logs start past 0 and nodes that
fall behind catch up from a leader's snapshot, fetched in chunks of 1 KiB.

The workload and the state machine are hooks, for a simulation of what the entries carry (the
controller's, `test_controller_simulation.py`): `propose` is what the leader proposes,
`applied_to` is told of every entry a node applies, and `snapshot_data` and `restore` write and
read a snapshot of the whole state machine.

Crashes happen between steps, and also in the middle of carrying out a `Ready`
(`Faults.crash_within_ready`), where a real driver may die between its writes.
"""

from __future__ import annotations

import heapq
import pickle
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from broker.raft import (
    ElectionState,
    Entry,
    Fetch,
    FetchSnapshot,
    Message,
    QuorumTimeouts,
    RaftNode,
    Role,
    Snapshot,
)

TICK_MS = 10


class SafetyViolation(AssertionError):
    pass


@dataclass
class Disk:
    election: ElectionState = field(default_factory=ElectionState)
    snapshot: Snapshot | None = None
    start: int = 0
    """The offset of `entries[0]`: a snapshot's end (entries below it may linger until the
    node's `Ready` says to delete them)."""
    entries: list[Entry] = field(default_factory=list)


@dataclass(frozen=True)
class Refused:
    """The driver's news that a request to `peer` failed without an answer (a crashed
    process refuses connections; a cut link is silence, found by the request timeout)."""

    peer: int


@dataclass(frozen=True)
class Faults:
    drop: float = 0.05
    duplicate: float = 0.02
    min_delay_ms: int = 1
    max_delay_ms: int = 40
    late_copy: float = 0.01
    """The chance that a message is also delivered once more, `late_copy_ms` later: the
    retransmission that arrives after its answer has been acted on."""
    late_copy_ms: tuple[int, int] = (100, 1000)
    crash_every_ms: int = 4000
    """On average; 0: never."""
    partition_every_ms: int = 3000
    """On average, a random link cut or healed; 0: never."""
    crash_within_ready: float = 0.005
    """The chance that a node crashes while its driver carries out a `Ready`: after the
    election state is persisted, after a fetched snapshot is persisted but before the old log
    is dropped, after a prefix of the entries is written (a torn write), or after some of the
    messages are sent."""


QUIET = Faults(
    drop=0, duplicate=0, late_copy=0, crash_every_ms=0, partition_every_ms=0, crash_within_ready=0
)
"""A network that delivers everything once, and nodes that never crash: a healed run."""


def reproduce(variable: str, test: str, seed: int, seeds: int) -> str:
    """The one command that runs a failing seeded schedule again: `variable` sets how many
    seeds there are, `test` is the test's path and name."""
    return f"reproduce: {variable}={max(seeds, seed + 1)} pytest '{test}[seed={seed}]'"


class Simulation:
    def __init__(
        self,
        seed: int,
        *,
        voters: int = 3,
        observers: int = 0,
        faults: Faults = Faults(),
        timeouts: QuorumTimeouts | None = None,
        snapshot_every: int | None = 40,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0
        self.faults = faults
        # Fetches of a few entries each: a proposal is often longer, and must still go whole.
        self.timeouts = timeouts or QuorumTimeouts(snapshot_chunk_bytes=4096, fetch_max_entries=4)
        self.snapshot_every = snapshot_every
        self.applied: dict[int, list[Entry]] = {}
        """Each node's state machine: the entries it applied, in order."""
        self.installed = 0
        """Snapshots installed from a leader, all nodes together."""
        self.voter_ids = list(range(1, voters + 1))
        self.ids = self.voter_ids + list(range(voters + 1, voters + observers + 1))
        self.disks = {node: Disk() for node in self.ids}
        self.nodes: dict[int, RaftNode | None] = {}
        self.cut: set[frozenset[int]] = set()
        self.queue: list[tuple[int, int, int, Message | Refused]] = []
        self._sequence = 0
        self.history: list[Entry] = []
        """The committed entries, as far as any node has committed."""
        self.leaders: dict[int, int] = {}
        self.proposed = 0
        for node in self.ids:
            self.start(node)

    # -- nodes ------------------------------------------------------------------------------

    def start(self, node: int) -> None:
        disk = self.disks[node]
        # Like a driver: load the latest snapshot and keep the log after it, if the log
        # continues it; one that does not is what an install left when it died halfway.
        skip = 0
        if disk.snapshot is not None:
            end, epoch = disk.snapshot.id.end_offset, disk.snapshot.id.epoch
            before = end - 1 - disk.start  # the snapshot's last entry, if the log holds it
            if before >= 0 and not (
                before < len(disk.entries) and disk.entries[before].epoch == epoch
            ):
                disk.start, disk.entries = end, []
            skip = end - disk.start
        self.restore(node, disk.snapshot)
        self.nodes[node] = RaftNode(
            node,
            self.voter_ids,
            election=disk.election,
            snapshot=disk.snapshot,
            entries=disk.entries[skip:],
            timeouts=self.timeouts,
            rng=random.Random(self.rng.random()),
            now_ms=self.now,
        )

    def crash(self, node: int) -> None:
        self.nodes[node] = None

    def live(self) -> list[RaftNode]:
        return [n for n in self.nodes.values() if n is not None]

    def leader(self) -> RaftNode | None:
        leaders = [n for n in self.live() if n.role is Role.LEADER]
        return max(leaders, key=lambda n: n.epoch) if leaders else None

    # -- running ----------------------------------------------------------------------------

    def run(
        self, duration_ms: int, *, faults: bool = True, propose_every_ms: int | None = 50
    ) -> None:
        """Advance time by ticks of `TICK_MS`: deliver what is due, tick every node, propose an
        entry at the leader every `propose_every_ms` (None: never), and inject faults."""
        end = self.now + duration_ms
        next_proposal = self.now
        while self.now < end:
            self.now += TICK_MS
            self._deliver_due()
            for node in self.live():
                node.tick(self.now)
                self.carry_out(node)
            if propose_every_ms is not None and self.now >= next_proposal:
                self.propose()
                next_proposal = self.now + propose_every_ms
            if faults:
                self._maybe_fault()

    def heal(self) -> None:
        self.cut.clear()
        for node, raft in self.nodes.items():
            if raft is None:
                self.start(node)

    def propose(self) -> None:
        """The workload: a proposal of one to six opaque entries at the leader of the highest
        epoch."""
        leader = self.leader()
        if leader is None:
            return
        self.proposed += 1
        size = self.rng.choice((1, 1, 1, 2, 3, 6))
        leader.propose([f"{self.seed}:{self.proposed}.{i}".encode() for i in range(size)], self.now)
        self.carry_out(leader)

    def _deliver_due(self) -> None:
        while self.queue and self.queue[0][0] <= self.now:
            _, _, to, message = heapq.heappop(self.queue)
            node = self.nodes.get(to)
            if node is None:
                if isinstance(message, (Fetch, FetchSnapshot)):
                    # A crashed process refuses the connection: the sender learns at once.
                    self._sequence += 1
                    refused = (self.now + 1, self._sequence, message.sender, Refused(to))
                    heapq.heappush(self.queue, refused)
                continue
            if isinstance(message, Refused):
                node.unreachable(message.peer, self.now)
                self.carry_out(node)
                continue
            node.step(message, self.now)
            self.carry_out(node)

    def carry_out(self, node: RaftNode) -> None:
        """Do what the node's `Ready` asks, as a driver would (crashing halfway through it
        now and then), and check the safety properties."""
        ready = node.ready()
        disk = self.disks[node.id]
        crash_at = None
        if ready and self.rng.random() < self.faults.crash_within_ready:
            crash_at = self.rng.choice(("election", "install", "entries", "messages"))
        if ready.election is not None:
            disk.election = ready.election
        if crash_at == "election":
            self.crash(node.id)
            return
        if ready.install is not None:
            disk.snapshot = ready.install
            if crash_at == "install":
                self.crash(node.id)  # the old log is still on disk: `start` must see to it
                return
            disk.start, disk.entries = ready.install.id.end_offset, []
            if ready.install.id.end_offset < len(self.applied[node.id]):
                self._fail(f"node {node.id} installs a snapshot older than its state machine")
            self.restore(node.id, ready.install)
            self.installed += 1
            self._commit(node, ready.install.id.end_offset)
        if ready.truncate_to is not None:
            if ready.truncate_to < disk.start:
                self._fail(f"node {node.id} truncates to {ready.truncate_to}, below its log")
            del disk.entries[ready.truncate_to - disk.start :]
        if ready.entries:
            if ready.append_from != disk.start + len(disk.entries):
                self._fail(
                    f"node {node.id} appends at {ready.append_from}, its disk ends at "
                    f"{disk.start + len(disk.entries)}"
                )
            if crash_at == "entries":
                # A torn write: the batches written whole are kept, and a batch is a proposal.
                entries = ready.entries
                cuts = [i for i in range(len(entries)) if i == 0 or not entries[i - 1].continued]
                disk.entries.extend(ready.entries[: self.rng.choice(cuts)])
                self.crash(node.id)
                return
            disk.entries.extend(ready.entries)
        if ready.delete_before is not None:
            if disk.snapshot is None or disk.snapshot.id.end_offset < ready.delete_before:
                self._fail(f"node {node.id} deletes below {ready.delete_before}, unsnapshotted")
            del disk.entries[: max(0, ready.delete_before - disk.start)]
            disk.start = max(disk.start, ready.delete_before)
        sent = len(ready.messages)
        if crash_at == "messages":
            sent = self.rng.randrange(sent + 1)
        for to, message in ready.messages[:sent]:
            self._send(node.id, to, message)
        if crash_at == "messages":
            self.crash(node.id)
            return
        if ready.high_watermark is not None:
            self._commit(node, ready.high_watermark)
        node.advance(self.now)
        if node.role is Role.LEADER:
            known = self.leaders.setdefault(node.epoch, node.id)
            if known != node.id:
                self._fail(f"two leaders in epoch {node.epoch}: {known} and {node.id}")
        log = node.log
        if node.high_watermark > log.end_offset:
            self._fail(f"node {node.id}'s high watermark is past its log's end")
        on_disk = disk.entries[log.start_offset - disk.start :]
        if disk.start > log.start_offset or tuple(on_disk) != log.read(log.start_offset, 1 << 30):
            self._fail(f"node {node.id}'s disk differs from its log")
        self._maybe_snapshot(node)
        # Whatever `advance` made ready (the leader's own commit) is carried out next turn.

    def _maybe_snapshot(self, node: RaftNode) -> None:
        """Snapshot the state machine now and then, as a controller does every so many bytes.
        It is persisted before the node's next `Ready` deletes any entry it holds, so no crash
        loses anything."""
        applied = self.applied[node.id]
        every = self.snapshot_every
        if every is None or len(applied) - node.log.start_offset < every:
            return
        if self.rng.random() < 0.5:
            return
        node.take_snapshot(len(applied), self.snapshot_data(node.id))
        self.disks[node.id].snapshot = node.snapshot

    def snapshot_data(self, node: int) -> bytes:
        """The node's state machine as a snapshot holds it: the entries it applied."""
        return pickle.dumps(tuple(self.applied[node]))

    def restore(self, node: int, snapshot: Snapshot | None) -> None:
        """Replace the node's state machine with the one `snapshot` holds (None: empty), as
        a driver loads it on a restart or installs it from the leader."""
        self.applied[node] = [] if snapshot is None else list(pickle.loads(snapshot.data))

    def applied_to(self, node: int, offset: int, entries: Sequence[Entry]) -> None:
        """The node has just applied `entries`, from `offset` on; here, nothing more to do."""

    def _commit(self, node: RaftNode, high_watermark: int) -> None:
        """Apply the entries below the high watermark to the node's state machine, and check
        that they agree with everything committed anywhere before."""
        committed = self.applied[node.id]
        if high_watermark > node.log.start_offset and node.log[high_watermark - 1].continued:
            self._fail(f"node {node.id} commits to {high_watermark}, inside a proposal")
        if high_watermark > len(committed):
            start = len(committed)
            entries = node.log.read(start, high_watermark - start)
            committed.extend(entries)
            self.applied_to(node.id, start, entries)
        shared = min(len(committed), len(self.history))
        if list(committed[:shared]) != self.history[:shared]:
            first = next(i for i in range(shared) if committed[i] != self.history[i])
            self._fail(
                f"node {node.id} committed {committed[first]} at offset {first}, where "
                f"{self.history[first]} was committed before"
            )
        if len(committed) > len(self.history):
            self.history.extend(committed[len(self.history) :])

    def _send(self, sender: int, to: int, message: Message) -> None:
        if frozenset((sender, to)) in self.cut:
            return
        faults = self.faults
        copies = 1
        if self.rng.random() < faults.drop:
            copies = 0
        elif self.rng.random() < faults.duplicate:
            copies = 2
        delays = [self.rng.randint(faults.min_delay_ms, faults.max_delay_ms) for _ in range(copies)]
        if copies and self.rng.random() < faults.late_copy:
            delays.append(self.rng.randint(*faults.late_copy_ms))
        for delay in delays:
            self._sequence += 1
            heapq.heappush(self.queue, (self.now + delay, self._sequence, to, message))

    def _maybe_fault(self) -> None:
        faults = self.faults
        if faults.crash_every_ms and self.rng.random() < TICK_MS / faults.crash_every_ms:
            node = self.rng.choice(self.ids)
            if self.nodes[node] is None:
                self.start(node)
            else:
                self.crash(node)
        if faults.partition_every_ms and self.rng.random() < TICK_MS / faults.partition_every_ms:
            a, b = self.rng.sample(self.ids, 2)
            self.cut ^= {frozenset((a, b))}

    def _fail(self, what: str) -> NoReturn:
        raise SafetyViolation(f"seed {self.seed}, at {self.now} ms: {what}")
