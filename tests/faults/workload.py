"""The run's producers: one idempotent `acks=all` confluent-kafka producer per topic
incarnation, fed by one thread at a steady rate, round-robin over the partitions.

Every record is entered in the ledger before the producer gets it, and its delivery report
settles it: acknowledged (no error, with the offset the leader gave it) or failed. A topic
about to be deleted is `close`d first: its producer is flushed, and whatever it still holds
is purged (failed), so that no record of the old incarnation can reach the new topic of the
same name from this side; the new incarnation gets a new producer (`open`). A producer whose
idempotence state becomes unusable (librdkafka's fatal errors) is replaced the same way, and
the error counted.

What it must never do: count a record as acknowledged that its delivery report did not
acknowledge, or produce to a topic between its `close` and the next `open`.
"""

from __future__ import annotations

import datetime
import functools
import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException, Producer

from tests.faults.stamps import Incarnation, Ledger, Stamp

__all__ = ["Workload"]


@dataclass
class _Slot:
    incarnation: Incarnation
    producer: Producer
    fatal: list[str] = field(default_factory=list)
    sent: int = 0


class Workload:
    def __init__(
        self,
        bootstrap: str,
        ledger: Ledger,
        partitions: int,
        *,
        rate: float,
        message_timeout_ms: int,
    ) -> None:
        """`rate`: records a second to each open topic."""
        self._bootstrap = bootstrap
        self._ledger = ledger
        self._partitions = partitions
        self._interval = 1.0 / rate
        self._message_timeout_ms = message_timeout_ms
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="faults-workload", daemon=True)
        self._crash: BaseException | None = None
        self.fatal_errors: Counter[str] = Counter()
        """librdkafka's fatal errors, each of which cost a producer (and its queued records)."""
        self.client_log: deque[str] = deque(maxlen=5000)
        """The producers' own log lines (librdkafka's, info and worse, and its idempotence
        debug lines), latest last: what the client was told when a check fails."""
        self._logger = logging.getLogger(f"{__name__}.producers.{id(self)}")
        self._logger.propagate = False
        self._logger.setLevel(logging.DEBUG)
        self._logger.addHandler(_Lines(self.client_log))

    def _producer(self, slot_errors: list[str]) -> Producer:
        def error(reported: Any) -> None:
            if reported.fatal():
                slot_errors.append(str(reported))

        return Producer(
            {
                "bootstrap.servers": self._bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": self._message_timeout_ms,
                "error_cb": error,
                "logger": self._logger,
                # The idempotence state machine's own lines (producer id, epoch bumps and
                # their reasons): what explains a record written under two epochs.
                "debug": "eos",
                "log_level": 7,
            }
        )

    def open(self, incarnation: Incarnation) -> None:
        """Start producing to `incarnation` (a topic that exists) with a new producer."""
        fatal: list[str] = []
        slot = _Slot(incarnation, self._producer(fatal), fatal)
        with self._lock:
            assert incarnation.topic not in self._slots, f"{incarnation.topic} is open"
            self._slots[incarnation.topic] = slot

    def close(self, topic: str, timeout: float = 30.0) -> Incarnation:
        """Stop producing to `topic`; returns once every record sent to it is settled."""
        with self._lock:
            slot = self._slots.pop(topic)
        self._finish(slot.producer, timeout)
        return slot.incarnation

    @staticmethod
    def _finish(producer: Producer, timeout: float) -> None:
        """Flush; what is still unacknowledged after `timeout` is purged, and its delivery
        reports (failed) come with the last flush."""
        if producer.flush(timeout) > 0:
            producer.purge()
            producer.flush(10)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and close every topic; raises what the thread died of, if it did."""
        self._stopping.set()
        self._thread.join(30)
        for topic in list(self._slots):
            self.close(topic)
        if self._crash is not None:
            raise RuntimeError("the workload's thread failed") from self._crash

    def _run(self) -> None:
        try:
            next_round = time.monotonic()
            while not self._stopping.is_set():
                with self._lock:
                    for slot in self._slots.values():
                        self._produce_one(slot)
                next_round += self._interval
                pause = next_round - time.monotonic()
                if pause > 0:
                    self._stopping.wait(pause)
                else:
                    next_round = time.monotonic()  # behind (the machine is busy): no burst
        except BaseException as crash:
            self._crash = crash
            raise

    def _produce_one(self, slot: _Slot) -> None:
        if slot.fatal:
            self.fatal_errors[slot.fatal[0]] += 1
            self._finish(slot.producer, 0)
            slot.fatal = []
            slot.producer = self._producer(slot.fatal)
        partition = slot.sent % self._partitions
        stamp = self._ledger.send(slot.incarnation, partition)
        try:
            slot.producer.produce(
                stamp.incarnation.topic,
                stamp.value(),
                stamp.key(),
                partition=partition,
                on_delivery=functools.partial(self._delivered, stamp),
            )
        except (BufferError, KafkaException):
            # A full queue (the cluster is slow), or a producer in a fatal state: never sent.
            self._ledger.unsent(stamp)
        else:
            slot.sent += 1
        slot.producer.poll(0)

    def _delivered(self, stamp: Stamp, error: Any, message: Any) -> None:
        offset = message.offset()
        self._ledger.delivered(
            stamp, None if error is None else error.name(), -1 if offset is None else offset
        )


class _Lines(logging.Handler):
    """Keeps each log record as a line, with the time in UTC as the nodes' logs have it."""

    def __init__(self, lines: deque[str]) -> None:
        super().__init__()
        self._lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        moment = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        self._lines.append(
            f"{moment.strftime('%H:%M:%S.%f')[:-3]} {record.levelname} {record.getMessage()}"
        )
