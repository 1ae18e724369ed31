"""The replica fetcher's side of fetch sessions (KIP-227): after a full fetch the leader
answered with a session id, the next fetches name only the partitions whose fetch state moved,
forget those no longer followed, and a lost session starts over with a full fetch. A fetcher
looks only at the partitions the replica manager told it of (appended to, truncated, led,
held back) since its last fetch, and at every one every `SWEEP_S`."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from broker.metadata import MetadataImage, PartitionChanged, PartitionState, TopicState
from broker.protocol import ErrorCode
from broker.replica import ReplicaManager
from broker.replica.fetcher import SWEEP_S, FetcherSettings, ReplicaFetchers, _Fetcher
from broker.storage import LogManager
from tests.unit.replica.test_replication import TOPIC, _manager
from tests.unit.storage.logs import batch


@pytest.fixture
def follower(tmp_path: Path) -> Iterator[tuple[ReplicaManager, LogManager]]:
    """Node 2 following t-0 and t-1, led by node 1."""
    manager, logs = _manager(tmp_path / "follower", 2)
    for index in (0, 1):
        manager.apply(PartitionChanged(TOPIC, index, PartitionState((1, 2), (1, 2), 1, 0, 0)))
    yield manager, logs
    logs.shutdown(now_ms=2_000)


def _fetchers(manager: ReplicaManager) -> tuple[ReplicaFetchers, _Fetcher]:
    image = MetadataImage()
    image.topics[TOPIC.name] = TOPIC
    fetchers = ReplicaFetchers(FetcherSettings(2, "cluster", "INTERNAL"), manager, lambda: image)
    fetcher = _Fetcher(1)
    fetchers._follow(fetcher, {("t", 0), ("t", 1)})
    return fetchers, fetcher


def _named(body: Any) -> set[int]:
    return {p.partition for t in body.topics for p in t.partitions}


def _forgotten(body: Any) -> set[int]:
    return {i for t in body.forgotten_topics_data for i in t.partitions}


def _answer(session_id: int, error: ErrorCode = ErrorCode.none) -> Any:
    return SimpleNamespace(error_code=error, session_id=session_id, responses=())


def _round(fetchers: ReplicaFetchers, fetcher: _Fetcher, answer: Any | None) -> Any:
    """The fetcher's next request, answered with `answer` (an empty answer naming a session
    id, or an error) unless None; the request's body."""
    request = fetchers._request(fetcher)
    assert request is not None
    body, sent = request
    if answer is not None:
        fetchers._take(fetcher, sent, answer)
    return body


def test_a_session_names_only_what_moved(
    follower: tuple[ReplicaManager, LogManager],
) -> None:
    manager, _ = follower
    fetchers, fetcher = _fetchers(manager)
    body = _round(fetchers, fetcher, _answer(77))
    assert (body.session_id, body.session_epoch) == (0, 0)  # a full fetch, asking for one
    assert _named(body) == {0, 1}

    request = fetchers._request(fetcher)
    assert request is not None
    body, sent = request
    assert (body.session_id, body.session_epoch) == (77, 1)
    assert _named(body) == set()
    assert len(sent) == 2  # both are still read, through the session
    fetchers._take(fetcher, sent, _answer(77))

    partition = manager.partitions[("t", 1)]
    manager.append_from_leader(partition, batch(2, epoch=0), 0)
    fetchers._follow(fetcher, {("t", 1)})  # t-0 is followed from another leader now
    body = _round(fetchers, fetcher, None)
    assert (body.session_id, body.session_epoch) == (77, 2)
    assert _named(body) == {1}
    assert body.topics[0].partitions[0].fetch_offset == 2
    assert _forgotten(body) == {0}


def test_a_lost_session_starts_over_with_a_full_fetch(
    follower: tuple[ReplicaManager, LogManager],
) -> None:
    manager, _ = follower
    fetchers, fetcher = _fetchers(manager)
    _round(fetchers, fetcher, _answer(77))
    _round(fetchers, fetcher, _answer(0, ErrorCode.fetch_session_id_not_found))

    body = _round(fetchers, fetcher, None)
    assert (body.session_id, body.session_epoch) == (0, 0)
    assert _named(body) == {0, 1}
    assert not fetcher.held_until  # nothing held back: the full fetch goes at once


def test_a_leader_without_sessions_gets_full_fetches(
    follower: tuple[ReplicaManager, LogManager],
) -> None:
    manager, _ = follower
    fetchers, fetcher = _fetchers(manager)
    for _ in range(2):
        body = _round(fetchers, fetcher, _answer(0))
        assert (body.session_id, body.session_epoch, _named(body)) == (0, 0, {0, 1})


