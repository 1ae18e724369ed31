"""Golden captures: the requests real Kafka clients send, recorded by a fake broker.

    python -m tests.golden.capture            # refresh tests/golden/<client>/ for every client
    python -m tests.golden.capture aiokafka   # or for some of them

Each client (confluent-kafka, kafka-python, aiokafka) is driven against its own
`RecordingBroker` through the same steps: fetch metadata; produce one keyed record with headers
to topic `golden-<codec>` with a new producer per codec; then a consumer with a group id
subscribes, which makes it send FindCoordinator and JoinGroup. Every step has a time limit.

The frames worth keeping are written as `<NNN>-<ApiName>-v<version>[-<variant>].bin` (see
`tests.golden.verify`), request frames without their size prefix, in arrival order: the first
of each API, version and variant. A Produce's variant is the codec of the step that sent it, so
the test can check that the batch inside says the same. Old captures of a client are removed
first.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiokafka
import aiokafka.errors
import confluent_kafka

from broker.aio import wait_for
from broker.protocol import ApiKey, ProtocolError, decode_request
from tests.golden.verify import (
    CLIENTS,
    CODECS,
    GOLDEN_DIR,
    HEADERS,
    KEY,
    VALUE,
    file_name,
    metadata_variant,
    topic_for,
)
from tests.support.kafka_python import close_kafka_python
from tests.support.recorder import RecordingBroker, api_key_of

__all__ = ["Capture", "capture", "main"]

GROUP = "golden-group"
CONSUME_TOPIC = "golden-consume"
STEP_TIMEOUT = 5.0
"""Seconds one step may take; a step that gets its answers takes a fraction of one."""
_POLL_SECONDS = 0.1


class StepFailed(Exception):
    pass


# confluent-kafka (librdkafka)


def _confluent_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "client.id": "golden-confluent-kafka",
        "socket.timeout.ms": int(STEP_TIMEOUT * 1000),
        **extra,
    }


def _confluent_metadata(broker: RecordingBroker) -> None:
    producer = confluent_kafka.Producer(_confluent_config(broker.bootstrap))
    producer.list_topics(topic_for("none"), timeout=STEP_TIMEOUT)
    producer.flush(STEP_TIMEOUT)


def _confluent_produce(broker: RecordingBroker, codec: str) -> None:
    producer = confluent_kafka.Producer(
        _confluent_config(
            broker.bootstrap,
            **{
                "compression.type": codec,
                "linger.ms": 0,
                "message.timeout.ms": int(STEP_TIMEOUT * 1000),
            },
        )
    )
    outcomes: list[object] = []
    producer.produce(
        topic_for(codec),
        key=KEY,
        value=VALUE,
        headers=list(HEADERS),
        on_delivery=lambda error, _message: outcomes.append(error),
    )
    if producer.flush(STEP_TIMEOUT) or outcomes != [None]:
        raise StepFailed(f"delivery outcomes {outcomes}")


def _confluent_consume(broker: RecordingBroker) -> None:
    consumer = confluent_kafka.Consumer(
        _confluent_config(broker.bootstrap, **{"group.id": GROUP, "enable.auto.commit": False})
    )
    try:
        consumer.subscribe([CONSUME_TOPIC])
        deadline = time.monotonic() + STEP_TIMEOUT
        while not broker.received(ApiKey.JOIN_GROUP) and time.monotonic() < deadline:
            consumer.poll(_POLL_SECONDS)  # the JoinGroup's error comes back as an event
    finally:
        consumer.close()


# kafka-python


def _kafka() -> Any:
    """kafka-python, imported when first driven rather than with this module: importing it
    warns on Python 3.11–3.12 (see the integration test), and pytest applies a test's warning
    filters only while the test runs, not while it is collected."""
    import kafka.errors  # noqa: PLC0415

    return kafka


def _kafka_python_producer(broker: RecordingBroker, **extra: Any) -> Any:
    return _kafka().KafkaProducer(
        bootstrap_servers=broker.bootstrap,
        client_id="golden-kafka-python",
        max_block_ms=int(STEP_TIMEOUT * 1000),
        request_timeout_ms=int(STEP_TIMEOUT * 1000),
        **extra,
    )


def _kafka_python_metadata(broker: RecordingBroker) -> None:
    producer = _kafka_python_producer(broker)
    try:
        producer.partitions_for(topic_for("none"))
    finally:
        close_kafka_python(producer, timeout=STEP_TIMEOUT)


def _kafka_python_produce(broker: RecordingBroker, codec: str) -> None:
    producer = _kafka_python_producer(broker, compression_type=None if codec == "none" else codec)
    try:
        future = producer.send(topic_for(codec), key=KEY, value=VALUE, headers=list(HEADERS))
        future.get(timeout=STEP_TIMEOUT)
    finally:
        close_kafka_python(producer, timeout=STEP_TIMEOUT)


def _kafka_python_consume(broker: RecordingBroker) -> None:
    consumer = _kafka().KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        client_id="golden-kafka-python",
        group_id=GROUP,
        enable_auto_commit=False,
        request_timeout_ms=int(STEP_TIMEOUT * 1000),
    )
    try:
        consumer.subscribe([CONSUME_TOPIC])
        deadline = time.monotonic() + STEP_TIMEOUT
        while not broker.received(ApiKey.JOIN_GROUP) and time.monotonic() < deadline:
            with contextlib.suppress(_kafka().errors.KafkaError):  # the JoinGroup's error
                consumer.poll(timeout_ms=int(_POLL_SECONDS * 1000))
    finally:
        close_kafka_python(consumer)


# aiokafka


def _run(coroutine: Coroutine[Any, Any, None]) -> None:
    asyncio.run(wait_for(coroutine, STEP_TIMEOUT))


def _aiokafka_metadata(broker: RecordingBroker) -> None:
    _run(_aiokafka_send(broker, None, None))


def _aiokafka_produce(broker: RecordingBroker, codec: str) -> None:
    _run(_aiokafka_send(broker, codec, topic_for(codec)))


async def _aiokafka_send(broker: RecordingBroker, codec: str | None, topic: str | None) -> None:
    producer = aiokafka.AIOKafkaProducer(
        bootstrap_servers=broker.bootstrap,
        client_id="golden-aiokafka",
        compression_type=None if codec in (None, "none") else codec,
    )
    try:
        await producer.start()
        if topic is None:
            await producer.partitions_for(topic_for("none"))
        else:
            await producer.send_and_wait(topic, VALUE, key=KEY, headers=list(HEADERS))
    finally:
        await producer.stop()


def _aiokafka_consume(broker: RecordingBroker) -> None:
    _run(_aiokafka_join(broker))


async def _aiokafka_join(broker: RecordingBroker) -> None:
    consumer = aiokafka.AIOKafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        client_id="golden-aiokafka",
        group_id=GROUP,
        enable_auto_commit=False,
    )
    # Subscribing after start: start() with a subscription waits for an assignment.
    try:
        await consumer.start()
        consumer.subscribe([CONSUME_TOPIC])
        while not broker.received(ApiKey.JOIN_GROUP):
            with contextlib.suppress(aiokafka.errors.KafkaError):  # the JoinGroup's error
                await consumer.getmany(timeout_ms=int(_POLL_SECONDS * 1000))
    finally:
        await consumer.stop()


@dataclass(frozen=True)
class _Driver:
    metadata: Callable[[RecordingBroker], None]
    produce: Callable[[RecordingBroker, str], None]
    consume: Callable[[RecordingBroker], None]


_DRIVERS = {
    "confluent-kafka": _Driver(_confluent_metadata, _confluent_produce, _confluent_consume),
    "kafka-python": _Driver(_kafka_python_metadata, _kafka_python_produce, _kafka_python_consume),
    "aiokafka": _Driver(_aiokafka_metadata, _aiokafka_produce, _aiokafka_consume),
}
assert tuple(_DRIVERS) == CLIENTS, "a driver for each client, in order"


@dataclass
class Capture:
    """What one client's run wrote, and what went wrong on the way (nothing, normally)."""

    client: str
    files: list[Path] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


