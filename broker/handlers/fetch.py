"""Fetch: batches from partition logs, up to the high watermark, with long polling.

A fetch that finds fewer than `min_bytes` waits up to `max_wait_ms` for appends to the
partitions it asks for (a purgatory keyed by partition, woken by appends). Sizes follow KIP-74:
`max_bytes` bounds the response and `partition_max_bytes` each partition, but the first
partition with data always returns at least one whole batch so a large batch cannot stall a
consumer. Records are not read here: each partition's answer holds a pinned slice of its
segment, which the server sends with `sendfile` (`broker/protocol/fetch.py`). From v7, fetch
sessions (KIP-227, `fetch_sessions.py`): an incremental fetch names only the partitions that
moved, and is answered only those with something new.

From v13 topics come by id (KIP-516), resolved through the metadata image; from v16 a partition
whose leader moved names the new leader and its endpoint (KIP-951).

A fetch with a replica id (ReplicaId before v15, ReplicaState from v15) is a follower's: it
reads up to the log end rather than the high watermark, only from a broker that is one of the
partition's replicas, and its fetch offset tells the leader how far the follower has come
(which moves the high watermark). Its LastFetchedEpoch is checked against the leader's epochs,
and a follower whose log parted is told where (DivergingEpoch). Only a registered broker of
this cluster may fetch as a replica, and only with its current broker epoch (ReplicaEpoch,
KIP-903): any other replica fetch, one below v15 (which has no epoch) included, is answered
NOT_LEADER_OR_FOLLOWER for every partition (`ReplicaManager.replica_fetch_error`). The
listener it comes on is not checked: Kafka authorizes replica fetches with ClusterAction, not
by listener, and without an authorizer allows them on any.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass
from typing import Any

from broker.aio import wait_for
from broker.protocol import ErrorCode
from broker.protocol.fetch import FetchPartition, FetchResponse, FetchTopic, NodeEndpoint
from broker.replica import FetchResult
from broker.server import RequestContext, parked

from .context import NodeState, steady_clock_ms
from .fetch_sessions import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    NOT_SENT,
    SWEEP_MS,
    FetchSession,
    FetchSessionCache,
    SessionKey,
    SessionPartition,
    session_key,
)

__all__ = ["Handler"]

FIRST_TOPIC_ID_VERSION = 13
FIRST_CURRENT_LEADER_VERSION = 16
FIRST_REPLICA_STATE_VERSION = 15
FIRST_SESSION_VERSION = 7
_LEADER_MOVED = (ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch)
_UNKNOWN_TOPIC_ID = FetchResult(ErrorCode.unknown_topic_id)


@dataclass(slots=True)
class _Wanted:
    """One partition a fetch reads: as the request names it, or as its session holds it."""

    name: str | None
    """None for a topic id this node does not know."""
    topic_id: uuid.UUID
    wanted: Any
    """The request's partition, or the session's (`SessionPartition`)."""
    named: bool = True
    """Named by this request (an incremental fetch names only what moved)."""


class Handler:
    def __init__(self, state: NodeState) -> None:
        self._state = state
        self._replicas = state.replicas
        self._sessions = FetchSessionCache(
            state.config.max_incremental_fetch_session_cache_slots, state.replicas
        )
        self._steady = steady_clock_ms()
        # A follower's idle partitions are caught up as of each sweep: well within the lag a
        # leader allows before it drops the follower from the ISR.
        self._sweep_ms = min(SWEEP_MS, max(1, state.config.replica_lag_time_max_ms // 3))

    async def __call__(self, context: RequestContext, request: Any) -> FetchResponse:
        version = context.header.api_version
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.max_wait.total_seconds()
        # From v13 topics are named by id (KIP-516); an id the image does not know is answered
        # UNKNOWN_TOPIC_ID for each of its partitions, as Kafka does.
        names = [self._name(topic, version) for topic in request.topics]
        replica_id, replica_epoch = _replica(request, version)
        if replica_id >= 0:
            # A broker's fetch only with that broker's current epoch (`replica_fetch_error`).
            refused = self._replicas.replica_fetch_error(replica_id, replica_epoch)
            if refused is not None:
                return _refused(request, names, refused)
        session = None
        named: set[SessionKey] | None = None
        if version >= FIRST_SESSION_VERSION:
            opened = self._session(request, names, replica_id, version)
            if isinstance(opened, ErrorCode):
                return FetchResponse(0, opened, 0, ())
            session, named = opened
        if session is None:
            reads = await self._read_sessionless(request, names, replica_id, deadline)
        else:
            session.fetching += 1
            try:
                reads = await self._read_session(
                    session,
                    named,
                    request,
                    version=version,
                    replica_id=replica_id,
                    deadline=deadline,
                )
            finally:
                session.fetching -= 1
            # No await from the read to here: every slice is pinned before the log can change.
            reads = self._told(session, reads, named is not None)
        return FetchResponse(
            throttle_time_ms=0,
            error_code=ErrorCode.none,
            session_id=0 if session is None else session.session_id,
            **self._answers(reads, version, context.listener),
        )

    async def _read_sessionless(
        self, request: Any, names: list[str | None], replica_id: int, deadline: float
    ) -> list[tuple[_Wanted, FetchResult]]:
        wanted = [
            _Wanted(name, topic_id, partition)
            for name, topic in zip(names, request.topics, strict=True)
            for topic_id in (_topic_id(topic),)
            for partition in topic.partitions
        ]
        keys = [(w.name, w.wanted.partition) for w in wanted if w.name is not None]
        loop = asyncio.get_running_loop()
        while True:
            reads, total, errors = self._read(
                wanted, request.max_bytes, replica_id, False, _client_rack(request)
            )
            remaining = deadline - loop.time()
            if total >= request.min_bytes or errors or remaining <= 0 or not keys:
                return reads
            with parked():  # a client that goes away does not leave its wait behind
                await self._replicas.wait_for_append(keys, remaining)

    async def _read_session(
        self,
        session: FetchSession,
        named: set[SessionKey] | None,
        request: Any,
        *,
        version: int,
        replica_id: int,
        deadline: float,
    ) -> list[tuple[_Wanted, FetchResult]]:
        """Read a session's partitions: all of them for a full fetch (`named` None), and
        every `SWEEP_MS`; otherwise those the fetch named, those always read, and those
        touched since the last fetch or while this one waits."""
        now = self._steady()
        if named is None or now - session.last_sweep_ms >= self._sweep_ms:
            session.last_sweep_ms = now
            session.take_touched()  # every partition is read anyway
            chosen = list(session.partitions)
        else:
            # In the session's order, where a partition that returned records goes behind
            # the others: one that keeps taking the response's bytes must not starve them.
            chosen = session.in_turn(
                list(dict.fromkeys([*named, *session.always, *session.take_touched()]))
            )
        names: dict[uuid.UUID, str | None] = {}
        loop = asyncio.get_running_loop()
        # What a wait that has read no records yet keeps: only the touched are read again.
        kept: dict[SessionKey, tuple[_Wanted, FetchResult]] = {}
        while True:
            session.woken.clear()
            wanted = [
                self._wanted(session, key, version, names, named)
                for key in chosen
                if key in session.partitions
            ]
            reads, total, errors = self._read(
                wanted, request.max_bytes, replica_id, named is not None, _client_rack(request)
            )
            if kept:
                # What was read before the wait, with what was touched since read again:
                # before the wait nothing had records (see below), so nothing else moved.
                kept |= _by_key(reads)
                reads = list(kept.values())
            remaining = deadline - loop.time()
            if total >= request.min_bytes or errors or remaining <= 0 or not session.watched:
                return reads
            with parked(), contextlib.suppress(TimeoutError):
                await wait_for(session.woken.wait(), remaining)
            touched = session.take_touched()
            if total == 0:
                # Only what was touched meanwhile is read again (a sweep's thousands of
                # partitions are not read again each time one of them is appended to).
                kept = kept or _by_key(reads)
                chosen = list(dict.fromkeys(touched))
            else:
                # Records under `min_bytes` were read: all again, within `max_bytes`.
                chosen = list(dict.fromkeys([*kept, *chosen, *touched]))
                kept = {}

    def _wanted(
        self,
        session: FetchSession,
        key: SessionKey,
        version: int,
        names: dict[uuid.UUID, str | None],
        named: set[SessionKey] | None,
    ) -> _Wanted:
        held = session.partitions[key]
        if version < FIRST_TOPIC_ID_VERSION:
            resolved: str | None = held.topic
        else:
            if held.topic_id not in names:
                names[held.topic_id] = self._state.topic_name(held.topic_id)
            resolved = names[held.topic_id]
            if resolved is not None and resolved != held.topic:
                session.rename(key, resolved)  # an id this node learned of since it joined
        return _Wanted(resolved, held.topic_id, held, named is None or key in named)

    def _session(
        self, request: Any, names: list[str | None], replica_id: int, version: int
    ) -> tuple[FetchSession | None, set[SessionKey] | None] | ErrorCode:
        """KIP-227: the session this fetch reads through, with the partitions it names if it
        is incremental (None for a full fetch), or the error it is answered with. Epoch -1
        fetches without a session (closing the one named), 0 starts one (when the cache has
        room), any other continues the one named."""
        session_id, epoch = request.session_id, request.session_epoch
        now = self._steady()
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != 0:
                self._sessions.remove(session_id)
            if epoch == FINAL_EPOCH:
                return None, None
            partitions = [
                _session_partition(topic, name, partition)
                for name, topic in zip(names, request.topics, strict=True)
                for partition in topic.partitions
            ]
            return self._sessions.create(replica_id, partitions, now), None
        session = self._sessions.get(session_id, now)
        if session is None or session.replica_id != replica_id:
            return ErrorCode.fetch_session_id_not_found
        if session.next_epoch != epoch:
            return ErrorCode.invalid_fetch_session_epoch
        session.advance()
        named: set[SessionKey] = set()
        for name, topic in zip(names, request.topics, strict=True):
            topic_id = _topic_id(topic)
            by_name = getattr(topic, "topic", "") if version < FIRST_TOPIC_ID_VERSION else ""
            for partition in topic.partitions:
                key = session_key(topic_id, by_name, partition.partition)
                named.add(key)
                known = session.partitions.get(key)
                if known is None:
                    session.add(key, _session_partition(topic, name, partition))
                else:
                    known.update(partition)
        # Then what it forgets, as Kafka's FetchSession.update (a topic created again under
        # the same name is forgotten under its old id as its new one is named).
        for forgotten in request.forgotten_topics_data:
            forgotten_id: uuid.UUID | None = getattr(forgotten, "topic_id", None)
            for index in forgotten.partitions:
                key = session_key(forgotten_id, getattr(forgotten, "topic", ""), index)
                session.forget(key)
                named.discard(key)
        return session, named

    def _name(self, topic: Any, version: int) -> str | None:
        if version < FIRST_TOPIC_ID_VERSION:
            return str(topic.topic)
        return self._state.topic_name(topic.topic_id) if topic.topic_id is not None else None

    def _point_at_leader(
        self, answer: FetchPartition, topic: str, listener: str, endpoints: dict[int, NodeEndpoint]
    ) -> None:
        """KIP-951, as Kafka's fetch path: the partition's current leader and epoch, and the
        leader's endpoint on this listener among the response's node endpoints."""
        leader = self._state.current_leader(topic, answer.partition_index, listener)
        answer.current_leader_id = leader.leader_id
        answer.current_leader_epoch = leader.leader_epoch
        if leader.node is not None:
            endpoints[leader.node[0]] = NodeEndpoint(*leader.node)

    def _idle(self, item: _Wanted, replica_id: int, *, from_follower: bool) -> bool:
        """An incremental fetch's partition it did not name, with nothing new since the
        session was last told of it: left out of the read and of the answer."""
        held = item.wanted
        if item.named or item.name is None or held.sent_high_watermark == NOT_SENT:
            return False
        if replica_id >= 0:
            return self._replicas.follower_idle(
                item.name,
                held.partition,
                replica_id,
                held.fetch_offset,
                leader_epoch=held.sent_leader_epoch,
                high_watermark=held.sent_high_watermark,
                log_start_offset=held.sent_log_start_offset,
            )
        return self._replicas.consumer_idle(
            item.name,
            held.partition,
            held.fetch_offset,
            leader_epoch=held.sent_leader_epoch,
            high_watermark=held.sent_high_watermark,
            log_start_offset=held.sent_log_start_offset,
            from_follower=from_follower,
        )

    def _read(
        self,
        wanted: list[_Wanted],
        max_bytes: int,
        replica_id: int,
        incremental: bool,
        client_rack: str | None,
    ) -> tuple[list[tuple[_Wanted, FetchResult]], int, bool]:
        budget = max_bytes
        total = 0
        errors = False
        reads = []
        for item in wanted:
            if incremental and self._idle(item, replica_id, from_follower=client_rack is not None):
                continue
            name, partition = item.name, item.wanted
            if name is None:
                result = _UNKNOWN_TOPIC_ID
            elif replica_id >= 0:
                result = self._replicas.read_for_follower(
                    name,
                    partition.partition,
                    replica_id,
                    partition.fetch_offset,
                    max(min(partition.partition_max_bytes, budget), 0),
                    min_one_batch=total == 0,
                    current_leader_epoch=getattr(partition, "current_leader_epoch", -1),
                    last_fetched_epoch=getattr(partition, "last_fetched_epoch", -1),
                    log_start_offset=getattr(partition, "log_start_offset", -1),
                )
            else:
                result = self._replicas.read(
                    name,
                    partition.partition,
                    partition.fetch_offset,
                    max(min(partition.partition_max_bytes, budget), 0),
                    min_one_batch=total == 0,
                    # Only from v9 (KIP-320): older fetches skip the leader epoch check.
                    current_leader_epoch=getattr(partition, "current_leader_epoch", -1),
                    client_rack=client_rack,
                )
            if result.records is not None:
                total += result.records.size
                budget -= result.records.size
            if (
                result.error != ErrorCode.none
                or result.diverging_epoch is not None
                or result.preferred_read_replica >= 0
            ):
                errors = True  # answered at once, as Kafka does
            reads.append((item, result))
        return reads, total, errors

    def _told(
        self,
        session: FetchSession,
        reads: list[tuple[_Wanted, FetchResult]],
        incremental: bool,
    ) -> list[tuple[_Wanted, FetchResult]]:
        """What the answer carries (all of a full fetch; of an incremental one, what the
        session was not told yet), remembered as told; partitions that returned records go
        to the end of the session's order."""
        answered = []
        for item, result in reads:
            held = item.wanted
            records = result.records is not None and result.records.size > 0
            moved = (
                result.high_watermark != held.sent_high_watermark
                or result.log_start_offset != held.sent_log_start_offset
            )
            failed = result.error != ErrorCode.none or result.diverging_epoch is not None
            # A consumer sent to another replica is always told (KIP-392), as Kafka does.
            redirected = result.preferred_read_replica >= 0
            if not incremental or records or moved or failed or redirected:
                answered.append((item, result))
            key = session_key(held.topic_id, held.topic, held.partition)
            name = item.name or ""
            if (
                failed
                # More to read than this answer carried (it filled `max_bytes`, or the client
                # has not taken it yet): read again until the client's offset catches up.
                or self._replicas.readable_past(
                    name, held.partition, held.fetch_offset, follower=session.privileged
                )
                or (
                    session.privileged
                    and not self._replicas.follower_in_sync(
                        name, held.partition, session.replica_id
                    )
                )
            ):
                session.always.add(key)
            else:
                session.always.discard(key)
            if failed:
                held.forget_sent()
            else:
                held.sent_high_watermark = result.high_watermark
                held.sent_log_start_offset = result.log_start_offset
                held.sent_leader_epoch = self._replicas.leader_epoch_of(
                    item.name or "", held.partition
                )
            if records:
                session.served(key)
        return answered

    def _answers(
        self, reads: list[tuple[_Wanted, FetchResult]], version: int, listener: str
    ) -> dict[str, Any]:
        """The response's topics, each partition answered in the order read, and the moved
        leaders' endpoints (KIP-951)."""
        endpoints: dict[int, NodeEndpoint] = {}
        topics: dict[tuple[str | None, uuid.UUID], list[FetchPartition]] = {}
        for item, got in reads:
            answer = _partition(item.wanted, got)
            if version >= FIRST_CURRENT_LEADER_VERSION and got.error in _LEADER_MOVED:
                assert item.name is not None  # an unknown topic id is not a moved leader
                self._point_at_leader(answer, item.name, listener, endpoints)
            topics.setdefault((item.name, item.topic_id), []).append(answer)
        return {
            "responses": tuple(
                FetchTopic(name or "", tuple(answers), topic_id)
                for (name, topic_id), answers in topics.items()
            ),
            "node_endpoints": tuple(endpoints.values()),
        }


