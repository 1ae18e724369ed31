"""A commit log with `__consumer_offsets` and a group service over it, for the service and
handler tests; `run` fails a scenario that leaves asyncio tasks behind."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from broker.groups import GroupConfig, GroupService, LogGroupLog
from broker.groups.persistence import GroupLog
from broker.groups.records import decode_key
from broker.storage import Log, LogConfig, LogManager

TOPIC = "__consumer_offsets"
PARTITIONS = 3
COMPACTED = LogConfig(cleanup_policy=frozenset({"compact"}))


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Broker:
    """A log manager with `__consumer_offsets` and a group service over it."""

    def __init__(
        self,
        directory: Path,
        *,
        group_log: Callable[[GroupLog], GroupLog] | None = None,
        **config: Any,
    ) -> None:
        self.directory = directory
        self.manager = LogManager([directory], COMPACTED)
        self.manager.startup(now_ms())
        for partition in range(PARTITIONS):
            self.manager.create_log(TOPIC, partition, now_ms())
        self.log = LogGroupLog(self.log_for, now_ms)
        settings: dict[str, Any] = {"num_partitions": PARTITIONS, "initial_rebalance_delay_ms": 0}
        settings.update(config)
        self.service_log = group_log(self.log) if group_log else self.log
        """What the service writes through: the log itself, or a wrapper around it."""
        self.service = GroupService(GroupConfig(**settings), self.service_log, now_ms=now_ms)

    def log_for(self, partition: int) -> Log | None:
        return self.manager.logs.get((TOPIC, partition))

    def records(self, group_id: str) -> list[tuple[Any, bytes | None]]:
        partition = self.service.partition_for(group_id)
        return [(decode_key(k), v) for k, v in self.log.replay(partition)]

    async def stop(self) -> None:
        await self.service.stop()
        self.manager.shutdown(now_ms())


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    async def guarded() -> None:
        await scenario()
        leftovers = asyncio.all_tasks() - {asyncio.current_task()}
        assert not leftovers, f"tasks left behind: {leftovers}"

    asyncio.run(guarded())
