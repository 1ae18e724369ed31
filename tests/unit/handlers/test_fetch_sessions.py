"""Fetch sessions (KIP-227) through the Fetch handler, on a real replica manager and logs: a
fetch with session epoch 0 starts a session; the next ones name only what moved and are
answered only what is new; unknown ids and wrong epochs are refused with Kafka's errors; an
idle follower in a session stays in the ISR; a full cache refuses or evicts as Kafka's does."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from broker.handlers.fetch import Handler
from broker.handlers.fetch_sessions import (
    EVICTION_MS,
    SWEEP_MS,
    FetchSessionCache,
    SessionPartition,
)
from broker.metadata import PartitionChanged, PartitionState
from broker.protocol import ApiKey, ErrorCode, RequestHeader, build, request_type
from broker.protocol.messages import decode_request_body, encode_request_body, request_module
from broker.server import RequestContext
from tests.support.requests import fill
from tests.unit.handlers.test_replica_fetch import CONFIG_BYTES, TOPIC, Leader
from tests.unit.storage.logs import batch

VERSION = 17


class SessionLeader(Leader):
    """Node 1 leading t-0 (3 records) and t-1 (empty), replicas 1-3, all in the ISR."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, (1, 2, 3))
        self.replicas.apply(
            PartitionChanged(TOPIC, 1, PartitionState((1, 2, 3), (1, 2, 3), 1, 0, 0))
        )

    def session_fetch(
        self,
        replica_id: int,
        session_id: int,
        session_epoch: int,
        offsets: dict[int, int],
        *,
        forgotten: tuple[int, ...] = (),
        topic_id: uuid.UUID = TOPIC.topic_id,
        forgotten_id: uuid.UUID = TOPIC.topic_id,
        max_bytes: int = CONFIG_BYTES,
        while_parked: Callable[[], None] | None = None,
    ) -> Any:
        """A Fetch in a session naming partitions `offsets` (index: fetch offset) of t (by
        `topic_id`), forgetting `forgotten` (of `forgotten_id`), answered in `max_bytes`;
        with `while_parked`, one that waits up to 5 s for a byte, `while_parked` called once it
        waits."""
        partitions = [
            {
                "partition": index,
                "current_leader_epoch": 0,
                "fetch_offset": offset,
                "last_fetched_epoch": -1,
                "log_start_offset": 0,
                "partition_max_bytes": CONFIG_BYTES,
            }
            for index, offset in offsets.items()
        ]
        values: dict[str, Any] = {
            "max_wait": timedelta(seconds=0 if while_parked is None else 5),
            "min_bytes": 0 if while_parked is None else 1,
            "max_bytes": max_bytes,
            "session_id": session_id,
            "session_epoch": session_epoch,
            "topics": [{"topic_id": topic_id, "partitions": partitions}] if partitions else [],
            "forgotten_topics_data": [{"topic_id": forgotten_id, "partitions": list(forgotten)}]
            if forgotten
            else [],
            "rack_id": "",
        }
        values["replica_state"] = build(
            request_module(ApiKey.FETCH, VERSION).ReplicaState,
            replica_id=replica_id,
            replica_epoch=self.epoch(replica_id) if replica_id >= 0 else -1,
        )
        filled = fill(request_type(ApiKey.FETCH, VERSION), values)
        body = decode_request_body(ApiKey.FETCH, VERSION, encode_request_body(filled))
        context = RequestContext(RequestHeader(ApiKey.FETCH, VERSION, 1, "unit"), "PLAINTEXT", "")

        async def fetch() -> Any:
            answer = asyncio.create_task(self.handler(context, body))
            if while_parked is not None:
                await asyncio.sleep(0.05)
                assert not answer.done()
                while_parked()
            return await answer

        response = asyncio.run(fetch())
        for region in response.regions():
            region.close()
        return response


def _answered(response: Any) -> dict[int, tuple[int, int, int]]:
    """Partition: (error, high watermark, bytes of records) of each partition answered."""
    return {
        p.partition_index: (p.error_code, p.high_watermark, len(p.records))
        for t in response.responses
        for p in t.partitions
    }


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[SessionLeader]:
    leader = SessionLeader(tmp_path)
    yield leader
    leader.logs.shutdown(now_ms=2_000)


