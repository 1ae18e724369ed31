"""The asyncio driver of the group coordinator: requests in, answers out, records to the log.

What it owns: the one lock that serialises every call into the pure `GroupCoordinator` with
the writes that call asks for; the futures behind parked JoinGroup and SyncGroup requests;
the timer task that wakes the coordinator at its next deadline; loading partitions from
`__consumer_offsets`; and the order of shutdown. What it must never do: decide anything
about groups, which is the coordinator's job.

Rules it keeps:
1. Records reach the log before any answer that follows them in the coordinator's outbox is
   delivered: an offset commit is acknowledged only once its record is in the log.
2. A write that fails leaves the log as the truth: the partition is unloaded (its parked
   requests answered NOT_COORDINATOR, as is every answer that depended on the write) and
   loaded again from its log. A write refused because this node no longer leads the
   partition (`GroupLogUnavailable`: a controlled shutdown or a reassignment moved it) is
   routine, as in Kafka: the groups are unloaded, their members told NOT_COORDINATOR so that
   they find the new coordinator, one line is logged, and nothing is reloaded here.
3. Work started for a request runs to the end even if the request's connection goes away,
   so the coordinator and the log never disagree about what was decided.
4. `stop()` leaves no task behind: timers stop, loads are cancelled, and parked requests are
   answered NOT_COORDINATOR.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

from broker.protocol import ErrorCode

from .api import (
    DeleteGroupsResult,
    GroupConfig,
    GroupDescription,
    HeartbeatRequest,
    JoinRequest,
    JoinResult,
    LeaveRequest,
    LeaveResult,
    ListGroupsResult,
    OffsetCommitRequest,
    OffsetCommitResult,
    OffsetDeleteRequest,
    OffsetDeleteResult,
    OffsetFetchResult,
    SyncRequest,
    SyncResult,
    TopicPartition,
)
from .coordinator import GroupCoordinator
from .effects import Append
from .persistence import GroupLog, GroupLogUnavailable
from .records import GroupRecordError

__all__ = ["GroupService"]

log = logging.getLogger(__name__)

T = TypeVar("T")
_YIELD_EVERY = 1_000
"""Records replayed between two yields to the event loop while a partition loads."""


class GroupService:
    def __init__(
        self,
        config: GroupConfig,
        group_log: GroupLog,
        *,
        now_ms: Callable[[], int],
        member_id_suffix: Callable[[], str] | None = None,
    ) -> None:
        """`now_ms`: the node's wall clock, the one the log stamps its records with."""
        self.config = config
        self._core = GroupCoordinator(config, member_id_suffix=member_id_suffix)
        self._log = group_log
        self._now_ms = now_ms
        self._lock = asyncio.Lock()
        self._waiters: dict[int, asyncio.Future[object]] = {}
        self._wakeup = asyncio.Event()
        self._timers: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = False

    def partition_for(self, group_id: str) -> int:
        return self._core.partition_of(group_id)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, partitions: Iterable[int] | None = None) -> None:
        """Load the given `__consumer_offsets` partitions (all by default) and start the
        timers; requests for a partition still loading get COORDINATOR_LOAD_IN_PROGRESS."""
        self._timers = asyncio.create_task(self._run_timers(), name="group-coordinator-timers")
        wanted = list(range(self.config.num_partitions) if partitions is None else partitions)
        for partition in wanted:
            self._core.begin_load(partition)
        for partition in wanted:
            await self.load(partition)

    async def stop(self) -> None:
        self._stopped = True
        tasks = [t for t in (self._timers, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._timers = None
        async with self._lock:
            for partition in sorted(self._core.loaded | self._core.loading):
                self._core.unload(partition)
            await self._flush()
        for future in self._waiters.values():
            future.cancel()
        self._waiters.clear()

    async def load(self, partition: int) -> None:
        """Replay one partition's records and serve its groups; a record that cannot be read
        is skipped with a warning, a log that cannot be read leaves the partition unserved.
        A partition this node no longer leads (its leadership moved on before the load ran)
        is not served here, with one line and no traceback: nothing is wrong. A stopped
        service loads nothing (a leadership can still move here while the node stops)."""
        if self._stopped:
            return
        self._core.begin_load(partition)
        try:
            for count, (key, value) in enumerate(self._log.replay(partition), 1):
                try:
                    self._core.replay(partition, key, value)
                except GroupRecordError as exc:
                    log.warning(
                        "skipping unreadable __consumer_offsets-%d record: %s", partition, exc
                    )
                if count % _YIELD_EVERY == 0:
                    await asyncio.sleep(0)
        except GroupLogUnavailable as exc:
            log.info("not loading the groups of __consumer_offsets-%d: %s", partition, exc)
            self._core.unload(partition)
            return
        except Exception:
            log.exception("cannot load __consumer_offsets-%d; its groups are not served", partition)
            self._core.unload(partition)
            return
        async with self._lock:
            if partition not in self._core.loading:
                return  # unloaded meanwhile (this node stopped leading it)
            self._core.complete_load(partition, self._now_ms())
            await self._flush()
        self._wakeup.set()

    def serves(self, partition: int) -> bool:
        """Whether the partition's groups are served here, or being loaded to be."""
        return partition in self._core.loaded or partition in self._core.loading

    async def unload(self, partition: int) -> None:
        async with self._lock:
            self._core.unload(partition)
            await self._flush()

    # -- requests --------------------------------------------------------------------------

    async def join_group(self, request: JoinRequest) -> JoinResult:
        return await self._parked(JoinResult, lambda now: self._core.join_group(request, now))

    async def sync_group(self, request: SyncRequest) -> SyncResult:
        return await self._parked(SyncResult, lambda now: self._core.sync_group(request, now))

    async def heartbeat(self, request: HeartbeatRequest) -> ErrorCode:
        return await self._now(lambda now: self._core.heartbeat(request, now))

    async def leave_group(self, request: LeaveRequest) -> LeaveResult:
        return await self._parked(LeaveResult, lambda now: self._core.leave_group(request, now))

    async def commit_offsets(self, request: OffsetCommitRequest) -> OffsetCommitResult:
        return await self._parked(
            OffsetCommitResult, lambda now: self._core.commit_offsets(request, now)
        )

    async def fetch_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None
    ) -> OffsetFetchResult:
        return await self._now(lambda now: self._core.fetch_offsets(group_id, partitions))

    async def delete_offsets(self, request: OffsetDeleteRequest) -> OffsetDeleteResult:
        return await self._parked(
            OffsetDeleteResult, lambda now: self._core.delete_offsets(request, now)
        )

    async def describe_groups(self, group_ids: Iterable[str]) -> tuple[GroupDescription, ...]:
        return await self._now(lambda now: self._core.describe_groups(group_ids))

    async def list_groups(
        self, states: Iterable[str] = (), types: Iterable[str] = ()
    ) -> ListGroupsResult:
        return await self._now(lambda now: self._core.list_groups(states, types))

    async def delete_groups(self, group_ids: Iterable[str]) -> DeleteGroupsResult:
        return await self._parked(
            DeleteGroupsResult, lambda now: self._core.delete_groups(group_ids, now)
        )

    # -- driving the core ------------------------------------------------------------------

    async def _now(self, call: Callable[[int], T]) -> T:
        """A call answered at once; it still waits for writes queued before it."""
        async with self._lock:
            answer = call(self._now_ms())
            await self._flush()
        self._wakeup.set()
        return answer

    async def _parked(self, kind: type[T], call: Callable[[int], int]) -> T:
        """A call answered through the outbox, possibly much later (JoinGroup, SyncGroup) or
        once its records are in the log."""
        future = await asyncio.shield(self._submit(call))
        result = await future
        assert isinstance(result, kind), f"expected {kind.__name__}, got {result!r}"
        return result

    async def _submit(self, call: Callable[[int], int]) -> asyncio.Future[object]:
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        async with self._lock:
            if self._stopped:
                raise RuntimeError("the group coordinator is stopped")
            ticket = call(self._now_ms())
            self._waiters[ticket] = future
            await self._flush()
        self._wakeup.set()
        return future

    async def _flush(self) -> None:
        """Carry out the outbox in order; called with the lock held. An answer that reports
        on a write is delivered once the write is replicated (off the lock, so that other
        groups go on meanwhile); COORDINATOR_NOT_AVAILABLE if it is not in time, as Kafka
        answers a commit whose write timed out."""
        failed: set[int] = set()
        moved: set[int] = set()
        """Failed partitions this node no longer leads: not reloaded here."""
        written: dict[int, int] = {}
        effects = self._core.outbox.take()
        while effects:
            for effect in effects:
                if isinstance(effect, Append):
                    if effect.partition not in failed:
                        try:
                            end = await self._log.append(effect.partition, effect.records)
                        except GroupLogUnavailable as exc:
                            log.info(
                                "unloading the groups of __consumer_offsets-%d (%s): their "
                                "members are told NOT_COORDINATOR",
                                effect.partition,
                                exc,
                            )
                            failed.add(effect.partition)
                            moved.add(effect.partition)
                            self._core.unload(effect.partition)
                        except Exception:
                            log.exception(
                                "cannot write to __consumer_offsets-%d; reloading it from its log",
                                effect.partition,
                            )
                            failed.add(effect.partition)
                            self._core.unload(effect.partition)
                        else:
                            if end is not None:
                                written[effect.partition] = end
                    continue
                result = effect.result
                if effect.depends_on & failed:
                    result = result.failed(ErrorCode.not_coordinator)
                waits = {p: written[p] for p in effect.depends_on if p in written}
                if waits and not effect.depends_on & failed:
                    self._spawn(self._deliver_replicated(effect.ticket, result, waits))
                else:
                    self._deliver(effect.ticket, result)
            effects = self._core.outbox.take()
        for partition in failed - moved:
            self._core.begin_load(partition)
            self._spawn(self.load(partition))

    async def _deliver_replicated(self, ticket: int, result: Any, ends: dict[int, int]) -> None:
        replicated = await asyncio.gather(
            *(self._log.replicated(partition, end) for partition, end in ends.items())
        )
        if not all(replicated):
            result = result.failed(ErrorCode.coordinator_not_available)
        self._deliver(ticket, result)

    def _deliver(self, ticket: int, result: object) -> None:
        future = self._waiters.pop(ticket, None)
        if future is not None and not future.done():
            future.set_result(result)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_timers(self) -> None:
        while True:
            self._wakeup.clear()
            deadline = self._core.next_deadline()
            if deadline is None:
                await self._wakeup.wait()
            else:
                delay = (deadline - self._now_ms()) / 1000
                if delay > 0:
                    try:
                        async with asyncio.timeout(delay):
                            await self._wakeup.wait()
                    except TimeoutError:
                        pass
            async with self._lock:
                try:
                    self._core.tick(self._now_ms())
                except Exception:
                    log.exception("group coordinator timers failed")
                await self._flush()
