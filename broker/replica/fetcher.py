"""Replica fetchers: how a follower copies its leaders' logs (Kafka's ReplicaFetcherThread).

One fetcher per leader this node follows partitions of, each a task with one connection to that
leader's inter-broker listener, sending Fetch requests with this node's replica id for all its
partitions at once: from each partition's log end, with the epoch of its last batch (so that
the leader can say where a log that parted from its own must be cut: DivergingEpoch). What
comes back is appended as it is (offsets and epochs the leader gave it), and the leader's high
watermark taken up to the follower's log end.

A partition whose leader refuses (it moved, or its epoch is not the one this node knows) waits
`replica.fetch.backoff.ms` and for the metadata to catch up; a leader that cannot be reached
is retried after the same backoff. Which fetcher follows which partitions changes with the
metadata (`update`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from broker.aio import wait_for
from broker.metadata import MetadataImage
from broker.peer import PeerConnection, PeerUnavailable
from broker.protocol import ApiKey, ErrorCode, build, request_type
from broker.protocol.messages import request_module
from broker.protocol.records import BATCH_HEADER_SIZE, read_batch_header
from broker.storage.epochs import UNDEFINED_EPOCH

from .manager import ReplicaManager
from .partition import Partition, TopicPartition

__all__ = ["FetcherSettings", "ReplicaFetchers"]

log = logging.getLogger(__name__)

FETCH_VERSION = 17
THROTTLE_BACKOFF_S = 0.1
"""How long a partition over the follower throttle is left out of the fetches."""
SWEEP_S = 5.0
"""How often a fetcher looks at every partition it follows, not only at those it was told
moved: a change that reaches a log by a way that tells no one (the follower's own retention
moving its log start) reaches the leader's session within this."""
CLOSE_TIMEOUT_S = 5.0
"""How long `close` waits for the fetchers to stop (each closes its leader connection)."""
_SESSION_ERRORS = (ErrorCode.fetch_session_id_not_found, ErrorCode.invalid_fetch_session_epoch)
_RETRIABLE = (
    ErrorCode.not_leader_or_follower,
    ErrorCode.fenced_leader_epoch,
    ErrorCode.unknown_leader_epoch,
    ErrorCode.unknown_topic_or_partition,
    ErrorCode.unknown_topic_id,
    ErrorCode.kafka_storage_error,
)


@dataclass(frozen=True, slots=True)
class FetcherSettings:
    """Kafka's `replica.fetch.*` settings, with its defaults."""

    node_id: int
    cluster_id: str
    listener: str
    """The leader's listener fetched from (`inter.broker.listener.name`)."""
    wait_max_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 1_048_576
    """Per partition (`replica.fetch.max.bytes`)."""
    response_max_bytes: int = 10_485_760
    backoff_ms: int = 1000
    request_timeout_ms: int = 30_000


_SessionEntry = tuple[int, int, int, int]
"""What a fetch session holds for a partition: fetch offset, leader epoch, last fetched
epoch, log start offset (a change in any is sent again)."""


@dataclass(slots=True)
class _Session:
    """This fetcher's fetch session with its leader (KIP-227): the leader keeps the partitions
    and their fetch state, so a fetch names only what changed since the last one."""

    session_id: int = 0
    """0: none yet; the next fetch is a full one, which asks for one."""
    epoch: int = 0
    """The next fetch's session epoch."""
    held: dict[tuple[Any, int], _SessionEntry] = field(default_factory=dict)
    """By (topic id, partition): what the leader's session holds."""
    pending: tuple[dict[tuple[Any, int], _SessionEntry], list[tuple[Any, int]]] = field(
        default_factory=lambda: ({}, [])
    )
    """What the fetch under way changes in the session: entries sent, partitions forgotten."""

    def reset(self) -> None:
        self.session_id, self.epoch = 0, 0
        self.held.clear()
        self.pending = ({}, [])

    def answered(self, session_id: int) -> None:
        """The fetch under way was answered: the leader's session now holds what it sent."""
        sent, forgotten = self.pending
        if self.epoch != 0 and session_id != self.session_id:
            # Answered outside the session (a refused replica fetch is answered without
            # one): the leader's session did not move; start over with a full fetch.
            self.reset()
            return
        if self.epoch == 0:
            self.held.clear()
            if session_id == 0:
                self.pending = ({}, [])
                return  # the leader keeps no session: the next fetch is full again
            self.session_id = session_id
        self.held.update(sent)
        for key in forgotten:
            self.held.pop(key, None)
        self.epoch = 1 if self.epoch >= 2**31 - 1 else self.epoch + 1
        self.pending = ({}, [])


