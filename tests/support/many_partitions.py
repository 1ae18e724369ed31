"""Many partitions at once, as a scenario: one CreateTopics of thousands of partitions
(replication factor 3) on three combined nodes, then each node stopped (SIGTERM) and started
again in turn, while a probe produces to another topic and a watcher follows the quorum and
the brokers. `bench/partitions.py` prints what it saw; `tests/integration/
test_many_partitions.py` holds it to Kafka's rules.

A *probe* produces one record every 10 ms (acks=all, idempotent) to a topic of one partition,
replication factor 3, and times each from `produce` to its acknowledgement. A *watcher* asks,
every 200 ms, the quorum's epoch and leader (DescribeQuorum) and the brokers a Metadata request
lists (a fenced broker is not listed, in Kafka as in Gregor).

Phases, each a window of the probe's timeline:
1. `idle`: 5 s before anything happens;
2. `create`: one CreateTopics of `partitions` partitions (9,999 with its TopicRecord is 10,000
   metadata records, the most one operation may write in Kafka and in Gregor), until it is
   answered, then until Metadata shows them all led with three replicas in sync, then until
   every node has their logs on disk (DescribeLogDirs), plus 10 s;
3. `restart N` for each node: stopped with SIGTERM and started again; the next once the
   probe's partition has its three replicas in sync again and the restarted node is listed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from broker.protocol import ApiKey, ErrorCode, request_type
from tests.support.clusters import ThreeNodes
from tests.support.requests import fill
from tests.support.wire import call

PROBE = "probe"
BIG = "many"
QUIET = {"log_level": 0}


@dataclass
class Timeline:
    """What the probe and the watcher saw, with the time (monotonic) of each."""

    sends: list[tuple[float, float | None]] = field(default_factory=list)
    """(sent at, round trip in seconds or None if it failed)."""
    quorum: list[tuple[float, int, int]] = field(default_factory=list)
    """(at, epoch, leader id)."""
    listed: list[tuple[float, frozenset[int]]] = field(default_factory=list)
    probe_led: list[tuple[float, int, tuple[int, ...]]] = field(default_factory=list)
    """(at, leader, ISR) of the probe's partition, as Metadata said."""
    stop: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class Phase:
    """One window of the timeline, and what happened in it."""

    name: str
    start: float
    end: float
    round_trips: tuple[float, ...]
    """The probe's acknowledged sends, in seconds, sorted."""
    failed: int
    slowest_at: float
    """When the slowest acknowledged send went, from the phase's start (s)."""
    epochs: tuple[int, ...]
    leaders_before: frozenset[int]
    """The quorum leaders seen in the last 2 s before the phase."""
    missing: tuple[int, ...]
    """Brokers missing from Metadata in the phase, but the one restarting."""
    restarting: int = 0
    notes: str = ""
    probe_led: tuple[tuple[float, int, tuple[int, ...]], ...] = ()
    """The probe partition's leader and ISR when the phase began, then each change, with its
    time from the phase's start (s)."""

    def percentile(self, q: float) -> float:
        """The probe's round trip at quantile `q`, in ms (nan if none)."""
        times = self.round_trips
        return times[min(len(times) - 1, int(q * len(times)))] * 1000 if times else float("nan")

    def describe(self) -> str:
        return (
            f"{self.name}: {self.end - self.start:.1f} s, probe n={len(self.round_trips)} "
            f"failed={self.failed} p50={self.percentile(0.5):.1f} ms "
            f"p99={self.percentile(0.99):.1f} ms max={self.percentile(1.0):.1f} ms "
            f"(sent at +{self.slowest_at:.1f} s), quorum epochs {list(self.epochs)}, "
            f"brokers missing from Metadata {list(self.missing)}, probe led by "
            + ", then ".join(
                f"{lead} {list(isr)} (+{at:.1f} s)" for at, lead, isr in self.probe_led
            )
            + (f"; {self.notes}" if self.notes else "")
        )


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
    metadata = fill(request_type(ApiKey.METADATA, 12), {"topics": [{"name": PROBE}]})
    while not timeline.stop.wait(0.2):
        for address in cluster.bootstrap.split(","):
            host, port = address.rsplit(":", 1)
            try:
                answer = call((host, int(port)), ApiKey.DESCRIBE_QUORUM, 1, quorum, timeout=2)
                partition = answer.topics[0].partitions[0]
                if partition.error_code == ErrorCode.none:
                    timeline.quorum.append(
                        (time.monotonic(), partition.leader_epoch, partition.leader_id)
                    )
                listed = call((host, int(port)), ApiKey.METADATA, 12, metadata, timeout=2)
                at = time.monotonic()
                timeline.listed.append((at, frozenset(b.node_id for b in listed.brokers)))
                for partition in (p for t in listed.topics for p in t.partitions):
                    # Leaderless is a state too (LEADER_NOT_AVAILABLE, leader -1).
                    if partition.error_code in (ErrorCode.none, ErrorCode.leader_not_available):
                        led = (partition.leader_id, tuple(sorted(partition.isr_nodes)))
                        if not timeline.probe_led or timeline.probe_led[-1][1:] != led:
                            timeline.probe_led.append((at, *led))
                break
            except Exception:  # a node stopping or electing: ask the next (never stop watching)
                continue


