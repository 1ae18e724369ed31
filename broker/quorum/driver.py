"""The quorum driver: the Raft core (`broker.raft`) on a real clock, a real disk and real
sockets.

One task owns the core. Everything that changes it — a request from a peer, a peer's
response, a proposal, the clock — is queued and handled by that task, which then carries out
the core's `Ready` in its order: election state, snapshot install, log truncation and append
(on a thread: they end in an fsync), then messages, then the new high watermark, which it
hands to the applier (below). Nothing steps the core while a `Ready` is on disk, which is
what makes `advance` true.

A peer's request is answered with the core's reply to it: the handler waits for the reply the
core addresses to that peer (a fetch the leader has nothing for yet waits up to the core's
fetch wait). The core's own requests go out through `PeerConnection`s, and their responses
come back as messages through the same queue.

Nothing leaves this node before the election state it depends on is on disk (etcd's rule:
persist the HardState, then send). The core's messages go out after their `Ready`'s disk work;
BeginQuorumEpoch and EndQuorumEpoch, which the core does not answer, are answered once the
`Ready` their step caused is carried out; and every answer states the election state on disk
(`_durable`), never one the core holds only in memory. A voter that acknowledged a leader or
granted a vote and then crashed comes back knowing it did.

A state machine that cannot apply a committed entry raises `StateMachineFault`: its state no
longer follows the log, so this node must not decide, vote or serve from it. The driver then
resigns leadership, if held (EndQuorumEpoch, so another voter leads at once), stops taking part
and tells `on_fault`; the node's policy decides what follows (a voter exits, as Kafka's
controllers do).

Committed entries are applied by a task of their own (the applier), so that a big commit (one
admin request of ten thousand partitions) never holds up the core: it goes on answering votes
and fetches while the state machine catches up. The applier works in slices of
`APPLY_SLICE_S`, yielding the event loop in between: the state machine prepares each entry
(decodes it, which needs no state) in as many slices as it takes, and applies the entries of
one proposal together, in one slice, so that nothing ever sees half of one (Kafka publishes
its metadata image at batch boundaries too). A proposal is answered once its entries are
applied; a leader is the active controller once it has applied every entry before its epoch.
A decision that need not be seen whole (`atomic=False`: leaders moved off a broker, ISR
changes, elections) is proposed as several proposals of about `NON_ATOMIC_PROPOSAL_BYTES` each,
so that every node applies ten thousand leader moves a hundred or so at a time, serving others
in between. (Kafka's controller writes such a decision in one batch of up to 10,000 records,
and its brokers apply it on a metadata thread of their own while their request handlers go
on; here one event loop does both.)

Snapshots are the driver's policy: once `metadata.log.max.record.bytes.between.snapshots`
bytes of records have been applied since the last one, the state machine gives its state as
of the last applied entry, which is encoded and written as a `.checkpoint` on a thread, and
the core drops the log below it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from broker.aio import wait_for
from broker.peer import PeerConnection, PeerUnavailable
from broker.protocol import ErrorCode, MalformedInput, RequestBody, ResponseBody
from broker.raft import (
    BeginQuorumEpoch,
    BeginQuorumEpochReply,
    ElectionState,
    Fetch,
    FetchReply,
    FetchSnapshot,
    FetchSnapshotReply,
    Message,
    NotLeader,
    QuorumTimeouts,
    RaftLog,
    RaftNode,
    Ready,
    Role,
    Snapshot,
    SnapshotId,
    Vote,
    VoteReply,
)

from .batches import read_snapshot, write_snapshot
from .store import QuorumStore
from .wire import error_of, message_from_request, reply_from_response, request_for, response_for

__all__ = [
    "NotController",
    "QuorumDriver",
    "QuorumStatus",
    "StateMachine",
    "StateMachineFault",
    "proposal_parts",
]

log = logging.getLogger(__name__)

_DEFAULT_TIMEOUTS = QuorumTimeouts()
TICK_S = 0.05
"""How often the core sees the clock when nothing else happens."""
APPLY_SLICE_S = 0.005
"""How long the state machine applies committed entries before the event loop serves
others."""
NON_ATOMIC_PROPOSAL_BYTES = 8 * 1024
"""The most a proposal of a non-atomic decision holds (but at least one entry): about 140
PartitionChangeRecords, 10 to 20 ms of the applier's time with the replica manager
following them."""
_REPLY_OF: dict[type, type] = {
    Vote: VoteReply,
    Fetch: FetchReply,
    FetchSnapshot: FetchSnapshotReply,
}


class NotController(Exception):
    """This node is not the active controller; `leader` is the one it knows, if any."""

    def __init__(self, leader: int | None) -> None:
        super().__init__(
            "this node is not the active controller"
            + ("" if leader is None else f" (node {leader} is)")
        )
        self.leader = leader


class StateMachineFault(Exception):
    """The state machine could not apply a committed entry and must not go on: its state no
    longer follows the log. The message names the entry."""


class StateMachine(Protocol):
    """What the committed entries build (the metadata image), as the driver sees it."""

    def prepare(self, offset: int, payload: bytes) -> None:
        """Do for the committed entry at `offset` what needs no state (decode it), before it
        is applied; never changes the state."""

    def apply(self, offset: int, payload: bytes) -> None:
        """Apply the committed entry at `offset`. A local failure to act on an entry is the
        state machine's to report, never the commit's; raises `StateMachineFault` only when
        its state can no longer be trusted (the driver then resigns and stops)."""

    def load(self, payloads: Sequence[bytes], end_offset: int) -> None:
        """Replace the whole state with a snapshot's (of the entries below `end_offset`);
        may raise `StateMachineFault` as `apply` does."""

    def snapshot(self) -> Iterable[bytes]:
        """The whole state as entries, as of the last entry applied. It is iterated on
        another thread, while the state goes on changing: it must hold what it needs (the
        records as they are now), encoding them as it is iterated."""


@dataclass(frozen=True, slots=True)
class QuorumStatus:
    """DescribeQuorum's view: the leader's, or what a follower knows."""

    leader: int | None
    epoch: int
    high_watermark: int
    voters: dict[int, tuple[int, int]]
    """Voter → (log end offset, last fetch time in ms; -1 when unknown)."""
    observers: dict[int, tuple[int, int]]


@dataclass(slots=True)
class _Proposal:
    epoch: int
    last_offset: int
    done: asyncio.Future[int]


class QuorumDriver:
    _role_seen: tuple[Role, int, int | None] | None = None
    """The role, epoch and leader last logged (a change of any is logged, as Kafka logs each
    transition of its quorum state)."""

    def __init__(
        self,
        node_id: int,
        voters: dict[int, tuple[str, int]],
        store: QuorumStore,
        machine: StateMachine,
        *,
        cluster_id: str,
        clock: Callable[[], int],
        wall_clock: Callable[[], int],
        timeouts: QuorumTimeouts = _DEFAULT_TIMEOUTS,
        snapshot_bytes: int = 20 * 1024 * 1024,
        endpoint: tuple[str, str, int] | None = None,
    ) -> None:
        """`voters`: every voter's controller listener (this node's too, when it votes);
        `endpoint`: this node's controller listener (name, host, port), announced to the
        voters when it leads. `clock` (monotonic) times the quorum; `wall_clock` stamps the
        records written."""
        self.node_id = node_id
        self.voters = dict(voters)
        self._store = store
        self._machine = machine
        self._cluster_id = cluster_id
        self._clock = clock
        self._wall_clock = wall_clock
        self._timeouts = timeouts
        self._snapshot_bytes = snapshot_bytes
        self._endpoint = endpoint
        self._peers = {
            voter: PeerConnection(voter, host, port, client_id=f"raft-client-{node_id}")
            for voter, (host, port) in voters.items()
            if voter != node_id
        }
        self._core: RaftNode | None = None
        self._inbox: collections.deque[Callable[[int], None]] = collections.deque()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._calls: set[asyncio.Task[None]] = set()
        self._waiters: dict[tuple[int, type], tuple[Message, asyncio.Future[Message | None]]] = {}
        """Peer requests waiting for the core's reply: (sender, reply type) → the request."""
        self._proposals: collections.deque[_Proposal] = collections.deque()
        self._queued: set[asyncio.Future[int]] = set()
        """Proposals still in the queue, not yet handed to the core."""
        self._after_ready: list[asyncio.Future[bool]] = []
        """Resolved (True) once the Ready of the changes queued before them is carried out;
        False if the task stops first."""
        self._unpersisted: set[asyncio.Future[bool]] = set()
        """Peer requests waiting for the Ready their step causes (see `_step_persisted`)."""
        self._durable = ElectionState()
        """The election state on disk: what every answer to a peer states."""
        self.applied = 0
        """Entries below this offset are applied to the state machine."""
        self._committed = 0
        """The high watermark the applier works towards."""
        self._prepared = 0
        """Entries below this offset are prepared (`StateMachine.prepare`)."""
        self._to_apply = asyncio.Event()
        self._applier: asyncio.Task[None] | None = None
        self._fault: BaseException | None = None
        """What stopped the applier: the driver's task stops on it."""
        self._bytes_since_snapshot = 0
        self._caught_up = asyncio.Event()
        self._active = asyncio.Event()
        self.failed: BaseException | None = None
        self.on_leadership: Callable[[bool], None] | None = None
        """Told when this node becomes (True) or stops being (False) the active controller."""
        self.on_fault: Callable[[StateMachineFault], None] | None = None
        """Told, once this node has resigned and stopped taking part, that the state machine
        failed on a committed entry."""
        self._was_active = False
        self._stopping = False
        self._refused_by: set[int] = set()
        """Peers that said this node is of another cluster (logged once each)."""

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Load what is on disk (the latest snapshot goes to the state machine) and start
        taking part in the quorum."""
        now = self._clock()
        persisted = await asyncio.to_thread(self._store.load, self._wall_clock())
        self._durable = persisted.election
        if persisted.snapshot is not None:
            end = persisted.snapshot.id.end_offset
            self._machine.load(read_snapshot(persisted.snapshot.data), end)
            self.applied = end
        self._core = RaftNode(
            self.node_id,
            tuple(self.voters),
            election=persisted.election,
            snapshot=persisted.snapshot,
            entries=persisted.entries,
            timeouts=self._timeouts,
            rng=random.Random(),
            now_ms=now,
        )
        log.info(
            "metadata quorum: node %d, voters %s, epoch %d, log [%d, %d)",
            self.node_id,
            sorted(self.voters),
            self._core.epoch,
            self._core.log.start_offset,
            self._core.log.end_offset,
        )
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name="quorum")
        self._applier = loop.create_task(self._apply_committed(), name="quorum-applier")
        self._wakeup.set()

    async def resign(self) -> None:
        """Hand leadership over, if held: the voters are told to elect another at once
        (KIP-595's EndQuorumEpoch) rather than after the fetch timeout. Returns once they
        were told (or a second passed)."""
        if self._task is None or self._task.done():
            return
        core = self._core_or_fail()
        if core.role is not Role.LEADER:
            return
        resigned: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def resign_now(now: int) -> None:
            if core.role is Role.LEADER:
                log.info(
                    "node %d resigns as leader of epoch %d: the voters elect another now",
                    self.node_id,
                    core.epoch,
                )
            core.resign(now)
            self._after_ready.append(resigned)

        self._submit(resign_now)
        await asyncio.wait([resigned], timeout=1.0)
        if self._calls:
            await asyncio.wait(list(self._calls), timeout=1.0)

    async def stop(self) -> None:
        """Resign leadership, if held, and stop."""
        if self._task is None:
            return
        await self.resign()
        # Let the task finish what it carries out (a Ready's disk work cannot be cancelled
        # halfway: its thread would go on writing while the store closes).
        self._stopping = True
        self._wakeup.set()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
        if self._applier is not None:
            self._applier.cancel()
            await asyncio.gather(self._applier, return_exceptions=True)
        for task in list(self._calls):
            task.cancel()
        await asyncio.gather(*self._calls, return_exceptions=True)
        for peer in self._peers.values():
            await peer.close()
        self._fail_proposals(NotController(None))
        for _, waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_result(None)
        await asyncio.to_thread(self._store.close, self._wall_clock())

    # -- what the node asks ------------------------------------------------------------------

    @property
    def leader(self) -> int | None:
        return None if self._core is None else self._core.leader

    @property
    def epoch(self) -> int:
        return 0 if self._core is None else self._core.epoch

    @property
    def is_active(self) -> bool:
        """Whether this node leads and has applied every entry of earlier epochs: what its
        controller decides on is the whole committed state."""
        return self._active.is_set()

    async def wait_caught_up(self) -> None:
        """Until this node has applied the metadata log as far as the leader has committed
        it (a restart does not serve an image older than what it had)."""
        await self._caught_up.wait()

    @property
    def end_offset(self) -> int:
        """Where the next entry goes in this node's log."""
        return self._core_or_fail().log.end_offset

    async def propose(
        self, payloads: Sequence[bytes], *, first_offset: int | None = None, atomic: bool = True
    ) -> int:
        """Append entries as the active controller; once committed and applied, the offset
        after the last. Raises `NotController` here or elsewhere, also when leadership is lost
        before the entries commit (they may still commit: the outcome is unknown, and without
        `atomic` a part of them may), and when `first_offset` is given and the first entry
        would go elsewhere (entries that name their own offset, as a broker registration
        does). `atomic` entries are one proposal, committed and applied together; others go
        in proposals of at most `NON_ATOMIC_PROPOSAL_BYTES`."""
        if not self.is_active or self.failed is not None or self._stopping:
            raise NotController(self.leader)
        if not payloads:
            return self.applied
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queued.add(done)

        def propose(now: int) -> None:
            self._queued.discard(done)
            if done.done():
                return  # its caller gave up waiting
            core = self._core_or_fail()
            if first_offset is not None and core.log.end_offset != first_offset:
                done.set_exception(NotController(core.leader))
                return
            try:
                core.propose_parts((payloads,) if atomic else list(proposal_parts(payloads)), now)
            except NotLeader as exc:
                done.set_exception(NotController(exc.leader))
                return
            self._proposals.append(_Proposal(core.epoch, core.log.end_offset - 1, done))

        self._submit(propose)
        return await done

    def now_ms(self) -> int:
        """The quorum's own (monotonic) clock, which `status()`'s fetch times are read by."""
        return self._clock()

    def status(self) -> QuorumStatus:
        core = self._core_or_fail()
        now = self._clock()
        progress = core.progress(now)
        voters = {
            voter: progress.get(voter, (-1, -1)) if progress else (-1, -1) for voter in self.voters
        }
        if core.role is not Role.LEADER:
            voters[self.node_id] = (core.log.end_offset, -1)
        observers = {node: p for node, p in progress.items() if node not in self.voters}
        durable = self._durable
        return QuorumStatus(durable.leader, durable.epoch, core.high_watermark, voters, observers)

    # -- requests from peers -------------------------------------------------------------

    async def handle(self, api_key: int, version: int, body: RequestBody) -> ResponseBody:
        """Answer a quorum request from a peer (the controller listener's handlers)."""
        message = message_from_request(api_key, body)
        core = self._core
        if core is None or self.failed is not None or self._stopping:
            # Starting, stopping, or its metadata log failed: this node takes no part now.
            return response_for(
                api_key,
                version,
                None,
                epoch=self._durable.epoch,
                leader=None,
                error=ErrorCode.broker_not_available,
            )
        cluster_id = getattr(body, "cluster_id", None)
        if cluster_id is not None and cluster_id != self._cluster_id:
            log.warning(
                "refused %s from node %d: cluster id %r is not this cluster's %r",
                type(message).__name__,
                message.sender,
                cluster_id,
                self._cluster_id,
            )
            return response_for(
                api_key,
                version,
                None,
                epoch=self._durable.epoch,
                leader=self._durable.leader,
                error=ErrorCode.inconsistent_cluster_id,
            )
        reply: Message | None = None
        reply_type = _REPLY_OF.get(type(message))
        if reply_type is None:
            # BeginQuorumEpoch, EndQuorumEpoch: the answer is the state the request moved this
            # node to, so it goes once that state is on disk.
            persisted = await self._step_persisted(message)
        else:
            key = (message.sender, reply_type)
            previous = self._waiters.get(key)
            if previous is not None and not previous[1].done():
                previous[1].set_result(None)  # a newer request from the same peer replaces it
            waiter: asyncio.Future[Message | None] = asyncio.get_running_loop().create_future()
            self._waiters[key] = (message, waiter)
            self._submit(lambda now: self._core_or_fail().step(message, now))
            wait_s = (self._timeouts.fetch_wait_ms + self._timeouts.request_ms) / 1000
            try:
                reply = await wait_for(waiter, wait_s)
            except TimeoutError:
                reply = None
            finally:
                if self._waiters.get(key, (None, None))[1] is waiter:
                    del self._waiters[key]
            persisted = reply is not None  # the core's replies go out after their Ready
        durable = self._durable
        if persisted:
            error = ErrorCode.none
        elif self._left:
            error = ErrorCode.broker_not_available
        else:
            error = ErrorCode.request_timed_out
        if isinstance(message, BeginQuorumEpoch) and message.epoch < durable.epoch:
            error = ErrorCode.fenced_leader_epoch  # as Kafka answers a leader of an old epoch
        return response_for(
            api_key,
            version,
            reply,
            epoch=durable.epoch,
            leader=durable.leader,
            error=error,
            now_ms=self._wall_clock(),
            voters=tuple(self.voters),
        )

    # -- the task that owns the core ---------------------------------------------------------

    @property
    def _left(self) -> bool:
        """Whether this node has stopped taking part in the quorum, or is stopping."""
        return self.failed is not None or self._stopping

    def _core_or_fail(self) -> RaftNode:
        if self._core is None:
            raise RuntimeError("the quorum driver has not started")
        return self._core

    def _submit(self, change: Callable[[int], None]) -> None:
        self._inbox.append(change)
        self._wakeup.set()

    async def _step_persisted(self, message: Message) -> bool:
        """Step the core with a peer's `message` and wait until the `Ready` that follows is
        carried out, so the election state it moved to is on disk. False if that did not
        happen within the request timeout, or the quorum stopped first."""
        persisted: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._unpersisted.add(persisted)

        def step(now: int) -> None:
            self._core_or_fail().step(message, now)
            self._after_ready.append(persisted)

        self._submit(step)
        try:
            return await wait_for(persisted, self._timeouts.request_ms / 1000)
        except TimeoutError:
            return False
        finally:
            self._unpersisted.discard(persisted)

    async def _run(self) -> None:
        core = self._core_or_fail()
        try:
            while not self._stopping:
                with contextlib.suppress(TimeoutError):
                    await wait_for(self._wakeup.wait(), TICK_S)
                self._wakeup.clear()
                if self._fault is not None:
                    raise self._fault
                now = self._clock()
                while self._inbox:
                    self._inbox.popleft()(now)
                core.tick(now)
                await self._carry_out(core)
                self._follow_role(core)
                done, self._after_ready = self._after_ready, []
                for future in done:
                    if not future.done():
                        future.set_result(True)
        except StateMachineFault as exc:
            self.failed = exc
            log.critical("node %d leaves the metadata quorum: %s", self.node_id, exc)
            self._deactivate()  # nothing is decided from this state any more
            await self._leave(core)
        except Exception as exc:
            # The disk failed under the metadata log: this node can no longer take part.
            log.exception("the metadata quorum stopped on node %d", self.node_id)
            self.failed = exc
        finally:
            self._inbox.clear()
            for future in (*self._after_ready, *self._unpersisted):
                if not future.done():
                    future.set_result(False)
            self._after_ready = []
            self._fail_proposals(NotController(None))
            self._deactivate()
        if isinstance(self.failed, StateMachineFault) and self.on_fault is not None:
            self.on_fault(self.failed)

    def _deactivate(self) -> None:
        if self._active.is_set():
            self._active.clear()
            self._was_active = False
            if self.on_leadership is not None:
                self.on_leadership(False)

    async def _leave(self, core: RaftNode) -> None:
        """After a state machine fault: resign leadership, if held, and carry out what that
        takes (persist, then tell the voters), applying nothing more; give the EndQuorumEpoch
        requests a second to go out."""
        core.resign(self._clock())
        try:
            await self._carry_out(core, apply=False)
        except Exception:
            log.exception("node %d could not resign after the fault", self.node_id)
            return
        if self._calls:
            await asyncio.wait(list(self._calls), timeout=1.0)

    async def _carry_out(self, core: RaftNode, *, apply: bool = True) -> None:
        while True:
            ready = core.ready()
            if not ready:
                return
            now = self._clock()
            if (
                ready.election is not None
                or ready.install is not None
                or ready.truncate_to is not None
                or ready.entries
                or ready.delete_before is not None
            ):
                leader = core.leader if core.leader is not None else -1
                await asyncio.to_thread(self._persist, ready, core.log, leader, self._wall_clock())
                if ready.election is not None:
                    self._durable = ready.election
            core.advance(now)
            if ready.install is not None and apply:
                snapshot = ready.install
                self._machine.load(read_snapshot(snapshot.data), snapshot.id.end_offset)
                self.applied = self._prepared = snapshot.id.end_offset
                self._bytes_since_snapshot = 0
                self._to_apply.set()  # the applier goes on from there
                log.info("installed snapshot %s fetched from the leader", snapshot.id)
            for to, message in ready.messages:
                self._send(to, message)
            if ready.high_watermark is not None and apply:
                self._committed = max(self._committed, ready.high_watermark)
                self._to_apply.set()
            if apply and self._fault is None:
                await self._maybe_snapshot(core)

    def _persist(self, ready: Ready, raft_log: RaftLog, leader: int, wall: int) -> None:
        """Ready's disk work, on a thread; nothing steps the core meanwhile, so its log may
        be read here (`raft_log`)."""
        store = self._store
        if ready.election is not None:
            store.save_election(ready.election)
        if ready.install is not None:
            store.install(ready.install, wall)
        if ready.truncate_to is not None:
            store.truncate(ready.truncate_to, raft_log, wall, leader=leader)
        if ready.entries:
            store.append(ready.append_from, ready.entries, wall, leader=leader)
        if ready.entries or ready.truncate_to is not None:
            store.flush(wall)
        if ready.delete_before is not None:
            store.delete_before(ready.delete_before, wall)

    async def _apply_committed(self) -> None:
        """The applier: committed entries to the state machine, a slice at a time."""
        core = self._core_or_fail()
        while True:
            await self._to_apply.wait()
            self._to_apply.clear()
            while self.applied < self._committed and self._fault is None and not self._left:
                try:
                    progressed = self._apply(core, self._committed)
                except Exception as exc:  # a StateMachineFault, or a bug: the driver stops
                    self._fault = exc
                    progressed = True
                self._wakeup.set()  # the driver's task sees how far it got
                if not progressed:
                    break  # a snapshot is being installed: the driver sets us off again
                await asyncio.sleep(0)

    def _apply(self, core: RaftNode, high_watermark: int) -> bool:
        """For at most `APPLY_SLICE_S` (or one whole proposal), prepare committed entries up
        to `high_watermark` and apply every proposal prepared whole; answer the proposals
        applied. False if nothing can be done now (a snapshot is being installed)."""
        if core.log.start_offset > self.applied:
            return False  # the core has a snapshot the state machine is yet to load
        end = min(high_watermark, core.log.end_offset)
        self._prepared = max(self._prepared, self.applied)
        deadline = time.perf_counter() + APPLY_SLICE_S
        while self.applied < end:
            while self._prepared < end:  # the rest of the proposal that starts at `applied`
                entry = core.log[self._prepared]
                if not entry.control:
                    self._machine.prepare(self._prepared, entry.payload)
                self._prepared += 1
                if not entry.continued:
                    break
                if time.perf_counter() >= deadline:
                    self._answer_applied(core)
                    return True
            for offset in range(self.applied, self._prepared):  # all of it, at once
                entry = core.log[offset]
                if not entry.control:
                    self._machine.apply(offset, entry.payload)
                    self._bytes_since_snapshot += len(entry.payload)
            self.applied = self._prepared
            if time.perf_counter() >= deadline:
                break
        self._answer_applied(core)
        return True

    def _answer_applied(self, core: RaftNode) -> None:
        while self._proposals and self._proposals[0].last_offset < self.applied:
            proposal = self._proposals.popleft()
            if proposal.done.done():
                continue
            last = proposal.last_offset
            if last >= core.log.start_offset and core.log[last].epoch == proposal.epoch:
                proposal.done.set_result(last + 1)
            else:
                proposal.done.set_exception(NotController(core.leader))

    def _follow_role(self, core: RaftNode) -> None:
        seen = (core.role, core.epoch, core.leader)
        if seen != self._role_seen:
            log.info(
                "metadata quorum: node %d is %s in epoch %d (leader: %s)",
                self.node_id,
                core.role.value,
                core.epoch,
                "none" if core.leader is None else core.leader,
            )
            self._role_seen = seen
        leading = core.role is Role.LEADER
        # Active once the entries before its epoch are committed and applied here.
        start = core.epoch_start
        active = leading and core.high_watermark > start and self.applied > start
        if active and not self._active.is_set():
            self._active.set()
        elif not active and self._active.is_set():
            self._active.clear()
        if self._proposals and (not leading or self._proposals[0].epoch != core.epoch):
            self._fail_proposals(NotController(core.leader))
        if active != self._was_active:
            self._was_active = active
            if active:
                log.info("node %d is the active controller in epoch %d", self.node_id, core.epoch)
            if self.on_leadership is not None:
                self.on_leadership(active)
        # A follower or observer has caught up once it has applied what its leader had
        # committed when it last answered a fetch that continued this node's log: until a
        # leader answers, a restarted node cannot know how much it is missing.
        leader_committed = core.leader_high_watermark
        if not self._caught_up.is_set() and (
            active
            or (
                core.role is Role.FOLLOWER
                and leader_committed is not None
                and self.applied >= leader_committed
            )
        ):
            self._caught_up.set()

    def _fail_proposals(self, error: Exception) -> None:
        futures = [proposal.done for proposal in self._proposals]
        if self._task is None or self._task.done() or self.failed is not None or self._stopping:
            futures += self._queued  # no task will hand these to the core any more
            self._queued.clear()
        self._proposals.clear()
        for future in futures:
            if not future.done():
                future.set_exception(error)

    async def _maybe_snapshot(self, core: RaftNode) -> None:
        if self._bytes_since_snapshot < self._snapshot_bytes or self._fault is not None:
            return
        end = self.applied
        if end <= core.log.start_offset:
            return
        epoch = core.log.epoch_at(end - 1)
        entries = self._machine.snapshot()
        wall = self._wall_clock()
        store = self._store

        def encode_and_save() -> tuple[bytes, int]:
            payloads = list(entries)
            data = write_snapshot(
                payloads, end_offset=end, epoch=epoch, last_timestamp=wall, now_ms=wall
            )
            store.save_snapshot(Snapshot(SnapshotId(end, epoch), data))
            return data, len(payloads)

        # Encoded and on disk first, then the core drops the log below it (nothing steps it
        # meanwhile: this is the driver's task).
        written = self._bytes_since_snapshot
        data, count = await asyncio.to_thread(encode_and_save)
        snapshot_id = core.take_snapshot(end, data)
        self._bytes_since_snapshot -= written  # what was applied meanwhile counts on
        log.info("metadata snapshot %s written (%d records)", snapshot_id, count)

    # -- messages out ------------------------------------------------------------------------

    def _send(self, to: int, message: Message) -> None:
        if isinstance(message, BeginQuorumEpochReply):
            return  # the response to the BeginQuorumEpoch already carries this node's epoch
        if isinstance(message, (VoteReply, FetchReply, FetchSnapshotReply)):
            # Kafka's responses do not say what they answer: a reply goes only to the request
            # it answers, never to a newer one from the same peer that took its place.
            key = (to, type(message))
            found = self._waiters.get(key)
            if found is not None and _answers(found[0], message) and not found[1].done():
                del self._waiters[key]
                found[1].set_result(message)
            return
        peer = self._peers.get(to)
        if peer is None:
            return
        task = asyncio.get_running_loop().create_task(self._call(peer, message))
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    async def _call(self, peer: PeerConnection, message: Message) -> None:
        timeouts = self._timeouts
        api_key, version, body = request_for(
            message,
            peer.node_id,
            cluster_id=self._cluster_id,
            endpoint=self._endpoint,
            fetch_wait_ms=timeouts.fetch_wait_ms,
            max_bytes=timeouts.snapshot_chunk_bytes,
        )
        wait_s = (timeouts.fetch_wait_ms + timeouts.request_ms) / 1000
        try:
            response = await peer.request(api_key, version, body, timeout_s=wait_s)
        except (PeerUnavailable, TimeoutError) as exc:
            log.debug("%s to %s: %s", type(message).__name__, peer, exc)
            node = peer.node_id
            self._submit(lambda now: self._core_or_fail().unreachable(node, now))
            return
        try:
            reply = reply_from_response(message, peer.node_id, response)
        except MalformedInput as exc:
            log.warning("%s answered %s with a malformed response: %s", peer, message, exc)
            return
        if reply is not None:
            self._submit(lambda now: self._core_or_fail().step(reply, now))
        elif (
            error_of(response) == ErrorCode.inconsistent_cluster_id
            and peer.node_id not in self._refused_by
        ):
            self._refused_by.add(peer.node_id)
            log.error(
                "node %d refuses this node's requests: it belongs to another cluster than "
                "%s (every node of a cluster is formatted with the same cluster id)",
                peer.node_id,
                self._cluster_id,
            )


def _answers(request: Message, reply: Message) -> bool:
    """Whether `reply` is the core's answer to `request` (same peer and kind assumed)."""
    if isinstance(request, Fetch) and isinstance(reply, FetchReply):
        return (reply.fetch_offset, reply.last_fetched_epoch) == (
            request.fetch_offset,
            request.last_fetched_epoch,
        )
    if isinstance(request, FetchSnapshot) and isinstance(reply, FetchSnapshotReply):
        return (reply.id, reply.position) == (request.id, request.position)
    if isinstance(request, Vote) and isinstance(reply, VoteReply):
        return reply.pre_vote == request.pre_vote
    return False


def proposal_parts(
    payloads: Sequence[bytes], most: int = NON_ATOMIC_PROPOSAL_BYTES
) -> Iterator[Sequence[bytes]]:
    """`payloads` in runs of at most `most` bytes (at least one entry each)."""
    start, size = 0, 0
    for end, payload in enumerate(payloads):
        if size and size + len(payload) > most:
            yield payloads[start:end]
            start, size = end, 0
        size += len(payload)
    if start < len(payloads):
        yield payloads[start:]
