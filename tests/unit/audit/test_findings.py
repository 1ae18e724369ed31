"""The retention audit's rules: what a configuration promises, the limits a record is judged
by, and the verdicts and findings from per-partition counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from gregor_audit.findings import (
    NO_LAG,
    PartitionFacts,
    PartitionStats,
    Policy,
    TopicFacts,
    judge,
    limits,
)
from gregor_audit.settings import AuditSettings, InvalidSettings, parse_duration, read_properties

pytestmark = pytest.mark.unit

HOUR = 3_600_000
DAY = 24 * HOUR
NOW = 1_800_000_000_000


def _policy(**configs: str) -> Policy:
    return Policy.from_configs(configs, retention_check_interval_ms=5 * 60_000)


def test_kafka_defaults_promise_two_weeks_and_five_minutes() -> None:
    policy = _policy()
    assert (policy.deletes, policy.compacts) == (True, False)
    assert policy.promised_age_ms == 7 * DAY + 7 * DAY + 5 * 60_000
    assert policy.max_compaction_lag_ms == NO_LAG


def test_unlimited_and_compacted_topics_promise_no_age() -> None:
    assert _policy(**{"retention.ms": "-1"}).promised_age_ms is None
    assert _policy(**{"cleanup.policy": "compact"}).promised_age_ms is None
    both = _policy(**{"cleanup.policy": "compact, delete", "retention.ms": str(DAY)})
    assert (both.deletes, both.compacts) == (True, True)
    assert both.promised_age_ms == DAY + 7 * DAY + 5 * 60_000


def test_a_config_that_is_not_a_number_is_named() -> None:
    with pytest.raises(ValueError, match=r"retention.ms='soon' is not an integer"):
        _policy(**{"retention.ms": "soon"})


def test_without_a_maximum_age_a_topic_is_held_to_its_promise() -> None:
    policy = _policy(**{"retention.ms": str(DAY), "segment.ms": str(HOUR)})
    bound = limits(policy, max_age_ms=None, future_skew_ms=HOUR, now_ms=NOW)
    promised = DAY + HOUR + 5 * 60_000
    assert (bound.max_age_ms, bound.old_before_ms) == (promised, NOW - promised)
    assert bound.future_after_ms == NOW + HOUR
    assert (bound.compaction_bound_ms, bound.backlog_before_ms) == (None, None)
    facts = TopicFacts("t", policy, (PartitionFacts(0, 0, 10, 1000),))
    stats = [PartitionStats("t", 0, 10, 100, NOW - DAY, NOW)]
    report = judge(facts, stats, bound=bound, now_ms=NOW)
    assert (report.verdict, report.findings) == ("Compliant", ())
    assert report.oldest_record_age_s == DAY // 1000


def test_compaction_is_bound_by_its_max_lag_else_by_the_maximum_age() -> None:
    lagged = _policy(**{"cleanup.policy": "compact", "max.compaction.lag.ms": str(HOUR)})
    bound = limits(lagged, max_age_ms=3 * DAY, future_skew_ms=0, now_ms=NOW)
    assert bound.old_before_ms is None  # records of a compacted topic age by key, not by time
    assert bound.backlog_before_ms == NOW - HOUR
    assert bound.tombstone_before_ms == NOW - HOUR - DAY
    unlagged = _policy(**{"cleanup.policy": "compact"})
    assert limits(unlagged, max_age_ms=3 * DAY, future_skew_ms=0, now_ms=NOW).backlog_before_ms == (
        NOW - 3 * DAY
    )
    assert limits(unlagged, max_age_ms=None, future_skew_ms=0, now_ms=NOW).backlog_before_ms is None


@pytest.mark.parametrize(
    ("configs", "detail"),
    [
        ({"retention.ms": "-1"}, "retention.ms=-1: records are kept forever"),
        ({"retention.ms": str(3 * DAY)}, "longer than the maximum age of 259200000 ms"),
    ],
)
def test_a_config_that_cannot_meet_the_maximum_age_is_a_topic_finding(
    configs: dict[str, str], detail: str
) -> None:
    policy = _policy(**configs)
    bound = limits(policy, max_age_ms=3 * DAY, future_skew_ms=HOUR, now_ms=NOW)
    report = judge(TopicFacts("t", policy, ()), [], bound=bound, now_ms=NOW)
    assert report.verdict == "Violations"
    ((finding),) = report.findings
    assert (finding.code, finding.partition, finding.records) == ("ConfigCannotMeetMaxAge", None, 0)
    assert detail in finding.detail
    assert report.oldest_record_age_s is None


def test_counts_become_findings_per_partition_in_order() -> None:
    policy = _policy(
        **{"cleanup.policy": "compact,delete", "retention.ms": str(HOUR), "segment.ms": str(HOUR)}
    )
    bound = limits(policy, max_age_ms=DAY, future_skew_ms=HOUR, now_ms=NOW)
    facts = TopicFacts("t", policy, (PartitionFacts(0, 5, 50, None), PartitionFacts(1, 0, 9, None)))
    stats = [
        PartitionStats(
            "t", 1, 9, 90, NOW - 2 * DAY, NOW + DAY, future_records=1, future_bytes=10,
            future_oldest_ms=NOW + DAY, future_newest_ms=NOW + DAY,
        ),
        PartitionStats(
            "t", 0, 45, 450, NOW - 3 * DAY, NOW, old_records=4, old_bytes=40,
            old_oldest_ms=NOW - 3 * DAY, old_newest_ms=NOW - 2 * DAY, backlog_records=2,
            backlog_bytes=20, stale_tombstones=1, stale_tombstone_bytes=3,
        ),
    ]  # fmt: skip
    report = judge(facts, stats, bound=bound, now_ms=NOW)
    assert report.verdict == "Violations"
    assert [(f.code, f.partition, f.records, f.bytes) for f in report.findings] == [
        ("RecordsOlderThanMaxAge", 0, 4, 40),
        ("CompactionBacklog", 0, 2, 20),
        ("TombstonesPastDeleteRetention", 0, 1, 3),
        ("FutureTimestamps", 1, 1, 10),
    ]
    assert report.oldest_record_age_s == 3 * DAY // 1000
    assert report.records == 54


def test_bytes_over_retention_bytes_and_a_segment_count_the_oldest_records_making_it() -> None:
    policy = _policy(**{"retention.bytes": "1000", "segment.bytes": "1000"})
    assert policy.promised_bytes == 2000
    bound = limits(policy, max_age_ms=None, future_skew_ms=HOUR, now_ms=NOW)
    partitions = (
        PartitionFacts(0, 0, 100, 5000),
        PartitionFacts(1, 0, 40, 2000),  # one segment over retention.bytes: as Kafka keeps it
        PartitionFacts(2, 0, 0, 80),
    )
    facts = TopicFacts("t", policy, partitions)
    stats = [
        PartitionStats("t", 0, 100, 4000, NOW - HOUR, NOW),
        PartitionStats("t", 1, 40, 1600, NOW - HOUR, NOW),
    ]
    report = judge(facts, stats, bound=bound, now_ms=NOW)
    # 3,000 bytes over on 5,000 held by 100 records: the oldest 60 records make the excess.
    ((finding),) = report.findings
    assert (finding.code, finding.partition, finding.records, finding.bytes) == (
        "BytesOverRetention",
        0,
        60,
        3000,
    )
    assert _policy(**{"retention.bytes": "-1"}).promised_bytes is None
    compacted = _policy(**{"cleanup.policy": "compact", "retention.bytes": "1000"})
    assert not judge(
        TopicFacts("t", compacted, facts.partitions),
        stats,
        bound=limits(compacted, max_age_ms=None, future_skew_ms=HOUR, now_ms=NOW),
        now_ms=NOW,
    ).findings  # retention.bytes applies to the delete policy only, as in Kafka


def test_a_compacted_topic_with_delete_rolls_by_its_max_compaction_lag() -> None:
    policy = _policy(
        **{
            "cleanup.policy": "compact,delete",
            "retention.ms": str(DAY),
            "max.compaction.lag.ms": str(HOUR),
        }
    )
    assert policy.roll_ms == HOUR  # shorter than segment.ms, 7 d by default
    assert policy.promised_age_ms == DAY + HOUR + 5 * 60_000
    assert _policy(**{"max.compaction.lag.ms": str(HOUR)}).roll_ms == 7 * DAY  # delete only


@pytest.mark.parametrize(
    "configs",
    [
        {"retention.ms": str(2**63 - 1)},  # Kafka's other "forever"
        {"cleanup.policy": "compact", "delete.retention.ms": str(2**63 - 1)},
        {"cleanup.policy": "compact", "max.compaction.lag.ms": str(2**63 - 2)},
    ],
)
def test_limits_before_the_epoch_are_no_limits(configs: dict[str, str]) -> None:
    # Spark's limits are 64-bit: an instant far before the epoch would not fit, and no record
    # is that old anyway.
    bound = limits(_policy(**configs), max_age_ms=None, future_skew_ms=2**63 - 1, now_ms=NOW)
    for instant in (bound.old_before_ms, bound.backlog_before_ms, bound.tombstone_before_ms):
        assert instant is None or 0 < instant <= NOW
    assert bound.future_after_ms == 2**63 - 1
    assert limits(_policy(), max_age_ms=2**62, future_skew_ms=0, now_ms=NOW).old_before_ms is None


def test_a_topic_without_facts_is_an_error_with_its_reason() -> None:
    report = judge(
        TopicFacts("gone", error="topic gone does not exist"), [], bound=None, now_ms=NOW
    )
    assert report.as_dict() == {
        "verdict": "Error",
        "reason": "topic gone does not exist",
        "oldest_record_age_s": None,
        "max_age_s": None,
        "records": 0,
        "findings": [],
    }


@pytest.mark.parametrize(
    ("text", "ms"),
    [("90m", 90 * 60_000), ("1d", DAY), ("30d", 30 * DAY), ("1h30m", 90 * 60_000), ("500ms", 500)],
)
def test_durations(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text", ["", "30", "d", "1 day", "-1d", "0s", "1.5h", "1M", "1D"])
def test_a_bad_duration_is_named(text: str) -> None:
    with pytest.raises(InvalidSettings, match="duration"):
        parse_duration(text)


def test_a_skew_may_be_zero() -> None:
    assert parse_duration("0s", zero=True) == 0


def test_client_properties_and_their_limits(tmp_path: Path) -> None:
    config = tmp_path / "client.properties"
    config.write_text(
        "# SASL\nsecurity.protocol=SASL_SSL\nsasl.mechanism: SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        '    username="audit" password="secret";\n'
    )
    properties = read_properties(config)
    assert properties["security.protocol"] == "SASL_SSL"
    assert properties["sasl.mechanism"] == "SCRAM-SHA-512"
    assert properties["sasl.jaas.config"].endswith('username="audit" password="secret";')
    with pytest.raises(InvalidSettings, match="cannot read the client properties"):
        read_properties(tmp_path / "absent.properties")
    for key in ("group.id", "auto.offset.reset", "enable.auto.commit", "bootstrap.servers"):
        with pytest.raises(InvalidSettings, match=rf"{key} cannot be set"):
            AuditSettings("h:9092", ("t",), "out", client_properties={key: "x"})
    with pytest.raises(InvalidSettings, match="no topics"):
        AuditSettings("h:9092", (), "out")
