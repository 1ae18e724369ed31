"""A voter answers a quorum request only once the election state the request moved it to is on
disk (Kafka's `quorum-state`; etcd-raft's rule: persist the HardState, then send). An answer
sent first is a promise a crash can take back: a voter that acknowledged a leader, or granted
a vote, comes back from a crash without knowing it did.

A crash between the write and the answer cannot be arranged deterministically, so the store
is the real one wrapped in a double (`RecordingStore`) that records when each election state
has reached disk, and the test records when each answer was returned: the order of the two is
what a crash would expose."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from broker.protocol import ErrorCode
from broker.quorum.driver import QuorumDriver
from broker.quorum.store import QuorumStore
from broker.quorum.wire import request_for
from broker.raft import BeginQuorumEpoch, ElectionState, EndQuorumEpoch, Message, Vote
from tests.support.nodes import free_port

Event = tuple[object, ...]


class RecordingStore(QuorumStore):
    """The real store, recording each election state once it is on disk."""

    def __init__(self, log_dir: Path, voters: tuple[int, ...], events: list[Event]) -> None:
        super().__init__(log_dir, voters, segment_bytes=8 << 20, now_ms=_wall())
        self.events = events

    def save_election(self, election: ElectionState) -> None:
        super().save_election(election)
        self.events.append(("persisted", election))


class Machine:
    def apply(self, offset: int, payload: bytes) -> None:
        pass

    def prepare(self, offset: int, payload: bytes) -> None:
        pass

    def load(self, payloads: Sequence[bytes], end_offset: int) -> None:
        pass

    def snapshot(self) -> Iterable[bytes]:
        return []


def _wall() -> int:
    return time.time_ns() // 1_000_000


def _monotonic() -> int:
    return time.monotonic_ns() // 1_000_000


def _answer_order(tmp_path: Path, message: Message, *, before: ElectionState | None) -> list[Event]:
    """Node 1 of three voters (the other two unreachable), its quorum-state `before`, answers
    `message`: what reached disk and what was answered, in order."""
    voters = {node: ("localhost", free_port()) for node in (1, 2, 3)}
    events: list[Event] = []
    if before is not None:
        seed = QuorumStore(tmp_path, (1, 2, 3), segment_bytes=8 << 20, now_ms=_wall())
        seed.save_election(before)
        seed.close(_wall())
    store = RecordingStore(tmp_path, (1, 2, 3), events)

    async def main() -> None:
        driver = QuorumDriver(
            1, voters, store, Machine(), cluster_id="c", clock=_monotonic, wall_clock=_wall
        )
        await driver.start()
        try:
            api_key, version, body = request_for(
                message,
                1,
                cluster_id="c",
                endpoint=("CONTROLLER", "localhost", voters[message.sender][1]),
                fetch_wait_ms=500,
                max_bytes=1 << 20,
            )
            response: Any = await driver.handle(api_key, version, body)
            answer = response.topics[0].partitions[0]
            events.append(("answered", answer.leader_epoch, answer.leader_id, answer.error_code))
        finally:
            await driver.stop()

    asyncio.run(main())
    answered = next(i for i, event in enumerate(events) if event[0] == "answered")
    return events[: answered + 1]


def test_begin_quorum_epoch_is_answered_once_the_new_leader_is_on_disk(tmp_path: Path) -> None:
    assert _answer_order(tmp_path, BeginQuorumEpoch(2, 5), before=None) == [
        ("persisted", ElectionState(5, None, 2)),
        ("answered", 5, 2, ErrorCode.none),
    ]


def test_end_quorum_epoch_is_answered_once_the_leader_is_forgotten_on_disk(
    tmp_path: Path,
) -> None:
    assert _answer_order(
        tmp_path, EndQuorumEpoch(2, 5, (1, 3)), before=ElectionState(5, None, 2)
    ) == [
        ("persisted", ElectionState(5, None, None)),
        ("answered", 5, -1, ErrorCode.none),
    ]


def test_a_vote_is_granted_once_it_is_on_disk(tmp_path: Path) -> None:
    events = _answer_order(tmp_path, Vote(2, 3, 0, 0), before=None)
    assert events[-2:] == [
        ("persisted", ElectionState(3, 2, None)),
        ("answered", 3, -1, ErrorCode.none),
    ]