_NO_TOPIC_ID = uuid.UUID(int=0)


def _topic_id(topic: Any) -> uuid.UUID:
    return getattr(topic, "topic_id", None) or _NO_TOPIC_ID


def _session_partition(topic: Any, name: str | None, partition: Any) -> SessionPartition:
    held = SessionPartition(
        _topic_id(topic),
        name or getattr(topic, "topic", "") or "",
        partition.partition,
        partition.fetch_offset,
        partition.partition_max_bytes,
    )
    held.update(partition)
    return held


def _client_rack(request: Any) -> str | None:
    """A consumer's rack (v11+, KIP-392; "" when it names none), None before v11: a fetch
    with client metadata may be served by a follower."""
    rack = getattr(request, "rack_id", None)
    return None if rack is None else str(rack)


def _replica(request: Any, version: int) -> tuple[int, int]:
    """Who fetches, as (replica id, replica epoch): a broker's id for a follower, -1 (or less)
    for a consumer; the epoch is -1 (unknown) before v15, which has no ReplicaState."""
    if version >= FIRST_REPLICA_STATE_VERSION:
        state = getattr(request, "replica_state", None)
        if state is None:
            return -1, -1
        return int(state.replica_id), int(state.replica_epoch)
    return int(getattr(request, "replica_id", -1)), -1