def test_an_incremental_fetch_is_answered_only_what_moved(leader: SessionLeader) -> None:
    full = leader.session_fetch(2, 0, 0, {0: 0, 1: 0})
    assert full.session_id != 0
    assert set(_answered(full)) == {0, 1}  # a full fetch answers every partition
    assert _answered(full)[0][2] > 0  # t-0's three records

    # Caught up on t-0 (it names the new offset); t-1 has not moved.
    moved = leader.session_fetch(2, full.session_id, 1, {0: 3})
    assert moved.session_id == full.session_id
    # The high watermark of t-0 moved (replica 2 is in the ISR, replica 3 has not fetched).
    assert set(_answered(moved)) <= {0}

    idle = leader.session_fetch(2, full.session_id, 2, {})
    assert _answered(idle) == {}

    leader.replicas.append("t", 1, batch(2), acks=1)
    appended = leader.session_fetch(2, full.session_id, 3, {})
    assert set(_answered(appended)) == {1}
    assert _answered(appended)[1][2] > 0  # t-1's new records, from the session's offset


def test_a_forgotten_partition_is_not_answered_again(leader: SessionLeader) -> None:
    full = leader.session_fetch(2, 0, 0, {0: 3, 1: 0})
    leader.session_fetch(2, full.session_id, 1, {}, forgotten=(1,))
    leader.replicas.append("t", 1, batch(2), acks=1)
    assert 1 not in _answered(leader.session_fetch(2, full.session_id, 2, {}))


def test_an_unknown_session_or_a_wrong_epoch_is_refused(leader: SessionLeader) -> None:
    full = leader.session_fetch(2, 0, 0, {0: 0})
    unknown = leader.session_fetch(2, full.session_id + 1, 1, {})
    assert (unknown.error_code, unknown.session_id) == (ErrorCode.fetch_session_id_not_found, 0)
    assert unknown.responses == ()
    wrong = leader.session_fetch(2, full.session_id, 5, {})
    assert wrong.error_code == ErrorCode.invalid_fetch_session_epoch
    # The session is still there for the right epoch, and not for another fetcher.
    assert leader.session_fetch(2, full.session_id, 1, {}).error_code == ErrorCode.none
    other = leader.session_fetch(3, full.session_id, 2, {})
    assert other.error_code == ErrorCode.fetch_session_id_not_found


def test_epoch_minus_one_closes_the_session(leader: SessionLeader) -> None:
    full = leader.session_fetch(2, 0, 0, {0: 0})
    closing = leader.session_fetch(2, full.session_id, -1, {0: 3})
    assert (closing.error_code, closing.session_id) == (ErrorCode.none, 0)
    gone = leader.session_fetch(2, full.session_id, 1, {})
    assert gone.error_code == ErrorCode.fetch_session_id_not_found


def test_an_idle_follower_in_a_session_stays_caught_up(leader: SessionLeader) -> None:
    """A follower at the log end that names nothing is still caught up as of each fetch:
    otherwise the leader would drop it from the ISR after `replica.lag.time.max.ms`."""
    full = leader.session_fetch(2, 0, 0, {0: 3, 1: 0})
    leader.session_fetch(2, full.session_id, 1, {})  # told the high watermarks
    partition = leader.replicas.partitions[("t", 1)]
    partition.caught_up_ms[2] = 0
    assert _answered(leader.session_fetch(2, full.session_id, 2, {})) == {}
    # Idle partitions are not looked at on every fetch, but every SWEEP_MS.
    session = leader.handler._sessions.get(full.session_id, 0)
    assert session is not None
    session.last_sweep_ms -= SWEEP_MS
    assert _answered(leader.session_fetch(2, full.session_id, 3, {})) == {}
    assert partition.caught_up_ms[2] > 0


def test_a_follower_out_of_the_isr_is_read_on_every_fetch(leader: SessionLeader) -> None:
    """Caught up but out of the ISR, an idle partition is read again at the next fetch, so
    that the leader asks for the follower to be taken back in without waiting for a sweep."""
    full = leader.session_fetch(2, 0, 0, {0: 3, 1: 0})
    leader.session_fetch(2, full.session_id, 1, {})
    leader.replicas.apply(PartitionChanged(TOPIC, 1, PartitionState((1, 2, 3), (1, 3), 1, 0, 1)))
    asked: list[tuple[int, ...]] = []
    leader.replicas.on_isr_change = lambda _, wanted: asked.append(wanted)
    leader.session_fetch(2, full.session_id, 2, {})
    assert asked == [(1, 2, 3)]


