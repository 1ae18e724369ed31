"""Retention-audit benchmark: how fast the audit scans a topic, against Spark reading it plainly.

    python -m bench.audit [--records N] [--record-size B] [--partitions P] [--runs R]
                          [--target gregor|kafka]

One broker (Gregor by default) holds one topic of `--records` records (10 million by default)
of `--record-size` bytes, written by Kafka's ProducerPerformance. One Spark session in local[2]
mode, with the connector the audit uses, then reads it, `--runs` times each, in turn:

- `count`: `spark.read.format("kafka")` over the topic, `.count()`: the peer, Spark's own
  fastest pass over the same records through the same connector;
- `scan`: the audit's facts from the Admin API and its scan (`gregor_audit.scan`, the
  per-partition aggregation), without the report;
- `audit`: the whole audit (`gregor_audit.job.run`): the cluster's facts, the scan, the Parquet
  detail and `summary.json`.

The output ends with `audit_scan_vs_count=<the count's median time over the scan's>` (the scan
rate as a fraction of the plain count's, the issue's target being at least 0.8),
`audit_records=<N>` and `audit_s=<the whole audit's median seconds>`. A measurement, never a
test: the broker, Spark's two executor threads and its driver share the machine's two cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from bench.broker import TOOL_TIMEOUT
from gregor_audit.cli import spark_session
from gregor_audit.facts import gather
from gregor_audit.findings import limits
from gregor_audit.job import run
from gregor_audit.scan import scan
from gregor_audit.settings import AuditSettings
from tests.support.brokers import BROKERS, BrokerKind, run_broker
from tests.support.kafka_dist import KafkaTools

TOPIC = "audited"
WARMUP = "warmup"
WARMUP_RECORDS = 500_000
"""Read once by each pass before the measured runs: the driver's and executors' JIT warms up."""
MAX_AGE_MS = 30 * 24 * 3_600_000


def _produce(bootstrap: str, topic: str, records: int, record_size: int, partitions: int) -> float:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)
    del admin
    started = time.monotonic()
    KafkaTools(bootstrap).producer_perf(
        "--topic", topic, "--num-records", str(records), "--record-size", str(record_size),
        "--throughput", "-1", "--command-property", "acks=1",
        "--command-property", "linger.ms=20", "--command-property", "batch.size=262144",
        timeout=TOOL_TIMEOUT,
    )  # fmt: skip
    return time.monotonic() - started


def _count(spark: Any, settings: AuditSettings) -> tuple[int, float]:
    started = time.monotonic()
    count = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", settings.bootstrap_servers)
        .option("subscribe", settings.topics[0])
        .load()
        .count()
    )
    return int(count), time.monotonic() - started


def _scan(spark: Any, settings: AuditSettings) -> tuple[int, float]:
    started = time.monotonic()
    facts = gather(spark._jvm, settings).topics[settings.topics[0]]
    assert facts.policy is not None, facts.error
    now = int(time.time() * 1000)
    bound = limits(facts.policy, max_age_ms=MAX_AGE_MS, future_skew_ms=3_600_000, now_ms=now)
    stats, unread = scan(spark, settings, [(facts, bound)])
    assert not unread, unread
    return sum(s.records for s in stats), time.monotonic() - started


def _audit(spark: Any, settings: AuditSettings) -> tuple[int, float]:
    started = time.monotonic()
    summary = run(spark, settings)
    report = summary["topics"][settings.topics[0]]
    assert report["verdict"] == "Compliant", report
    return int(report["records"]), time.monotonic() - started


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.audit", description=__doc__)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--target", choices=BROKERS, default="gregor")
    args = parser.parse_args(argv)
    kind: BrokerKind = args.target
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as scratch:
        directory = Path(scratch)
        with run_broker(kind, directory, kafka_heap="1g") as broker:
            for topic, records in ((WARMUP, WARMUP_RECORDS), (TOPIC, args.records)):
                took = _produce(broker.bootstrap, topic, records, args.record_size, args.partitions)
                print(f"{kind}: {records:,} records of {args.record_size} B in {took:.1f} s")
            warmup, settings = (
                AuditSettings(
                    broker.bootstrap, (topic,), str(directory / "report"), max_age_ms=MAX_AGE_MS
                )
                for topic in (WARMUP, TOPIC)
            )
            spark = spark_session("local[2]")
            times: dict[str, list[float]] = {"count": [], "scan": [], "audit": []}
            measures: dict[str, Callable[[Any, AuditSettings], tuple[int, float]]] = {
                "count": _count,
                "scan": _scan,
                "audit": _audit,
            }
            try:
                for measure in measures.values():
                    measure(spark, warmup)
                for round_number in range(1, args.runs + 1):
                    for name, measure in measures.items():
                        records, took = measure(spark, settings)
                        if records != args.records:
                            raise RuntimeError(f"{name} saw {records} records, not {args.records}")
                        times[name].append(took)
                        rate = records / took / 1e6
                        print(
                            f"run {round_number} {name:<6} {took:7.1f} s  {rate:5.2f} M records/s"
                        )
            finally:
                spark.stop()
    count, scanned, audited = (statistics.median(times[k]) for k in ("count", "scan", "audit"))
    print(f"audit_scan_vs_count={count / scanned:.2f}")
    print(f"audit_whole_vs_count={count / audited:.2f}")
    print(f"audit_records={args.records}")
    print(f"audit_s={audited:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
