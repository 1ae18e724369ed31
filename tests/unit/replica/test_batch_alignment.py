"""Replicas share their leader's batch boundaries (issue 25): a follower whose log ends inside
one of its leader's batches cuts back to where that batch starts instead of asking for the
same offset forever; a replica that led an epoch without writing to it does not loop on the
same DivergingEpoch; and an answer to a fetch asked from a log end that has moved since is
dropped, as Kafka's fetcher drops it, rather than appended past a hole. Each test takes the
leader's answers in through the replica fetcher, as a node does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from broker.metadata import MetadataImage, PartitionChanged, PartitionState
from broker.protocol import ErrorCode
from broker.protocol.records import Record, build_batch
from broker.replica import ReplicaManager
from broker.replica.fetcher import FetcherSettings, ReplicaFetchers, _Fetcher
from broker.storage import Log, LogConfig
from tests.unit.replica.test_replication import TOPIC, _manager
from tests.unit.storage.logs import batch


def _state(leader: int, epoch: int) -> PartitionState:
    return PartitionState((1, 2), (1, 2), leader, epoch, epoch)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[ReplicaManager, ReplicaManager]]:
    """Node 1 leads in epoch 0, node 2 follows."""
    leader, leader_logs = _manager(tmp_path / "leader", 1)
    follower, follower_logs = _manager(tmp_path / "follower", 2)
    for manager in (leader, follower):
        manager.apply(PartitionChanged(TOPIC, 0, _state(1, 0)))
    yield leader, follower
    leader_logs.shutdown(now_ms=2_000)
    follower_logs.shutdown(now_ms=2_000)


def _fetchers(follower: ReplicaManager) -> ReplicaFetchers:
    image = MetadataImage()
    image.topics[TOPIC.name] = TOPIC
    return ReplicaFetchers(FetcherSettings(2, "cluster", "INTERNAL"), follower, lambda: image)


def _answer(leader: ReplicaManager, follower: ReplicaManager) -> Any:
    """The leader's answer to a replica fetch from the follower's log end, as decoded."""
    mine = follower.partitions[("t", 0)]
    found = leader.read_for_follower(
        "t",
        0,
        2,
        mine.log.log_end_offset,
        1 << 20,
        min_one_batch=True,
        current_leader_epoch=mine.leader_epoch,
        last_fetched_epoch=mine.log.epochs.latest_epoch,
    )
    diverging = found.diverging_epoch
    return SimpleNamespace(
        partition_index=0,
        error_code=found.error,
        high_watermark=found.high_watermark,
        log_start_offset=found.log_start_offset,
        records=None if found.records is None else found.records.read(),
        diverging_epoch=None
        if diverging is None
        else SimpleNamespace(epoch=diverging[0], end_offset=diverging[1]),
    )


def _fetch(leader: ReplicaManager, follower: ReplicaManager, rounds: int) -> None:
    """`rounds` replica fetches, each answered and taken in by the fetcher."""
    fetchers = _fetchers(follower)
    for _ in range(rounds):
        fetchers._take_partition(
            _Fetcher(1), follower.partitions[("t", 0)], _answer(leader, follower)
        )


def _boundaries(log: Log) -> list[tuple[int, int]]:
    return [(h.base_offset, h.last_offset) for _, _, h in log.batches(0)]


def test_a_follower_ending_inside_a_leader_batch_cuts_back_to_its_start(
    pair: tuple[ReplicaManager, ReplicaManager],
) -> None:
    """The leader wrote offsets 3-9 as one batch; this follower holds 3-5 as a batch of its
    own, in the same epoch, so no DivergingEpoch comes: the leader sends its batch from 3,
    which starts below the follower's log end 6. Refused, the follower would ask from 6 and
    be sent the same batch forever (the `corrupt_message … below the log end offset` of the
    issue)."""
    leader, follower = pair
    leader.append("t", 0, batch(3), acks=1)
    leader.append("t", 0, batch(7), acks=1)
    _fetch(leader, follower, 1)
    mine = follower.partitions[("t", 0)].log
    mine.truncate_to(3)
    records = [Record(3 + i, 1_000, b"k", b"v") for i in range(3)]
    mine.append_as_follower(build_batch(records, partition_leader_epoch=0), now_ms=1_000)
    assert _boundaries(mine) == [(0, 2), (3, 5)]  # ends at 6, inside the leader's 3-9

    _fetch(leader, follower, 3)

    assert mine.log_end_offset == 10
    assert _boundaries(mine) == _boundaries(leader.partitions[("t", 0)].log)


def test_a_follower_cut_below_the_leader_batch_fetches_it_from_there(
    pair: tuple[ReplicaManager, ReplicaManager],
) -> None:
    """Its own last batch (2-4) starts below the leader's (3-9): the cut takes it whole, and
    the next fetch, from 2, brings the leader's batches from there; no hole is left."""
    leader, follower = pair
    leader.append("t", 0, batch(3), acks=1)
    leader.append("t", 0, batch(7), acks=1)
    _fetch(leader, follower, 1)
    mine = follower.partitions[("t", 0)].log
    mine.truncate_to(0)
    for base, count in ((0, 2), (2, 3)):
        records = [Record(base + i, 1_000, b"k", b"v") for i in range(count)]
        mine.append_as_follower(build_batch(records, partition_leader_epoch=0), now_ms=1_000)
    assert mine.log_end_offset == 5  # inside the leader's 3-9

    _fetch(leader, follower, 4)

    assert _boundaries(mine) == _boundaries(leader.partitions[("t", 0)].log)