def test_a_consumer_session_is_told_when_the_high_watermark_moves(
    leader: SessionLeader,
) -> None:
    full = leader.session_fetch(-1, 0, 0, {0: 0})
    assert _answered(full)[0] == (ErrorCode.none, 0, 0)  # nothing committed yet
    assert _answered(leader.session_fetch(-1, full.session_id, 1, {})) == {}
    leader.replicas.follower_fetched(leader.partition, 2, 3)
    leader.replicas.follower_fetched(leader.partition, 3, 3)  # committed: 3
    moved = leader.session_fetch(-1, full.session_id, 2, {})
    assert _answered(moved)[0][:2] == (ErrorCode.none, 3)
    assert _answered(moved)[0][2] > 0


def test_a_partition_that_leaves_the_leader_is_answered_with_its_error(
    leader: SessionLeader,
) -> None:
    full = leader.session_fetch(2, 0, 0, {0: 3, 1: 0})
    leader.session_fetch(2, full.session_id, 1, {})
    leader.replicas.apply(PartitionChanged(TOPIC, 1, PartitionState((1, 2, 3), (1, 2, 3), 2, 1, 1)))
    leader.handler._point_at_leader = lambda answer, *_: None  # type: ignore[method-assign]
    answered = _answered(leader.session_fetch(2, full.session_id, 2, {}))
    assert answered[1][0] == ErrorCode.not_leader_or_follower


def _partitions(count: int) -> list[SessionPartition]:
    return [SessionPartition(TOPIC.topic_id, "t", i, 0, CONFIG_BYTES) for i in range(count)]


class _Unwatched:
    """The cache's own rules need no replica manager: nobody tells these sessions of
    anything."""

    def watch(self, key: tuple[str, int], watcher: object) -> None:
        pass

    def unwatch(self, key: tuple[str, int], watcher: object) -> None:
        pass


def test_a_full_cache_evicts_as_kafka_does() -> None:
    cache = FetchSessionCache(2, _Unwatched(), seed=1)
    small = cache.create(-1, _partitions(1), now_ms=0)
    follower = cache.create(2, _partitions(5), now_ms=0)
    assert small is not None
    assert follower is not None
    # A consumer session no larger than the smallest one finds no room.
    assert cache.create(-1, _partitions(1), now_ms=1_000) is None
    # A larger one takes the smallest consumer session's place.
    larger = cache.create(-1, _partitions(3), now_ms=1_000)
    assert larger is not None
    assert cache.get(small.session_id, 1_000) is None
    # A follower's session is never evicted for a consumer's while it is in use...
    assert cache.create(-1, _partitions(9), now_ms=2_000) is not None
    assert cache.get(follower.session_id, 2_000) is not None
    # ...but any session unused for two minutes gives way.
    later = EVICTION_MS + 10_000
    assert cache.create(-1, _partitions(1), now_ms=later) is not None
    assert len(cache) == 2


def test_a_session_unused_for_two_minutes_is_told_of_nothing_until_used_again(
    leader: SessionLeader,
) -> None:
    """A consumer that went away leaves its session in the cache (Kafka keeps it until a new
    one needs its slot): it must not be told of every append meanwhile. Used again, it reads
    what it missed."""
    clock = [0]
    handler: Any = leader.handler
    handler._steady = lambda: clock[0]
    gone = leader.session_fetch(-1, 0, 0, {0: 3, 1: 0})
    assert set(leader.replicas._watchers) == {("t", 0), ("t", 1)}
    clock[0] = EVICTION_MS + 1
    other = leader.session_fetch(-1, 0, 0, {1: 0})  # any fetch looks at the unused ones
    assert other.error_code == ErrorCode.none
    assert set(leader.replicas._watchers) == {("t", 1)}, "the unused session is still told"
    assert all(len(w) == 1 for w in leader.replicas._watchers.values())
    leader.replicas.append("t", 0, batch(2), acks=1)
    for follower in (2, 3):  # committed: a consumer may read them
        leader.replicas.follower_fetched(leader.partition, follower, 5)
    clock[0] += 10
    back = leader.session_fetch(-1, gone.session_id, 1, {})
    assert back.error_code == ErrorCode.none
    answered = _answered(back)
    assert answered[0][2] > 0, "the records appended while the session slept were not read"
    assert set(leader.replicas._watchers) == {("t", 0), ("t", 1)}
    assert len(leader.replicas._watchers[("t", 1)]) == 2


