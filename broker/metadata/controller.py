"""The quorum controller's decisions: admin requests in, metadata records and results out.

Pure: each method reads the image, validates the request with Kafka's rules and error codes, and
returns the records that carry it out plus the per-item results. It changes nothing itself; the
records take effect when the metadata log has committed them and the image applies them, so a
failed write leaves no half-made topic. Randomness (topic ids) is passed in.
"""

from __future__ import annotations

import collections
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from broker.protocol.errors import ErrorCode
from broker.storage.config import InvalidConfig

from .broker_configs import BROKER_CONFIGS, invalid_broker_update, is_list_config
from .configs import TOPIC_CONFIGS, ConfigType, validate_topic_configs
from .image import (
    BROKER_ONLY_TOPICS,
    BROKER_RESOURCE,
    CLUSTER_METADATA_TOPIC,
    TOPIC_RESOURCE,
    MetadataImage,
)
from .placement import UsableBroker, place, usable_brokers
from .records import (
    ConfigRecord,
    MetadataRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RemoveTopicRecord,
    TopicRecord,
)

__all__ = [
    "MAX_RECORDS_PER_USER_OP",
    "PRODUCER_ID_BLOCK_SIZE",
    "ConfigOp",
    "Outcome",
    "QuorumController",
    "TopicRequest",
    "TopicResult",
    "validate_topic_name",
]

PRODUCER_ID_BLOCK_SIZE = 1000
"""Producer ids handed to a broker at a time (Kafka's ProducerIdsBlock size)."""

MAX_RECORDS_PER_USER_OP = 10_000
"""The most metadata records one admin operation may write (Kafka's QuorumController bound):
a topic with 10 000 partitions or more, or a request creating that many, is refused whole
rather than half-applied, and no single commit grows past what a restart replays quickly."""

MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")


def validate_topic_name(name: str) -> str | None:
    """Kafka's topic name rules; the message Kafka gives, or None when the name is legal."""
    if not name:
        return "Topic name is illegal, it can't be empty"
    if name in (".", ".."):
        return 'Topic name cannot be "." or ".."'
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        return (
            f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LENGTH} characters, "
            f"topic name: {name}"
        )
    if not _LEGAL_TOPIC.match(name):
        return (
            f'Topic name "{name}" is illegal, it contains a character other than ASCII '
            "alphanumerics, '.', '_' and '-'"
        )
    return None


