"""Brokers joining and leaving the cluster, as the active controller decides it (KIP-631):
registration, heartbeats, fencing, and controlled shutdown.

Pure, like the rest of the controller: the image and the request in, records and an answer
out. Liveness is the one thing that is not in the log: `BrokerSessions` is the active
controller's memory of when each broker last sent a heartbeat (Kafka's
`BrokerHeartbeatManager`). A controller that has just become active gives every registered
broker a whole session, since it cannot know when they last reached its predecessor.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from broker.protocol.errors import ErrorCode

from .elections import elect_returning, move_off, no_unclean, one_min_isr
from .image import MetadataImage
from .records import (
    FENCE,
    BrokerEndpoint,
    BrokerRegistrationChangeRecord,
    FeatureLevelRecord,
    FenceBrokerRecord,
    MetadataRecord,
    RegisterBrokerRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
)

__all__ = [
    "METADATA_VERSION",
    "BrokerSessions",
    "Heartbeat",
    "HeartbeatAnswer",
    "Registration",
    "RegistrationAnswer",
    "fence",
    "heartbeat",
    "register",
    "unregister",
]

METADATA_VERSION = 21
"""`metadata.version` feature level written when a cluster is formatted (Kafka 3.9-IV0)."""


@dataclass(frozen=True, slots=True)
class Registration:
    """A BrokerRegistration request."""

    broker_id: int
    incarnation_id: uuid.UUID
    cluster_id: str
    listeners: tuple[BrokerEndpoint, ...]
    rack: str | None = None
    log_dirs: tuple[uuid.UUID, ...] = ()
    """The directory ids of the broker's online log dirs (KIP-858)."""
    previous_broker_epoch: int = -1
    """The epoch the broker had when it last shut down cleanly (KIP-966), -1 if it did not:
    a broker that crashed, or lost the disk its clean-shutdown marker was on, may have lost
    records, and leaves every ISR and ELR."""


@dataclass(frozen=True, slots=True)
class RegistrationAnswer:
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    broker_epoch: int = -1


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A BrokerHeartbeat request: `metadata_offset` is the last metadata offset the broker
    has applied (-1: none)."""

    broker_id: int
    broker_epoch: int
    metadata_offset: int
    want_fence: bool = False
    want_shut_down: bool = False


@dataclass(frozen=True, slots=True)
class HeartbeatAnswer:
    error: ErrorCode = ErrorCode.none
    is_caught_up: bool = False
    is_fenced: bool = True
    should_shut_down: bool = False


class BrokerSessions:
    """When each broker last reached the active controller, in the controller's clock."""

    def __init__(self, session_timeout_ms: int) -> None:
        self.session_timeout_ms = session_timeout_ms
        self._last: dict[int, int] = {}
        self.shutdown_offsets: dict[int, int] = {}
        """Brokers in controlled shutdown: the offset of the records that moved their
        leaderships, which each must have applied before it is let go."""

    def start(self, image: MetadataImage, now_ms: int, *, restarted: int | None = None) -> None:
        """This controller has just become active: every unfenced broker has a whole session
        from now, but `restarted`, a broker known to be a new process (this very node,
        starting again after a crash: its log dirs are locked to this process)."""
        self._last = {
            broker.broker_id: now_ms
            for broker in image.brokers.values()
            if not broker.fenced and broker.broker_id != restarted
        }

    def touch(self, broker_id: int, now_ms: int) -> None:
        self._last[broker_id] = now_ms

    def end(self, broker_id: int) -> None:
        """The broker shut down cleanly: its next process need not wait for a session."""
        self._last.pop(broker_id, None)

    def alive(self, broker_id: int, now_ms: int) -> bool:
        last = self._last.get(broker_id)
        return last is not None and now_ms - last < self.session_timeout_ms

    def expired(self, image: MetadataImage, now_ms: int) -> list[int]:
        """Unfenced brokers whose session ran out: the ones to fence."""
        return [
            broker.broker_id
            for broker in image.brokers.values()
            if not broker.fenced and not self.alive(broker.broker_id, now_ms)
        ]


def register(
    image: MetadataImage,
    sessions: BrokerSessions,
    request: Registration,
    *,
    cluster_id: str,
    next_offset: int,
    now_ms: int,
    unclean: Callable[[str], bool] = no_unclean,
    min_isr: Callable[[str], int] = one_min_isr,
) -> tuple[list[MetadataRecord], RegistrationAnswer]:
    """Register a broker, fenced until it has caught up with the metadata log. Its epoch is
    the offset of its registration record (`next_offset` is where the records go). The same
    process registering again (a retry) keeps its epoch; another process with the same node id
    is refused while the first one's session lasts."""
    if request.cluster_id != cluster_id:
        return [], RegistrationAnswer(
            ErrorCode.inconsistent_cluster_id,
            f"Expected cluster ID {cluster_id}, but got cluster ID {request.cluster_id}",
        )
    registered = image.registration(request.broker_id)
    if registered is not None:
        if registered.incarnation_id == request.incarnation_id:
            sessions.touch(request.broker_id, now_ms)
            return [], RegistrationAnswer(broker_epoch=registered.broker_epoch)
        if sessions.alive(request.broker_id, now_ms):
            return [], RegistrationAnswer(
                ErrorCode.duplicate_broker_registration,
                f"Another broker is registered with node id {request.broker_id} and its "
                f"session has not expired (incarnation {registered.incarnation_id})",
            )
    records: list[MetadataRecord] = []
    if "metadata.version" not in image.features:
        records.append(FeatureLevelRecord("metadata.version", METADATA_VERSION))
    previous = image.brokers.get(request.broker_id)
    leaving: set[int] = set()
    if previous is not None and not previous.fenced:
        # A new process under a live registration's id (the old one died unnoticed): the old
        # one's leaderships and ISR places go first, as if it had been fenced.
        leaving.add(request.broker_id)
    lost: frozenset[int] = frozenset()
    if registered is not None and _may_have_lost_records(registered, request):
        lost = frozenset({request.broker_id})
    if leaving or lost:
        records.extend(move_off(image, leaving, unclean, min_isr, lost=lost))
    epoch = next_offset + len(records)
    records.append(
        RegisterBrokerRecord(
            broker_id=request.broker_id,
            incarnation_id=request.incarnation_id,
            broker_epoch=epoch,
            end_points=request.listeners,
            rack=request.rack,
            fenced=True,
            log_dirs=request.log_dirs,
        )
    )
    sessions.touch(request.broker_id, now_ms)
    sessions.shutdown_offsets.pop(request.broker_id, None)
    return records, RegistrationAnswer(broker_epoch=epoch)


def _may_have_lost_records(previous: RegisterBrokerRecord, request: Registration) -> bool:
    """KIP-966's unclean shutdown, and KIP-858's lost directory: the broker did not shut down
    cleanly as the registration it replaces (its clean-shutdown marker names another epoch,
    or none), or a log dir it had is gone (a new disk has a new directory id)."""
    if request.previous_broker_epoch != previous.broker_epoch:
        return True
    return bool(previous.log_dirs) and not set(previous.log_dirs) <= set(request.log_dirs)