def test_a_session_whose_fetch_is_waiting_does_not_doze(leader: SessionLeader) -> None:
    """A fetch may wait as long as its client asks (librdkafka allows 5 minutes): begun more
    than two minutes before another client's fetch, it is still in use, and an append must
    still wake it."""
    clock = [0]
    handler: Any = leader.handler
    handler._steady = lambda: clock[0]
    full = leader.session_fetch(2, 0, 0, {0: 3, 1: 0})
    leader.session_fetch(2, full.session_id, 1, {})

    def much_later() -> None:
        clock[0] = EVICTION_MS + 1
        assert handler._sessions.create(-1, _partitions(1), now_ms=clock[0]) is not None
        leader.replicas.append("t", 1, batch(2), acks=1)

    answer = leader.session_fetch(2, full.session_id, 2, {}, while_parked=much_later)
    assert _answered(answer)[1][2] > 0, "the waiting fetch was not woken by the append"
    session = handler._sessions.get(full.session_id, clock[0])
    assert session is not None
    assert not session.dormant


def test_no_slots_means_no_sessions(tmp_path: Path) -> None:
    leader = SessionLeader(tmp_path)
    try:
        leader.handler._sessions = FetchSessionCache(0, leader.replicas)
        full = leader.session_fetch(2, 0, 0, {0: 0})
        assert (full.error_code, full.session_id) == (ErrorCode.none, 0)
        assert set(_answered(full)) == {0}
    finally:
        leader.logs.shutdown(now_ms=2_000)


def test_deleted_records_are_told_at_the_next_fetch(leader: SessionLeader) -> None:
    """DeleteRecords moves the leader's log start; the followers' sessions hear of it at
    once (their log starts follow it, and DeleteRecords waits for them)."""
    leader.replicas.follower_fetched(leader.partition, 3, 3)
    full = leader.session_fetch(2, 0, 0, {0: 3, 1: 0})
    leader.session_fetch(2, full.session_id, 1, {})
    assert leader.replicas.delete_records("t", 0, 2) == (ErrorCode.none, 2)
    moved = leader.session_fetch(2, full.session_id, 2, {})
    assert [p.log_start_offset for t in moved.responses for p in t.partitions] == [2]


def test_a_closed_session_stops_watching(leader: SessionLeader) -> None:
    full = leader.session_fetch(2, 0, 0, {0: 3, 1: 0})
    assert set(leader.replicas._watchers) == {("t", 0), ("t", 1)}
    leader.session_fetch(2, full.session_id, 1, {}, forgotten=(1,))
    assert set(leader.replicas._watchers) == {("t", 0)}
    leader.session_fetch(2, full.session_id, -1, {})
    assert leader.replicas._watchers == {}


def test_a_followers_new_session_replaces_its_old_one(leader: SessionLeader) -> None:
    """A restarted follower starts a new session; the old one is dropped at once, and so is
    the watching of its partitions."""
    first = leader.session_fetch(2, 0, 0, {0: 3, 1: 0})
    consumer = leader.session_fetch(-1, 0, 0, {0: 0})
    second = leader.session_fetch(2, 0, 0, {0: 3})
    assert len(leader.handler._sessions) == 2
    gone = leader.session_fetch(2, first.session_id, 1, {})
    assert gone.error_code == ErrorCode.fetch_session_id_not_found
    assert leader.session_fetch(2, second.session_id, 1, {}).error_code == ErrorCode.none
    assert leader.session_fetch(-1, consumer.session_id, 1, {}).error_code == ErrorCode.none
    assert set(leader.replicas._watchers) == {("t", 0)}


def test_a_topic_created_again_under_its_name_stays_watched(leader: SessionLeader) -> None:
    """The follower forgets the old topic id and names the new one in the same fetch: the
    session must go on hearing of the partition under its name."""
    full = leader.session_fetch(2, 0, 0, {0: 3})
    new_id = uuid.UUID(int=99)
    state: Any = leader.handler._state
    state.topic_name = lambda t: "t" if t == new_id else None
    leader.session_fetch(2, full.session_id, 1, {0: 3}, topic_id=new_id, forgotten=(0,))
    leader.session_fetch(2, full.session_id, 2, {}, topic_id=new_id)
    leader.replicas.append("t", 0, batch(2), acks=1)
    appended = _answered(leader.session_fetch(2, full.session_id, 3, {}, topic_id=new_id))
    assert appended[0][2] > 0


def test_a_topic_id_learned_later_is_watched_from_then_on(leader: SessionLeader) -> None:
    state: Any = leader.handler._state
    names = state.topic_name
    state.topic_name = lambda t: None
    full = leader.session_fetch(2, 0, 0, {0: 3})
    assert _answered(full)[0][0] == ErrorCode.unknown_topic_id
    state.topic_name = names
    leader.session_fetch(2, full.session_id, 1, {})
    leader.session_fetch(2, full.session_id, 2, {})
    leader.replicas.append("t", 0, batch(2), acks=1)
    assert 0 in _answered(leader.session_fetch(2, full.session_id, 3, {}))


