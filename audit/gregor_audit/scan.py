"""Every readable record of the audited topics, counted per partition by Spark.

What it owns: reading the topics with Spark's Kafka source from each partition's log start to
the end offset the Admin API reported (one consistent snapshot; records removed by retention
while the scan runs are skipped, not an error), and the per-partition aggregation that
`gregor_audit.findings` judges: records and bytes (key plus value), oldest and newest
timestamps, and for each check the records past its limit. Limits are per topic, given to Spark
as a small broadcast table. Compacted topics go through one more step, a window per key, to know
each record's successor. Records never reach the driver: only one row per partition does.

What it must never do: collect records, or read a topic twice unless a pass over several failed
(then each is read alone, so that one unreadable topic costs only its own verdict).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gregor_audit.facts import java_failure
from gregor_audit.findings import Limits, PartitionStats, TopicFacts
from gregor_audit.settings import AuditSettings

__all__ = ["LIMITS_SCHEMA", "aggregate", "scan"]

LIMITS_SCHEMA = T.StructType(
    [
        T.StructField("topic", T.StringType(), nullable=False),
        T.StructField("old_before", T.LongType()),
        T.StructField("future_after", T.LongType()),
        T.StructField("backlog_before", T.LongType()),
        T.StructField("tombstone_before", T.LongType()),
    ]
)


def _reader(
    spark: SparkSession, settings: AuditSettings, topics: Sequence[TopicFacts]
) -> DataFrame:
    assign: dict[str, list[int]] = {}
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for topic in topics:
        for p in topic.partitions:
            if p.log_end_offset > p.log_start_offset:
                assign.setdefault(topic.name, []).append(p.partition)
                starting.setdefault(topic.name, {})[str(p.partition)] = p.log_start_offset
                ending.setdefault(topic.name, {})[str(p.partition)] = p.log_end_offset
    reader = spark.read.format("kafka")
    for key, value in settings.client_properties.items():
        reader = reader.option(f"kafka.{key}", value)
    timeout = str(settings.timeout_ms)
    return (
        reader.option("kafka.bootstrap.servers", settings.bootstrap_servers)
        .option("kafka.request.timeout.ms", timeout)
        .option("kafka.default.api.timeout.ms", timeout)
        .option("kafkaConsumer.pollTimeoutMs", timeout)
        .option("assign", json.dumps(assign))
        .option("startingOffsets", json.dumps(starting))
        .option("endingOffsets", json.dumps(ending))
        .option("failOnDataLoss", "false")
        .load()
    )


def _count(condition: Column) -> Column:
    return F.count(F.when(condition, 1))


def _sum(condition: Column, value: Column) -> Column:
    return F.coalesce(F.sum(F.when(condition, value)), F.lit(0))


def _group(count: str, prefix: str, condition: Column) -> list[Column]:
    """The records matching `condition`: count, bytes, oldest and newest timestamps."""
    return [
        _count(condition).alias(count),
        _sum(condition, F.col("size")).alias(f"{prefix}_bytes"),
        F.min(F.when(condition, F.col("ts"))).alias(f"{prefix}_oldest_ms"),
        F.max(F.when(condition, F.col("ts"))).alias(f"{prefix}_newest_ms"),
    ]


def aggregate(records: DataFrame, limits: DataFrame, *, compacted: bool) -> DataFrame:
    """`PartitionStats`' columns, one row per (topic, partition), from records shaped as Spark's
    Kafka source gives them and each topic's limits (`LIMITS_SCHEMA`; None: no such check).
    A timestamp of -1 (no timestamp) counts as a record, never as old or new."""
    ts = F.unix_millis(F.col("timestamp"))
    rows = records.select(
        "topic",
        "partition",
        "offset",
        "key",
        ts.alias("ts"),
        (
            F.coalesce(F.octet_length("key"), F.lit(0))
            + F.coalesce(F.octet_length("value"), F.lit(0))
        ).alias("size"),
        F.col("value").isNull().alias("null_value"),
    ).join(F.broadcast(limits), "topic")
    stamped = F.col("ts") >= 0
    columns = [
        F.count(F.lit(1)).alias("records"),
        F.coalesce(F.sum("size"), F.lit(0)).alias("bytes"),
        F.min(F.when(stamped, F.col("ts"))).alias("oldest_ms"),
        F.max(F.when(stamped, F.col("ts"))).alias("newest_ms"),
        *_group("old_records", "old", stamped & (F.col("ts") < F.col("old_before"))),
        *_group("future_records", "future", F.col("ts") > F.col("future_after")),
    ]
    if compacted:
        successor = Window.partitionBy("topic", "partition", "key").orderBy("offset")
        rows = rows.withColumn("next_ts", F.lead("ts").over(successor))
        keyed = F.col("key").isNotNull()
        tombstone = keyed & F.col("null_value")
        # A successor without a timestamp (-1, old message formats) tells nothing of its age.
        succeeded = keyed & F.col("next_ts").isNotNull()
        backlog = succeeded & (F.col("next_ts") >= 0) & (F.col("next_ts") < F.col("backlog_before"))
        stale = tombstone & stamped & (F.col("ts") < F.col("tombstone_before"))
        columns += [
            _count(tombstone).alias("tombstones"),
            _count(succeeded).alias("superseded"),
            *_group("backlog_records", "backlog", backlog),
            *_group("stale_tombstones", "stale_tombstone", stale),
        ]
    return rows.groupBy("topic", "partition").agg(*columns)


def _count_group(
    spark: SparkSession,
    settings: AuditSettings,
    group: Sequence[tuple[TopicFacts, Limits]],
    compacted: bool,
) -> list[PartitionStats]:
    limits = spark.createDataFrame(
        [
            (
                facts.name,
                bound.old_before_ms,
                bound.future_after_ms,
                bound.backlog_before_ms,
                bound.tombstone_before_ms,
            )
            for facts, bound in group
        ],
        LIMITS_SCHEMA,
    )
    records = _reader(spark, settings, [facts for facts, _ in group])
    rows = aggregate(records, limits, compacted=compacted).collect()
    return [PartitionStats(**row.asDict()) for row in rows]


def scan(
    spark: SparkSession,
    settings: AuditSettings,
    topics: Sequence[tuple[TopicFacts, Limits]],
) -> tuple[list[PartitionStats], dict[str, str]]:
    """One row of counts per non-empty partition of `topics` (each with its limits), and why
    each topic that could not be read was not. Topics are read together, one pass for those
    that compact and one for the others; when a pass fails, its topics are read one by one, so
    that only the failing ones go without a verdict."""
    stats: list[PartitionStats] = []
    errors: dict[str, str] = {}
    for compacted in (False, True):
        group = [
            (facts, bound)
            for facts, bound in topics
            if facts.policy is not None
            and facts.policy.compacts == compacted
            and any(p.log_end_offset > p.log_start_offset for p in facts.partitions)
        ]
        if not group:
            continue
        try:
            stats += _count_group(spark, settings, group, compacted)
            continue
        except Exception as exc:
            if len(group) == 1:
                errors[group[0][0].name] = f"cannot read {group[0][0].name}: {java_failure(exc)}"
                continue
        for one in group:
            try:
                stats += _count_group(spark, settings, [one], compacted)
            except Exception as exc:
                errors[one[0].name] = f"cannot read {one[0].name}: {java_failure(exc)}"
    return stats, errors