def _phase(
    name: str, timeline: Timeline, start: float, end: float, restarting: int = 0, notes: str = ""
) -> Phase:
    sent = [(at, rt) for at, rt in timeline.sends if start <= at < end]
    acknowledged = [(rt, at) for at, rt in sent if rt is not None]
    slowest = max(acknowledged, default=(0.0, start))
    return Phase(
        name,
        start,
        end,
        tuple(sorted(rt for rt, _ in acknowledged)),
        sum(1 for _, rt in sent if rt is None),
        slowest[1] - start,
        tuple(sorted({epoch for at, epoch, _ in timeline.quorum if start <= at < end})),
        frozenset(leader for at, _, leader in timeline.quorum if start - 2 <= at < start),
        tuple(
            sorted(
                {
                    node
                    for at, listed in timeline.listed
                    if start <= at < end
                    for node in {1, 2, 3} - listed
                    if node != restarting
                }
            )
        ),
        restarting,
        notes,
        _probe_led(timeline, start, end),
    )


def _probe_led(
    timeline: Timeline, start: float, end: float
) -> tuple[tuple[float, int, tuple[int, ...]], ...]:
    """The probe partition's state when the phase began, then each change in it, timed from
    its start."""
    before = [seen for seen in timeline.probe_led if seen[0] < start][-1:]
    during = [seen for seen in timeline.probe_led if start <= seen[0] < end]
    return tuple((max(0.0, at - start), leader, isr) for at, leader, isr in before + during)


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


def _wait_listed(timeline: Timeline, node: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    since = time.monotonic()
    while time.monotonic() < deadline:
        if any(at > since and node in listed for at, listed in timeline.listed[-3:]):
            return
        time.sleep(0.5)
    raise TimeoutError(f"node {node} is not listed again")


def run(cluster: ThreeNodes, partitions: int, restarts: bool = True) -> Iterator[Phase]:
    """The scenario on a running `cluster`, a phase at a time."""
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
        yield _phase(
            "create",
            timeline,
            created,
            time.monotonic(),
            notes=f"answered in {answered:.1f} s, all led and in sync after {led:.1f} s, "
            f"every log on every node after {hosted:.1f} s",
        )
        if not restarts:
            return
        for node in (1, 2, 3):
            start = time.monotonic()
            code = cluster.stop(node)
            stopped = time.monotonic() - start
            cluster.restart(node, timeout=900)
            serving = time.monotonic() - start
            _wait_led(admin, PROBE, 1, 600)
            _wait_listed(timeline, node, 600)
            yield _phase(
                f"restart {node}",
                timeline,
                start,
                time.monotonic(),
                node,
                notes=f"exit code {code} after {stopped:.1f} s, serving again at +{serving:.1f} s",
            )
    finally:
        timeline.stop.set()
        for thread in threads:
            thread.join()