def test_records_a_full_response_left_behind_come_with_the_next_fetch(
    leader: SessionLeader,
) -> None:
    """`max_bytes` ran out before a partition's turn: it is read again next time, not left
    for the sweep."""
    full = leader.session_fetch(2, 0, 0, {0: 3, 1: 0})
    leader.session_fetch(2, full.session_id, 1, {})
    leader.replicas.append("t", 0, batch(2), acks=1)
    leader.replicas.append("t", 1, batch(2), acks=1)
    first = _answered(leader.session_fetch(2, full.session_id, 2, {}, max_bytes=1))
    (served,) = [i for i, (_, _, size) in first.items() if size > 0]
    other = 1 - served
    offsets = {served: 5 if served == 0 else 2}
    second = _answered(leader.session_fetch(2, full.session_id, 3, offsets))
    assert second[other][2] > 0


def test_partitions_take_turns_at_a_full_response(leader: SessionLeader) -> None:
    full = leader.session_fetch(2, 0, 0, {0: 3, 1: 0})
    leader.session_fetch(2, full.session_id, 1, {})
    served: list[int] = []
    for epoch in range(2, 6):
        leader.replicas.append("t", 0, batch(1), acks=1)
        leader.replicas.append("t", 1, batch(1), acks=1)
        answered = _answered(leader.session_fetch(2, full.session_id, epoch, {}, max_bytes=1))
        served.extend(i for i, (_, _, size) in answered.items() if size > 0)
    assert sorted(served) == [0, 0, 1, 1]


def test_a_replica_moved_off_this_node_is_told_at_once(leader: SessionLeader) -> None:
    full = leader.session_fetch(-1, 0, 0, {0: 3, 1: 0})
    leader.session_fetch(-1, full.session_id, 1, {})
    leader.replicas.apply(PartitionChanged(TOPIC, 0, PartitionState((2, 3), (2, 3), 2, 1, 1)))
    leader.handler._point_at_leader = lambda answer, *_: None  # type: ignore[method-assign]
    answered = _answered(leader.session_fetch(-1, full.session_id, 2, {}))
    assert answered[0][0] != ErrorCode.none


def test_the_sweep_comes_well_within_the_replica_lag_time(tmp_path: Path) -> None:
    """With `replica.lag.time.max.ms=1500` (shorter than the 5 s sweep), an idle follower's
    partitions are looked at every 500 ms, or its leader would drop a healthy follower from
    the ISR between sweeps."""
    leader = SessionLeader(tmp_path)
    try:
        state: Any = leader.handler._state
        state.config.replica_lag_time_max_ms = 1500
        leader.handler = Handler(state)
        full = leader.session_fetch(2, 0, 0, {0: 3, 1: 0})
        leader.session_fetch(2, full.session_id, 1, {})  # told the high watermarks
        partition = leader.replicas.partitions[("t", 1)]
        partition.caught_up_ms[2] = 0
        session = leader.handler._sessions.get(full.session_id, 0)
        assert session is not None
        session.last_sweep_ms -= 600  # 600 ms since the last sweep: past 500, short of 5 s
        assert _answered(leader.session_fetch(2, full.session_id, 2, {})) == {}
        assert partition.caught_up_ms[2] > 0
    finally:
        leader.logs.shutdown(now_ms=2_000)


def test_a_parked_fetch_reads_again_only_what_was_touched(leader: SessionLeader) -> None:
    """A fetch of a session's thousands of partitions that waits for data is woken by an
    append to one: it reads that one again, not every partition, and answers it."""
    full = leader.session_fetch(2, 0, 0, {0: 3, 1: 0})
    leader.session_fetch(2, full.session_id, 1, {})
    read = leader.handler._read
    reads: list[int] = []

    def counted(wanted: list[Any], *args: Any) -> Any:
        reads.extend(item.wanted.partition for item in wanted)
        return read(wanted, *args)

    leader.handler._read = counted  # type: ignore[method-assign,assignment]
    session = leader.handler._sessions.get(full.session_id, 0)
    assert session is not None
    session.last_sweep_ms -= SWEEP_MS  # this fetch sweeps: it reads every partition, waits

    def append() -> None:
        reads.clear()
        leader.replicas.append("t", 1, batch(2), acks=1)

    answer = leader.session_fetch(2, full.session_id, 2, {}, while_parked=append)
    assert set(_answered(answer)) == {1}
    assert _answered(answer)[1][2] > 0
    assert reads == [1]
