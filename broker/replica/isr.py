"""A leader's ISR changes, sent to the active controller (AlterPartition, KIP-497): what the
replica manager decides (`ReplicaManager.on_isr_change`) goes out in the background, and the
answer comes back as a metadata change.

Each request names the epochs it was decided against (the partition's leader and partition
epochs, each new member's broker epoch, KIP-903). Until the controller answers it is sent
again after `RETRY_BACKOFF_S`, as long as it is still the partition's pending change (it may
have been committed meanwhile); a refusal lets the leader decide again after the same backoff.
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
        self._spawn(self._until_answered(partition, wanted, change))

    async def _until_answered(
        self, partition: Partition, wanted: tuple[int, ...], change: IsrChange
    ) -> None:
        while partition.pending_isr == wanted and partition.pending_since_epoch == (
            change.partition_epoch
        ):
            try:
                answered = await self._send([change])
            except Exception:
                log.exception("AlterPartition for %s-%d failed", partition.topic, partition.index)
                answered = None
            if answered is None:
                await asyncio.sleep(RETRY_BACKOFF_S)
                continue
            error = answered[1][0].error if answered[1] else answered[0]
            # NEW_LEADER_ELECTED: committed, and it completed a reassignment that moved the
            # leadership away; the metadata tells the rest.
            if error not in (ErrorCode.none, ErrorCode.new_leader_elected):
                log.info(
                    "the controller did not change the ISR of %s-%d to %s: %s",
                    partition.topic,
                    partition.index,
                    list(wanted),
                    error.name,
                )
                await asyncio.sleep(RETRY_BACKOFF_S)  # before the leader asks again
                self._replicas.isr_change_failed(partition, wanted)
            return
