"""Broker benchmark: Gregor against Apache Kafka, one workload, one load generator for both.

    python -m bench.broker [--target both|gregor|kafka] [--records N] [--latency-records N]
                           [--latency-rate R] [--warmup-records N] [--rounds R]

Each target is a single-node broker (broker and controller in one process) started afresh in a
temporary directory: Gregor as the integration tests start it (`gregor broker --config …`),
Apache Kafka 4.3.1 in KRaft mode from Maven Central (tests/support/kafka_dist.py), with a 1 GiB
heap as `kafka-server-start.sh` gives it. Both get `group.initial.rebalance.delay.ms=0` and are
otherwise at their defaults (no fsync per write on either). The load comes from Kafka's own
tools on the same machine: ProducerPerformance and ConsumerPerformance, 1,024-byte records,
producer defaults apart from `acks`. Before the cases, `--warmup-records` (default 50,000)
go through an 8-partition topic untimed, so that neither broker is measured while it warms up.

Four cases per target: acks=1 and acks=all, on a topic of 1 and of 8 partitions. In each:

1. throughput: ProducerPerformance sends `--records` records (default 100,000, about 100 MB,
   a few seconds) as fast as the broker takes them; its p50/p99 then measure the producer's
   queue at saturation as much as the broker;
2. latency: ProducerPerformance at a fixed `--latency-rate` (default 2,000 records/s) for
   `--latency-records` (default 6,000), so p50/p99 are the broker's round trip, not a queue.
   Both report ProducerPerformance's steady state: the first fifth of the records (its own
   `--warmup-records`) warms the producer's JVM and is not counted;
3. consume: ConsumerPerformance reads the first `--records` records of the topic in a new
   group; its figure is the fetch rate after the group formed (`fetch.MB.sec`).

MB/s are the tools' own figures, which count MiB (2^20 bytes). The targets alternate order in
each round, and each figure is the median over the rounds. The output ends with the two lines
`produce_vs_kafka=<ratio>` and `consume_vs_kafka=<ratio>`: Gregor's median throughput over
Kafka's, 1 KiB records, acks=1, 8 partitions (`n/a` when a target was not run). Before them,
`cpu_per_gb_vs_kafka=<ratio>`: the broker process's CPU seconds (from /proc) per GB produced
in that case's throughput run, Gregor's over Kafka's, so that the comparison holds per core.
This is a measurement, never a pass/fail test.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from bench.cpu import CpuMeter
from broker.protocol import ApiKey
from tests.support.brokers import (
    BROKERS,
    GROUP_CONSUMER_APIS,
    BrokerKind,
    RunningBroker,
    require_apis,
    run_broker,
)
from tests.support.kafka_dist import KAFKA_VERSION, KafkaTools, fetch

RECORD_BYTES = 1024
KAFKA_HEAP = "1g"
ACKS = ("1", "all")
PARTITIONS = (1, 8)
HEADLINE = ("1", 8)
"""The case behind the two closing ratios: acks=1, 8 partitions."""
NEEDED = (
    ApiKey.METADATA,
    ApiKey.CREATE_TOPICS,
    ApiKey.PRODUCE,
    ApiKey.INIT_PRODUCER_ID,
    *GROUP_CONSUMER_APIS,
)
TOOL_TIMEOUT = 600.0
_STEADY = re.compile(
    r"(?P<records>\d+) steady state records sent, [\d.]+ records/sec \((?P<mbps>[\d.]+) MB/sec\), "
    r"[\d.]+ ms avg latency, [\d.]+ ms max latency, (?P<p50>[\d.]+) ms 50th, "
    r"[\d.]+ ms 95th, (?P<p99>[\d.]+) ms 99th"
)


@dataclass(frozen=True, slots=True)
class Case:
    acks: str
    partitions: int
    purpose: str = "bench"

    @property
    def topic(self) -> str:
        return f"{self.purpose}-acks-{self.acks}-p{self.partitions}"

    def __str__(self) -> str:
        return f"acks={self.acks:<3} partitions={self.partitions}"


CASES = tuple(Case(acks, partitions) for acks in ACKS for partitions in PARTITIONS)
WARMUP = Case("1", max(PARTITIONS), "warmup")
"""Untimed load before the cases, so that neither broker is measured while it warms up
(Kafka's JIT compiles its hot paths during the first tens of megabytes)."""


@dataclass(frozen=True, slots=True)
class Produced:
    mbps: float
    p50_ms: float
    p99_ms: float


@dataclass(frozen=True, slots=True)
class Measurement:
    produce: Produced
    latency: Produced
    consume_mbps: float
    cpu_per_gb: float
    """The broker's CPU seconds per GB produced in the throughput run."""


# -- one target ------------------------------------------------------------------------------


def create_topics(broker: RunningBroker, cases: Sequence[Case]) -> None:
    """Every topic of the run, before any load. The admin client is gone before the broker
    stops, so that librdkafka has no reconnection errors to print into the report."""
    # librdkafka's informational lines (level 6) would interleave with the report.
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 4})
    futures = admin.create_topics(
        [NewTopic(case.topic, case.partitions, 1) for case in cases], operation_timeout=30
    )
    for future in futures.values():
        future.result(timeout=60)
    del admin