def test_a_replica_that_led_without_writing_does_not_loop_on_its_divergence(
    pair: tuple[ReplicaManager, ReplicaManager],
) -> None:
    """Node 2 led epoch 1 and wrote nothing (its epoch cache says epoch 1 starts at its log
    end); node 1 leads again in epoch 2. Node 1 never had epoch 1, so it answers with epoch
    0's end, 3, which is node 2's log end: nothing to cut, but epoch 1 has to go from node
    2's epoch cache too, else every fetch says epoch 1 and gets the same answer."""
    leader, follower = pair
    leader.append("t", 0, batch(3), acks=1)
    _fetch(leader, follower, 2)
    for epoch, leads in ((1, 2), (2, 1)):
        for manager in (leader, follower):
            manager.apply(PartitionChanged(TOPIC, 0, _state(leads, epoch)))
    assert follower.partitions[("t", 0)].log.epochs.entries() == [(0, 0), (1, 3)]
    leader.append("t", 0, batch(2), acks=1)

    _fetch(leader, follower, 3)

    mine = follower.partitions[("t", 0)].log
    assert mine.log_end_offset == 5
    assert mine.epochs.entries() == [(0, 0), (2, 3)]


def test_an_answer_to_a_fetch_from_a_log_end_that_moved_is_dropped(
    pair: tuple[ReplicaManager, ReplicaManager],
) -> None:
    """A fetch asked from offset 3; before its answer came, this log was cut back to 0 (it
    followed another leader for a moment). Appended, the answer's batch from 3 would leave
    offsets 0-2 out of this log; Kafka's fetcher drops an answer to a fetch state that is no
    longer current, and so does this one."""
    leader, follower = pair
    leader.append("t", 0, batch(3), acks=1)
    leader.append("t", 0, batch(7), acks=1)
    fetchers = _fetchers(follower)
    fetcher = _Fetcher(1, partitions={("t", 0)})
    _fetch(leader, follower, 1)
    mine = follower.partitions[("t", 0)].log
    mine.truncate_to(3)
    request = fetchers._request(fetcher)
    assert request is not None
    _, sent = request
    answer = _answer(leader, follower)  # records from 3
    mine.truncate_to(0)

    fetchers._take(fetcher, sent, _response(answer))

    assert mine.log_end_offset == 0
    # Asked again from 0, the answer is taken in.
    request = fetchers._request(fetcher)
    assert request is not None
    fetchers._take(fetcher, request[1], _response(_answer(leader, follower)))
    assert _boundaries(mine) == _boundaries(leader.partitions[("t", 0)].log)


def _response(answer: Any) -> Any:
    return SimpleNamespace(
        error_code=ErrorCode.none,
        session_id=0,  # a leader that keeps no fetch session
        responses=[SimpleNamespace(topic_id=TOPIC.topic_id, partitions=[answer])],
    )


def test_truncating_inside_a_batch_takes_the_whole_batch(tmp_path: Path) -> None:
    """A log never ends inside a batch: a cut inside one removes it whole (Kafka's
    LogSegment.truncateTo), and the epochs that started in it with it."""
    log = Log(tmp_path / "t-0", LogConfig(index_interval_bytes=1), now_ms=0)
    log.append_as_leader(batch(3, timestamp=1_000), leader_epoch=0, now_ms=0)
    log.append_as_leader(batch(7, timestamp=2_000), leader_epoch=1, now_ms=0)
    log.truncate_to(5)
    assert log.log_end_offset == 3
    assert log.epochs.entries() == [(0, 0)]
    log.close(now_ms=0)
