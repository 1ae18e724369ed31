"""New partitions' logs created in the background, as the node has it: past the first few of a
turn of the event loop, their directories and fsyncs never hold the loop, a partition answers
NOT_LEADER_OR_FOLLOWER until its log exists, and what the metadata says meanwhile (a new
leader, the topic deleted or created again, its configs) is what the partition becomes once
its log does."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from broker.metadata import MetadataImage, PartitionChanged, PartitionState, TopicRemoved
from broker.metadata.image import TopicState
from broker.protocol import ErrorCode
from broker.replica import ReplicaManager
from broker.replica.partition import Partition
from broker.storage import LogConfig, LogManager
from broker.storage.partition_metadata import read_topic_id

CONFIG = LogConfig()


def _manager(directory: Path, image: MetadataImage) -> tuple[ReplicaManager, LogManager]:
    logs = LogManager([directory], CONFIG)
    logs.startup(now_ms=0)
    manager = ReplicaManager(
        1, logs, image, lambda _: CONFIG, lambda: 1_000, create_in_background=True
    )
    return manager, logs


async def _until_created(manager: ReplicaManager) -> None:
    """Until the background creation has nothing left to do."""
    while manager._creator is not None and not manager._creator.done():
        await asyncio.sleep(0.01)


def _topic(image: MetadataImage, name: str, partitions: int, leader: int) -> TopicState:
    topic = TopicState(name, uuid.uuid4())
    topic.partitions = {
        i: PartitionState((1, 2, 3), (1, 2, 3), leader, 0, 0) for i in range(partitions)
    }
    image.topics[name] = topic
    return topic


def test_partitions_answer_once_their_logs_exist_with_the_newest_state(tmp_path: Path) -> None:
    image = MetadataImage()
    topic = _topic(image, "t", 40, leader=1)
    manager, logs = _manager(tmp_path, image)

    async def main() -> tuple[Partition | ErrorCode, Partition | ErrorCode, Partition | ErrorCode]:
        for index, state in topic.partitions.items():
            manager.apply(PartitionChanged(topic, index, state))
        first, last = manager.get("t", 0), manager.get("t", 39)
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # the round is on its threads
        # Meanwhile partition 30 gets a new leader, in a new epoch.
        moved = PartitionState((1, 2, 3), (1, 2, 3), 2, 1, 1)
        manager.apply(PartitionChanged(topic, 30, moved))
        await _until_created(manager)
        return first, last, manager.get("t", 30)

    first, before, after = asyncio.run(main())
    assert isinstance(first, Partition)  # the first few at once
    assert before == ErrorCode.not_leader_or_follower
    assert isinstance(after, Partition)
    assert (after.state.leader, after.state.leader_epoch) == (2, 1)
    assert len(manager.partitions) == 40
    assert all(read_topic_id(log.directory) == topic.topic_id for _, log in logs)
    assert manager.partitions[("t", 0)].log.epochs.latest_epoch == 0  # its leader's epoch
    logs.shutdown(now_ms=2_000)


def test_a_topic_deleted_while_its_logs_are_created_leaves_none(tmp_path: Path) -> None:
    image = MetadataImage()
    topic = _topic(image, "gone", 30, leader=1)
    manager, logs = _manager(tmp_path, image)

    async def main() -> None:
        for index, state in topic.partitions.items():
            manager.apply(PartitionChanged(topic, index, state))
        await asyncio.sleep(0)  # the first round is on its threads
        del image.topics["gone"]
        manager.apply(TopicRemoved(topic))
        await _until_created(manager)

    asyncio.run(main())
    assert manager.partitions == {}
    assert list(logs) == []
    assert not [
        d for d in tmp_path.iterdir() if d.name.startswith("gone-") and d.name[5:].isdigit()
    ]
    logs.shutdown(now_ms=2_000)


def test_a_topic_deleted_and_created_again_mid_round_gets_new_logs(tmp_path: Path) -> None:
    image = MetadataImage()
    old = _topic(image, "again", 20, leader=1)
    manager, logs = _manager(tmp_path, image)

    async def main() -> TopicState:
        for index, state in old.partitions.items():
            manager.apply(PartitionChanged(old, index, state))
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # the round is on its threads
        manager.apply(TopicRemoved(old))
        new = _topic(image, "again", 20, leader=1)  # same name, a new topic id
        for index, state in new.partitions.items():
            manager.apply(PartitionChanged(new, index, state))
        await _until_created(manager)
        return new

    new = asyncio.run(main())
    assert len(manager.partitions) == 20
    assert all(p.log.topic_id == new.topic_id for p in manager.partitions.values())
    assert all(read_topic_id(log.directory) == new.topic_id for _, log in logs)
    logs.shutdown(now_ms=2_000)


def test_a_log_takes_its_topics_configs_as_they_are_when_it_is_created(tmp_path: Path) -> None:
    """A CreateTopics's configs are applied after its partitions, maybe while their logs are
    being created: the logs get them all the same."""
    image = MetadataImage()
    topic = _topic(image, "compacted", 40, leader=1)
    configs = {"compacted": LogConfig()}
    logs = LogManager([tmp_path], CONFIG)
    logs.startup(now_ms=0)
    manager = ReplicaManager(
        1, logs, image, lambda name: configs[name], lambda: 1_000, create_in_background=True
    )

    async def main() -> None:
        for index, state in topic.partitions.items():
            manager.apply(PartitionChanged(topic, index, state))
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # the round is on its threads
        configs["compacted"] = LogConfig(cleanup_policy=frozenset({"compact"}))
        await _until_created(manager)

    asyncio.run(main())
    assert len(manager.partitions) == 40
    created_later = [p for (_, i), p in manager.partitions.items() if i >= 16]
    assert created_later
    assert all(p.log.config.compact for p in created_later)
    logs.shutdown(now_ms=2_000)


def test_a_few_logs_and_internal_topics_are_created_at_once(tmp_path: Path) -> None:
    """What a small admin request or the group coordinator creates is there when the change
    is applied, as before: a client that creates a topic of a few partitions and produces at
    once is not told NOT_LEADER_OR_FOLLOWER."""
    image = MetadataImage()
    small = _topic(image, "small", 3, leader=1)
    offsets = _topic(image, "__consumer_offsets", 50, leader=1)
    manager, logs = _manager(tmp_path, image)

    async def main() -> None:
        for topic in (small, offsets):
            for index, state in topic.partitions.items():
                manager.apply(PartitionChanged(topic, index, state))
        assert manager._creator is None

    asyncio.run(main())
    assert len(manager.partitions) == 53
    logs.shutdown(now_ms=2_000)
