"""A Kafka client for the e2e tier's client pod (confluent-kafka, as the broker image ships
it): the Helm test copies this file into a pod inside the cluster, where the brokers' names
resolve, and runs its commands with `kubectl exec`. Each prints one JSON line.

  produce TOPIC COUNT [SHIFT_S]  COUNT records, acks=all, idempotent, stamped SHIFT_S seconds
                                 from now (a negative shift: in the past); what was acknowledged
  produce-until TOPIC STOP LOG   records until the file STOP exists, each acknowledged value
                                 appended to LOG; then how many and the errors
  consume TOPIC                  every record from the start to each partition's end: the
                                 numbers, and any other values
  config TOPIC                   the topic's configs as DescribeConfigs gives them
  group-until TOPIC STOP LOG     a consumer group member reading until the file STOP exists
                                 and then on to each partition's end, committing as it goes,
                                 each value appended to LOG; then how many and the errors it
                                 was told of
  fetched-from TOPIC RACK        every record from the start with client.rack=RACK: for each
                                 partition, the brokers it fetched from and its leader
  broker-config ID NAME          a broker's config NAME: its value and source
  replicas                       every partition of every topic (internal ones too): its
                                 replicas

Only the standard library and confluent-kafka: it runs outside the project's environment.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource

BOOTSTRAP = os.environ["BOOTSTRAP"]
QUIET = {"log_level": 3}


def _producer() -> Producer:
    return Producer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 300_000,
            **QUIET,
        }
    )


def produce(topic: str, count: int, shift_s: float = 0.0) -> dict[str, object]:
    producer = _producer()
    stamp = int((time.time() + shift_s) * 1000) if shift_s else 0  # 0: the producer's clock
    acknowledged: list[int] = []
    errors: list[str] = []

    def done(error: object, message: object) -> None:
        if error is not None:
            errors.append(str(error))
        else:
            acknowledged.append(int(message.value()))  # type: ignore[attr-defined]

    for i in range(count):
        while True:
            try:
                producer.produce(topic, value=str(i).encode(), on_delivery=done, timestamp=stamp)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    left = producer.flush(120)
    return {"acknowledged": len(acknowledged), "errors": errors[:5], "unsent": left}


def produce_until(topic: str, stop: str, log: str) -> dict[str, object]:
    producer = _producer()
    errors: list[str] = []
    acknowledged = 0
    with open(log, "a") as out:

        def done(error: object, message: object) -> None:
            nonlocal acknowledged
            if error is not None:
                errors.append(str(error))
            else:
                acknowledged += 1
                out.write(message.value().decode() + "\n")  # type: ignore[attr-defined]
                out.flush()

        sent = 0
        while not os.path.exists(stop):
            producer.produce(topic, value=str(sent).encode(), on_delivery=done)
            sent += 1
            producer.poll(0.02)  # about 50 records a second
        left = producer.flush(120)
    return {"sent": sent, "acknowledged": acknowledged, "errors": errors[:5], "unsent": left}


def consume(topic: str) -> dict[str, object]:
    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": f"e2e-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **QUIET,
        }
    )
    consumer.subscribe([topic])
    values: list[int] = []
    others: list[str] = []

    def take(value: str) -> None:
        if value.isdigit():
            values.append(int(value))
        else:
            others.append(value)

    at_end = _read_to_end(consumer, take, raise_errors=True)
    consumer.close()
    if not at_end:
        raise RuntimeError(f"{topic}: not read to every partition's end in time")
    return {"count": len(values), "values": sorted(set(values)), "others": others}


def _read_to_end(
    consumer: Consumer,
    take: Callable[[str], None],
    *,
    raise_errors: bool = False,
    limit_s: float = 180.0,
) -> bool:
    """Poll until the consumer's position in every partition it was given has reached that
    partition's end as it was when the assignment came (so: call it once nothing more is
    produced), passing each value to `take`; whether it got there within `limit_s`."""
    ends: dict[tuple[str, int], tuple[int, int]] = {}
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        message = consumer.poll(0.5)
        if message is not None:
            if message.error() is not None:
                if raise_errors:
                    raise KafkaException(message.error())
                continue
            take((message.value() or b"").decode())
            continue
        assignment = consumer.assignment()
        if not assignment:
            continue
        for partition in assignment:
            key = (partition.topic, partition.partition)
            if key not in ends:
                ends[key] = consumer.get_watermark_offsets(partition, timeout=10, cached=False)
        positions = consumer.position(assignment)
        if all(_at_end(p.offset, *ends[(p.topic, p.partition)]) for p in positions):
            return True
    return False


def _at_end(position: int, low: int, high: int) -> bool:
    """Whether a consumer at `position` (negative: nothing read yet) has read a partition
    holding offsets `low` to `high` (exclusive)."""
    return high <= low or position >= high


def config(topic: str) -> dict[str, object]:
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP, **QUIET})
    resource = ConfigResource("topic", topic)
    described = admin.describe_configs([resource])[resource].result(30)
    return {name: entry.value for name, entry in described.items()}


def group_until(topic: str, stop: str, log: str) -> dict[str, object]:
    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": f"e2e-group-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "auto.commit.interval.ms": 1000,
            **QUIET,
        }
    )
    consumer.subscribe([topic])
    errors: list[str] = []
    consumed = 0
    with open(log, "a") as out:
        while not os.path.exists(stop):
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                errors.append(str(message.error()))
                continue
            out.write((message.value() or b"").decode() + "\n")
            out.flush()
            consumed += 1
        # What was produced up to the stop (the producer has finished by then): read on to
        # each partition's end.

        def take(value: str) -> None:
            nonlocal consumed
            out.write(value + "\n")
            consumed += 1

        at_end = _read_to_end(consumer, take)
    consumer.close()
    return {"consumed": consumed, "errors": errors[:5], "at_end": at_end}


def fetched_from(topic: str, rack: str) -> dict[str, object]:
    seen: dict[str, set[int]] = {}
    leaders: dict[str, int] = {}

    def statistics(text: str) -> None:
        partitions = json.loads(text)["topics"].get(topic, {}).get("partitions", {})
        for name, partition in partitions.items():
            if name != "-1" and partition.get("broker", -1) >= 0:
                seen.setdefault(name, set()).add(int(partition["broker"]))
                leaders[name] = int(partition.get("leader", -1))

    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": f"e2e-rack-{uuid.uuid4()}",
            "client.rack": rack,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "statistics.interval.ms": 200,
            "stats_cb": statistics,
            **QUIET,
        }
    )
    consumer.subscribe([topic])
    count = 0
    started = time.monotonic()
    while time.monotonic() - started < 20:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            count += 1
    consumer.close()
    return {
        "count": count,
        "fetchedFrom": {name: sorted(brokers) for name, brokers in seen.items()},
        "leaders": leaders,
    }


def broker_config(node: str, name: str) -> dict[str, object]:
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP, **QUIET})
    resource = ConfigResource("broker", node)
    entry = admin.describe_configs([resource])[resource].result(30)[name]
    return {"value": entry.value, "source": entry.source}


def replicas() -> dict[str, object]:
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP, **QUIET})
    metadata = admin.list_topics(timeout=30)
    return {
        f"{name}-{index}": list(partition.replicas)
        for name, topic in metadata.topics.items()
        for index, partition in topic.partitions.items()
    }


def main(argv: list[str]) -> int:
    command, *arguments = argv
    if command == "replicas":
        print(json.dumps(replicas()))
        return 0
    if command == "broker-config":
        print(json.dumps(broker_config(*arguments)))
        return 0
    topic, *rest = arguments
    if command == "produce":
        result = produce(topic, int(rest[0]), float(rest[1]) if len(rest) > 1 else 0.0)
    elif command == "produce-until":
        result = produce_until(topic, rest[0], rest[1])
    elif command == "consume":
        result = consume(topic)
    elif command == "config":
        result = config(topic)
    elif command == "group-until":
        result = group_until(topic, rest[0], rest[1])
    elif command == "fetched-from":
        result = fetched_from(topic, rest[0])
    else:
        print(f"unknown command {command}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
