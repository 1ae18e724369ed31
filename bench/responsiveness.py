"""Responsiveness benchmark: does the broker keep answering while it does heavy work of its own?

    python -m bench.responsiveness [--target both|gregor|kafka] [--megabytes M] [--keys K]
                                   [--clean-timeout S] [--list-offsets N]

Issue 11 asks that ApiVersions round trips from another client stay under 50 ms at p99 while a
1 GB compacted partition is cleaned and a large ListOffsets runs. This measures exactly that,
on Gregor and on Apache Kafka in the same run, with the same load:

1. a single-node broker starts afresh (as bench.broker starts it); a topic `compacted` of one
   partition gets `cleanup.policy=compact`, `segment.bytes=64 MiB` and
   `min.cleanable.dirty.ratio=0.01`, so that the cleaner takes it on its next round;
2. a *pinger* in a process of its own (so that nothing in the driver competes with it for a
   GIL) sends ApiVersions v3 on one connection, one request at a time, one due every 10 ms,
   and times each from when it was due (a stall counts once for every request it held up);
3. phases, each a window of the pinger's timeline: `idle` (5 s before any load), `load`
   (`--megabytes` of 1 KiB records with keys drawn from `--keys` distinct ones, produced with
   confluent-kafka, acks=1), `clean` (from the end of the load until the cleaner's checkpoint,
   `cleaner-offset-checkpoint` in the log dir, reaches the active segment: the whole cleanable
   range has been compacted; Kafka and Gregor both write that file), and `list-offsets`
   (`--list-offsets` ListOffsets for the max timestamp of the partition, one after another, with
   confluent-kafka's AdminClient; each one's duration is reported too).

The report gives each phase's p50, p99 and max round trip and the number of round trips, and the
broker process's CPU seconds (from /proc) from the start of the load to the end of the last
ListOffsets, per GB loaded; the output ends with `clean_p99_ms=<Gregor's p99 while cleaning>`,
`list_offsets_p99_ms=<…>`, `cpu_per_gb=<…>`, each followed by its ratio against Kafka's in the
same run (`…_vs_kafka`). A round trip that the broker never
answers (a closed connection) counts as a failure and is reported. It is a measurement, never a
test: on a shared 2-core machine the pinger, the producer and the broker compete for the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import multiprocessing.connection
import socket
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec  # re-exported without __all__
from confluent_kafka.cimpl import NewTopic

from bench.broker import ratio
from bench.cpu import CpuMeter
from broker.protocol import ApiKey, FrameReader, RequestHeader, build, encode_request, request_type
from tests.support.brokers import BROKERS, BrokerKind, RunningBroker, run_broker
from tests.support.kafka_dist import KAFKA_VERSION, fetch

TOPIC = "compacted"
RECORD_BYTES = 1024
SEGMENT_BYTES = 64 * 1024 * 1024
PING_INTERVAL_S = 0.010
IDLE_S = 5.0
PHASES = ("idle", "load", "clean", "list-offsets")


# -- the pinger (its own process) ------------------------------------------------------------


def _ping(host: str, port: int, stop: multiprocessing.connection.Connection) -> None:
    """ApiVersions round trips on a fixed schedule until `stop` receives anything; then send
    back the samples: (intended send time, seconds until answered, answered) for each.

    Request k is due at start + k × PING_INTERVAL_S. When the broker stalls, the requests that
    fell due meanwhile are sent as soon as the previous one is answered and timed from when
    they were *due*, not from when they left: a 2 s stall then weighs as the 200 requests a
    client would have waited on, not as one sample (no coordinated omission)."""
    body = build(
        request_type(ApiKey.API_VERSIONS, 3),
        client_software_name="gregor-bench-pinger",
        client_software_version="1",
    )
    samples: list[tuple[float, float, bool]] = []
    sock: socket.socket | None = None
    start = time.monotonic()
    due = start
    correlation_id = 0
    while not stop.poll(max(0.0, due - time.monotonic())):
        correlation_id += 1
        frame = encode_request(RequestHeader(ApiKey.API_VERSIONS, 3, correlation_id, "ping"), body)
        try:
            if sock is None:
                sock = socket.create_connection((host, port), timeout=60)
            sock.sendall(frame)
            reader = FrameReader()
            while reader.next_frame() is None:
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("closed")
                reader.receive_data(data)
            samples.append((due, time.monotonic() - due, True))
        except OSError:
            samples.append((due, time.monotonic() - due, False))
            if sock is not None:
                sock.close()
            sock = None
        due += PING_INTERVAL_S
    if sock is not None:
        sock.close()
    stop.send(samples)


@contextlib.contextmanager
def pinger(broker: RunningBroker) -> Iterator[list[tuple[float, float, bool]]]:
    """The pinger runs for the block; its samples fill the yielded list when the block ends."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    host, port = broker.host_port
    process = context.Process(target=_ping, args=(host, port, theirs), daemon=True)
    process.start()
    samples: list[tuple[float, float, bool]] = []
    try:
        yield samples
    finally:
        ours.send("stop")
        samples.extend(ours.recv())
        process.join(30)


