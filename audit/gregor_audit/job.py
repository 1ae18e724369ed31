"""The retention audit as one Spark application: `run(spark, settings) -> summary`.

What it owns: the order of an audit (the cluster's facts, each topic's limits, one scan, the
verdicts) and its report: `summary.json` and Parquet detail under `settings.output`
(`partitions/`, one row per partition; `findings/`, one row per finding; both by topic).
Every launcher shares it: the command line in local mode, and the operator's launches on
Kubernetes (ADR 0026).

What it must never do: stop the session it was given (its caller owns it), or let one topic's
error keep the others from their verdicts.
"""

from __future__ import annotations

import datetime
import json
import time
import urllib.parse
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from gregor_audit.facts import gather
from gregor_audit.findings import (
    Finding,
    Limits,
    PartitionStats,
    TopicFacts,
    TopicReport,
    judge,
    limits,
)
from gregor_audit.scan import scan
from gregor_audit.settings import AuditSettings

__all__ = ["SUMMARY", "run"]

SUMMARY = "summary.json"

_PARTITION_COLUMNS = (
    ("topic", T.StringType()),
    ("partition", T.IntegerType()),
    ("log_start_offset", T.LongType()),
    ("log_end_offset", T.LongType()),
    ("size_bytes", T.LongType()),
    *(
        (name, T.LongType())
        for name in PartitionStats.__dataclass_fields__
        if name not in {"topic", "partition"}
    ),
    ("audited_at_ms", T.LongType()),
)
_FINDING_COLUMNS = (
    ("topic", T.StringType()),
    ("code", T.StringType()),
    ("partition", T.IntegerType()),
    ("records", T.LongType()),
    ("bytes", T.LongType()),
    ("oldest_timestamp_ms", T.LongType()),
    ("newest_timestamp_ms", T.LongType()),
    ("detail", T.StringType()),
    ("audited_at_ms", T.LongType()),
)


def _schema(columns: tuple[tuple[str, T.DataType], ...]) -> T.StructType:
    return T.StructType([T.StructField(name, kind) for name, kind in columns])


def _partition_rows(
    facts: dict[str, TopicFacts], stats: list[PartitionStats], now_ms: int
) -> list[tuple[Any, ...]]:
    counted = {(s.topic, s.partition): s for s in stats}
    rows = []
    for topic in facts.values():
        for p in topic.partitions:
            s = counted.get((topic.name, p.partition)) or PartitionStats(
                topic.name, p.partition, 0, 0, None, None
            )
            values = [getattr(s, name) for name, _ in _PARTITION_COLUMNS[5:-1]]
            rows.append(
                (
                    topic.name,
                    p.partition,
                    p.log_start_offset,
                    p.log_end_offset,
                    p.size_bytes,
                    *values,
                    now_ms,
                )
            )
    return rows


def _finding_rows(reports: list[TopicReport], now_ms: int) -> list[tuple[Any, ...]]:
    def row(topic: str, f: Finding) -> tuple[Any, ...]:
        return (
            topic,
            f.code,
            f.partition,
            f.records,
            f.bytes,
            f.oldest_timestamp_ms,
            f.newest_timestamp_ms,
            f.detail,
            now_ms,
        )

    return [row(report.topic, finding) for report in reports for finding in report.findings]


def _local_path(output: str) -> Path | None:
    """The directory `output` names on this machine (a path, or a `file:` URI); None for a
    Hadoop file system's URI."""
    parsed = urllib.parse.urlparse(output)
    if parsed.scheme == "file":
        return Path(parsed.path)
    return Path(output) if parsed.scheme == "" else None


class _Report:
    """`summary.json` under `output`: removed when an audit starts, so that a failed audit
    leaves none beside new detail, and written whole (a temporary file renamed) at its end."""

    def __init__(self, spark: SparkSession, output: str) -> None:
        self._local = _local_path(output)
        self._spark = spark
        self._output = output

    def _hadoop(self, name: str) -> tuple[Any, Any]:
        jvm: Any = self._spark._jvm
        target = jvm.org.apache.hadoop.fs.Path(f"{self._output}/{name}")
        return target.getFileSystem(self._spark._jsc.hadoopConfiguration()), target

    def clear(self) -> None:
        if self._local is not None:
            (self._local / SUMMARY).unlink(missing_ok=True)
            return
        filesystem, target = self._hadoop(SUMMARY)
        filesystem.delete(target, False)

    def write(self, text: str) -> None:
        if self._local is not None:
            self._local.mkdir(parents=True, exist_ok=True)
            partial = self._local / f".{SUMMARY}.partial"
            partial.write_text(text)
            partial.replace(self._local / SUMMARY)
            return
        filesystem, partial = self._hadoop(f".{SUMMARY}.partial")
        stream = filesystem.create(partial, True)
        try:
            stream.write(bytearray(text.encode()))
        finally:
            stream.close()
        _, target = self._hadoop(SUMMARY)
        filesystem.delete(target, False)
        filesystem.rename(partial, target)


def run(
    spark: SparkSession, settings: AuditSettings, *, now_ms: int | None = None
) -> dict[str, Any]:
    """Audit `settings.topics` and write the report; returns the summary it wrote."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    output = settings.output.rstrip("/")
    report = _Report(spark, output)
    report.clear()
    jvm: Any = spark._jvm
    cluster = gather(jvm, settings)
    facts = cluster.topics
    bounds: dict[str, Limits] = {
        name: limits(
            topic.policy,
            max_age_ms=settings.max_age_ms,
            future_skew_ms=settings.future_skew_ms,
            now_ms=now_ms,
        )
        for name, topic in facts.items()
        if topic.policy is not None
    }
    stats, unread = scan(spark, settings, [(facts[name], bound) for name, bound in bounds.items()])
    for name, reason in unread.items():
        facts[name] = TopicFacts(name, error=reason)
        del bounds[name]
    reports = [
        judge(
            topic,
            [s for s in stats if s.topic == name],
            bound=bounds.get(name),
            now_ms=now_ms,
        )
        for name, topic in facts.items()
    ]
    spark.createDataFrame(
        _partition_rows(facts, stats, now_ms), _schema(_PARTITION_COLUMNS)
    ).coalesce(1).write.mode("overwrite").partitionBy("topic").parquet(f"{output}/partitions")
    spark.createDataFrame(_finding_rows(reports, now_ms), _schema(_FINDING_COLUMNS)).coalesce(
        1
    ).write.mode("overwrite").partitionBy("topic").parquet(f"{output}/findings")
    summary = {
        "audited_at": datetime.datetime.fromtimestamp(now_ms / 1000, datetime.UTC).isoformat(),
        "audited_at_ms": now_ms,
        "bootstrap_servers": settings.bootstrap_servers,
        "max_age_s": None if settings.max_age_ms is None else settings.max_age_ms / 1000,
        "future_skew_s": settings.future_skew_ms / 1000,
        "spark_application_id": spark.sparkContext.applicationId,
        "report": output,
        "warnings": cluster.warnings,
        "topics": {verdict.topic: verdict.as_dict() for verdict in reports},
        "policies": {name: topic.policy.as_dict() for name, topic in facts.items() if topic.policy},
    }
    report.write(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary
