"""The node's metadata: the controller's decisions committed through the Raft quorum, and the
image every node builds from the committed log.

`propose(decide)` runs a controller decision against the image, as the active controller, and
returns its result once the records it wrote are committed by the quorum and applied here, so
an admin request is answered after its records are committed, as in Kafka. Proposals are
serialised: each one sees the image its predecessor left.

This class is also the quorum's state machine (`StateMachine`): the driver hands it every
committed entry, and it applies it to the image and tells the subscribers (the replica manager,
the connection limits) what changed. A subscriber that fails — a log dir that went offline, no
descriptors left — is logged, counted (`apply_error_count`) and kept in `load_failures`, never
raised into the commit: the image stays the committed state whatever this node could do with
it.

A committed record that cannot be applied to the image is another matter: the image no longer
follows the log. Kafka's rule (its "metadata loading" fault handler, fatal on a process with the
controller role):
1. Every failure is counted (`load_error_count`, Kafka's `metadata-load-error-count`).
2. On a controller (a voter: the active one, or one that could be elected and decide from a
   wrong image), it is fatal: the node resigns leadership, leaves the quorum and the process
   exits with status 1, naming the record's offset and type. Another voter, whose image
   follows the log, leads.
3. On a broker-only node, it is logged and kept in `load_failures`; the node serves what it can
   from the image it has.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

from broker.config import BrokerConfig
from broker.metadata import MetadataImage, MetadataRecord, QuorumController
from broker.metadata.brokers import (
    BrokerSessions,
    Heartbeat,
    HeartbeatAnswer,
    Registration,
    RegistrationAnswer,
    fence,
    heartbeat,
    register,
    unregister,
)
from broker.metadata.configs import ResolvedConfig, log_config, resolve_topic_configs
from broker.metadata.elections import (
    MAX_ELECTIONS_PER_REBALANCE,
    ElectionResult,
    IsrAnswer,
    IsrChange,
    alter_isr,
    elect_leaders,
    elect_unclean,
    rebalance,
)
from broker.metadata.image import BROKER_RESOURCE, Change, PartitionState
from broker.metadata.reassignments import (
    Reassignment,
    ReassignmentResult,
    alter_reassignments,
    ongoing,
)
from broker.metadata.records import RECORD_TYPES, decode_record, encode_record
from broker.protocol.errors import ErrorCode
from broker.quorum import NotController, QuorumDriver, QuorumStore, StateMachineFault
from broker.raft import QuorumTimeouts
from broker.storage import LogConfig

__all__ = ["MetadataService", "NotController", "halt"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_LOG_CONFIGS_KEPT = 1024
"""How many resolved topic storage settings `topic_log_config` keeps (one per distinct set
of topic, dynamic and static settings: usually a handful)."""


def halt(message: str) -> None:
    """End the process at once with status 1, as Kafka's ProcessTerminatingFaultHandler halts a
    controller on a fatal fault. Not a clean shutdown: that would go on serving, and hand a
    controlled shutdown to a quorum, from an image that no longer follows the log; the
    partition logs recover on restart as after any crash."""
    log.critical("%s: exiting", message)
    logging.shutdown()
    sys.stderr.write(f"gregor: {message}\n")
    sys.stderr.flush()
    os._exit(1)


class MetadataService:
    def __init__(
        self,
        config: BrokerConfig,
        clock: Callable[[], int],
        *,
        cluster_id: str,
        steady_clock: Callable[[], int],
        controller_endpoint: tuple[str, str, int] | None = None,
        fatal: Callable[[str], None] = halt,
    ) -> None:
        """`fatal` is told why this node must stop once a controller has resigned after a
        record it could not apply (the process exits; tests pass their own)."""
        self.config = config
        self._clock = clock
        self.image = MetadataImage()
        self.controller = QuorumController(
            self.image,
            num_partitions=config.num_partitions,
            replication_factor=config.default_replication_factor,
        )
        self.subscribers: list[Callable[[Change], None]] = []
        self._log_configs: dict[tuple[tuple[tuple[str, str], ...], ...], LogConfig] = {}
        """`topic_log_config`'s answers, by the settings they were resolved from."""
        self._prepared: dict[int, MetadataRecord] = {}
        """Entries decoded ahead of `apply`, by offset (`prepare`)."""
        self.load_failures: list[str] = []
        """What this node failed to act on locally (see the module docstring)."""
        self.load_error_count = 0
        """Committed records not applied to the image (Kafka's `metadata-load-error-count`)."""
        self.apply_error_count = 0
        """Changes a subscriber failed to act on (Kafka's `metadata-apply-error-count`)."""
        self._fatal = fatal
        self._controller = "controller" in config.process_roles
        self._lock = asyncio.Lock()
        self.broker_epoch = -1
        """This node's broker epoch once it is registered (`BrokerLifecycle` sets it)."""
        # Without `controller.quorum.voters`, a combined node is the only voter (`make run`).
        voters = config.controller_quorum_voters or {config.node_id: ("localhost", 0)}
        store = QuorumStore(
            config.metadata_log_dir or config.log_dirs[0],
            tuple(sorted(voters)),
            segment_bytes=config.metadata_log_segment_bytes,
            now_ms=clock(),
        )
        self.driver = QuorumDriver(
            config.node_id,
            voters,
            store,
            self,
            cluster_id=cluster_id,
            clock=steady_clock,
            wall_clock=clock,
            timeouts=QuorumTimeouts(
                election_ms=config.controller_quorum_election_timeout_ms,
                fetch_ms=config.controller_quorum_fetch_timeout_ms,
                election_backoff_max_ms=config.controller_quorum_election_backoff_max_ms,
                request_ms=config.controller_quorum_request_timeout_ms,
                retry_backoff_ms=config.controller_quorum_retry_backoff_ms,
            ),
            snapshot_bytes=config.metadata_log_max_record_bytes_between_snapshots,
            endpoint=controller_endpoint,
        )
        self.driver.on_leadership = self._on_leadership
        self.driver.on_fault = self._on_fault
        self._cluster_id = cluster_id
        self._steady = steady_clock
        self.sessions = BrokerSessions(config.broker_session_timeout_ms)
        """The active controller's view of which brokers still send heartbeats."""
        self._fencer: asyncio.Task[None] | None = None
        self._periodic: list[asyncio.Task[None]] = []
        """The active controller's periodic elections (preferred, unclean)."""

    async def start(self) -> None:
        """Join the quorum and wait until the committed log is applied to the image (before
        anything subscribes)."""
        await self.driver.start()
        await self.driver.wait_caught_up()
        log.info(
            "metadata caught up to offset %d: %d topics, %d brokers, epoch %d",
            self.driver.applied,
            len(self.image.topics),
            len(self.image.brokers),
            self.driver.epoch,
        )

    @property
    def is_active_controller(self) -> bool:
        return self.driver.is_active

    async def propose(
        self,
        decide: Callable[[QuorumController], tuple[Sequence[MetadataRecord], T]],
        *,
        atomic: bool = True,
    ) -> T:
        """Raises `NotController` on a node that is not the active controller. `atomic`
        records are committed and applied as one (an admin request's); a decision that others
        may see in parts (leaders moved, ISRs changed: Kafka's non-atomic controller results)
        is written in batches, so that every node applies it a batch at a time."""
        async with self._lock:
            if not self.driver.is_active:
                raise NotController(self.driver.leader)
            records, result = decide(self.controller)
            if records:
                await self.driver.propose([encode_record(r) for r in records], atomic=atomic)
            return result

    # -- the quorum's state machine ----------------------------------------------------------

    def prepare(self, offset: int, payload: bytes) -> None:
        """Decode the entry ahead of `apply` (the driver does it in slices; the proposal's
        records are then applied together). One that cannot be decoded fails in `apply`."""
        with contextlib.suppress(Exception):
            self._prepared[offset] = decode_record(payload)

    def apply(self, offset: int, payload: bytes) -> None:
        record: MetadataRecord | None = self._prepared.pop(offset, None)
        try:
            if record is None:
                record = decode_record(payload)
            change = self.image.apply(record, offset)
        except Exception as exc:
            what = type(record).__name__ if record is not None else _record_type(payload)
            self._load_failed(f"{what} at offset {offset}", exc)
            return
        if change is not None:
            self._notify(change)

    def load(self, payloads: Sequence[bytes], end_offset: int) -> None:
        self._prepared.clear()
        try:
            records = [decode_record(payload) for payload in payloads]
            changes = self.image.load(records, end_offset - 1)
        except Exception as exc:
            self._load_failed(f"snapshot ending at offset {end_offset}", exc)
            raise  # a broker's quorum stops here, as on a failed metadata disk
        for change in changes:
            self._notify(change)

    def _load_failed(self, what: str, exc: Exception) -> None:
        """A committed record (or snapshot) not applied to the image: fatal on a controller,
        reported on a broker (see the module docstring)."""
        self.load_error_count += 1
        failure = f"the committed {what} of the metadata log could not be applied: {exc!r}"
        if self._controller:
            raise StateMachineFault(f"controller {self.config.node_id}: {failure}") from exc
        log.error("%s; this broker serves what it can from the image it has", failure, exc_info=exc)
        self.load_failures.append(failure)

    def _on_fault(self, fault: StateMachineFault) -> None:
        """The driver has resigned and left the quorum after `_load_failed` on a controller."""
        self._fatal(
            f"{fault}; it left the quorum (resigning leadership, if held) so that a voter whose "
            "image follows the log leads"
        )

    def snapshot(self) -> Iterable[bytes]:
        records = self.image.snapshot_records()  # now; encoded as the driver iterates
        return (encode_record(record) for record in records)

    def _notify(self, change: Change) -> None:
        for subscriber in self.subscribers:
            try:
                subscriber(change)
            except Exception as exc:
                log.exception("this node failed to act on %s", change)
                self.apply_error_count += 1
                self.load_failures.append(f"{change}: {exc}")

    # -- brokers, as the active controller sees them (KIP-631) ----------------------------------

    async def register(self, request: Registration) -> RegistrationAnswer:
        """A broker's BrokerRegistration, decided and committed here (the active controller)."""
        return await self._propose_at(
            lambda next_offset: register(
                self.image,
                self.sessions,
                request,
                cluster_id=self._cluster_id,
                next_offset=next_offset,
                now_ms=self._steady(),
                unclean=self.unclean_allowed,
                min_isr=self.controller_min_isr,
            )
        )

    async def heartbeat(self, request: Heartbeat) -> HeartbeatAnswer:
        """A broker's BrokerHeartbeat, decided and committed here (the active controller).
        The session is kept as the request arrives, before it waits for the controller's lock:
        a controller busy committing must not fence brokers whose heartbeats are queued
        behind it (Kafka's BrokerHeartbeatTracker). A heartbeat that writes nothing does not
        wait for the lock at all."""
        broker = self.image.brokers.get(request.broker_id)
        if (
            self.driver.is_active
            and broker is not None
            and broker.epoch == request.broker_epoch
            and not request.want_shut_down
        ):
            self.sessions.touch(request.broker_id, self._steady())
            if not request.want_fence and (
                not broker.fenced
                or broker.in_controlled_shutdown
                or request.metadata_offset < broker.epoch
            ):
                # Nothing to write (the broker stays as it is): answered now from the committed
                # state, never behind another request's records waiting to commit and apply
                # (a fence or unfence under way shows in the next answer).
                records, answer = heartbeat(
                    self.image, self.sessions, request, now_ms=self._steady()
                )
                if not records:
                    return answer
        return await self._propose_at(
            lambda next_offset: heartbeat(
                self.image,
                self.sessions,
                request,
                now_ms=self._steady(),
                unclean=self.unclean_allowed,
                next_offset=next_offset,
                min_isr=self.controller_min_isr,
            ),
            atomic=False,  # a controlled shutdown moves every leader the broker has
        )

    async def alter_isr(
        self, broker_id: int, broker_epoch: int, changes: list[IsrChange]
    ) -> tuple[ErrorCode, list[IsrAnswer]]:
        """A partition leader's AlterPartition, decided and committed here (the active
        controller): answered once the ISR changes are committed."""

        def decide(_: int) -> tuple[Sequence[MetadataRecord], tuple[ErrorCode, list[IsrAnswer]]]:
            records, error, answers = alter_isr(
                self.image, broker_id, broker_epoch, changes, self.controller_min_isr
            )
            return records, (error, answers)

        return await self._propose_at(decide, atomic=False)

    async def elect_leaders(
        self, election_type: int, wanted: list[tuple[str, list[int]]] | None
    ) -> list[ElectionResult]:
        """An ElectLeaders request, decided and committed here (the active controller)."""

        def decide(_: QuorumController) -> tuple[Sequence[MetadataRecord], list[ElectionResult]]:
            return elect_leaders(self.image, election_type, wanted)

        return await self.propose(decide, atomic=False)

    async def unregister(self, broker_id: int) -> tuple[ErrorCode, str | None]:
        """An UnregisterBroker request, decided and committed here (the active controller)."""

        def decide(
            _: QuorumController,
        ) -> tuple[Sequence[MetadataRecord], tuple[ErrorCode, str | None]]:
            records, error, message = unregister(
                self.image, self.sessions, broker_id, self.unclean_allowed, self.controller_min_isr
            )
            return records, (error, message)

        return await self.propose(decide, atomic=False)

    async def allocate_producer_ids(
        self, broker_id: int, broker_epoch: int
    ) -> tuple[ErrorCode, range]:
        """A broker's AllocateProducerIds, decided and committed here (the active controller):
        the next block of producer ids, for a broker registered with that epoch (else
        STALE_BROKER_EPOCH, as Kafka's controller answers)."""

        def decide(
            controller: QuorumController,
        ) -> tuple[Sequence[MetadataRecord], tuple[ErrorCode, range]]:
            broker = self.image.brokers.get(broker_id)
            if broker is None or broker.epoch != broker_epoch:
                return (), (ErrorCode.stale_broker_epoch, range(0))
            records, block = controller.allocate_producer_ids(broker_id, broker_epoch)
            return records, (ErrorCode.none, block)

        return await self.propose(decide)

    async def alter_reassignments(
        self, wanted: list[Reassignment], *, allow_replication_factor_change: bool = True
    ) -> list[ReassignmentResult]:
        """An AlterPartitionReassignments request, decided and committed here (the active
        controller)."""

        def decide(
            _: QuorumController,
        ) -> tuple[Sequence[MetadataRecord], list[ReassignmentResult]]:
            return alter_reassignments(
                self.image,
                wanted,
                allow_replication_factor_change=allow_replication_factor_change,
            )

        return await self.propose(decide)

    async def list_reassignments(
        self, wanted: list[tuple[str, list[int]]] | None
    ) -> list[tuple[str, int, PartitionState]]:
        """A ListPartitionReassignments request, answered by the active controller from what
        it has committed (as Kafka's, so that a broker behind the log never answers stale)."""
        return await self.propose(lambda _: ((), ongoing(self.image, wanted)))

    async def _propose_at(
        self, decide: Callable[[int], tuple[Sequence[MetadataRecord], T]], *, atomic: bool = True
    ) -> T:
        """As `propose`, for records that name their own offset (a broker's epoch is the
        offset of its registration): `decide` is told where the first record will go."""
        async with self._lock:
            if not self.driver.is_active:
                raise NotController(self.driver.leader)
            first = self.driver.end_offset
            records, result = decide(first)
            if records:
                payloads = [encode_record(r) for r in records]
                await self.driver.propose(payloads, first_offset=first, atomic=atomic)
            return result

    def _on_leadership(self, active: bool) -> None:
        """The active controller's own tasks start with its leadership and end with it."""
        for task in (self._fencer, *self._periodic):
            if task is not None:
                task.cancel()
        self._fencer = None
        self._periodic = []
        if not active:
            return
        # This node's own broker, if it has not registered in this process yet, is a new
        # process of it: its old registration has no session to wait out.
        registering = "broker" in self.config.process_roles and self.broker_epoch < 0
        restarted = self.config.node_id if registering else None
        self.sessions.start(self.image, self._steady(), restarted=restarted)
        loop = asyncio.get_running_loop()
        self._fencer = loop.create_task(self._fence_expired())
        if self.config.auto_leader_rebalance_enable:
            self._periodic.append(loop.create_task(self._rebalance_leaders()))
        self._periodic.append(loop.create_task(self._elect_unclean()))

    async def _fence_expired(self) -> None:
        """Fence the brokers whose heartbeats stopped for `broker.session.timeout.ms`, for as
        long as this node is the active controller."""
        period = min(1.0, self.sessions.session_timeout_ms / 4000)
        while True:
            await asyncio.sleep(period)
            if not self.sessions.expired(self.image, self._steady()):
                continue
            try:
                await self.propose(self._fence_decision, atomic=False)
            except NotController:
                return

    async def _rebalance_leaders(self) -> None:
        """`auto.leader.rebalance.enable`: every `leader.imbalance.check.interval.seconds`, for
        as long as this node is the active controller, preferred elections for the partitions
        whose preferred replica is in the ISR and live but does not lead; a step that hit its
        bound is followed by the next at once."""
        period = float(self.config.leader_imbalance_check_interval_seconds)
        pause = period
        while True:
            await asyncio.sleep(pause)
            try:
                moved = await self.propose(self._rebalance_decision, atomic=False)
            except NotController:
                return
            except Exception:
                log.exception("the preferred-leader rebalance failed; trying again later")
                moved = 0
            pause = 0.01 if moved >= MAX_ELECTIONS_PER_REBALANCE else period

    async def _elect_unclean(self) -> None:
        """Every `unclean.leader.election.interval.ms`, for as long as this node is the active
        controller: leaderless partitions of topics with `unclean.leader.election.enable` get
        a live replica (a broker's fencing or return does it at once; this catches a setting
        turned on later)."""
        while True:
            await asyncio.sleep(self.config.unclean_leader_election_interval_ms / 1000)
            try:
                await self.propose(self._unclean_decision, atomic=False)
            except NotController:
                return
            except Exception:
                log.exception("unclean leader elections failed; trying again later")

    def _unclean_decision(self, _: QuorumController) -> tuple[list[MetadataRecord], None]:
        records = elect_unclean(self.image, self.unclean_allowed)
        if records:
            log.warning("unclean leader elections for %d leaderless partitions", len(records))
        return list(records), None

    def unclean_allowed(self, topic: str) -> bool:
        """`unclean.leader.election.enable` for `topic`, as the controller resolves it: the
        topic's setting, every broker's dynamic default, `server.properties`, false."""
        for configs in (self.image.topic_config(topic), self.cluster_dynamic_configs):
            value = configs.get("unclean.leader.election.enable")
            if value is not None:
                return value.strip().lower() == "true"
        return self.config.unclean_leader_election_enable

    def controller_min_isr(self, topic: str) -> int:
        """`min.insync.replicas` for `topic` as the controller resolves it for its eligible
        leader replicas (KIP-966): the topic's setting, every broker's dynamic default,
        `server.properties`, 1 (a broker's own dynamic setting is not the controller's)."""
        for configs in (self.image.topic_config(topic), self.cluster_dynamic_configs):
            value = configs.get("min.insync.replicas")
            if value is not None:
                try:
                    return int(value)
                except ValueError:
                    continue  # validated when set; a bad value falls through, never fails
        return self.config.min_insync_replicas

    def _rebalance_decision(self, _: QuorumController) -> tuple[list[MetadataRecord], int]:
        records = rebalance(self.image)
        if records:
            log.info("moving %d partition leaders back to their preferred replicas", len(records))
        return list(records), len(records)

    def _fence_decision(self, _: QuorumController) -> tuple[list[MetadataRecord], None]:
        expired = self.sessions.expired(self.image, self._steady())
        if expired:
            log.warning(
                "fencing brokers %s: no heartbeat for %d ms",
                expired,
                self.sessions.session_timeout_ms,
            )
        return fence(self.image, expired, self.unclean_allowed, self.controller_min_isr), None

    @property
    def broker_dynamic_configs(self) -> dict[str, str]:
        """Settings kafka-configs set for this broker (`--entity-name <node.id>`)."""
        return self.image.configs.get((BROKER_RESOURCE, str(self.config.node_id)), {})

    @property
    def cluster_dynamic_configs(self) -> dict[str, str]:
        """Settings kafka-configs set for every broker (`--entity-default`)."""
        return self.image.configs.get((BROKER_RESOURCE, ""), {})

    def min_insync_replicas(self, topic: str) -> int:
        """`min.insync.replicas` for a produce to `topic`, resolved as Kafka does (topic →
        this broker's dynamic setting → the cluster's → server.properties → 1) with a few
        dictionary lookups rather than the whole config chain."""
        for configs in (
            self.image.topic_config(topic),
            self.broker_dynamic_configs,
            self.cluster_dynamic_configs,
        ):
            value = configs.get("min.insync.replicas")
            if value is not None:
                try:
                    return int(value)
                except ValueError:
                    continue  # validated when set; a bad value falls through, never fails
        return self.config.min_insync_replicas

    def resolved_topic_configs(self, overrides: Mapping[str, str]) -> list[ResolvedConfig]:
        """Every topic setting for a topic with `overrides`, with its effective value and
        source: the one place the topic → dynamic broker → static broker → default chain is
        assembled."""
        return resolve_topic_configs(
            overrides,
            self.config.properties,
            self.broker_dynamic_configs,
            self.cluster_dynamic_configs,
        )

    def topic_log_config(self, topic: str) -> LogConfig:
        """The storage settings of `topic`: its own, over dynamic and static broker ones.
        Resolved once per set of those settings (creating or taking over thousands of
        partitions of a topic asks for each one: resolving the whole chain every time was a
        tenth to a quarter of a node's event loop then)."""
        overrides = self.image.topic_config(topic)
        key = (  # the static settings (`self.config`) never change
            tuple(sorted(overrides.items())),
            tuple(sorted(self.broker_dynamic_configs.items())),
            tuple(sorted(self.cluster_dynamic_configs.items())),
        )
        found = self._log_configs.get(key)
        if found is None:
            if len(self._log_configs) >= _LOG_CONFIGS_KEPT:
                self._log_configs.clear()
            found = self._log_configs[key] = log_config(self.resolved_topic_configs(overrides))
        return found

    async def resign(self) -> None:
        """Hand the active controller's role to another voter (a controlled shutdown's first
        step): the quorum elects a successor while this node winds down."""
        await self.driver.resign()

    async def close(self) -> None:
        """Resign leadership, if held, so the voters elect another at once; then stop."""
        for task in (self._fencer, *self._periodic):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.driver.stop()


def _record_type(payload: bytes) -> str:
    """The record type a metadata record value names (the second varint of its frame), for a
    record that did not decode."""
    fields: list[int] = []
    value = shift = 0
    for byte in payload[:10]:
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            fields.append(value)
            value = shift = 0
            if len(fields) == 2:
                break
    if len(fields) < 2:
        return "unreadable record"
    record_type = RECORD_TYPES.get(fields[1])
    return f"record of type {fields[1]}" if record_type is None else record_type.__name__