@dataclass(frozen=True, slots=True)
class TopicRequest:
    name: str
    num_partitions: int = -1
    """-1: the broker's `num.partitions`."""
    replication_factor: int = -1
    """-1: the broker's `default.replication.factor`."""
    assignments: Mapping[int, Sequence[int]] = field(default_factory=dict)
    configs: Mapping[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TopicResult:
    name: str
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    topic_id: uuid.UUID | None = None
    num_partitions: int = -1
    replication_factor: int = -1

    @property
    def ok(self) -> bool:
        return self.error == ErrorCode.none


@dataclass(frozen=True, slots=True)
class ConfigOp:
    """One IncrementalAlterConfigs operation (AlterConfigs is a SET of everything)."""

    name: str
    op: int
    """0 SET, 1 DELETE, 2 APPEND, 3 SUBTRACT (Kafka's AlterConfigOp.OpType ids)."""
    value: str | None


@dataclass(frozen=True, slots=True)
class Outcome:
    error: ErrorCode = ErrorCode.none
    message: str | None = None


_TOPIC_NAME_OF = {d.broker_name: d.name for d in TOPIC_CONFIGS.values() if d.broker_name}
"""Broker-level name → the topic config it sets the default of."""


class QuorumController:
    def __init__(
        self,
        image: MetadataImage,
        *,
        num_partitions: int,
        replication_factor: int,
        new_topic_id: Callable[[], uuid.UUID] = uuid.uuid4,
    ) -> None:
        self.image = image
        self.num_partitions = num_partitions
        self.replication_factor = replication_factor
        self._new_topic_id = new_topic_id

    # -- topics -----------------------------------------------------------------------------

    def create_topics(
        self, requests: Sequence[TopicRequest], *, by_broker: bool = False
    ) -> tuple[list[MetadataRecord], list[TopicResult]]:
        """`by_broker`: the broker itself creates an internal topic (`__consumer_offsets` on
        the first group request); a client may not. A request whose records would exceed
        `MAX_RECORDS_PER_USER_OP` is refused whole, every topic with POLICY_VIOLATION."""
        records: list[MetadataRecord] = []
        results: list[TopicResult] = []
        # At least a TopicRecord and a PartitionRecord per partition each: a request that asks
        # for more than one operation may write is refused before any record is built.
        least = sum(1 + self._partitions_asked(r) for r in requests)
        if least > MAX_RECORDS_PER_USER_OP:
            message = (
                f"{_EXCESSIVE}: it would write at least {least} metadata records, more than "
                f"the {MAX_RECORDS_PER_USER_OP} one operation may write."
            )
            return [], [TopicResult(r.name, ErrorCode.policy_violation, message) for r in requests]
        counts = collections.Counter(r.name for r in requests)
        creating: set[str] = set()
        start = self._partitions_held()
        for request in requests:
            if counts[request.name] > 1:
                results.append(
                    TopicResult(
                        request.name,
                        ErrorCode.invalid_request,
                        f"Create topics request from client contains multiple entries for "
                        f"topic {request.name}",
                    )
                )
                continue
            try:
                result, topic_records = self._create_topic(
                    request,
                    creating,
                    by_broker,
                    MAX_RECORDS_PER_USER_OP - len(records),
                    start,
                )
            except _TooLarge as exc:
                refused = Outcome(ErrorCode.policy_violation, str(exc))
                return [], [TopicResult(r.name, refused.error, refused.message) for r in requests]
            results.append(result)
            if result.ok:
                creating.add(request.name)
                records.extend(topic_records)
                start += result.num_partitions
        return records, results

    def _partitions_asked(self, request: TopicRequest) -> int:
        if request.assignments:
            return len(request.assignments)
        return (
            self.num_partitions if request.num_partitions == -1 else max(request.num_partitions, 0)
        )

    def _partitions_held(self) -> int:
        """Where a placement starts in the cluster's sequence of partitions: after every one
        the cluster has (and, in a request of several topics, after those placed before), so
        that successive topics carry the leaders' rotation on instead of starting it again on
        the same broker. Read from the image, it is the same on every controller."""
        return sum(len(topic.partitions) for topic in self.image.topics.values())

    def _create_topic(
        self,
        request: TopicRequest,
        creating: set[str],
        by_broker: bool,
        budget: int,
        start: int,
    ) -> tuple[TopicResult, list[MetadataRecord]]:
        name = request.name
        illegal = validate_topic_name(name)
        if illegal is not None:
            return TopicResult(name, ErrorCode.invalid_topic_exception, illegal), []
        if name == CLUSTER_METADATA_TOPIC or (name in BROKER_ONLY_TOPICS and not by_broker):
            return TopicResult(
                name, ErrorCode.invalid_request, f"Creation of internal topic {name} is prohibited."
            ), []
        if name in self.image.topics:
            return TopicResult(
                name, ErrorCode.topic_already_exists, f"Topic '{name}' already exists."
            ), []
        collision = self._collides(name, creating)
        if collision is not None:
            return TopicResult(
                name,
                ErrorCode.invalid_topic_exception,
                f"Topic '{name}' collides with existing topic: {collision}",
            ), []
        try:
            validate_topic_configs(request.configs)
        except InvalidConfig as exc:
            return TopicResult(name, ErrorCode.invalid_config, str(exc)), []
        usable = usable_brokers(self.image.brokers.values())
        if request.assignments:
            if request.num_partitions != -1 or request.replication_factor != -1:
                return TopicResult(
                    name,
                    ErrorCode.invalid_request,
                    "Both numPartitions or replicationFactor and replicasAssignments were set. "
                    "Both cannot be used at the same time.",
                ), []
            _within(1 + len(request.assignments) + len(request.configs), budget)
            assignments = {p: tuple(r) for p, r in request.assignments.items()}
            problem = _check_assignments(self.image, assignments, first_partition=0)
            if problem is not None:
                return TopicResult(name, ErrorCode.invalid_replica_assignment, problem), []
        else:
            partitions = request.num_partitions
            if partitions == -1:
                partitions = self.num_partitions
            if partitions <= 0:
                return TopicResult(
                    name,
                    ErrorCode.invalid_partitions,
                    "Number of partitions was set to an invalid non-positive value.",
                ), []
            factor = request.replication_factor
            if factor == -1:
                factor = self.replication_factor
            if factor <= 0:
                return TopicResult(
                    name,
                    ErrorCode.invalid_replication_factor,
                    "Replication factor must be larger than 0, or -1 to use the default value.",
                ), []
            unplaceable = _unplaceable(
                factor,
                usable,
                too_few=f"The target replication factor of {factor} cannot be reached because "
                f"only {len(usable)} broker(s) are registered.",
            )
            if unplaceable is not None:
                return TopicResult(name, ErrorCode.invalid_replication_factor, unplaceable), []
            _within(1 + partitions + len(request.configs), budget)
            placed = place(usable, partitions=partitions, factor=factor, start=start)
            assignments = dict(enumerate(placed))
        topic_id = self._new_topic_id()
        records: list[MetadataRecord] = [TopicRecord(name, topic_id)]
        records.extend(_partition_records(topic_id, assignments, self.image.usable_broker_ids()))
        records.extend(
            ConfigRecord(TOPIC_RESOURCE, name, key, value)
            for key, value in sorted(request.configs.items())
            if value is not None
        )
        factor = len(next(iter(assignments.values())))
        return TopicResult(name, ErrorCode.none, None, topic_id, len(assignments), factor), records

    def _collides(self, name: str, creating: set[str]) -> str | None:
        """Kafka refuses names that differ only by '.' vs '_' (metric names would clash)."""
        canonical = name.replace(".", "_")
        for existing in (*self.image.topics, *creating):
            if existing != name and existing.replace(".", "_") == canonical:
                return existing
        return None

    def delete_topics(
        self, names: Sequence[str], ids: Sequence[uuid.UUID] = ()
    ) -> tuple[list[MetadataRecord], list[tuple[str | None, uuid.UUID | None, Outcome]]]:
        """Results are (name, id, outcome) in request order: names first, then ids. More
        topics than `MAX_RECORDS_PER_USER_OP` are refused whole, as Kafka refuses them."""
        if len(names) + len(ids) > MAX_RECORDS_PER_USER_OP:
            refused = Outcome(
                ErrorCode.policy_violation,
                f"{_EXCESSIVE}: it names {len(names) + len(ids)} topics, more than the "
                f"{MAX_RECORDS_PER_USER_OP} one operation may delete.",
            )
            return [], [(name, None, refused) for name in names] + [
                (None, topic_id, refused) for topic_id in ids
            ]
        records: list[MetadataRecord] = []
        results: list[tuple[str | None, uuid.UUID | None, Outcome]] = []
        removed: set[uuid.UUID] = set()
        for name in names:
            topic = self.image.topics.get(name)
            if topic is None:
                results.append(
                    (
                        name,
                        None,
                        Outcome(
                            ErrorCode.unknown_topic_or_partition,
                            "This server does not host this topic-partition.",
                        ),
                    )
                )
                continue
            if topic.topic_id not in removed:
                removed.add(topic.topic_id)
                records.append(RemoveTopicRecord(topic.topic_id))
            results.append((name, topic.topic_id, Outcome()))
        for topic_id in ids:
            topic = self.image.topics_by_id.get(topic_id)
            if topic is None:
                results.append(
                    (None, topic_id, Outcome(ErrorCode.unknown_topic_id, "Unknown topic id"))
                )
                continue
            if topic.topic_id not in removed:
                removed.add(topic.topic_id)
                records.append(RemoveTopicRecord(topic.topic_id))
            results.append((topic.name, topic_id, Outcome()))
        return records, results

    def create_partitions_all(
        self, requests: Sequence[tuple[str, int, Sequence[Sequence[int]] | None]]
    ) -> tuple[list[MetadataRecord], list[Outcome]]:
        """One CreatePartitions request, (topic, new count, assignments) per topic, as one
        operation: refused whole, every topic with POLICY_VIOLATION, if its records would
        exceed `MAX_RECORDS_PER_USER_OP`."""
        records: list[MetadataRecord] = []
        outcomes: list[Outcome] = []
        start = self._partitions_held()
        for name, count, assignments in requests:
            try:
                topic_records, outcome = self.create_partitions(
                    name,
                    count,
                    assignments,
                    budget=MAX_RECORDS_PER_USER_OP - len(records),
                    start=start,
                )
            except _TooLarge as exc:
                return [], [Outcome(ErrorCode.policy_violation, str(exc)) for _ in requests]
            records.extend(topic_records)
            outcomes.append(outcome)
            start += len(topic_records)  # one PartitionRecord per new partition
        return records, outcomes

    def create_partitions(
        self,
        topic_name: str,
        count: int,
        assignments: Sequence[Sequence[int]] | None,
        *,
        budget: int | None = None,
        start: int | None = None,
    ) -> tuple[list[MetadataRecord], Outcome]:
        """Grow one topic to `count` partitions; `_TooLarge` if that takes more than `budget`
        records (by default `MAX_RECORDS_PER_USER_OP`). `start`: where the new partitions
        start in the cluster's sequence of placed partitions (by default, after the cluster's
        own)."""
        topic = self.image.topics.get(topic_name)
        if topic is None:
            return [], Outcome(
                ErrorCode.unknown_topic_or_partition,
                "This server does not host this topic-partition.",
            )
        if topic_name in BROKER_ONLY_TOPICS:
            return [], Outcome(
                ErrorCode.invalid_request,
                f"Cannot add partitions to internal topic {topic_name}: the broker maps each "
                "group to one of its partitions by the partition count, so existing groups "
                "would lose their state.",
            )
        current = len(topic.partitions)
        if count < current:
            return [], Outcome(
                ErrorCode.invalid_partitions,
                f"The topic {topic_name} currently has {current} partition(s); {count} would not "
                "be an increase.",
            )
        if count == current:
            return [], Outcome(
                ErrorCode.invalid_partitions, f"Topic already has {current} partition(s)."
            )
        _within(count - current, MAX_RECORDS_PER_USER_OP if budget is None else budget)
        usable = usable_brokers(self.image.brokers.values())
        factor = len(topic.partitions[0].replicas)
        new_partitions = range(current, count)
        if assignments:
            if len(assignments) != len(new_partitions):
                return [], Outcome(
                    ErrorCode.invalid_replica_assignment,
                    f"Attempted to add {len(new_partitions)} additional partitions, but only "
                    f"{len(assignments)} assignment(s) were specified.",
                )
            placed = {p: tuple(a) for p, a in zip(new_partitions, assignments, strict=True)}
            problem = _check_assignments(self.image, placed, first_partition=current)
            if problem is not None:
                return [], Outcome(ErrorCode.invalid_replica_assignment, problem)
        else:
            unplaceable = _unplaceable(
                factor, usable, too_few=f"only {len(usable)} broker(s) are registered."
            )
            if unplaceable is not None:
                return [], Outcome(ErrorCode.invalid_replication_factor, unplaceable)
            if start is None:
                start = self._partitions_held()
            lists = place(usable, partitions=len(new_partitions), factor=factor, start=start)
            placed = dict(zip(new_partitions, lists, strict=True))
        active = self.image.usable_broker_ids()
        return list(_partition_records(topic.topic_id, placed, active)), Outcome()

    # -- configs ----------------------------------------------------------------------------

    def alter_configs(
        self, resource_type: int, resource_name: str, ops: Sequence[ConfigOp], *, replace: bool
    ) -> tuple[list[MetadataRecord], Outcome]:
        """`replace`: AlterConfigs semantics (the given set becomes the whole set);
        otherwise IncrementalAlterConfigs."""
        if resource_type == TOPIC_RESOURCE:
            if resource_name not in self.image.topics:
                return [], Outcome(
                    ErrorCode.unknown_topic_or_partition,
                    f"The topic '{resource_name}' does not exist.",
                )
        elif resource_type == BROKER_RESOURCE:
            if resource_name and (
                not resource_name.isdigit() or int(resource_name) not in self.image.brokers
            ):
                return [], Outcome(
                    ErrorCode.invalid_request, f"Unknown broker id {resource_name!r}"
                )
        else:
            return [], Outcome(
                ErrorCode.invalid_request, f"Unsupported resource type {resource_type}"
            )
        current = dict(self.image.configs.get((resource_type, resource_name), {}))
        updated = {} if replace else dict(current)
        for op in ops:
            if resource_type == TOPIC_RESOURCE and op.name not in TOPIC_CONFIGS:
                return [], Outcome(
                    ErrorCode.invalid_config, f"Unknown topic config name: {op.name}"
                )
            outcome = _apply_op(updated, op, resource_type)
            if outcome is not None:
                return [], outcome
        if resource_type == BROKER_RESOURCE:
            # Kafka checks the whole set the level would hold, not only the names sent.
            refused = invalid_broker_update(updated, per_broker=bool(resource_name))
            if refused is not None:
                return [], Outcome(ErrorCode.invalid_request, refused)
        # A broker-level default is held to the rules of the topic config it is the default of.
        as_topic = (
            updated
            if resource_type == TOPIC_RESOURCE
            else {_TOPIC_NAME_OF[k]: v for k, v in updated.items() if k in _TOPIC_NAME_OF}
        )
        try:
            validate_topic_configs(as_topic)
        except InvalidConfig as exc:
            error = (
                ErrorCode.invalid_config
                if resource_type == TOPIC_RESOURCE
                else ErrorCode.invalid_request
            )
            return [], Outcome(error, str(exc))
        records: list[MetadataRecord] = []
        for key in sorted(set(current) | set(updated)):
            if current.get(key) != updated.get(key):
                records.append(ConfigRecord(resource_type, resource_name, key, updated.get(key)))
        return records, Outcome()

    # -- producer ids -----------------------------------------------------------------------

    def allocate_producer_ids(
        self, broker_id: int, broker_epoch: int
    ) -> tuple[list[MetadataRecord], range]:
        start = self.image.next_producer_id
        end = start + PRODUCER_ID_BLOCK_SIZE
        return [ProducerIdsRecord(broker_id, broker_epoch, end)], range(start, end)


_EXCESSIVE = "Unable to perform excessively large batch operation"
"""Kafka's message when one controller operation would write too many records."""


class _TooLarge(Exception):
    """One admin operation would write more than `MAX_RECORDS_PER_USER_OP` records."""


def _within(records: int, budget: int) -> None:
    if records > budget:
        raise _TooLarge(
            f"{_EXCESSIVE}: it would write {MAX_RECORDS_PER_USER_OP - budget + records} "
            f"metadata records, more than the {MAX_RECORDS_PER_USER_OP} one operation may write."
        )


def _list_default(resource_type: int, name: str) -> str | None:
    """What APPEND and SUBTRACT start from when the resource does not set `name`: Kafka's
    default for it (as Kafka's ConfigurationControlManager and ConfigAdminManager do), not
    nothing; None if `name` is not a list config, which they refuse."""
    if resource_type == TOPIC_RESOURCE:
        topic = TOPIC_CONFIGS.get(name)
        return topic.default if topic is not None and topic.type == ConfigType.LIST else None
    if not is_list_config(name):
        return None
    return BROKER_CONFIGS[name].default or ""


def _apply_op(configs: dict[str, str], op: ConfigOp, resource_type: int) -> Outcome | None:
    if op.op == 0:
        if op.value is None:
            return Outcome(ErrorCode.invalid_request, f"Null value not supported for {op.name}")
        configs[op.name] = op.value
    elif op.op == 1:
        configs.pop(op.name, None)
    elif op.op in (2, 3):
        default = _list_default(resource_type, op.name)
        if default is None:
            if resource_type == BROKER_RESOURCE and op.name not in BROKER_CONFIGS:
                return Outcome(ErrorCode.invalid_config, f"Unknown config name: {op.name}")
            verb = "append" if op.op == 2 else "subtract"
            return Outcome(
                ErrorCode.invalid_config,
                f"Config value {verb} is not allowed for config key: {op.name}",
            )
        # A list not set here starts from its default: APPEND compact to a topic without a
        # cleanup.policy gives delete,compact, as in Kafka, not compact alone.
        items = [v.strip() for v in configs.get(op.name, default).split(",") if v.strip()]
        given = [v for v in (op.value or "").split(",") if v]
        if op.op == 2:
            items.extend(v for v in given if v not in items)
        else:
            items = [v for v in items if v not in given]
        configs[op.name] = ",".join(items)
    else:
        return Outcome(ErrorCode.invalid_request, f"Unknown config operation {op.op}")
    return None


_ALL_FENCED = "All brokers are currently fenced."
"""Kafka's refusal when no broker could lead a new partition."""


def _unplaceable(factor: int, usable: Sequence[UsableBroker], *, too_few: str) -> str | None:
    """Why `factor` replicas cannot be placed on the usable brokers, in Kafka's order: no
    broker could lead, then too few brokers (a fenced one may hold a follower, so it counts);
    None when they can. A cluster with no broker at all is told so, not that all are fenced."""
    if usable and not any(not b.fenced for b in usable):
        return f"Unable to replicate the partition {factor} time(s): {_ALL_FENCED}"
    if factor > len(usable):
        return f"Unable to replicate the partition {factor} time(s): {too_few}"
    return None


def _check_assignments(
    image: MetadataImage, assignments: Mapping[int, tuple[int, ...]], first_partition: int
) -> str | None:
    """Kafka's checks of a manual assignment: it may name any registered broker, fenced or
    not (a stopped broker stays registered until it is unregistered), but each partition
    needs one active replica to lead it."""
    expected = list(range(first_partition, first_partition + len(assignments)))
    if sorted(assignments) != expected:
        return "Partitions must be numbered consecutively from " + str(first_partition)
    sizes = {len(r) for r in assignments.values()}
    if len(sizes) != 1 or 0 in sizes:
        return "All partitions must have the same, non-zero number of replicas"
    active = image.usable_broker_ids()
    for partition, replicas in assignments.items():
        if len(set(replicas)) != len(replicas):
            return f"Duplicate brokers not allowed in replica assignment of partition {partition}"
        unknown = [b for b in replicas if b not in image.brokers]
        if unknown:
            return (
                f"The manual partition assignment includes broker {unknown[0]}, but no such "
                "broker is registered."
            )
        if not any(b in active for b in replicas):
            return (
                "All brokers specified in the manual partition assignment for partition "
                f"{partition} are fenced or in controlled shutdown."
            )
    return None


def _partition_records(
    topic_id: uuid.UUID, assignments: Mapping[int, tuple[int, ...]], active: set[int]
) -> list[PartitionRecord]:
    """New partitions: only the active replicas start in the ISR (Kafka's rule: a fenced
    broker, or one shutting down, has yet to catch up), and the first of them leads, so a
    manual assignment that names a stopped broker first is led by the next one. The caller
    has made sure each partition has one."""
    records = []
    for partition, replicas in sorted(assignments.items()):
        isr = tuple(b for b in replicas if b in active)
        records.append(
            PartitionRecord(
                partition_id=partition,
                topic_id=topic_id,
                replicas=replicas,
                isr=isr,
                leader=isr[0],
                leader_epoch=0,
                partition_epoch=0,
            )
        )
    return records
