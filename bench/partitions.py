"""Many partitions at once: one CreateTopics of thousands of partitions on three combined
nodes, then each node restarted in turn, while another client keeps producing.

    python -m bench.partitions [--target both|gregor|kafka] [--partitions N] [--no-restarts]
                               [--dir DIR]

Each target is three combined nodes (broker and controller in each process, all three voters)
started afresh on this machine, as `tests/support/clusters.py` starts them. A *probe* produces
one record every 10 ms (acks=all, idempotent) to a topic of one partition, replication factor
3, and times each from `produce` to its acknowledgement. A *watcher* asks, every 200 ms, the
quorum's epoch (DescribeQuorum) and the brokers a Metadata request lists (a fenced broker is
not listed, in Kafka as in Gregor).

Phases, each a window of the probe's timeline:
1. `idle`: 5 s before anything happens;
2. `create`: one CreateTopics of `--partitions` partitions (default 9,999: with its
   TopicRecord that is 10,000 metadata records, the most one operation may write in Kafka
   and in Gregor), replication factor 3, until it is answered, then until Metadata shows
   them all led with three replicas in sync, then until every node has their logs on disk
   (DescribeLogDirs), plus 10 s;
3. `restarts`: each node in turn stopped with SIGTERM and started again, the next once the
   probe's partition has its three replicas in sync again and the restarted node is listed.

The report gives, per phase, the probe's p50, p99 and max and its failed sends, the quorum
epochs seen (an election moves the epoch) and which brokers went missing from Metadata
outside their own restart. It is a measurement, never a pass/fail test: on a shared 2-core
machine the probe, the watcher and the three nodes compete for the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from broker.protocol import ApiKey, ErrorCode, request_type
from tests.support.clusters import ThreeNodes, three_nodes
from tests.support.requests import fill
from tests.support.wire import call

PROBE = "probe"
BIG = "many"
QUIET = {"log_level": 0}
KAFKA_HEAP = "1g"
"""Each Kafka node's heap: with the tests' 384 MiB, 10,000 partitions ran a node out of memory
(and into minutes of garbage collection before that)."""


@dataclass
class Timeline:
    """What the probe and the watcher saw, with the time (monotonic) of each."""

    sends: list[tuple[float, float | None]] = field(default_factory=list)
    """(sent at, round trip in seconds or None if it failed)."""
    epochs: list[tuple[float, int]] = field(default_factory=list)
    listed: list[tuple[float, frozenset[int]]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


def _probe(bootstrap: str, timeline: Timeline) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, **QUIET}
    )

    def delivered(sent: float) -> Callable[[object, object], None]:
        def done(error: object, _: object) -> None:
            timeline.sends.append((sent, None if error else time.monotonic() - sent))

        return done

    while not timeline.stop.is_set():
        producer.produce(PROBE, b"x", on_delivery=delivered(time.monotonic()))
        producer.poll(0.01)
    producer.flush(60)


def _watch(cluster: ThreeNodes, timeline: Timeline) -> None:
    quorum = fill(
        request_type(ApiKey.DESCRIBE_QUORUM, 1),
        {"topics": [{"topic_name": "__cluster_metadata", "partitions": [{"partition_index": 0}]}]},
    )
    metadata = fill(request_type(ApiKey.METADATA, 12), {"topics": []})
    while not timeline.stop.wait(0.2):
        for address in cluster.bootstrap.split(","):
            host, port = address.rsplit(":", 1)
            try:
                answer = call((host, int(port)), ApiKey.DESCRIBE_QUORUM, 1, quorum, timeout=2)
                partition = answer.topics[0].partitions[0]
                if partition.error_code == ErrorCode.none:
                    timeline.epochs.append((time.monotonic(), partition.leader_epoch))
                listed = call((host, int(port)), ApiKey.METADATA, 12, metadata, timeout=2)
                timeline.listed.append(
                    (time.monotonic(), frozenset(b.node_id for b in listed.brokers))
                )
                break
            except OSError:
                continue


def _phase(name: str, timeline: Timeline, start: float, end: float, restarting: int = 0) -> str:
    times = sorted(rt for sent, rt in timeline.sends if start <= sent < end and rt is not None)
    failed = sum(1 for sent, rt in timeline.sends if start <= sent < end and rt is None)
    epochs = sorted({epoch for at, epoch in timeline.epochs if start <= at < end})
    missing = sorted(
        {
            node
            for at, listed in timeline.listed
            if start <= at < end
            for node in {1, 2, 3} - listed
            if node != restarting
        }
    )

    def pct(q: float) -> float:
        return times[min(len(times) - 1, int(q * len(times)))] * 1000 if times else float("nan")

    slowest = max(
        ((rt, sent) for sent, rt in timeline.sends if start <= sent < end and rt is not None),
        default=(0.0, start),
    )
    return (
        f"{name}: {end - start:.1f} s, probe n={len(times)} failed={failed} "
        f"p50={pct(0.5):.1f} ms p99={pct(0.99):.1f} ms max={pct(1.0):.1f} ms "
        f"(sent at +{slowest[1] - start:.1f} s), "
        f"quorum epochs {epochs}, brokers missing from Metadata {missing}"
    )


def _wait_led(admin: AdminClient, topic: str, partitions: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        described = admin.list_topics(topic, timeout=30).topics.get(topic)
        if described is not None and described.error is None:
            led = [p for p in described.partitions.values() if p.leader >= 0 and not p.error]
            if len(led) == partitions and all(len(p.isrs) == 3 for p in led):
                return
        time.sleep(1)
    raise TimeoutError(f"{topic}: not all {partitions} partitions led with 3 in sync")


def _wait_hosted(cluster: ThreeNodes, topic: str, partitions: int, timeout: float) -> None:
    """Until every node has a log for each of the topic's partitions (DescribeLogDirs, which
    lists what a broker holds on its disks, in Kafka as in Gregor)."""
    request = fill(request_type(ApiKey.DESCRIBE_LOG_DIRS, 1), {"topics": None})
    deadline = time.monotonic() + timeout
    for address in cluster.bootstrap.split(","):
        host, port = address.rsplit(":", 1)
        while True:
            answer = call((host, int(port)), ApiKey.DESCRIBE_LOG_DIRS, 1, request, timeout=30)
            hosted = sum(
                len(t.partitions) for r in answer.results for t in r.topics if t.name == topic
            )
            if hosted >= partitions:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{address} holds {hosted} of {topic}'s {partitions} logs")
            time.sleep(1)


def run(kind: str, partitions: int, restarts: bool, keep: Path | None = None) -> Iterator[str]:
    """The phases' lines; the nodes' data and logs go under `keep` (kept) if given."""
    with contextlib.ExitStack() as stack:
        if keep is None:
            where = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        else:
            where = keep / kind
            where.mkdir(parents=True)
        nodes = three_nodes(kind, where, kafka_heap=KAFKA_HEAP)
        yield from _run(stack.enter_context(nodes), partitions, restarts)


def _run(cluster: ThreeNodes, partitions: int, restarts: bool) -> Iterator[str]:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, **QUIET})
    admin.create_topics([NewTopic(PROBE, 1, 3)])[PROBE].result(60)
    timeline = Timeline()
    threads = [
        threading.Thread(target=_probe, args=(cluster.bootstrap, timeline)),
        threading.Thread(target=_watch, args=(cluster, timeline)),
    ]
    for thread in threads:
        thread.start()
    try:
        while not any(rt is not None for _, rt in timeline.sends):
            time.sleep(0.1)  # the producer has its id and its connections
        begin = time.monotonic()
        time.sleep(5)
        created = time.monotonic()
        yield _phase("idle", timeline, begin, created)
        answer = admin.create_topics(
            [NewTopic(BIG, partitions, 3)], operation_timeout=600, request_timeout=600
        )
        answer[BIG].result(900)
        answered = time.monotonic() - created
        _wait_led(admin, BIG, partitions, 900)
        led = time.monotonic() - created
        _wait_hosted(cluster, BIG, partitions, 900)
        hosted = time.monotonic() - created
        time.sleep(10)
        yield (
            _phase("create", timeline, created, time.monotonic())
            + f"; answered in {answered:.1f} s, all led and in sync after {led:.1f} s, "
            f"every log on every node after {hosted:.1f} s"
        )
        if restarts:
            for node in (1, 2, 3):
                start = time.monotonic()
                code = cluster.stop(node)
                stopped = time.monotonic() - start
                cluster.restart(node, timeout=900)
                serving = time.monotonic() - start
                _wait_led(admin, PROBE, 1, 600)
                _wait_listed(timeline, node, 600)
                yield (
                    _phase(f"restart {node}", timeline, start, time.monotonic(), node)
                    + f"; exit code {code} after {stopped:.1f} s, serving again at "
                    f"+{serving:.1f} s"
                )
    finally:
        timeline.stop.set()
        for thread in threads:
            thread.join()


def _wait_listed(timeline: Timeline, node: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    since = time.monotonic()
    while time.monotonic() < deadline:
        if any(at > since and node in listed for at, listed in timeline.listed[-3:]):
            return
        time.sleep(0.5)
    raise TimeoutError(f"node {node} is not listed again")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=("both", "gregor", "kafka"), default="gregor")
    parser.add_argument("--partitions", type=int, default=9_999)
    parser.add_argument("--no-restarts", action="store_true")
    parser.add_argument(
        "--dir", type=Path, help="keep the nodes' data and logs here (a new directory per target)"
    )
    args = parser.parse_args(argv)
    kinds = ("gregor", "kafka") if args.target == "both" else (args.target,)
    for kind in kinds:
        for line in run(kind, args.partitions, not args.no_restarts, args.dir):
            print(f"{kind} {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