def _refused(request: Any, names: list[str | None], error: ErrorCode) -> FetchResponse:
    """Every partition answered `error` (a replica fetch that is not the broker's), but a topic
    id this node does not know, answered UNKNOWN_TOPIC_ID as Kafka does before its checks."""
    refused = FetchResult(error)
    return FetchResponse(
        throttle_time_ms=0,
        error_code=ErrorCode.none,
        session_id=0,
        responses=tuple(
            FetchTopic(
                name or "",
                tuple(
                    _partition(wanted, refused if name is not None else _UNKNOWN_TOPIC_ID)
                    for wanted in topic.partitions
                ),
                getattr(topic, "topic_id", None) or uuid.UUID(int=0),
            )
            for topic, name in zip(request.topics, names, strict=True)
        ),
    )


def _partition(wanted: Any, result: FetchResult) -> FetchPartition:
    return FetchPartition(
        partition_index=wanted.partition,
        error_code=result.error,
        high_watermark=result.high_watermark,
        last_stable_offset=result.high_watermark,  # no transactions: nothing is left open
        log_start_offset=result.log_start_offset,
        records=b"" if result.records is None else result.records.pin(),
        preferred_read_replica=result.preferred_read_replica,
        diverging_epoch=result.diverging_epoch,
    )


def _by_key(
    reads: list[tuple[_Wanted, FetchResult]],
) -> dict[SessionKey, tuple[_Wanted, FetchResult]]:
    return {
        session_key(item.wanted.topic_id, item.wanted.topic, item.wanted.partition): (item, result)
        for item, result in reads
    }