@dataclass(slots=True)
class _Asking:
    """A partition the next fetch reads: as whom it is asked for, and from where."""

    at: tuple[Any, int]
    """(topic id, index): how the leader names it."""
    partition: Partition
    entry: _SessionEntry


@dataclass(slots=True)
class _Fetcher:
    leader: int
    partitions: set[TopicPartition] = field(default_factory=set)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    held_until: dict[TopicPartition, float] = field(default_factory=dict)
    """Partitions a refusal holds back until then (monotonic seconds)."""
    asking: dict[TopicPartition, _Asking] = field(default_factory=dict)
    """Every partition the fetches read now (followed, not held back), with the fetch state
    last sent for it. A fetch answer is taken only for the state it asked from."""
    reading: dict[tuple[Any, int], Partition] = field(default_factory=dict)
    """`asking` by the leader's names for the partitions."""
    dirty: set[TopicPartition] = field(default_factory=set)
    """Partitions whose fetch state may have moved since the last fetch (appended to,
    truncated, answered, led, no longer followed...): only these are looked at again."""
    unsaid: set[tuple[Any, int]] = field(default_factory=set)
    """Partitions no longer read that the leader's session may still hold: the next fetch
    forgets them (a round with nothing to ask sends none, so they wait for one)."""
    swept: float = 0.0
    """When every partition was last looked at (`SWEEP_S`; monotonic seconds)."""
    idle: bool = False
    """Waiting for a change with nothing to ask: a partition told of wakes it."""
    session: _Session = field(default_factory=_Session)

    def forget(self, key: TopicPartition) -> None:
        """`key` is read no longer: the next fetch forgets it (`unsaid`)."""
        asking = self.asking.pop(key, None)
        if asking is not None:
            if self.reading.get(asking.at) is asking.partition:
                del self.reading[asking.at]
            self.unsaid.add(asking.at)