def test_an_answer_outside_the_session_starts_it_over(
    follower: tuple[ReplicaManager, LogManager],
) -> None:
    """A refused replica fetch is answered without a session: the leader's did not move, so
    the next fetch is a full one, not one at an epoch the leader does not expect."""
    manager, _ = follower
    fetchers, fetcher = _fetchers(manager)
    _round(fetchers, fetcher, _answer(77))
    _round(fetchers, fetcher, _answer(0))
    body = _round(fetchers, fetcher, None)
    assert (body.session_id, body.session_epoch) == (0, 0)


def _idle(fetchers: ReplicaFetchers, fetcher: _Fetcher) -> None:
    """A full fetch that starts session 77, then a round with nothing moved."""
    _round(fetchers, fetcher, _answer(77))
    body = _round(fetchers, fetcher, _answer(77))
    assert (_named(body), _forgotten(body)) == (set(), set())


InSession = tuple[ReplicaManager, ReplicaFetchers, _Fetcher]


@pytest.fixture
def in_session(follower: tuple[ReplicaManager, LogManager]) -> InSession:
    """The follower's fetcher in session 77 with the leader, nothing moved since."""
    manager, _ = follower
    fetchers, fetcher = _fetchers(manager)
    _idle(fetchers, fetcher)
    return manager, fetchers, fetcher


def test_a_change_nobody_told_of_is_found_by_the_sweep(in_session: InSession) -> None:
    """A log that moves behind the replica manager's back (as the follower's own retention
    would move its log start) reaches the leader's session within `SWEEP_S`, not before: the
    rounds in between look at nothing."""
    manager, fetchers, fetcher = in_session
    manager.partitions[("t", 0)].log.append_as_follower(batch(3, epoch=0), now_ms=1_000)
    assert _named(_round(fetchers, fetcher, _answer(77))) == set()

    fetcher.swept -= SWEEP_S
    body = _round(fetchers, fetcher, _answer(77))
    assert _named(body) == {0}
    assert body.topics[0].partitions[0].fetch_offset == 3


def test_a_new_leader_epoch_is_named_at_once(in_session: InSession) -> None:
    manager, fetchers, fetcher = in_session
    manager.apply(PartitionChanged(TOPIC, 1, PartitionState((1, 2), (1, 2), 1, 4, 4)))
    body = _round(fetchers, fetcher, _answer(77))
    assert _named(body) == {1}
    assert body.topics[0].partitions[0].current_leader_epoch == 4


def test_a_partition_led_here_now_is_forgotten(in_session: InSession) -> None:
    """Led here, it is not followed any more: even before the fetchers hear who follows what
    (`update`), the next fetch stops asking for it, and an answer for it is not taken."""
    manager, fetchers, fetcher = in_session
    manager.apply(PartitionChanged(TOPIC, 0, PartitionState((1, 2), (1, 2), 2, 1, 1)))
    request = fetchers._request(fetcher)
    assert request is not None
    body, sent = request
    assert (_named(body), _forgotten(body)) == (set(), {0})
    assert [p.index for p in sent.values()] == [1]


def test_a_held_partition_is_forgotten_then_asked_again(in_session: InSession) -> None:
    manager, fetchers, fetcher = in_session
    fetchers._hold(fetcher, manager.partitions[("t", 1)])
    body = _round(fetchers, fetcher, _answer(77))
    assert (_named(body), _forgotten(body)) == (set(), {1})

    fetcher.held_until[("t", 1)] = time.monotonic()  # the backoff is over
    body = _round(fetchers, fetcher, _answer(77))
    assert (_named(body), _forgotten(body)) == ({1}, set())


def test_a_partition_followed_from_another_leader_is_no_longer_told_of(
    follower: tuple[ReplicaManager, LogManager],
) -> None:
    """Told of a change, only the fetcher that follows the partition now looks at it."""
    manager, _ = follower
    fetchers, first = _fetchers(manager)
    second = _Fetcher(3)
    fetchers._follow(first, {("t", 0)})
    fetchers._follow(second, {("t", 1)})
    first.dirty.clear()
    second.dirty.clear()
    manager.append_from_leader(manager.partitions[("t", 1)], batch(1, epoch=0), 0)
    assert (first.dirty, second.dirty) == (set(), {("t", 1)})