def capture(client: str, golden_dir: Path = GOLDEN_DIR) -> Capture:
    """Drive `client` against a recorder and write its captures to `golden_dir/client`."""
    driver = _DRIVERS[client]
    result = Capture(client)
    started = time.monotonic()
    steps: list[tuple[int, str | None]] = []  # (first frame of the step, codec it produces with)
    with RecordingBroker() as broker:

        def step(name: str, codec: str | None, run: Callable[[], None]) -> None:
            steps.append((len(broker.frames), codec))
            try:
                run()
            except Exception as exc:  # reported, and the remaining steps still run
                result.failures.append(f"{client} {name}: {type(exc).__name__}: {exc}")

        step("metadata", None, lambda: driver.metadata(broker))
        for codec in CODECS:
            step(f"produce {codec}", codec, functools.partial(driver.produce, broker, codec))
        step("consume", None, lambda: driver.consume(broker))
        if not broker.received(ApiKey.JOIN_GROUP):
            result.failures.append(f"{client} consume: no JoinGroup within {STEP_TIMEOUT}s")
        frames = broker.frames
        result.failures.extend(f"{client} recorder: {error}" for error in broker.errors)

    codecs: list[str | None] = [None] * len(frames)
    for start, step_codec in steps:
        codecs[start:] = [step_codec] * (len(frames) - start)
    result.files = _write(golden_dir / client, frames, codecs)
    result.seconds = time.monotonic() - started
    return result


def _write(directory: Path, frames: Sequence[bytes], codecs: Sequence[str | None]) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.bin"):
        old.unlink()
    seen: set[tuple[int, int, str | None]] = set()
    files: list[Path] = []
    for frame, codec in zip(frames, codecs, strict=True):
        api_key = api_key_of(frame)
        version = int.from_bytes(frame[2:4], "big", signed=True)
        variant = _variant(frame, codec)
        if (api_key, version, variant) in seen:
            continue
        seen.add((api_key, version, variant))
        path = directory / file_name(len(files), api_key, version, variant)
        path.write_bytes(frame)
        files.append(path)
    return files


def _variant(frame: bytes, codec: str | None) -> str | None:
    api_key = api_key_of(frame)
    if api_key == ApiKey.PRODUCE:
        return codec
    if api_key == ApiKey.METADATA:
        try:
            body: Any = decode_request(frame).body
        except ProtocolError:  # kept, unlabelled, for the test to report
            return None
        return metadata_variant(body.topics)
    return None


def main(argv: Sequence[str] = ()) -> int:
    clients = list(argv) or list(CLIENTS)
    unknown = set(clients) - set(CLIENTS)
    if unknown:
        print(f"unknown clients {sorted(unknown)}; choose from {list(CLIENTS)}", file=sys.stderr)
        return 2
    failed = False
    for client in clients:
        result = capture(client)
        print(f"{client}: {len(result.files)} captures in {result.seconds:.1f}s")
        for path in result.files:
            print(f"  {path.relative_to(GOLDEN_DIR)}")
        for failure in result.failures:
            print(f"  FAILED {failure}", file=sys.stderr)
        failed = failed or bool(result.failures)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