class ReplicaFetchers:
    def __init__(
        self,
        settings: FetcherSettings,
        replicas: ReplicaManager,
        image: Any,
    ) -> None:
        """`image`: a callable giving the current metadata image (brokers' endpoints, topic
        ids)."""
        self._settings = settings
        self._replicas = replicas
        self._image = image
        self._fetchers: dict[int, _Fetcher] = {}
        self._closed = False
        self._stopping: set[asyncio.Task[None]] = set()
        """Fetchers of leaders no longer followed, until their tasks have ended."""
        self._following: dict[TopicPartition, _Fetcher] = {}
        """Which fetcher follows each partition (the replica manager tells `touched`)."""

    def update(self) -> None:
        """Follow what the replica manager says this node follows now: a fetcher per leader,
        started or stopped as leaders come and go."""
        if self._closed:
            return
        wanted: dict[int, set[TopicPartition]] = {}
        for key, partition in self._replicas.followed().items():
            wanted.setdefault(partition.state.leader, set()).add(key)
        for leader, fetcher in list(self._fetchers.items()):
            if leader not in wanted:
                del self._fetchers[leader]
                self._follow(fetcher, set())
                if fetcher.task is not None:
                    fetcher.task.cancel()
                    # Held until it has wound down (its connection closes): a task nothing
                    # refers to may be collected mid-flight ("Task was destroyed but it is
                    # pending").
                    self._stopping.add(fetcher.task)
                    fetcher.task.add_done_callback(self._stopping.discard)
        moved: list[_Fetcher] = []
        for leader, keys in wanted.items():
            following = self._fetchers.get(leader)
            if following is not None and following.partitions != keys:
                moved.append(following)
                self._follow(following, keys & following.partitions)  # what left, first
        for leader, keys in wanted.items():
            following = self._fetchers.get(leader)
            if following is None:
                following = self._fetchers[leader] = _Fetcher(leader)
                following.task = asyncio.get_running_loop().create_task(
                    self._run(following), name=f"replica-fetcher-{leader}"
                )
                following.task.add_done_callback(functools.partial(self._ended, following))
                moved.append(following)
            self._follow(following, keys)
        for following in moved:
            following.changed.set()

    def _follow(self, fetcher: _Fetcher, keys: set[TopicPartition]) -> None:
        """`fetcher` follows `keys` from now on: it is told of every change of those (the
        replica manager's `watch`), and looks at what joined or left before its next fetch."""
        if fetcher.partitions == keys:
            return
        for key in fetcher.partitions - keys:
            if self._following.get(key) is fetcher:
                del self._following[key]
                self._replicas.unwatch(key, self)
        for key in keys - fetcher.partitions:
            self._following[key] = fetcher
            self._replicas.watch(key, self)
        fetcher.dirty |= fetcher.partitions ^ keys
        fetcher.partitions = keys

    def touched(self, key: TopicPartition) -> None:
        """The replica manager's word that `key` changed (appended to, truncated, its leader
        or epoch or log start moved): its fetcher looks at it again before the next fetch."""
        fetcher = self._following.get(key)
        if fetcher is not None:
            fetcher.dirty.add(key)
            if fetcher.idle:
                fetcher.changed.set()

    def _ended(self, fetcher: _Fetcher, task: asyncio.Task[None]) -> None:
        """A fetcher that died (it should not) is logged and forgotten, so that the next
        `update` starts another."""
        # The task's exception (a CancelledError too) holds `_run`'s frame, and so the
        # fetcher: letting go of the task makes that no cycle, and a stopped fetcher's state
        # (an entry per partition it read) goes by reference counting.
        fetcher.task = None
        if task.cancelled():
            return
        exc = task.exception()
        if self._fetchers.get(fetcher.leader) is fetcher:
            del self._fetchers[fetcher.leader]
            self._follow(fetcher, set())  # the next `update` starts another
        if exc is not None:
            log.error("the replica fetcher stopped", exc_info=exc)
            if not self._closed:
                asyncio.get_running_loop().call_later(self._settings.backoff_ms / 1000, self.update)

    async def close(self) -> None:
        self._closed = True
        tasks = [f.task for f in self._fetchers.values() if f.task is not None]
        tasks.extend(self._stopping)
        for fetcher in self._fetchers.values():
            self._follow(fetcher, set())
        self._fetchers.clear()
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        # Bounded: a fetcher's connection that will not close (its leader stopped, SIGSTOP)
        # must not hold up the node's shutdown.
        _, stuck = await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
        if stuck:
            log.warning(
                "%d replica fetchers did not stop within %.0f s; going on without them",
                len(stuck),
                CLOSE_TIMEOUT_S,
            )

    # -- one leader ---------------------------------------------------------------------------

    async def _run(self, fetcher: _Fetcher) -> None:
        settings = self._settings
        peer: PeerConnection | None = None
        try:
            while True:
                # Cleared first: a change that comes while this round is on its way wakes
                # the next wait, and one already seen does not (without an endpoint, the
                # pause below would return at once, round after round, and never yield).
                fetcher.changed.clear()
                address = self._address(fetcher.leader)
                if address is None:
                    log.warning(
                        "broker %d has no %s endpoint to fetch from; retrying",
                        fetcher.leader,
                        settings.listener,
                    )
                    await self._pause(fetcher)
                    continue
                if peer is None or (peer.host, peer.port) != address:
                    if peer is not None:
                        await peer.close()
                    fetcher.session.reset()
                    peer = PeerConnection(
                        fetcher.leader,
                        *address,
                        client_id=f"replica-fetcher-{settings.node_id}-{fetcher.leader}",
                    )
                request = self._request(fetcher)
                if request is None:
                    # Nothing to ask now: wait for a change, or until the first held
                    # partition may be asked again.
                    first = min(fetcher.held_until.values(), default=None)
                    wait = SWEEP_S if first is None else max(0.0, first - time.monotonic())
                    fetcher.idle = True
                    try:
                        # Told of any change (`touched`), and at most until the sweep.
                        await self._pause(
                            fetcher,
                            until_changed=first is None,
                            at_most=wait,
                        )
                    finally:
                        fetcher.idle = False
                    continue
                body, sent = request
                try:
                    response = await peer.request(
                        ApiKey.FETCH,
                        FETCH_VERSION,
                        body,
                        timeout_s=settings.request_timeout_ms / 1000,
                    )
                except (PeerUnavailable, TimeoutError) as exc:
                    log.info("cannot fetch from broker %d: %s; retrying", fetcher.leader, exc)
                    fetcher.session.reset()  # whether the leader took the fetch is not known
                    await self._pause(fetcher)
                    continue
                try:
                    self._take(fetcher, sent, response)
                except Exception:
                    # A bug or a disk error must not end this leader's replication quietly.
                    log.exception("taking in a fetch from broker %d failed", fetcher.leader)
                    for asked in sent.values():
                        self._hold(fetcher, asked)
        finally:
            if peer is not None:
                with contextlib.suppress(Exception):
                    await peer.close()

    async def _pause(
        self, fetcher: _Fetcher, *, until_changed: bool = False, at_most: float | None = None
    ) -> None:
        """Until the partitions change, or the backoff (or `at_most` seconds) is over."""
        timeout = at_most if until_changed else self._settings.backoff_ms / 1000
        if at_most is not None and timeout is not None:
            timeout = min(timeout, at_most)
        with contextlib.suppress(TimeoutError):
            await wait_for(fetcher.changed.wait(), timeout)

    def _address(self, leader: int) -> tuple[str, int] | None:
        image: MetadataImage = self._image()
        broker = image.brokers.get(leader)
        if broker is None:
            return None
        return broker.endpoints.get(self._settings.listener)

    def _request(self, fetcher: _Fetcher) -> tuple[Any, dict[tuple[Any, int], Partition]] | None:
        """The Fetch for every partition of this leader not held back, and each partition it
        reads by (topic id, index); None when there is none to ask. In a fetch session, the
        request names only the partitions whose fetch state the leader's session does not
        hold, and forgets those no longer asked for. Only partitions told of since the last
        fetch (`dirty`) are looked at, and every one after a lost session or `SWEEP_S`."""
        settings = self._settings
        image: MetadataImage = self._image()
        schema = request_module(ApiKey.FETCH, FETCH_VERSION)
        session = fetcher.session
        now = time.monotonic()
        if session.session_id == 0 or now - fetcher.swept >= SWEEP_S:
            fetcher.dirty |= fetcher.partitions
            fetcher.dirty |= fetcher.asking.keys()
            fetcher.swept = now
        for key, until in list(fetcher.held_until.items()):
            if key not in fetcher.partitions:
                del fetcher.held_until[key]  # no longer followed from this leader
            elif until <= now:
                del fetcher.held_until[key]
                fetcher.dirty.add(key)
        looked_at, fetcher.dirty = fetcher.dirty, set()
        full = session.session_id == 0
        by_topic: dict[Any, list[Any]] = {}
        entries: dict[tuple[Any, int], _SessionEntry] = {}
        for key in looked_at:
            asking = self._asking(fetcher, key, image, now)
            if asking is None:
                fetcher.forget(key)
                continue
            before = fetcher.asking.get(key)
            if before is not None and before.at != asking.at:
                fetcher.forget(key)  # another topic of the same name now
            fetcher.asking[key] = asking
            fetcher.reading[asking.at] = asking.partition
            if not full and session.held.get(asking.at) == asking.entry:
                continue  # the leader's session holds it as it is
            entries[asking.at] = asking.entry
            by_topic.setdefault(asking.at[0], []).append(
                build(
                    schema.FetchPartition,
                    partition=key[1],
                    current_leader_epoch=asking.entry[1],
                    fetch_offset=asking.entry[0],
                    last_fetched_epoch=asking.entry[2],
                    log_start_offset=asking.entry[3],
                    partition_max_bytes=settings.max_bytes,
                    replica_directory_id=None,
                )
            )
        if not fetcher.asking:
            return None
        forgotten: dict[Any, list[int]] = {}
        if not full:
            for at in fetcher.unsaid:
                if at in session.held and at not in fetcher.reading:
                    forgotten.setdefault(at[0], []).append(at[1])
        fetcher.unsaid.clear()  # sent now; a fetch that fails starts the session over
        session.pending = (entries, [(t, i) for t, indexes in forgotten.items() for i in indexes])
        body = build(
            request_type(ApiKey.FETCH, FETCH_VERSION),
            cluster_id=settings.cluster_id,
            # KIP-903: this broker's epoch, as the leaders' images have its registration too
            # (`ReplicaManager.replica_fetch_error` refuses any other).
            replica_state=build(
                schema.ReplicaState,
                replica_id=settings.node_id,
                replica_epoch=getattr(image.brokers.get(settings.node_id), "epoch", -1),
            ),
            max_wait=datetime.timedelta(milliseconds=settings.wait_max_ms),
            min_bytes=settings.min_bytes,
            max_bytes=settings.response_max_bytes,
            isolation_level=0,
            session_id=session.session_id,
            session_epoch=session.epoch,
            topics=tuple(
                build(schema.FetchTopic, topic_id=topic_id, partitions=tuple(partitions))
                for topic_id, partitions in by_topic.items()
            ),
            forgotten_topics_data=tuple(
                build(schema.ForgottenTopic, topic_id=topic_id, partitions=tuple(indexes))
                for topic_id, indexes in forgotten.items()
            ),
            rack_id="",
        )
        return body, fetcher.reading

    def _asking(
        self, fetcher: _Fetcher, key: TopicPartition, image: MetadataImage, now: float
    ) -> _Asking | None:
        """What the next fetch asks for `key`, or None when it asks nothing (no longer
        followed from this leader, led here, held back, or its log busy)."""
        if key not in fetcher.partitions or key in fetcher.held_until:
            return None
        found = self._replicas.partitions.get(key)
        topic = image.topics.get(key[0])
        if found is None or topic is None or found.is_leader:
            return None
        if self._replicas.follower_throttled(found):
            # Over `follower.replication.throttled.rate`: it waits, the others go on.
            fetcher.held_until[key] = now + THROTTLE_BACKOFF_S
            return None
        log_ = found.log
        if log_.appending:
            # Its last write as leader is still on a thread: the log is not to change under
            # it; the next round asks.
            fetcher.held_until[key] = now + 0.05
            return None
        entry = (
            log_.log_end_offset,
            found.leader_epoch,
            log_.epochs.latest_epoch,
            log_.log_start_offset,
        )
        return _Asking((topic.topic_id, key[1]), found, entry)

    def _take(
        self, fetcher: _Fetcher, sent: dict[tuple[Any, int], Partition], response: Any
    ) -> None:
        if response.error_code in _SESSION_ERRORS:
            # The leader lost the session (it restarted, or evicted it) or took a fetch whose
            # answer never came: the next fetch is a full one, which starts another.
            log.info(
                "broker %d ended the fetch session: %s",
                fetcher.leader,
                ErrorCode(response.error_code).name,
            )
            fetcher.session.reset()
            return
        if response.error_code != ErrorCode.none:
            log.warning(
                "broker %d refused a replica fetch: %s",
                fetcher.leader,
                ErrorCode(response.error_code).name,
            )
            fetcher.session.reset()
            for asked in sent.values():
                self._hold(fetcher, asked)
            return
        fetcher.session.answered(response.session_id)
        for topic in response.responses:
            for answer in topic.partitions:
                partition = sent.get((topic.topic_id, answer.partition_index))
                if partition is None:
                    continue
                key = (partition.topic, partition.index)
                fetcher.dirty.add(key)  # answered: its fetch state may move now
                if self._replicas.partitions.get(key) is not partition:
                    continue  # deleted, or failed with its disk, while the fetch was out
                if partition.is_leader or partition.state.leader != fetcher.leader:
                    continue
                asking = fetcher.asking.get(key)
                if asking is None or asking.entry[:2] != (
                    partition.log.log_end_offset,
                    partition.leader_epoch,
                ):
                    # Kafka's fetcher takes an answer only for the fetch state it asked from:
                    # this log or its leader's epoch changed while the fetch was out (the node
                    # led meanwhile, or followed another leader), so the answer may not follow
                    # on from this log's end. The next fetch asks again.
                    continue
                self._take_partition(fetcher, partition, answer)

    def _take_partition(self, fetcher: _Fetcher, partition: Partition, answer: Any) -> None:
        error = ErrorCode(answer.error_code)
        log_ = partition.log
        if error == ErrorCode.offset_out_of_range:
            self._out_of_range(partition, answer)
            return
        if error != ErrorCode.none:
            if error not in _RETRIABLE:
                log.warning(
                    "fetching %s-%d from broker %d: %s",
                    partition.topic,
                    partition.index,
                    fetcher.leader,
                    error.name,
                )
            self._hold(fetcher, partition)
            return
        diverging = getattr(answer, "diverging_epoch", None)
        if diverging is not None and diverging.epoch >= 0 and diverging.end_offset >= 0:
            self._truncate_diverged(partition, diverging.epoch, diverging.end_offset)
            return
        records = _whole_batches(bytes(answer.records or b""))
        self._replicas.follower_took(partition, len(records))
        result = self._replicas.append_from_leader(
            partition, records, answer.high_watermark, answer.log_start_offset
        )
        if result.error != ErrorCode.none:
            log.error(
                "cannot append %s-%d as a follower at offset %d: %s %s",
                partition.topic,
                partition.index,
                log_.log_end_offset,
                result.error.name,
                result.message or "",
            )
            self._hold(fetcher, partition)

    def _truncate_diverged(self, partition: Partition, epoch: int, end_offset: int) -> None:
        """Kafka's truncation on a DivergingEpoch: to where this log's record of `epoch`
        ends, or the leader's, whichever is first; without such an epoch here, to the high
        watermark. The next fetch says the epoch it ends with now, and the leader checks
        again."""
        log_ = partition.log
        own_epoch, own_end = log_.end_offset_for_epoch(epoch)
        if own_epoch == UNDEFINED_EPOCH:
            target = min(partition.high_watermark, end_offset)
        else:
            target = min(own_end, end_offset)
        log.info(
            "%s-%d parted from its leader's log in epoch %d: truncating from %d to %d",
            partition.topic,
            partition.index,
            epoch,
            log_.log_end_offset,
            target,
        )
        self._replicas.truncate(partition, target)

    def _out_of_range(self, partition: Partition, answer: Any) -> None:
        """This log ends outside the leader's: before its start (the leader deleted what this
        follower still needs), so start over at the leader's log start; or past its end, so
        cut back to the leader's high watermark (it has at least that)."""
        log_ = partition.log
        if log_.log_end_offset < answer.log_start_offset:
            log.info(
                "%s-%d is behind its leader's log start %d: starting over there",
                partition.topic,
                partition.index,
                answer.log_start_offset,
            )
            self._replicas.start_over(partition, answer.log_start_offset)
        elif 0 <= answer.high_watermark < log_.log_end_offset:
            self._replicas.truncate(partition, answer.high_watermark)

    def _hold(self, fetcher: _Fetcher, partition: Partition) -> None:
        key = (partition.topic, partition.index)
        fetcher.held_until[key] = time.monotonic() + self._settings.backoff_ms / 1000
        fetcher.dirty.add(key)  # left out of the fetches until then


def _whole_batches(records: bytes) -> bytes:
    """The batches that arrived whole: a fetch answer may end inside a batch (KIP-74), and a
    follower appends only what it has entirely (the rest comes with the next fetch)."""
    end = 0
    while len(records) - end >= BATCH_HEADER_SIZE:
        size = read_batch_header(records, end).size
        if end + size > len(records):
            break
        end += size
    return records if end == len(records) else records[:end]
