"""Replicated benchmark: three Gregor nodes against three Apache Kafka nodes, one workload.

    python -m bench.replicated [--target both|gregor|kafka] [--records N]
                               [--latency-records N] [--latency-rate R]
                               [--warmup-records N] [--rounds R]

Each target is a cluster of three combined nodes (broker and controller in each process, all
three voters of the metadata quorum) started afresh on this machine: Gregor's as the
integration tests start it, Apache Kafka 4.3.1's from Maven Central with a 1 GiB heap per
node as `kafka-server-start.sh` gives it. The topic has 8 partitions, replication factor 3
and `min.insync.replicas=2`; the load is Kafka's ProducerPerformance with `acks=all` and
1,024-byte records, on the same machine. Before the cases, `--warmup-records` (default
50,000) go to another topic of the same shape, untimed.

Per round and target:

1. throughput: `--records` records (default 100,000) as fast as the cluster takes them, every
   one on all three replicas before it is acknowledged; and the CPU seconds the three broker
   processes used meanwhile (from /proc), per GB produced;
2. latency: `--latency-records` (default 6,000) at `--latency-rate` (default 1,000/s), a rate
   both clusters sustain, so that p50/p99 are the round trip through the leader and its
   followers and not a queue.

Both report ProducerPerformance's steady state (its first fifth warms the producer up). The
targets alternate order in each round; each figure is the median over the rounds. The output
ends with `replicated_cpu_per_gb_vs_kafka=<ratio>`, `replicated_produce_vs_kafka=<ratio>` and
`replicated_p99_vs_kafka=<ratio>` (Gregor's over Kafka's; `n/a` when a target was not run).
This is a measurement, never a pass/fail test.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from bench.broker import RECORD_BYTES, Case, Produced, produce, ratio, workload_arguments
from bench.cpu import CpuMeter
from tests.support.brokers import BrokerKind
from tests.support.kafka_dist import KAFKA_VERSION, KafkaTools, fetch, start_kafka_cluster
from tests.support.kafka_dist import stop_kafka_cluster as _stop_kafka
from tests.support.nodes import start_cluster

KAFKA_HEAP = "1g"
NODES = 3
CASE = Case("all", 8, "replicated")
WARMUP = Case("all", 8, "replicated-warmup")
TOPIC_CONFIGS = {"min.insync.replicas": "2"}
SETTINGS = {"group.initial.rebalance.delay.ms": "0"}


@dataclass(frozen=True, slots=True)
class Round:
    throughput: Produced
    latency: Produced
    cpu_per_gb: tuple[float, ...]
    """Each node's CPU seconds per GB produced in the throughput run."""


@dataclass(frozen=True, slots=True)
class Running:
    bootstrap: str
    pids: tuple[int, ...]


@contextlib.contextmanager
def run_cluster(kind: BrokerKind, directory: Path) -> Iterator[Running]:
    if kind == "gregor":
        cluster = start_cluster(directory, NODES, 0, SETTINGS)
        try:
            yield Running(
                ",".join(node.bootstrap for node in cluster.brokers),
                tuple(node.process.pid for node in cluster.brokers),
            )
        finally:
            cluster.kill()  # how it stops is not measured; its directory goes next
    else:
        brokers = start_kafka_cluster(directory, NODES, SETTINGS, heap=KAFKA_HEAP)
        try:
            yield Running(
                ",".join(b.bootstrap for b in brokers), tuple(b.process.pid for b in brokers)
            )
        finally:
            _stop_kafka(brokers)