def produce(tools: KafkaTools, case: Case, records: int, rate: int) -> Produced:
    """ProducerPerformance's steady-state figures: the first fifth of the records warms up the
    producer's JVM and is left out (its JIT would otherwise weigh on the first seconds)."""
    warmup = records // 5
    result = tools.producer_perf(
        "--topic",
        case.topic,
        "--num-records",
        str(records),
        "--warmup-records",
        str(warmup),
        "--record-size",
        str(RECORD_BYTES),
        "--throughput",
        str(rate),
        "--command-property",
        f"acks={case.acks}",
        timeout=TOOL_TIMEOUT,
    )
    summary = [m for line in result.stdout.splitlines() if (m := _STEADY.match(line))]
    if not summary or int(summary[-1]["records"]) != records - warmup:
        raise RuntimeError(
            f"ProducerPerformance did not report {records - warmup} steady-state records:\n"
            + result.describe()
        )
    last = summary[-1]
    return Produced(float(last["mbps"]), float(last["p50"]), float(last["p99"]))


def consume(tools: KafkaTools, case: Case, records: int, group: str) -> float:
    result = tools.consumer_perf(
        "--topic",
        case.topic,
        "--num-records",
        str(records),
        "--group",
        group,
        "--timeout",
        "30000",
        timeout=TOOL_TIMEOUT,
    )
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    header, row = lines[-2], lines[-1]
    columns = dict(zip((c.strip() for c in header.split(",")), row.split(","), strict=True))
    if int(columns["data.consumed.in.nMsg"]) < records:
        raise RuntimeError(
            f"ConsumerPerformance read fewer than {records} records:\n" + result.describe()
        )
    return float(columns["fetch.MB.sec"])


def measure(
    kind: BrokerKind, directory: Path, arguments: argparse.Namespace, round_number: int
) -> dict[Case, Measurement]:
    with run_broker(kind, directory, kafka_heap=KAFKA_HEAP) as broker:
        require_apis(broker, NEEDED)
        create_topics(broker, (WARMUP, *CASES))
        tools = KafkaTools(broker.bootstrap)
        if arguments.warmup_records:
            produce(tools, WARMUP, arguments.warmup_records, -1)
            consume(tools, WARMUP, arguments.warmup_records, f"warmup-{round_number}")
        results: dict[Case, Measurement] = {}
        for case in CASES:
            meter = CpuMeter([broker.pid])
            meter.start()
            throughput = produce(tools, case, arguments.records, -1)
            meter.stop()
            (cpu_per_gb,) = meter.per_gb(arguments.records * RECORD_BYTES)
            latency = produce(tools, case, arguments.latency_records, arguments.latency_rate)
            consumed = consume(tools, case, arguments.records, f"bench-{round_number}")
            results[case] = Measurement(throughput, latency, consumed, cpu_per_gb)
            print(
                f"  {kind:<6} round {round_number + 1} {case}: produce {throughput.mbps:7.1f} MB/s "
                f"(p50 {throughput.p50_ms:.0f} ms, p99 {throughput.p99_ms:.0f} ms), "
                f"at {arguments.latency_rate}/s p50 {latency.p50_ms:.0f} ms p99 "
                f"{latency.p99_ms:.0f} ms, consume {consumed:7.1f} MB/s, "
                f"{cpu_per_gb:.1f} CPU-s/GB produced",
                flush=True,
            )
        return results


# -- the report ------------------------------------------------------------------------------


def ratio(gregor: float | None, kafka: float | None, places: int = 2) -> str:
    """Gregor's figure over Kafka's, as the benchmarks print it; `n/a` without both."""
    if gregor is None or kafka is None or kafka == 0:
        return "n/a"
    return f"{gregor / kafka:.{places}f}"


@dataclass(frozen=True, slots=True)
class Summary:
    produce_mbps: float
    produce_p50: float
    produce_p99: float
    latency_p50: float
    latency_p99: float
    consume_mbps: float
    cpu_per_gb: float


def summarise(runs: Sequence[dict[Case, Measurement]], case: Case) -> Summary:
    ms = [run[case] for run in runs]
    return Summary(
        statistics.median([m.produce.mbps for m in ms]),
        statistics.median([m.produce.p50_ms for m in ms]),
        statistics.median([m.produce.p99_ms for m in ms]),
        statistics.median([m.latency.p50_ms for m in ms]),
        statistics.median([m.latency.p99_ms for m in ms]),
        statistics.median([m.consume_mbps for m in ms]),
        statistics.median([m.cpu_per_gb for m in ms]),
    )


