"""Produce-flood benchmark: does a well-behaved client still get answers while others flood?

    python -m bench.flood [--target both|gregor|kafka] [--connections C] [--requests R]
                          [--megabytes M] [--runs N]

The hostile-client suite's produce flood, on Gregor and on Apache Kafka in the same run, with the
same load: `--connections` connections each pipeline `--requests` well-formed Produce requests of
`--megabytes` MiB (one batch each, to one partition; 5 GiB with the defaults) without reading an
answer until all are sent, from one thread on non-blocking sockets; meanwhile a pinger in a
process of its own sends ApiVersions v3 every 10 ms on one connection and times each round trip
from when it was due (`tests.support.pinger`: a stall counts once for every request it held up).
Both brokers run with `socket.request.max.bytes` 16 MiB and `queued.max.request.bytes` 64 MiB;
the topic keeps 64 MiB (retention runs every second).

Each run reports the flood's throughput, the pinger's p50, p99 and max, and the broker
process's CPU seconds (from /proc) per GB taken in; the output ends with `flood_p99_ms=<Gregor's
median p99 over the runs>`, `flood_mib_per_s=<Gregor's median throughput>` and
`flood_cpu_per_gb=<Gregor's median CPU-s/GB>`, each followed by its ratio against Kafka's
(`flood_p99_vs_kafka`, `flood_throughput_vs_kafka`, `flood_cpu_per_gb_vs_kafka`).
It is a measurement, never a test: on a 2-core machine the generator, the pinger and the broker
compete for the CPU.
"""

from __future__ import annotations

import argparse
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.broker import ratio
from bench.cpu import CpuMeter
from tests.integration.clients import create_topic
from tests.support.brokers import BROKERS, BrokerKind, RunningBroker, run_broker
from tests.support.hostile import collect_frames, connections, push
from tests.support.kafka_dist import KAFKA_VERSION, fetch
from tests.support.pinger import Latency, latency, pinging
from tests.support.wire import produce_frame

MiB = 1024 * 1024
TOPIC = "flood"
TIMEOUT_S = 600.0
SETTINGS = {
    "socket.request.max.bytes": str(16 * MiB),
    "queued.max.request.bytes": str(64 * MiB),
    "log.retention.check.interval.ms": "1000",
}


@dataclass(frozen=True, slots=True)
class Run:
    mib_per_s: float
    pinger: Latency
    cpu_per_gb: float
    """The broker's CPU seconds per GB (10^9 bytes) of requests taken in."""


def flood(broker: RunningBroker, arguments: argparse.Namespace) -> Run:
    """One flood beside the pinger: MiB/s taken in, the pinger's latency, the broker's CPU."""
    port = broker.host_port[1]
    meter = CpuMeter([broker.pid])
    frame = produce_frame(TOPIC, arguments.megabytes * MiB)
    body = memoryview(frame)[12:]  # after size, api key, version and correlation id
    count = arguments.requests
    with pinging(port) as samples, connections(port, arguments.connections) as socks:
        meter.start()
        started = time.monotonic()
        chunks = {
            sock: [
                part
                for number in range(count)
                for part in (frame[:8] + struct.pack(">i", index * count + number), body)
            ]
            for index, sock in enumerate(socks)
        }
        sent = push(chunks, timeout=TIMEOUT_S)
        answers = collect_frames(socks, count, timeout=TIMEOUT_S)
        elapsed = time.monotonic() - started
        meter.stop()
    answered = sum(len(got) for got in answers.values())
    if answered != arguments.connections * count:
        raise SystemExit(f"only {answered} of {arguments.connections * count} requests answered")
    (cpu_per_gb,) = meter.per_gb(sent)
    return Run(sent / MiB / elapsed, latency(samples), cpu_per_gb)


def measure(kind: BrokerKind, directory: Path, arguments: argparse.Namespace) -> list[Run]:
    size = str(arguments.megabytes * MiB)
    settings = SETTINGS | {"message.max.bytes": size}
    seen = []
    with run_broker(kind, directory, settings, kafka_heap="1g") as broker:
        create_topic(
            broker.bootstrap,
            TOPIC,
            1,
            **{
                "max.message.bytes": size,
                "segment.bytes": str(32 * MiB),
                "retention.bytes": str(64 * MiB),
                "file.delete.delay.ms": "0",
            },
        )
        for run in range(arguments.runs):
            found = flood(broker, arguments)
            print(
                f"  {kind} run {run + 1}: {found.mib_per_s:.0f} MiB/s, "
                f"{found.cpu_per_gb:.2f} CPU-s/GB; pinger {found.pinger}",
                flush=True,
            )
            seen.append(found)
    return seen


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.flood", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--target", choices=("both", *BROKERS), default="both")
    parser.add_argument("--connections", type=int, default=40)
    parser.add_argument("--requests", type=int, default=16, help="per connection")
    parser.add_argument("--megabytes", type=int, default=8, help="MiB per request")
    parser.add_argument("--runs", type=int, default=3)
    arguments = parser.parse_args(argv)
    targets: tuple[BrokerKind, ...] = BROKERS if arguments.target == "both" else (arguments.target,)
    if "kafka" in targets:
        fetch()
    total = arguments.connections * arguments.requests * arguments.megabytes
    print(
        f"flood: {arguments.connections} connections x {arguments.requests} Produce requests "
        f"of {arguments.megabytes} MiB ({total} MiB), {arguments.runs} runs; "
        f"Apache Kafka {KAFKA_VERSION} as the peer",
        flush=True,
    )
    figures: dict[str, dict[BrokerKind, float]] = {
        "flood_p99_ms": {},
        "flood_mib_per_s": {},
        "flood_cpu_per_gb": {},
    }
    for kind in targets:
        with tempfile.TemporaryDirectory(prefix=f"bench-flood-{kind}-") as directory:
            runs = measure(kind, Path(directory), arguments)
        figures["flood_p99_ms"][kind] = statistics.median(run.pinger.p99_ms for run in runs)
        figures["flood_mib_per_s"][kind] = statistics.median(run.mib_per_s for run in runs)
        figures["flood_cpu_per_gb"][kind] = statistics.median(run.cpu_per_gb for run in runs)
    for name, ratio_name in (
        ("flood_p99_ms", "flood_p99_vs_kafka"),
        ("flood_mib_per_s", "flood_throughput_vs_kafka"),
        ("flood_cpu_per_gb", "flood_cpu_per_gb_vs_kafka"),
    ):
        ours, theirs = figures[name].get("gregor"), figures[name].get("kafka")
        print(f"{name}={'n/a' if ours is None else f'{ours:.2f}'}")
        # Four places: Gregor's p99 under a flood is hundreds of times below Kafka's.
        print(f"{ratio_name}={ratio(ours, theirs, places=4)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
