"""What a topic's retention promises, and the verdict on what its partitions really hold.

What it owns: reading a topic's effective configuration into a `Policy`; turning the policy and
the audit's settings into `Limits` (the instants before or after which a record is a finding);
and `judge`, which turns per-partition counts (computed by Spark over every readable record,
`gregor_audit.scan`) into a verdict with stable finding codes. Pure: no Spark, no Kafka client,
no clock (the audit's `now_ms` is given).

The rules, as Kafka applies them (ADR 0026):
- A delete-policy topic's records can outlive `retention.ms` by up to `segment.ms` (the active
  segment is deleted only once its newest record is past retention, and it rolls no later than
  `segment.ms`, or `max.compaction.lag.ms` if the topic also compacts and that is shorter) plus
  `log.retention.check.interval.ms`. That sum is what the configuration promises, and the
  maximum age when the audit is given none. A limit before the epoch is no limit.
- `RecordsOlderThanMaxAge` (delete policy): records stamped before `now - max age`.
- `ConfigCannotMeetMaxAge` (delete policy): the promise is longer than the maximum age asked
  for, or there is none (`retention.ms=-1`).
- `FutureTimestamps`: records stamped after `now + skew`. They also hold back the deletion of
  every older record in their segment.
- `CompactionBacklog` (compacted): records superseded by a newer value of their key which is
  itself older than `max.compaction.lag.ms` (or the maximum age, when that is unset): the cleaner
  should have removed them.
- `TombstonesPastDeleteRetention` (compacted): tombstones older than the compaction bound plus
  `delete.retention.ms`, which a cleaner keeping its promises would have dropped.
- `BytesOverRetention` (delete policy): a partition larger on disk than retention keeps it,
  `retention.bytes` plus one segment (`segment.bytes`), since Kafka deletes whole segments only
  while what remains stays at or above `retention.bytes`. Between two retention checks a busy
  partition can grow past that too. Its records are the oldest ones that make up the excess,
  estimated from the partition's mean record size on disk.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from broker.storage.config import LONG_MAX, InvalidConfig, LogConfig

__all__ = [
    "CODES",
    "NO_LAG",
    "Finding",
    "Limits",
    "PartitionFacts",
    "PartitionStats",
    "Policy",
    "TopicFacts",
    "TopicReport",
    "Verdict",
    "judge",
    "limits",
]

Verdict = Literal["Compliant", "Violations", "Error"]

RECORDS_OLDER_THAN_MAX_AGE = "RecordsOlderThanMaxAge"
CONFIG_CANNOT_MEET_MAX_AGE = "ConfigCannotMeetMaxAge"
FUTURE_TIMESTAMPS = "FutureTimestamps"
COMPACTION_BACKLOG = "CompactionBacklog"
TOMBSTONES_PAST_DELETE_RETENTION = "TombstonesPastDeleteRetention"
BYTES_OVER_RETENTION = "BytesOverRetention"
CODES = (
    RECORDS_OLDER_THAN_MAX_AGE,
    CONFIG_CANNOT_MEET_MAX_AGE,
    FUTURE_TIMESTAMPS,
    COMPACTION_BACKLOG,
    TOMBSTONES_PAST_DELETE_RETENTION,
    BYTES_OVER_RETENTION,
)

NO_LAG = LONG_MAX
"""`max.compaction.lag.ms`'s default (Long.MAX_VALUE): no bound on compaction."""


