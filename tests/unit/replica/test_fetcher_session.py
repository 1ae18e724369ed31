"""The replica fetcher's side of fetch sessions (KIP-227): after a full fetch the leader
answered with a session id, the next fetches name only the partitions whose fetch state moved,
forget those no longer followed, and a lost session starts over with a full fetch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from broker.metadata import MetadataImage, PartitionChanged, PartitionState
from broker.protocol import ErrorCode
from broker.replica import ReplicaManager
from broker.replica.fetcher import FetcherSettings, ReplicaFetchers, _Fetcher
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
    return fetchers, _Fetcher(1, {("t", 0), ("t", 1)})


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
    partition.log.append_as_follower(batch(2, epoch=0), now_ms=1_000)
    fetcher.partitions = {("t", 1)}  # t-0 is followed from another leader now
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
