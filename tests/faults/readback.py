"""What the nodes hold, read back: every record of a topic through a plain consumer, the
producer ids and epochs of chosen records' batches through Fetch by hand, and the ERROR lines
of each node's log. What it must never do: change anything on the cluster (no group, no
commits)."""

from __future__ import annotations

import datetime
import re
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from broker.protocol import ApiKey, request_type
from broker.protocol.records import iter_batches
from tests.faults.cluster_view import QUIET, address, describe
from tests.support.clusters import ThreeNodes
from tests.support.requests import fill
from tests.support.wire import call, fetch_values

__all__ = ["Read", "logged_errors", "producer_marks", "read_partitions"]


@dataclass
class Read:
    """What one partition held, from its log start to its high watermark."""

    log_start: int
    high_watermark: int
    records: list[tuple[int, bytes | None]]


def read_partitions(
    nodes: ThreeNodes, topic: str, partitions: int, timeout: float = 120.0
) -> dict[int, Read]:
    """Every record of every partition of `topic` from its log start, by assignment (no
    group, nothing committed), up to the high watermark each leader gave before the read.
    Raises if a partition cannot be read to its end within `timeout`."""
    consumer = Consumer(
        {
            "bootstrap.servers": nodes.bootstrap,
            "group.id": f"faults-reader-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "check.crcs": True,
            **QUIET,
        }
    )
    deadline = time.monotonic() + timeout
    try:
        reads: dict[int, Read] = {}
        for partition in range(partitions):
            while partition not in reads:
                try:
                    low, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=5
                    )
                    reads[partition] = Read(int(low), int(high), [])
                except KafkaException:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        seen: set[tuple[int, int, bytes | None]] = set()
        errors: list[str] = []

        def complete(read: Read) -> bool:
            last = read.records[-1][0] if read.records else read.log_start - 1
            return last >= read.high_watermark - 1

        while not all(complete(r) for r in reads.values()):
            if time.monotonic() > deadline:
                progress = {
                    p: (r.log_start, r.records[-1][0] if r.records else None, r.high_watermark)
                    for p, r in reads.items()
                }
                raise AssertionError(
                    f"{topic} not read to its end within {timeout:.0f} s (partition: log "
                    f"start, last offset read, high watermark): {progress}; errors {errors[-5:]}"
                )
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                errors.append(str(message.error()))
                continue
            index, offset = message.partition(), message.offset()
            assert index is not None
            assert offset is not None
            if (index, offset, message.value()) in seen:
                continue  # read again after a reset of the fetch position
            seen.add((index, offset, message.value()))
            reads[index].records.append((offset, message.value()))
        for read in reads.values():
            read.records.sort(key=lambda r: r[0])
        return reads
    finally:
        consumer.close()


def producer_marks(
    nodes: ThreeNodes, topic: str, places: set[tuple[int, int]]
) -> dict[tuple[int, int], tuple[int, int, int]]:
    """The producer id, producer epoch and sequence number of the records at `places`
    ((partition, offset)), from the batches the partitions' leaders serve: no client shows
    them, so Fetch v12 by hand. Places not found (no leader, a fetch that failed) are left
    out."""
    found: dict[tuple[int, int], tuple[int, int, int]] = {}
    leaders: dict[int, int] = {}
    for view in describe(nodes, [topic]).values():
        if not isinstance(view, str) and topic in view[1]:
            leaders = {p: v.leader for p, v in view[1][topic].partitions.items()}
            break
    for partition, offset in sorted(places):
        if (partition, offset) in found or leaders.get(partition, -1) < 0:
            continue
        request = fill(
            request_type(ApiKey.FETCH, 12),
            fetch_values(
                topic, datetime.timedelta(0), (partition,), fetch_offset=offset, min_bytes=0
            ),
        )
        try:
            answer: Any = call(address(nodes, leaders[partition]), ApiKey.FETCH, 12, request)
        except (OSError, ConnectionError):
            continue
        records = answer.responses[0].partitions[0].records or b""
        for _, header in iter_batches(records, allow_partial_tail=True):
            for delta in range(header.last_offset_delta + 1):
                found[(partition, header.base_offset + delta)] = (
                    header.producer_id,
                    header.producer_epoch,
                    header.base_sequence + delta,
                )
    return {place: found[place] for place in places if place in found}


_LEVEL = re.compile(r"\b(ERROR|CRITICAL|FATAL)\b")
_TIMESTAMP = re.compile(r"^\[?\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+\]? ")


def logged_errors(nodes: ThreeNodes, node_id: int) -> Counter[str]:
    """The node's ERROR (and worse) log lines over the whole run, counted by message with its
    numbers blanked out (`#`). The node's output file is found next to its log dir, where
    both systems' runners write it (`broker.log`, `kafka.log`)."""
    found: Counter[str] = Counter()
    home = nodes.log_dir(node_id).parent
    for name in ("broker.log", "kafka.log"):
        path = home / name
        if not path.exists():
            continue
        with path.open(errors="replace") as lines:
            for line in lines:
                if _LEVEL.search(line[:40]):
                    message = re.sub(r"\d+", "#", _TIMESTAMP.sub("", line.strip()))
                    found[message[:200]] += 1
    return found
