"""Fetch sessions (KIP-227) on the wire, against Gregor and Apache Kafka with the same steps:
a full fetch with session epoch 0 gets a session id; the next fetches name only what moved and
are answered only what is new; a wrong epoch and an unknown id are refused with Kafka's
errors; epoch -1 closes the session. Kafka's Java clients and kafka-python fetch this way."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from broker.protocol import ApiKey, ErrorCode, request_type
from broker.protocol.records import Record, build_batch
from tests.integration.clients import create_topic
from tests.support.brokers import RunningBroker
from tests.support.requests import fill
from tests.support.wire import call, fetch_values, now_ms, produce_values

VERSION = 12
TOPIC = "sessions"
_NOT_READY = (
    ErrorCode.not_leader_or_follower,
    ErrorCode.leader_not_available,
    ErrorCode.unknown_topic_or_partition,
)


def _produce(broker: RunningBroker, partition: int, count: int) -> None:
    """`count` records to `partition`, retried while the new topic's partition has no leader
    yet (its log is still being created), as a client retries."""
    records = [Record(i, now_ms(), None, b"v%d" % i) for i in range(count)]
    values = produce_values(TOPIC, build_batch(records))
    values["topic_data"][0]["partition_data"][0]["index"] = partition
    body = fill(request_type(ApiKey.PRODUCE, 9), values)
    deadline = time.monotonic() + 30
    while True:
        answer = call(broker.host_port, ApiKey.PRODUCE, 9, body)
        partition_answer = answer.responses[0].partition_responses[0]
        if partition_answer.error_code not in _NOT_READY or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert partition_answer.error_code == ErrorCode.none, partition_answer


def _fetch(
    broker: RunningBroker,
    session_id: int,
    epoch: int,
    offsets: dict[int, int],
    *,
    forgotten: tuple[int, ...] = (),
    wait_ms: int = 0,
    topic: str = TOPIC,
) -> Any:
    values = fetch_values(topic, timedelta(milliseconds=wait_ms), offsets)
    values["session_id"], values["session_epoch"] = session_id, epoch
    for partition in values["topics"][0]["partitions"]:
        partition["fetch_offset"] = offsets[partition["partition"]]
    if not offsets:
        values["topics"] = []
    if forgotten:
        values["forgotten_topics_data"] = [{"topic": topic, "partitions": list(forgotten)}]
    body = fill(request_type(ApiKey.FETCH, VERSION), values)
    return call(broker.host_port, ApiKey.FETCH, VERSION, body)


def _wait_led(broker: RunningBroker, partitions: int, topic: str = TOPIC) -> None:
    """Until a sessionless fetch of every partition is answered without an error: a new
    topic's partitions may have no leader for a moment."""
    deadline = time.monotonic() + 30
    offsets = dict.fromkeys(range(partitions), 0)
    while True:
        response = _fetch(broker, 0, -1, offsets, topic=topic)
        errors = [p.error_code for t in response.responses for p in t.partitions]
        if errors == [ErrorCode.none] * partitions:
            return
        assert time.monotonic() < deadline, f"{topic} is not led: {errors}"
        time.sleep(0.2)


def _answered(response: Any) -> dict[int, tuple[int, int]]:
    """Partition: (high watermark, record bytes) of each partition answered."""
    return {
        p.partition_index: (p.high_watermark, len(p.records or b""))
        for t in response.responses
        for p in t.partitions
    }


def test_a_fetch_session_answers_only_what_changed(broker: RunningBroker) -> None:
    create_topic(broker.bootstrap, TOPIC, 2)
    _wait_led(broker, 2)
    _produce(broker, 0, 3)

    full = _fetch(broker, 0, 0, {0: 0, 1: 0})
    assert full.error_code == ErrorCode.none
    assert full.session_id != 0, "no session was started"
    answered = _answered(full)
    assert set(answered) == {0, 1}
    assert answered[0][0] == 3
    assert answered[0][1] > 0
    session = full.session_id

    # Consumed partition 0: it names the new position; nothing else moved.
    assert _answered(_fetch(broker, session, 1, {0: 3}, wait_ms=200)) == {}
    assert _answered(_fetch(broker, session, 2, {}, wait_ms=200)) == {}

    _produce(broker, 1, 2)
    appended = _answered(_fetch(broker, session, 3, {}, wait_ms=2000))
    assert set(appended) == {1}
    assert appended[1][0] == 2
    assert appended[1][1] > 0

    # Partition 1 forgotten: its next records are not answered.
    assert 1 not in _answered(_fetch(broker, session, 4, {}, forgotten=(1,), wait_ms=200))
    _produce(broker, 1, 1)
    assert 1 not in _answered(_fetch(broker, session, 5, {}, wait_ms=200))


def test_a_wrong_epoch_or_an_unknown_session_is_refused(broker: RunningBroker) -> None:
    topic = TOPIC + "-refused"
    create_topic(broker.bootstrap, topic, 1)
    _wait_led(broker, 1, topic)
    full = _fetch(broker, 0, 0, {0: 0}, topic=topic)
    session = full.session_id
    assert session != 0

    wrong = _fetch(broker, session, 7, {0: 0}, topic=topic)
    assert wrong.error_code == ErrorCode.invalid_fetch_session_epoch
    unknown = _fetch(broker, session ^ 0x5A5A, 1, {0: 0}, topic=topic)
    assert unknown.error_code == ErrorCode.fetch_session_id_not_found
    # The session survived both, at the epoch it expects.
    assert _fetch(broker, session, 1, {}, topic=topic).error_code == ErrorCode.none

    closing = _fetch(broker, session, -1, {0: 0}, topic=topic)
    assert (closing.error_code, closing.session_id) == (ErrorCode.none, 0)
    gone = _fetch(broker, session, 2, {}, topic=topic)
    assert gone.error_code == ErrorCode.fetch_session_id_not_found