def heartbeat(
    image: MetadataImage,
    sessions: BrokerSessions,
    request: Heartbeat,
    *,
    now_ms: int,
    unclean: Callable[[str], bool] = no_unclean,
    next_offset: int = -1,
    min_isr: Callable[[str], int] = one_min_isr,
) -> tuple[list[MetadataRecord], HeartbeatAnswer]:
    """A broker's heartbeat keeps its session; it is unfenced once it has applied the log up
    to its own registration (and elected where it is the only in-sync replica left), fenced
    when it asks, and told it may shut down once it asked to and has applied the records
    that moved its leaderships to other in-sync replicas and took it out of every ISR (as
    Kafka's controller waits for its controlled shutdown offset): until then it still
    answers its clients, with the new leaders' names. `next_offset` is where the records
    returned will be committed."""
    broker = image.brokers.get(request.broker_id)
    if broker is None or broker.epoch != request.broker_epoch:
        return [], HeartbeatAnswer(ErrorCode.stale_broker_epoch)
    caught_up = request.metadata_offset >= broker.epoch
    records: list[MetadataRecord] = []
    fenced = broker.fenced
    if request.want_shut_down:
        sessions.end(request.broker_id)
        # What is left to move, each time: a decision is written in parts, and a controller
        # elected between two parts finds only some of it committed.
        records.extend(move_off(image, {broker.broker_id}, unclean, min_isr))
        if not broker.in_controlled_shutdown or not broker.fenced:
            records.append(  # last: once it is committed, so is every move before it
                BrokerRegistrationChangeRecord(
                    broker.broker_id, broker.epoch, fenced=FENCE, in_controlled_shutdown=1
                )
            )
        if records:
            sessions.shutdown_offsets[broker.broker_id] = next_offset + len(records) - 1
        # A controller that became active since knows only that it is all committed.
        shutdown_offset = sessions.shutdown_offsets.setdefault(broker.broker_id, image.offset)
        return records, HeartbeatAnswer(
            is_caught_up=caught_up,
            is_fenced=True,
            should_shut_down=request.metadata_offset >= shutdown_offset,
        )
    sessions.touch(request.broker_id, now_ms)
    # The broker's own record goes last (as Kafka writes them): a decision is written in
    # parts, and until the last is committed the broker is as it was, so the same decision is
    # taken again, for what is left, by whichever controller is active then.
    if request.want_fence:
        if not broker.fenced:
            records.extend(move_off(image, {broker.broker_id}, unclean, min_isr))
            records.append(FenceBrokerRecord(broker.broker_id, broker.epoch))
        fenced = True
    elif broker.fenced and caught_up and not broker.in_controlled_shutdown:
        records.extend(elect_returning(image, broker.broker_id, unclean, min_isr))
        records.append(UnfenceBrokerRecord(broker.broker_id, broker.epoch))
        fenced = False
    return records, HeartbeatAnswer(is_caught_up=caught_up, is_fenced=fenced)


def unregister(
    image: MetadataImage,
    sessions: BrokerSessions,
    broker_id: int,
    unclean: Callable[[str], bool] = no_unclean,
    min_isr: Callable[[str], int] = one_min_isr,
) -> tuple[list[MetadataRecord], ErrorCode, str | None]:
    """An operator removes a broker from the cluster for good (UnregisterBroker, KIP-631;
    what a scale-down does once the broker is gone): its leaderships and ISR places go as if
    it were fenced, then its registration. A process still running under that id is refused
    its next heartbeat and registers again."""
    broker = image.brokers.get(broker_id)
    if broker is None:
        return (
            [],
            ErrorCode.broker_id_not_registered,
            (f"Broker ID {broker_id} is not currently registered"),
        )
    records: list[MetadataRecord] = list(move_off(image, {broker_id}, unclean, min_isr))
    records.append(UnregisterBrokerRecord(broker_id, broker.epoch))
    sessions.end(broker_id)
    sessions.shutdown_offsets.pop(broker_id, None)
    return records, ErrorCode.none, None


def fence(
    image: MetadataImage,
    broker_ids: list[int],
    unclean: Callable[[str], bool] = no_unclean,
    min_isr: Callable[[str], int] = one_min_isr,
) -> list[MetadataRecord]:
    """Fence brokers whose sessions expired; their leaderships and ISR places go."""
    fencing = [
        broker_id
        for broker_id in broker_ids
        if broker_id in image.brokers and not image.brokers[broker_id].fenced
    ]
    if not fencing:
        return []
    # The fences last: until they are committed the brokers are still expired and unfenced,
    # so a controller that finds only the first parts committed fences them again.
    records: list[MetadataRecord] = list(move_off(image, set(fencing), unclean, min_isr))
    records += [FenceBrokerRecord(b, image.brokers[b].epoch) for b in fencing]
    return records