# -- the work the broker is given ------------------------------------------------------------


def create_topic(broker: RunningBroker) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 4})
    config = {
        "cleanup.policy": "compact",
        "segment.bytes": str(SEGMENT_BYTES),
        "min.cleanable.dirty.ratio": "0.01",
    }
    futures = admin.create_topics([NewTopic(TOPIC, 1, 1, config=config)], operation_timeout=30)
    for future in futures.values():
        future.result(timeout=60)


def load(broker: RunningBroker, megabytes: int, keys: int) -> int:
    """Produce `megabytes` MiB of 1 KiB records with keys cycling over `keys`; the count."""
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "acks": "1",
            "linger.ms": 5,
            "batch.size": 1 << 20,
            "queue.buffering.max.kbytes": 1 << 20,
            "log_level": 4,
        }
    )
    value = bytes(range(256)) * (RECORD_BYTES // 256)
    count = megabytes * 1024 * 1024 // RECORD_BYTES
    for number in range(count):
        while True:
            try:
                producer.produce(TOPIC, value, key=b"key-%d" % (number % keys))
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(300) != 0:
        raise RuntimeError("records still unsent after 300 s")
    return count


def partition_dir(directory: Path) -> Path:
    """`compacted-0` under whichever log dir the harness gave the broker."""
    found = sorted(directory.rglob(f"{TOPIC}-0"))
    if not found:
        raise RuntimeError(f"no {TOPIC}-0 under {directory}")
    return found[0]


def cleaned_through(log_dir: Path) -> int:
    """The partition's first dirty offset in `cleaner-offset-checkpoint`, -1 if none yet."""
    checkpoint = log_dir / "cleaner-offset-checkpoint"
    with contextlib.suppress(OSError):
        for line in checkpoint.read_text().splitlines()[2:]:
            parts = line.split()
            if len(parts) == 3 and parts[0] == TOPIC and parts[1] == "0":
                return int(parts[2])
    return -1


def wait_until_cleaned(directory: Path, timeout: float) -> bool:
    """Until the cleaner checkpoint reaches the active segment's base offset (everything
    cleanable is clean), or `timeout` seconds."""
    partition = partition_dir(directory)
    active_base = max(int(path.stem) for path in partition.glob("*.log"))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cleaned_through(partition.parent) >= active_base:
            return True
        time.sleep(0.5)
    return False


def list_max_timestamp(broker: RunningBroker, times: int) -> list[float]:
    """Seconds each ListOffsets(max timestamp) took, one after another."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 4})
    durations = []
    for _ in range(times):
        started = time.monotonic()
        spec = OffsetSpec.max_timestamp()  # type: ignore[no-untyped-call]
        futures = admin.list_offsets({TopicPartition(TOPIC, 0): spec}, request_timeout=120)
        for future in futures.values():
            future.result(timeout=180)
        durations.append(time.monotonic() - started)
    return durations


# -- one target ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Window:
    round_trips: int
    failures: int
    p50_ms: float
    p99_ms: float
    max_ms: float


@dataclass(frozen=True, slots=True)
class Measurement:
    windows: dict[str, Window]
    records: int
    clean_seconds: float
    cleaned: bool
    list_offsets_ms: list[float]
    cpu_per_gb: float
    """The broker's CPU seconds from the load to the last ListOffsets, per GB loaded."""


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending sequence (0.0 when it is empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, round(fraction * len(sorted_values) + 0.5))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def window(samples: Sequence[tuple[float, float, bool]], start: float, end: float) -> Window:
    inside = [(rtt, ok) for sent, rtt, ok in samples if start <= sent < end]
    rtts = sorted(rtt * 1000 for rtt, _ in inside)
    return Window(
        round_trips=len(inside),
        failures=sum(1 for _, ok in inside if not ok),
        p50_ms=percentile(rtts, 0.50),
        p99_ms=percentile(rtts, 0.99),
        max_ms=rtts[-1] if rtts else 0.0,
    )


def measure(kind: BrokerKind, directory: Path, arguments: argparse.Namespace) -> Measurement:
    with run_broker(kind, directory, kafka_heap="1g") as broker:
        create_topic(broker)
        meter = CpuMeter([broker.pid])
        with pinger(broker) as samples:
            marks = [time.monotonic()]
            time.sleep(IDLE_S)
            marks.append(time.monotonic())
            meter.start()
            records = load(broker, arguments.megabytes, arguments.keys)
            marks.append(time.monotonic())
            print(f"  {kind}: {records} records produced, waiting for the cleaner", flush=True)
            cleaned = wait_until_cleaned(directory, arguments.clean_timeout)
            marks.append(time.monotonic())
            durations = list_max_timestamp(broker, arguments.list_offsets)
            marks.append(time.monotonic())
            meter.stop()
    windows = {
        phase: window(samples, marks[index], marks[index + 1]) for index, phase in enumerate(PHASES)
    }
    (cpu_per_gb,) = meter.per_gb(records * RECORD_BYTES)
    return Measurement(
        windows, records, marks[3] - marks[2], cleaned, [d * 1000 for d in durations], cpu_per_gb
    )


def report(results: dict[BrokerKind, Measurement]) -> list[str]:
    lines = [
        f"{'target':<7} {'phase':<13} {'round trips':>11} {'failed':>6} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'max ms':>9}"
    ]
    for kind, measurement in results.items():
        for phase, found in measurement.windows.items():
            lines.append(
                f"{kind:<7} {phase:<13} {found.round_trips:>11} {found.failures:>6} "
                f"{found.p50_ms:>8.1f} {found.p99_ms:>8.1f} {found.max_ms:>9.1f}"
            )
        state = "done" if measurement.cleaned else "NOT finished"
        listed = ", ".join(f"{ms:.0f}" for ms in measurement.list_offsets_ms)
        lines.append(
            f"{kind:<7} cleaning {state} in {measurement.clean_seconds:.0f} s after the load; "
            f"ListOffsets(max timestamp) took {listed} ms; "
            f"{measurement.cpu_per_gb:.2f} CPU-s per GB loaded"
        )
    gregor, kafka = results.get("gregor"), results.get("kafka")
    for phase, name in (("clean", "clean"), ("list-offsets", "list_offsets")):
        ours = gregor.windows[phase].p99_ms if gregor else None
        theirs = kafka.windows[phase].p99_ms if kafka else None
        lines.append(f"{name}_p99_ms={'n/a' if ours is None else f'{ours:.1f}'}")
        lines.append(f"{name}_p99_vs_kafka={ratio(ours, theirs)}")
    ours = gregor.cpu_per_gb if gregor else None
    theirs = kafka.cpu_per_gb if kafka else None
    lines.append(f"cpu_per_gb={'n/a' if ours is None else f'{ours:.2f}'}")
    lines.append(f"cpu_per_gb_vs_kafka={ratio(ours, theirs)}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.responsiveness", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--target", choices=("both", *BROKERS), default="both")
    parser.add_argument("--megabytes", type=int, default=1024, help="MiB loaded, then cleaned")
    parser.add_argument("--keys", type=int, default=100_000, help="distinct keys in the load")
    parser.add_argument("--clean-timeout", type=float, default=1200.0, help="seconds")
    parser.add_argument("--list-offsets", type=int, default=5, help="ListOffsets calls")
    arguments = parser.parse_args(argv)
    targets: tuple[BrokerKind, ...] = BROKERS if arguments.target == "both" else (arguments.target,)
    if "kafka" in targets:
        fetch()
    print(
        f"responsiveness: {arguments.megabytes} MiB of {RECORD_BYTES}-byte records over "
        f"{arguments.keys} keys, cleaned; Apache Kafka {KAFKA_VERSION} as the peer",
        flush=True,
    )
    results: dict[BrokerKind, Measurement] = {}
    for kind in targets:
        with tempfile.TemporaryDirectory(prefix=f"bench-responsiveness-{kind}-") as directory:
            results[kind] = measure(kind, Path(directory), arguments)
    print("\n".join(report(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