def report(results: dict[BrokerKind, list[dict[Case, Measurement]]], rate: int) -> list[str]:
    medians = {
        kind: {case: summarise(runs, case) for case in CASES} for kind, runs in results.items()
    }
    gregor, kafka = medians.get("gregor"), medians.get("kafka")

    def field(table: dict[Case, Summary] | None, case: Case, name: str) -> float | None:
        return None if table is None else float(getattr(table[case], name))

    def shown(value: float | None, width: int, digits: int = 1) -> str:
        return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"

    lines: list[str] = []
    for title, name in (
        ("produce MB/s", "produce_mbps"),
        ("consume MB/s", "consume_mbps"),
        ("broker CPU-s per GB produced", "cpu_per_gb"),
    ):
        lines.append(f"{title:<28}{'Gregor':>10}{'Kafka':>10}{'ratio':>8}")
        for case in CASES:
            g, k = field(gregor, case, name), field(kafka, case, name)
            lines.append(f"  {case!s:<26}{shown(g, 10)}{shown(k, 10)}{ratio(g, k):>8}")
    for title, prefix in (
        ("produce latency at saturation", "produce"),
        (f"produce latency at {rate} records/s", "latency"),
    ):
        lines.append(
            f"{title:<36}{'Gregor p50/p99 ms':>19}{'Kafka p50/p99 ms':>19}{'p99 ratio':>11}"
        )
        for case in CASES:
            cells = []
            for table in (gregor, kafka):
                p50, p99 = field(table, case, f"{prefix}_p50"), field(table, case, f"{prefix}_p99")
                cells.append("-" if p50 is None else f"{p50:.0f}/{p99:.0f}")
            p99_ratio = ratio(
                field(gregor, case, f"{prefix}_p99"), field(kafka, case, f"{prefix}_p99")
            )
            lines.append(f"  {case!s:<34}{cells[0]:>19}{cells[1]:>19}{p99_ratio:>11}")
    headline = Case(*HEADLINE)
    cpu = ratio(field(gregor, headline, "cpu_per_gb"), field(kafka, headline, "cpu_per_gb"))
    lines.append(f"cpu_per_gb_vs_kafka={cpu}")
    for label, name in (("produce_vs_kafka", "produce_mbps"), ("consume_vs_kafka", "consume_mbps")):
        lines.append(
            f"{label}={ratio(field(gregor, headline, name), field(kafka, headline, name))}"
        )
    return lines


# -- main ------------------------------------------------------------------------------------


@contextlib.contextmanager
def scratch(kind: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=f"bench-broker-{kind}-") as directory:
        yield Path(directory)


def preflight(kind: BrokerKind) -> str | None:
    """Why the broker cannot take the workload (an API it lacks), before any measurement."""
    with scratch(kind) as directory, run_broker(kind, directory) as broker:
        try:
            require_apis(broker, NEEDED)
        except AssertionError as missing:
            return str(missing)
    return None


def workload_arguments(
    prog: str, doc: str, argv: Sequence[str] | None, *, latency_rate: int
) -> tuple[argparse.Namespace, tuple[BrokerKind, ...]]:
    """The options every broker benchmark takes, parsed; and the targets they name."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n", maxsplit=1)[0])
    parser.add_argument("--target", choices=("both", *BROKERS), default="both")
    parser.add_argument("--records", type=int, default=100_000, help="per throughput run")
    parser.add_argument("--latency-records", type=int, default=6_000)
    parser.add_argument("--latency-rate", type=int, default=latency_rate, help="records/s")
    parser.add_argument("--warmup-records", type=int, default=50_000, help="0 for none")
    parser.add_argument("--rounds", type=int, default=1)
    arguments = parser.parse_args(argv)
    targets: tuple[BrokerKind, ...] = BROKERS if arguments.target == "both" else (arguments.target,)
    return arguments, targets


def main(argv: Sequence[str] | None = None) -> int:
    arguments, targets = workload_arguments(
        "python -m bench.broker", __doc__, argv, latency_rate=2_000
    )

    started = time.perf_counter()
    fetch()
    print(
        f"broker benchmark: {RECORD_BYTES}-byte records, {arguments.records} per throughput run, "
        f"Apache Kafka {KAFKA_VERSION}'s ProducerPerformance and ConsumerPerformance as the load",
        flush=True,
    )
    if "gregor" in targets and (missing := preflight("gregor")):
        print(
            f"cannot run the benchmark: {missing}; `--target kafka` runs Kafka alone",
            file=sys.stderr,
        )
        return 1
    results: dict[BrokerKind, list[dict[Case, Measurement]]] = {kind: [] for kind in targets}
    for round_number in range(arguments.rounds):
        order = targets if round_number % 2 == 0 else tuple(reversed(targets))
        for kind in order:
            with scratch(kind) as directory:
                results[kind].append(measure(kind, directory, arguments, round_number))
    print(f"({arguments.rounds} round(s), {time.perf_counter() - started:.0f} s; medians)")
    print("\n".join(report(results, arguments.latency_rate)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