@dataclass(frozen=True, slots=True)
class Policy:
    """A topic's effective retention configuration, and its broker's retention check."""

    cleanup_policy: frozenset[str]
    retention_ms: int
    retention_bytes: int
    segment_ms: int
    segment_bytes: int
    max_compaction_lag_ms: int
    delete_retention_ms: int
    retention_check_interval_ms: int

    roll_ms: int
    """How long the active segment may stay open: `segment.ms`, or `max.compaction.lag.ms` when
    the topic compacts and that is shorter (Kafka's `maxSegmentMs`)."""

    @classmethod
    def from_configs(cls, configs: Mapping[str, str], retention_check_interval_ms: int) -> Policy:
        """From a topic's described configs, read as the broker reads its own (Kafka's names
        and defaults, `broker.storage.config`); a value Kafka would refuse is a ValueError."""
        try:
            log = LogConfig.from_properties(configs)
        except InvalidConfig as exc:
            raise ValueError(f"{exc.key}={configs.get(exc.key)!r} is {exc.reason}") from None
        return cls(
            cleanup_policy=log.cleanup_policy,
            retention_ms=log.retention_ms,
            retention_bytes=log.retention_bytes,
            segment_ms=log.segment_ms,
            segment_bytes=log.segment_bytes,
            max_compaction_lag_ms=log.max_compaction_lag_ms,
            delete_retention_ms=log.delete_retention_ms,
            retention_check_interval_ms=retention_check_interval_ms,
            roll_ms=log.max_segment_ms,
        )

    @property
    def deletes(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def compacts(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def promised_age_ms(self) -> int | None:
        """How old a record may get before retention removes it (None: never removed)."""
        if not self.deletes or self.retention_ms < 0:
            return None
        return self.retention_ms + self.roll_ms + self.retention_check_interval_ms

    @property
    def promised_bytes(self) -> int | None:
        """How large a partition may be after a retention check (None: no bound). Kafka
        deletes whole segments, oldest first, only while what remains stays at or above
        `retention.bytes`: up to one segment more than it is left."""
        if not self.deletes or self.retention_bytes < 0:
            return None
        return self.retention_bytes + self.segment_bytes

    def as_dict(self) -> dict[str, Any]:
        facts = asdict(self)
        facts["cleanup_policy"] = ",".join(sorted(self.cleanup_policy))
        return facts


@dataclass(frozen=True, slots=True)
class PartitionFacts:
    """What the cluster says of one partition through the Admin API."""

    partition: int
    log_start_offset: int
    log_end_offset: int
    size_bytes: int | None
    """The leader's replica on disk (DescribeLogDirs); None when no log dir reported it."""


@dataclass(frozen=True, slots=True)
class TopicFacts:
    name: str
    policy: Policy | None = None
    partitions: tuple[PartitionFacts, ...] = ()
    error: str | None = None
    """Why the topic cannot be audited (it does not exist, its configs are unreadable)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Per topic, the instants that make a record a finding (None: no such check)."""

    max_age_ms: int | None
    old_before_ms: int | None
    future_after_ms: int
    compaction_bound_ms: int | None
    backlog_before_ms: int | None
    tombstone_before_ms: int | None


def _before(now_ms: int, *ages: int | None) -> int | None:
    """`now_ms` less the ages; None when an age is unbounded or the instant precedes the epoch
    (no record is that old: Kafka's "forever" is often Long.MAX_VALUE rather than -1)."""
    if any(age is None for age in ages):
        return None
    instant = now_ms - sum(age for age in ages if age is not None)
    return instant if instant > 0 else None


def limits(policy: Policy, *, max_age_ms: int | None, future_skew_ms: int, now_ms: int) -> Limits:
    """The checks for one topic: `max_age_ms` is the audit's (None: what the config promises)."""
    age = max_age_ms if max_age_ms is not None else policy.promised_age_ms
    bound: int | None = None
    if policy.compacts:
        bound = policy.max_compaction_lag_ms if policy.max_compaction_lag_ms < NO_LAG else age
    return Limits(
        max_age_ms=age,
        old_before_ms=_before(now_ms, age) if policy.deletes else None,
        future_after_ms=min(now_ms + future_skew_ms, NO_LAG),
        compaction_bound_ms=bound,
        backlog_before_ms=_before(now_ms, bound),
        tombstone_before_ms=_before(now_ms, bound, policy.delete_retention_ms),
    )


@dataclass(frozen=True, slots=True)
class PartitionStats:
    """Spark's counts over every readable record of one partition (None: no such record)."""

    topic: str
    partition: int
    records: int
    bytes: int
    oldest_ms: int | None
    newest_ms: int | None
    old_records: int = 0
    old_bytes: int = 0
    old_oldest_ms: int | None = None
    old_newest_ms: int | None = None
    future_records: int = 0
    future_bytes: int = 0
    future_oldest_ms: int | None = None
    future_newest_ms: int | None = None
    tombstones: int = 0
    stale_tombstones: int = 0
    stale_tombstone_bytes: int = 0
    stale_tombstone_oldest_ms: int | None = None
    stale_tombstone_newest_ms: int | None = None
    superseded: int = 0
    backlog_records: int = 0
    backlog_bytes: int = 0
    backlog_oldest_ms: int | None = None
    backlog_newest_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Finding:
    code: str
    partition: int | None
    """None for what concerns the whole topic (its configuration)."""
    records: int
    bytes: int
    oldest_timestamp_ms: int | None = None
    newest_timestamp_ms: int | None = None
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class TopicReport:
    topic: str
    verdict: Verdict
    reason: str | None
    oldest_record_age_s: int | None
    findings: tuple[Finding, ...]
    max_age_ms: int | None = None
    records: int = 0

    def as_dict(self) -> dict[str, Any]:
        report: dict[str, Any] = {"verdict": self.verdict}
        if self.reason is not None:
            report["reason"] = self.reason
        report["oldest_record_age_s"] = self.oldest_record_age_s
        report["max_age_s"] = None if self.max_age_ms is None else self.max_age_ms / 1000
        report["records"] = self.records
        report["findings"] = [finding.as_dict() for finding in self.findings]
        return report


def _config_finding(policy: Policy, bound: Limits) -> Finding | None:
    # Without a maximum age of the audit's, the bound is the promise itself: never a finding.
    if not policy.deletes or bound.max_age_ms is None:
        return None
    promised = policy.promised_age_ms
    if promised is None:
        detail = "retention.ms=-1: records are kept forever"
    elif promised > bound.max_age_ms:
        rolled = "segment.ms" if policy.roll_ms == policy.segment_ms else "max.compaction.lag.ms"
        detail = (
            f"retention.ms + {rolled} + log.retention.check.interval.ms = {promised} ms, "
            f"longer than the maximum age of {bound.max_age_ms} ms"
        )
    else:
        return None
    return Finding(CONFIG_CANNOT_MEET_MAX_AGE, None, 0, 0, detail=detail)


def _partition_findings(
    policy: Policy, facts: PartitionFacts | None, stats: PartitionStats
) -> list[Finding]:
    found = []
    p = stats.partition
    if stats.old_records:
        found.append(
            Finding(
                RECORDS_OLDER_THAN_MAX_AGE,
                p,
                stats.old_records,
                stats.old_bytes,
                stats.old_oldest_ms,
                stats.old_newest_ms,
            )
        )
    if stats.future_records:
        found.append(
            Finding(
                FUTURE_TIMESTAMPS,
                p,
                stats.future_records,
                stats.future_bytes,
                stats.future_oldest_ms,
                stats.future_newest_ms,
            )
        )
    if stats.backlog_records:
        found.append(
            Finding(
                COMPACTION_BACKLOG,
                p,
                stats.backlog_records,
                stats.backlog_bytes,
                stats.backlog_oldest_ms,
                stats.backlog_newest_ms,
            )
        )
    if stats.stale_tombstones:
        found.append(
            Finding(
                TOMBSTONES_PAST_DELETE_RETENTION,
                p,
                stats.stale_tombstones,
                stats.stale_tombstone_bytes,
                stats.stale_tombstone_oldest_ms,
                stats.stale_tombstone_newest_ms,
            )
        )
    size = facts.size_bytes if facts is not None else None
    promised = policy.promised_bytes
    if promised is not None and size is not None and size > promised:
        excess = size - promised
        records = min(stats.records, math.ceil(excess * stats.records / size))
        found.append(
            Finding(
                BYTES_OVER_RETENTION,
                p,
                records,
                excess,
                stats.oldest_ms,
                None,
                detail=(
                    f"{size} bytes on disk, over retention.bytes={policy.retention_bytes} "
                    f"+ segment.bytes={policy.segment_bytes}"
                ),
            )
        )
    return found


def judge(
    facts: TopicFacts,
    stats: Sequence[PartitionStats],
    *,
    bound: Limits | None,
    now_ms: int,
) -> TopicReport:
    """The verdict on one topic from its facts and its partitions' counts."""
    if facts.error is not None or facts.policy is None or bound is None:
        return TopicReport(facts.name, "Error", facts.error or "no configuration", None, ())
    by_partition = {p.partition: p for p in facts.partitions}
    findings: list[Finding] = []
    config = _config_finding(facts.policy, bound)
    if config is not None:
        findings.append(config)
    for partition in sorted(stats, key=lambda s: s.partition):
        findings.extend(
            _partition_findings(facts.policy, by_partition.get(partition.partition), partition)
        )
    # A partition with no readable record can still be over retention.bytes (its batches are
    # all aborted or filtered); count it from the facts alone.
    counted = {s.partition for s in stats}
    for partition_facts in facts.partitions:
        if partition_facts.partition not in counted:
            empty = PartitionStats(facts.name, partition_facts.partition, 0, 0, None, None)
            findings.extend(_partition_findings(facts.policy, partition_facts, empty))
    oldest = [s.oldest_ms for s in stats if s.oldest_ms is not None]
    age = (now_ms - min(oldest)) // 1000 if oldest else None
    return TopicReport(
        facts.name,
        "Violations" if findings else "Compliant",
        None,
        age,
        tuple(findings),
        bound.max_age_ms,
        sum(s.records for s in stats),
    )
