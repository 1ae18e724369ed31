"""Fetch sessions (KIP-227): a fetcher that asks for the same partitions again and again sends
only what changed, and is answered only what changed.

A Fetch with session epoch 0 is a full fetch that asks for a session: the leader keeps the
partitions it named, with their fetch offsets, under a new session id, and answers with that
id. The next fetches name the id and the epoch after the last (1, 2, ...): they carry only the
partitions whose fetch offset or other fields moved, and `ForgottenTopicsData` for those no
longer wanted; the answer carries only the partitions with records, an error, or a high
watermark or log start other than the last one this session was told. Epoch -1 is a full
fetch without a session (and closes the one named). An unknown id is answered
FETCH_SESSION_ID_NOT_FOUND, a wrong epoch INVALID_FETCH_SESSION_EPOCH: the fetcher starts a
new session.

What this saves a leader of thousands of partitions: its followers' fetches are a few
partitions long instead of thousands, and so are the answers, and an idle partition costs a
few comparisons (`ReplicaManager.follower_idle`, `consumer_idle`) instead of a read.

The cache holds `max.incremental.fetch.session.cache.slots` sessions (Kafka's default 1000).
When it is full, a new session takes the place of the least recently used one if that was not
used for 2 minutes, or else of the smallest consumer session if the new one is a follower's
or larger (Kafka's eviction rule); otherwise the fetch is answered without a session (id 0),
and the client goes on with full fetches. A follower's new session replaces the one it had
(one replica fetcher per leader). A session unused for 2 minutes, with no fetch of it
waiting, keeps its slot but dozes: it is told of nothing until its next fetch, which reads
all its partitions (`FetchSession.doze`).
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "EVICTION_MS",
    "FINAL_EPOCH",
    "INITIAL_EPOCH",
    "NOT_SENT",
    "SWEEP_MS",
    "FetchSession",
    "FetchSessionCache",
    "Registry",
    "SessionKey",
    "SessionPartition",
    "session_key",
]

SWEEP_MS = 5_000
"""An incremental fetch reads only the partitions named, touched or always read; every
partition of the session is read at least this often all the same (a third of
`replica.lag.time.max.ms` when that is shorter): a log start moved by retention is told then,
and a follower's idle partitions are caught up as of then, well before the leader would drop
it from the ISR."""
EVICTION_MS = 120_000
"""A session unused this long may be evicted by any new one (Kafka's 2 minutes)."""
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
NOT_SENT = -2
"""What a session partition was last told before its first answer: any value differs."""


@dataclass(slots=True)
class SessionPartition:
    """One partition of a session, with the fields a Fetch names it with (so that it reads
    like one of the request's partitions), and what the session was last told of it."""

    topic_id: uuid.UUID
    topic: str
    """The name it had when it joined (before v13, how the request names it)."""
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1
    log_start_offset: int = -1
    sent_high_watermark: int = NOT_SENT
    sent_log_start_offset: int = NOT_SENT
    sent_leader_epoch: int = NOT_SENT
    """The leader epoch of the answer last sent; with the two above and no error, the
    partition may be skipped while nothing moves."""

    def update(self, wanted: object) -> None:
        self.fetch_offset = wanted.fetch_offset  # type: ignore[attr-defined]
        self.partition_max_bytes = wanted.partition_max_bytes  # type: ignore[attr-defined]
        self.current_leader_epoch = getattr(wanted, "current_leader_epoch", -1)
        self.last_fetched_epoch = getattr(wanted, "last_fetched_epoch", -1)
        self.log_start_offset = getattr(wanted, "log_start_offset", -1)

    def forget_sent(self) -> None:
        """The next answer carries this partition whatever it holds."""
        self.sent_high_watermark = NOT_SENT


SessionKey = tuple[uuid.UUID | str, int]
"""A session partition by topic id (v13+) or name, and index."""
PartitionName = tuple[str, int]
"""A partition as the replica manager names it: topic name and index."""


class Registry(Protocol):
    """Who tells sessions of their partitions' changes (`ReplicaManager.watch`)."""

    def watch(self, key: PartitionName, watcher: FetchSession) -> None: ...

    def unwatch(self, key: PartitionName, watcher: FetchSession) -> None: ...


@dataclass(slots=True, eq=False)
class FetchSession:
    session_id: int
    replica_id: int
    """The follower's broker id, or -1 for a consumer: a session is used by whoever made it."""
    registry: Registry
    next_epoch: int = 1
    partitions: OrderedDict[SessionKey, SessionPartition] = field(default_factory=OrderedDict)
    """In the order they are read: a partition that returned records goes to the end, so
    that a response full to `max_bytes` does not starve the ones after it."""
    last_used_ms: int = 0
    watched: dict[PartitionName, SessionKey] = field(default_factory=dict)
    """The partitions the replica manager tells this session of, by name."""
    touched_keys: set[PartitionName] = field(default_factory=set)
    """Partitions that changed since the last read (`touched`)."""
    always: set[SessionKey] = field(default_factory=set)
    """Partitions read on every fetch: not told yet, answered an error last time, or (a
    follower's) out of the ISR, which the next read may bring back in."""
    last_sweep_ms: int = 0
    """When every partition was last read (`SWEEP_MS`)."""
    turns: dict[SessionKey, int] = field(default_factory=dict)
    """Each partition's place in the reading order, as `partitions` has it: a partition
    that returned records goes behind the others (`served`)."""
    _turn: int = 0
    woken: asyncio.Event = field(default_factory=asyncio.Event)
    fetching: int = 0
    """Fetches of this session being answered (one may wait up to its `max_wait`): a session
    in use never dozes, however long ago its fetch began."""
    dormant: bool = False
    """Unused for `EVICTION_MS`: it keeps its place in the cache, as in Kafka, but is told of
    nothing (`doze`): a session its client abandoned would otherwise be told of every change
    to its partitions for as long as the cache keeps it."""

    def add(self, key: SessionKey, held: SessionPartition) -> None:
        """A partition joins: read at the next fetch, and watched under its name (a topic id
        this node does not know yet has none: `rename` once it does)."""
        self.partitions[key] = held
        self.always.add(key)
        if held.topic:
            self.watched[(held.topic, held.partition)] = key
            self.registry.watch((held.topic, held.partition), self)

    def forget(self, key: SessionKey) -> None:
        """A partition leaves (`ForgottenTopicsData`)."""
        held = self.partitions.pop(key, None)
        self.turns.pop(key, None)
        self.always.discard(key)
        if held is not None:
            self._unwatch(key, held)

    def rename(self, key: SessionKey, name: str) -> None:
        """The topic id of a partition resolved to `name` (Kafka's maybeResolveUnknownName):
        watched under that name from now on."""
        held = self.partitions[key]
        self._unwatch(key, held)
        held.topic = name
        self.add(key, held)

    def close(self) -> None:
        """Removed from the cache: no longer told of anything."""
        for watched in self.watched:
            self.registry.unwatch(watched, self)
        self.watched.clear()

    def doze(self) -> None:
        """Told of nothing until used again (`wake`)."""
        for watched in self.watched:
            self.registry.unwatch(watched, self)
        self.touched_keys.clear()
        self.dormant = True

    def wake(self) -> None:
        """Used again: told of its partitions' changes from now on. What changed meanwhile is
        read all the same: its last sweep was `EVICTION_MS` ago at least, so this fetch reads
        every partition (`SWEEP_MS`)."""
        if self.dormant:
            self.dormant = False
            for watched in self.watched:
                self.registry.watch(watched, self)

    def take_touched(self) -> list[SessionKey]:
        """The partitions touched since the last call."""
        touched = [self.watched[k] for k in self.touched_keys if k in self.watched]
        self.touched_keys.clear()
        return touched

    def _unwatch(self, key: SessionKey, held: SessionPartition) -> None:
        """No longer told of this partition, unless its name now stands for another session
        partition (a topic deleted and created again under the same name: the new one is
        watched under that name)."""
        watched = (held.topic, held.partition)
        if self.watched.get(watched) == key:
            del self.watched[watched]
            self.registry.unwatch(watched, self)

    def served(self, key: SessionKey) -> None:
        """`key` returned records: it is read after the others from now on."""
        self.partitions.move_to_end(key)
        self._turn += 1
        self.turns[key] = self._turn

    def in_turn(self, keys: list[SessionKey]) -> list[SessionKey]:
        """`keys` (a few of the session's) in the session's reading order."""
        return sorted(keys, key=lambda k: self.turns.get(k, 0))

    def touched(self, key: PartitionName) -> None:
        if key in self.watched:
            self.touched_keys.add(key)
            self.woken.set()

    @property
    def privileged(self) -> bool:
        return self.replica_id >= 0

    def advance(self) -> None:
        self.next_epoch = 1 if self.next_epoch >= 2**31 - 1 else self.next_epoch + 1


class FetchSessionCache:
    def __init__(self, slots: int, registry: Registry, *, seed: int | None = None) -> None:
        """`registry`: what tells the sessions of their partitions' changes."""
        self._slots = slots
        self._registry = registry
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()
        """Least recently used first."""
        self._random = random.Random(seed)
        self._next_doze_ms = 0
        """When to look again for sessions unused for `EVICTION_MS` (`_doze_unused`)."""

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: int, now_ms: int) -> FetchSession | None:
        session = self._sessions.get(session_id)
        if session is not None:
            session.last_used_ms = now_ms
            self._sessions.move_to_end(session_id)
            session.wake()
        self._doze_unused(now_ms)
        return session

    def remove(self, session_id: int) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            session.close()

    def create(
        self, replica_id: int, partitions: list[SessionPartition], now_ms: int
    ) -> FetchSession | None:
        """A new session of `partitions`, or None when the cache has no room for it."""
        if self._slots <= 0:
            return None
        self._doze_unused(now_ms)
        if replica_id >= 0:
            # A broker fetches from this leader through one session: a new one (it restarted,
            # reconnected or lost its session) replaces the one it had, which nothing will
            # use again.
            for stale in [s for s in self._sessions.values() if s.replica_id == replica_id]:
                self.remove(stale.session_id)
        if len(self._sessions) >= self._slots and not self._evict(
            replica_id >= 0, len(partitions), now_ms
        ):
            return None
        session_id = self._random.randrange(1, 2**31)
        while session_id in self._sessions:
            session_id = self._random.randrange(1, 2**31)
        session = FetchSession(
            session_id, replica_id, self._registry, last_used_ms=now_ms, last_sweep_ms=now_ms
        )
        for partition in partitions:
            session.add(_key(partition), partition)
        self._sessions[session_id] = session
        return session

    def _doze_unused(self, now_ms: int) -> None:
        """Sessions unused for `EVICTION_MS` doze, least recently used first (once a second at
        most: the dormant ones stay at the front)."""
        if now_ms < self._next_doze_ms:
            return
        self._next_doze_ms = now_ms + 1_000
        for session in self._sessions.values():
            if session.last_used_ms + EVICTION_MS > now_ms:
                break
            if not session.dormant and not session.fetching:
                session.doze()

    def _evict(self, privileged: bool, size: int, now_ms: int) -> bool:
        oldest = next(iter(self._sessions.values()))
        if oldest.last_used_ms + EVICTION_MS <= now_ms:
            self.remove(oldest.session_id)
            return True
        consumers = [s for s in self._sessions.values() if not s.privileged]
        if not consumers:
            return False
        smallest = min(consumers, key=lambda s: len(s.partitions))
        if privileged or len(smallest.partitions) < size:
            self.remove(smallest.session_id)
            return True
        return False


def session_key(topic_id: uuid.UUID | None, topic: str, partition: int) -> SessionKey:
    return (topic_id if topic_id is not None and topic_id.int != 0 else topic, partition)


def _key(partition: SessionPartition) -> SessionKey:
    return session_key(partition.topic_id, partition.topic, partition.partition)