def create_topics(bootstrap: str) -> None:
    """Both topics, once every broker has registered, led and in sync before any load."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
    deadline = time.monotonic() + 60
    while len(admin.list_topics(timeout=10).brokers) < NODES:
        if time.monotonic() > deadline:
            raise RuntimeError("the brokers did not all register")
        time.sleep(0.2)
    futures = admin.create_topics(
        [NewTopic(c.topic, c.partitions, NODES, config=TOPIC_CONFIGS) for c in (WARMUP, CASE)],
        operation_timeout=30,
    )
    for future in futures.values():
        future.result(timeout=60)
    for case in (WARMUP, CASE):
        while True:
            partitions = admin.list_topics(case.topic, timeout=10).topics[case.topic].partitions
            if len(partitions) == case.partitions and all(
                p.leader >= 0 and len(p.isrs) == NODES for p in partitions.values()
            ):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{case.topic} did not get its leaders and ISRs")
            time.sleep(0.2)
    del admin


def measure(
    kind: BrokerKind, directory: Path, arguments: argparse.Namespace, round_number: int
) -> Round:
    with run_cluster(kind, directory) as cluster:
        create_topics(cluster.bootstrap)
        tools = KafkaTools(cluster.bootstrap)
        if arguments.warmup_records:
            produce(tools, WARMUP, arguments.warmup_records, -1)
        meter = CpuMeter(cluster.pids)
        meter.start()
        throughput = produce(tools, CASE, arguments.records, -1)
        meter.stop()
        cpu = meter.per_gb(arguments.records * RECORD_BYTES)
        latency = produce(tools, CASE, arguments.latency_records, arguments.latency_rate)
        print(
            f"  {kind:<6} round {round_number + 1}: produce {throughput.mbps:7.1f} MB/s "
            f"(p50 {throughput.p50_ms:.0f} ms, p99 {throughput.p99_ms:.0f} ms), "
            f"at {arguments.latency_rate}/s p50 {latency.p50_ms:.0f} ms p99 "
            f"{latency.p99_ms:.0f} ms, CPU-s/GB per node " + "/".join(f"{c:.1f}" for c in cpu),
            flush=True,
        )
        return Round(throughput, latency, cpu)


def report(results: dict[BrokerKind, list[Round]], rate: int) -> list[str]:
    def median(kind: BrokerKind, pick: str) -> float | None:
        rounds = results.get(kind)
        if not rounds:
            return None
        values = {
            "mbps": [r.throughput.mbps for r in rounds],
            "sat_p99": [r.throughput.p99_ms for r in rounds],
            "p50": [r.latency.p50_ms for r in rounds],
            "p99": [r.latency.p99_ms for r in rounds],
            "cpu": [sum(r.cpu_per_gb) for r in rounds],
        }[pick]
        return statistics.median(values)

    def shown(value: float | None) -> str:
        return f"{'-':>10}" if value is None else f"{value:>10.1f}"

    rows = (
        ("produce MB/s, acks=all", "mbps"),
        ("p99 ms at saturation", "sat_p99"),
        (f"p50 ms at {rate}/s", "p50"),
        (f"p99 ms at {rate}/s", "p99"),
        ("CPU-s per GB, 3 nodes", "cpu"),
    )
    lines = [f"{'3 nodes, RF 3, 8 partitions':<32}{'Gregor':>10}{'Kafka':>10}{'ratio':>8}"]
    for title, pick in rows:
        g, k = median("gregor", pick), median("kafka", pick)
        lines.append(f"  {title:<30}{shown(g)}{shown(k)}{ratio(g, k):>8}")
    for label, pick in (
        ("replicated_cpu_per_gb_vs_kafka", "cpu"),
        ("replicated_produce_vs_kafka", "mbps"),
        ("replicated_p99_vs_kafka", "p99"),
    ):
        lines.append(f"{label}={ratio(median('gregor', pick), median('kafka', pick))}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    arguments, targets = workload_arguments(
        "python -m bench.replicated", __doc__, argv, latency_rate=1_000
    )

    started = time.perf_counter()
    fetch()
    print(
        f"replicated benchmark: {NODES} nodes, RF {NODES}, acks=all, {RECORD_BYTES}-byte "
        f"records, {arguments.records} per throughput run, Apache Kafka {KAFKA_VERSION}'s "
        "ProducerPerformance as the load",
        flush=True,
    )
    results: dict[BrokerKind, list[Round]] = {kind: [] for kind in targets}
    for round_number in range(arguments.rounds):
        order = targets if round_number % 2 == 0 else tuple(reversed(targets))
        for kind in order:
            with tempfile.TemporaryDirectory(prefix=f"bench-replicated-{kind}-") as directory:
                results[kind].append(measure(kind, Path(directory), arguments, round_number))
    print(f"({arguments.rounds} round(s), {time.perf_counter() - started:.0f} s; medians)")
    print("\n".join(report(results, arguments.latency_rate)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