def _refused(index: int, error: ErrorCode) -> Any:
    """An answer in session 77 refusing partition `index` of t."""
    answer = SimpleNamespace(partition_index=index, error_code=error)
    topic = SimpleNamespace(topic_id=TOPIC.topic_id, partitions=(answer,))
    return SimpleNamespace(error_code=ErrorCode.none, session_id=77, responses=(topic,))


def test_a_partition_left_while_nothing_is_asked_is_forgotten_by_the_next_fetch(
    in_session: InSession,
) -> None:
    """t-1 is held back and t-0 moves to another leader: the round after asks nothing, and
    the fetch after the hold still tells the leader's session to forget t-0 (a partition it
    holds, which no one reads, would answer with an error on every fetch: no fetch would
    wait for data any more)."""
    _, fetchers, fetcher = in_session
    request = fetchers._request(fetcher)
    assert request is not None
    fetchers._take(fetcher, request[1], _refused(1, ErrorCode.fenced_leader_epoch))
    fetchers._follow(fetcher, {("t", 1)})
    assert fetchers._request(fetcher) is None

    fetcher.held_until[("t", 1)] = time.monotonic()
    request = fetchers._request(fetcher)
    assert request is not None
    body, sent = request
    assert (body.session_id, _forgotten(body)) == (77, {0})
    assert [p.index for p in sent.values()] == [1]  # held by the session all along


def test_a_fetcher_that_died_leaves_no_partition_watched(tmp_path: Path) -> None:
    manager, logs = _manager(tmp_path / "f", 2)
    for index in (0, 1):
        manager.apply(PartitionChanged(TOPIC, index, PartitionState((1, 2), (1, 2), 1, 0, 0)))
    image = MetadataImage()
    image.topics[TOPIC.name] = TOPIC

    async def scenario() -> None:
        settings = FetcherSettings(2, "c", "INTERNAL", backoff_ms=10)
        fetchers = ReplicaFetchers(settings, manager, lambda: image)
        died = False

        async def run(fetcher: _Fetcher) -> None:
            nonlocal died
            if not died:
                died = True
                raise RuntimeError("a bug")
            await asyncio.Event().wait()

        fetchers._run = run  # type: ignore[method-assign]
        fetchers.update()
        await asyncio.sleep(0.001)
        assert 1 not in fetchers._fetchers
        # t-0 leaves this node before the next `update` starts another fetcher.
        manager.apply(PartitionChanged(TOPIC, 0, PartitionState((1, 3), (1, 3), 1, 1, 1)))
        await asyncio.sleep(0.05)
        assert fetchers._fetchers[1].partitions == {("t", 1)}
        assert ("t", 0) not in manager._watchers
        await fetchers.close()
        assert not manager._watchers

    try:
        asyncio.run(scenario())
    finally:
        logs.shutdown(now_ms=2_000)


def test_an_idle_fetcher_is_woken_by_a_replica_created_in_the_background(
    tmp_path: Path,
) -> None:
    """Another topic of the same name replaces t-0 (its removal never applied here) and the
    new log is created on a thread: once it is in, its fetcher, idle with nothing to ask,
    asks for it."""
    manager, logs = _manager(tmp_path / "f", 2)
    manager.create_in_background = True
    image = MetadataImage()
    image.topics[TOPIC.name] = TOPIC

    async def scenario() -> None:
        manager.apply(PartitionChanged(TOPIC, 0, PartitionState((1, 2), (1, 2), 1, 0, 0)))
        fetchers = ReplicaFetchers(FetcherSettings(2, "c", "INTERNAL"), manager, lambda: image)
        fetcher = fetchers._fetchers[1] = _Fetcher(1)
        fetchers._follow(fetcher, {("t", 0)})
        manager.on_role_change = fetchers.update
        _idle(fetchers, fetcher)

        other = TopicState("t", uuid.UUID(int=8))
        image.topics["t"] = other
        manager._created_this_turn = 16  # past what is created at once: on a thread
        manager.apply(PartitionChanged(other, 0, PartitionState((1, 2), (1, 2), 1, 0, 0)))
        assert manager.being_created(("t", 0))
        request = fetchers._request(fetcher)
        assert request is None
        fetcher.idle = True
        assert manager._creator is not None
        await manager._creator
        assert fetcher.changed.is_set()
        body = _round(fetchers, fetcher, _answer(77))
        assert {t.topic_id for t in body.topics} == {other.topic_id}
        assert _forgotten(body) == {0}  # the earlier topic's t-0

    try:
        asyncio.run(scenario())
    finally:
        logs.shutdown(now_ms=2_000)
