"""A leader's ISR changes, sent to the active controller (AlterPartition, KIP-497): what the
replica manager decides (`ReplicaManager.on_isr_change`) goes out in the background, and the
answer comes back as a metadata change.

Changes go out in one request at a time, each carrying every change decided meanwhile. Each
change names the epochs it was decided against (the partition's leader and partition epochs,
each new member's broker epoch, KIP-903). Until the controller answers it is sent again after
`RETRY_BACKOFF_S`, as long as it is still the partition's pending change (it may have been
committed meanwhile); a refusal lets the leader decide again after the same backoff.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from broker.metadata import MetadataImage
from broker.metadata.elections import IsrAnswer, IsrChange
from broker.protocol.errors import ErrorCode

from .manager import ReplicaManager
from .partition import Partition

__all__ = ["RETRY_BACKOFF_S", "IsrSender"]

log = logging.getLogger(__name__)

RETRY_BACKOFF_S = 0.5

SendIsr = Callable[[list[IsrChange]], Awaitable[tuple[ErrorCode, list[IsrAnswer]] | None]]
"""AlterPartition to the active controller: its answer, or None when none answered."""


class IsrSender:
    def __init__(
        self,
        replicas: ReplicaManager,
        image: Callable[[], MetadataImage],
        send: SendIsr,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self._replicas = replicas
        self._image = image
        self._send = send
        self._spawn = spawn
        self._queued: dict[tuple[str, int], tuple[Partition, tuple[int, ...], IsrChange]] = {}
        """The changes the next AlterPartition carries, the newest per partition."""
        self._sending = False

    def __call__(self, partition: Partition, wanted: tuple[int, ...]) -> None:
        """Ask for a led partition's new ISR, against the epochs it was decided on."""
        image = self._image()
        topic = image.topics.get(partition.topic)
        if topic is None:
            return  # deleted: the partition goes with the next metadata change
        change = IsrChange(
            topic.topic_id,
            partition.index,
            partition.leader_epoch,
            partition.pending_since_epoch,
            tuple(
                (member, image.brokers[member].epoch if member in image.brokers else -1)
                for member in wanted
            ),
        )
        self._queued[(partition.topic, partition.index)] = (partition, wanted, change)
        if not self._sending:
            self._sending = True
            self._spawn(self._send_queued())

    async def _send_queued(self) -> None:
        """One AlterPartition at a time, with every change queued meanwhile (Kafka's
        AlterPartitionManager): a broker that restarts leaves the ISR of thousands of
        partitions, and their leaders ask in a few requests, not thousands."""
        try:
            while self._queued:
                batch = [
                    (partition, wanted, change)
                    for partition, wanted, change in self._queued.values()
                    if _still_pending(partition, wanted, change)
                ]
                self._queued.clear()
                if not batch:
                    return
                try:
                    answered = await self._send([change for _, _, change in batch])
                except Exception:
                    log.exception("AlterPartition for %d partitions failed", len(batch))
                    answered = None
                if answered is None:
                    # Unanswered (it may have been committed): asked again, unless decided
                    # anew meanwhile.
                    await asyncio.sleep(RETRY_BACKOFF_S)
                    for partition, wanted, change in batch:
                        key = (partition.topic, partition.index)
                        self._queued.setdefault(key, (partition, wanted, change))
                    continue
                error, answers = answered
                if error != ErrorCode.none or len(answers) != len(batch):  # refused whole
                    answers = [IsrAnswer(error or ErrorCode.unknown_server_error)] * len(batch)
                refused = []
                for (partition, wanted, _), answer in zip(batch, answers, strict=True):
                    # NEW_LEADER_ELECTED: committed, and it completed a reassignment that
                    # moved the leadership away; the metadata tells the rest.
                    if answer.error not in (ErrorCode.none, ErrorCode.new_leader_elected):
                        log.info(
                            "the controller did not change the ISR of %s-%d to %s: %s",
                            partition.topic,
                            partition.index,
                            list(wanted),
                            answer.error.name,
                        )
                        refused.append((partition, wanted))
                if refused:
                    self._spawn(self._decide_again_later(refused))
        finally:
            self._sending = False

    async def _decide_again_later(self, refused: list[tuple[Partition, tuple[int, ...]]]) -> None:
        await asyncio.sleep(RETRY_BACKOFF_S)  # before the leaders ask again
        for partition, wanted in refused:
            self._replicas.isr_change_failed(partition, wanted)


def _still_pending(partition: Partition, wanted: tuple[int, ...], change: IsrChange) -> bool:
    """Whether the change is still the partition's pending one (it may have been committed
    meanwhile, or the leader decided another)."""
    return partition.pending_isr == wanted and partition.pending_since_epoch == (
        change.partition_epoch
    )
