"""A leader's ISR changes go to the controller in one AlterPartition at a time, each carrying
every change decided while the one before was on its way (Kafka's AlterPartitionManager): a
broker that restarts takes thousands of partitions out of their ISRs, and their leaders ask
in a few requests, not one request (and one metadata commit) per partition."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from broker.metadata import PartitionChanged, QuorumController, TopicRequest
from broker.metadata.elections import IsrAnswer, IsrChange
from broker.protocol import ErrorCode
from broker.replica import ReplicaManager
from broker.replica.isr import IsrSender
from broker.storage import LogConfig, LogManager
from tests.unit.metadata.test_controller import _commit, _image

CONFIG = LogConfig()


def test_changes_decided_while_one_is_sent_go_together_in_the_next(tmp_path: Path) -> None:
    image = _image(3)
    records, _ = QuorumController(image, num_partitions=1, replication_factor=3).create_topics(
        [TopicRequest("t", assignments=dict.fromkeys(range(50), (1, 2, 3)))]
    )
    _commit(image, records)
    logs = LogManager([tmp_path], CONFIG)
    logs.startup(now_ms=0)
    replicas = ReplicaManager(1, logs, image, lambda _: CONFIG, lambda: 1_000)
    topic = image.topics["t"]
    for index, state in topic.partitions.items():
        replicas.apply(PartitionChanged(topic, index, state))
    sent: list[list[IsrChange]] = []

    async def main() -> None:
        first_sent = asyncio.Event()
        answer = asyncio.Event()
        tasks: list[asyncio.Task[None]] = []

        async def send(changes: list[IsrChange]) -> tuple[ErrorCode, list[IsrAnswer]]:
            sent.append(changes)
            first_sent.set()
            await answer.wait()
            return ErrorCode.none, [IsrAnswer(ErrorCode.none) for _ in changes]

        def spawn(coroutine: Coroutine[Any, Any, None]) -> None:
            tasks.append(asyncio.get_running_loop().create_task(coroutine))

        sender = IsrSender(replicas, lambda: image, send, spawn)
        partitions = [replicas.partitions[("t", i)] for i in range(50)]
        for partition in partitions:
            partition.pending_isr = (1, 2)  # the leader decided: follower 3 is out
            partition.pending_since_epoch = partition.state.partition_epoch
            sender(partition, (1, 2))
            if partition is partitions[0]:
                await first_sent.wait()  # the first is on its way; the others queue
        answer.set()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    logs.shutdown(now_ms=2_000)
    assert [len(changes) for changes in sent] == [1, 49]
    assert {change.partition for change in sent[1]} == set(range(1, 50))
    assert all(change.new_isr == ((1, 1), (2, 2)) for changes in sent for change in changes)
