"""The retention audit (`gregor audit retention`, real Spark in local[2] mode through its Kafka
connector) against a real broker, Gregor and Apache Kafka alike, holding crafted topics written
by a producer that stamps its records:

- `compliant`: records an hour old, a configuration whose promise is within the maximum age;
- `aged`: delete policy, 30 records ten days old in a segment whose newest record is new, so
  retention cannot remove them (and the node's retention check runs only hourly);
- `future`: allows timestamps a month ahead, and holds 20 records two days ahead;
- `keyed`: compacted, the cleaner off, with superseded values and tombstones five days old;
- `forever`: `retention.ms=-1`;
- `bulky`: more bytes on disk than its `retention.bytes` and a segment (1 MiB) keep it;
- `missing`: not a topic.

Each gets exactly its verdict and findings, with their record and byte counts; an unreachable
cluster is one line on stderr and exit status 1.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from gregor_audit import connector
from tests.integration.clients import QUIET
from tests.support.brokers import BROKERS, BrokerKind, RunningBroker, run_broker
from tests.support.nodes import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HOUR = 3_600_000
DAY = 24 * HOUR
MAX_AGE = "3d"
HELD_OFF = {"log.retention.check.interval.ms": str(HOUR), "log.cleaner.enable": "false"}
"""The node's retention check runs hourly, and its cleaner never: what the crafted topics hold
stays readable while the audit runs."""
KAFKA_HELD_OFF = {"log.initial.task.delay.ms": str(HOUR)}
"""Kafka runs its first retention check 30 s after it starts, then every interval; Gregor
waits the interval from its start."""
MiB = 1024 * 1024
WITHIN = {"retention.ms": str(DAY), "segment.ms": str(HOUR)}
"""A promise of 1 d + 1 h + the hourly check: within the maximum age of 3 d."""

TOPICS: dict[str, dict[str, str]] = {
    "compliant": WITHIN,
    "aged": WITHIN,
    "future": WITHIN | {"message.timestamp.after.max.ms": str(30 * DAY)},
    "keyed": {
        "cleanup.policy": "compact",
        "delete.retention.ms": str(DAY),
        "segment.ms": str(30 * DAY),
    },
    "forever": {"retention.ms": "-1"},
    "bulky": WITHIN | {"retention.bytes": "1000", "segment.bytes": str(MiB)},
}


def _craft(bootstrap: str, now: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    created = admin.create_topics([NewTopic(t, 2, 1, config=c) for t, c in TOPICS.items()])
    for future in created.values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, **QUIET})

    def send(
        topic: str, partition: int, count: int, value: bytes | None, ts: int, **kw: Any
    ) -> None:
        for _ in range(count):
            producer.produce(topic, value=value, partition=partition, timestamp=ts, **kw)
        assert producer.flush(30) == 0

    send("compliant", 0, 60, b"c" * 100, now - HOUR)
    send("compliant", 1, 40, b"c" * 100, now - HOUR)
    # The new records first: a segment rolls on segment.ms counted from its first record, so
    # the old ones join the new ones' segment, whose newest record keeps it from retention.
    send("aged", 0, 10, b"r" * 100, now)
    send("aged", 0, 30, b"o" * 100, now - 10 * DAY)
    send("future", 0, 5, b"n" * 10, now)
    send("future", 1, 20, b"f" * 10, now + 2 * DAY)
    for k in range(10):
        send("keyed", 0, 1, b"old", now - 10 * DAY, key=b"k%d" % k)
    for k in range(10):
        send("keyed", 0, 1, b"mid", now - 5 * DAY, key=b"k%d" % k)
    for k in range(4):
        send("keyed", 0, 1, None, now - 5 * DAY, key=b"k%d" % k)
    for k in range(5, 8):
        send("keyed", 0, 1, b"new", now, key=b"k%d" % k)
    send("forever", 0, 7, b"x", now)
    send("bulky", 1, 25_000, b"b" * 100, now)  # 2.5 MB of values: three segments


def _audit(
    bootstrap: str, output: Path, *topics: str, timeout: str = "30s"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "broker.cli",
            "audit",
            "retention",
            "--bootstrap-server",
            bootstrap,
            *(arg for topic in topics for arg in ("--topic", topic)),
            "--max-age",
            MAX_AGE,
            "--output",
            str(output),
            "--timeout",
            timeout,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=os.environ | {"PYTHONWARNINGS": "ignore"},
    )


@pytest.fixture(scope="module", params=BROKERS)
def audited(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningBroker, dict[str, Any], int, str]]:
    kind: BrokerKind = request.param
    directory = tmp_path_factory.mktemp(f"audit-{kind}")
    connector.jars()  # a first resolution from Maven Central, outside the command's timeout
    settings = HELD_OFF | (KAFKA_HELD_OFF if kind == "kafka" else {})
    with run_broker(kind, directory, settings) as broker:
        now = int(time.time() * 1000)
        _craft(broker.bootstrap, now)
        output = directory / "report"
        done = _audit(broker.bootstrap, output, *TOPICS, "missing")
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads((output / "summary.json").read_text())
        yield broker, summary, now, done.stdout


def _findings(summary: dict[str, Any], topic: str) -> list[tuple[Any, ...]]:
    return sorted(
        (f["code"], f["partition"], f["records"], f["bytes"])
        for f in summary["topics"][topic]["findings"]
    )


def test_a_compliant_topic_is_compliant(
    audited: tuple[RunningBroker, dict[str, Any], int, str],
) -> None:
    _, summary, now, _ = audited
    report = summary["topics"]["compliant"]
    assert (report["verdict"], report["findings"], report["records"]) == ("Compliant", [], 100)
    elapsed = int(time.time() * 1000) - now
    assert 3600 <= report["oldest_record_age_s"] <= 3600 + elapsed // 1000 + 1


def test_records_past_the_maximum_age_are_counted(
    audited: tuple[RunningBroker, dict[str, Any], int, str],
) -> None:
    _, summary, now, _ = audited
    report = summary["topics"]["aged"]
    assert report["verdict"] == "Violations"
    assert _findings(summary, "aged") == [("RecordsOlderThanMaxAge", 0, 30, 3000)]
    (finding,) = report["findings"]
    assert finding["oldest_timestamp_ms"] == finding["newest_timestamp_ms"] == now - 10 * DAY
    assert report["oldest_record_age_s"] >= 10 * DAY // 1000


def test_timestamps_in_the_future_are_counted(
    audited: tuple[RunningBroker, dict[str, Any], int, str],
) -> None:
    _, summary, now, _ = audited
    assert summary["topics"]["future"]["verdict"] == "Violations"
    assert _findings(summary, "future") == [("FutureTimestamps", 1, 20, 200)]
    assert summary["topics"]["future"]["findings"][0]["oldest_timestamp_ms"] == now + 2 * DAY


def test_a_compacted_topic_shows_its_backlog_and_stale_tombstones(
    audited: tuple[RunningBroker, dict[str, Any], int, str],
) -> None:
    _, summary, _, _ = audited
    # Superseded by a value older than the maximum age: ten "old" values (by "mid") and four
    # "mid" ones (by tombstones); the three "mid" values superseded by "new" are within it.
    # Tombstones five days old are past 3 d of compaction plus 1 d of delete.retention.ms.
    assert summary["topics"]["keyed"]["verdict"] == "Violations"
    assert _findings(summary, "keyed") == [
        ("CompactionBacklog", 0, 14, 14 * 5),
        ("TombstonesPastDeleteRetention", 0, 4, 4 * 2),
    ]
    assert summary["topics"]["keyed"]["records"] == 27


def test_unlimited_retention_cannot_meet_a_maximum_age(
    audited: tuple[RunningBroker, dict[str, Any], int, str],
) -> None:
    _, summary, _, _ = audited
    report = summary["topics"]["forever"]
    assert report["verdict"] == "Violations"
    assert _findings(summary, "forever") == [("ConfigCannotMeetMaxAge", None, 0, 0)]
    assert "retention.ms=-1" in report["findings"][0]["detail"]


def test_bytes_over_retention_bytes_are_counted(
    audited: tuple[RunningBroker, dict[str, Any], int, str],
) -> None:
    _, summary, _, _ = audited
    report = summary["topics"]["bulky"]
    assert report["verdict"] == "Violations"
    ((code, partition, records, excess),) = _findings(summary, "bulky")
    # 25,000 records of 100 bytes are 2.5 MB of values, and more on disk with their batches'
    # overhead: past 1,000 bytes and a segment of 1 MiB by 1.45 MB at least.
    assert (code, partition) == ("BytesOverRetention", 1)
    assert 2_500_000 - 1000 - MiB <= excess < 3_500_000 - 1000 - MiB
    # The oldest records making up the excess, by the partition's mean record size on disk.
    assert records == math.ceil(excess * 25_000 / (excess + 1000 + MiB))


def test_a_missing_topic_is_an_error_and_the_report_is_written(
    audited: tuple[RunningBroker, dict[str, Any], int, str], tmp_path: Path
) -> None:
    _, summary, _, stdout = audited
    assert summary["topics"]["missing"] == {
        "verdict": "Error",
        "reason": "topic missing does not exist",
        "oldest_record_age_s": None,
        "max_age_s": None,
        "records": 0,
        "findings": [],
    }
    assert "missing: Error (topic missing does not exist)" in stdout
    assert "aged: Violations" in stdout
    report = Path(summary["report"])
    assert sorted(p.name for p in (report / "partitions").glob("topic=*")) == sorted(
        f"topic={t}" for t in TOPICS
    )
    assert any((report / "findings" / "topic=aged").glob("*.parquet"))


def test_an_unreachable_cluster_is_a_clear_error(tmp_path: Path) -> None:
    done = _audit(f"127.0.0.1:{free_port()}", tmp_path / "report", "anything", timeout="5s")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "gregor: cannot reach the Kafka cluster at 127.0.0.1:" in done.stderr
    assert not (tmp_path / "report" / "summary.json").exists()
