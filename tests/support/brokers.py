"""One switch between the two brokers a scenario runs against: Gregor and Apache Kafka.

What it owns: starting either broker by name on a temporary directory with the same settings
(`group.initial.rebalance.delay.ms=0`, so that a group forms as soon as its first member
joins), and asking a broker which APIs it serves, so that a scenario needing an API the broker
does not serve fails at once, naming what is missing, instead of waiting out a client timeout.

What it must never do: skip; a missing API is a failure the scenario reports.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from broker.protocol import ApiKey, ErrorCode, build, request_type
from tests.support.kafka_dist import run_kafka
from tests.support.nodes import run_node
from tests.support.wire import call

__all__ = [
    "BROKERS",
    "GROUP_CONSUMER_APIS",
    "BrokerKind",
    "RunningBroker",
    "advertised_apis",
    "require_apis",
    "run_broker",
]

BrokerKind = Literal["gregor", "kafka"]
BROKERS: tuple[BrokerKind, ...] = ("gregor", "kafka")

COMMON_SETTINGS = {"group.initial.rebalance.delay.ms": "0"}

GROUP_CONSUMER_APIS = (
    ApiKey.FETCH,
    ApiKey.LIST_OFFSETS,
    ApiKey.FIND_COORDINATOR,
    ApiKey.JOIN_GROUP,
    ApiKey.SYNC_GROUP,
    ApiKey.HEARTBEAT,
    ApiKey.LEAVE_GROUP,
    ApiKey.OFFSET_COMMIT,
    ApiKey.OFFSET_FETCH,
)
"""What a Java consumer in a group (console consumer, consumer perf test) needs."""


@dataclass(frozen=True, slots=True)
class RunningBroker:
    kind: BrokerKind
    bootstrap: str
    pid: int = 0
    """The broker's process (for its CPU time)."""

    @property
    def host_port(self) -> tuple[str, int]:
        host, port = self.bootstrap.rsplit(":", 1)
        return host, int(port)


@contextlib.contextmanager
def run_broker(
    kind: BrokerKind,
    directory: Path,
    extra: Mapping[str, str] | None = None,
    *,
    kafka_heap: str = "512m",
) -> Iterator[RunningBroker]:
    """A single-node broker of `kind` (broker and controller in one process) on a free port."""
    settings = COMMON_SETTINGS | dict(extra or {})
    if kind == "gregor":
        with run_node(directory, settings) as node:
            yield RunningBroker(kind, node.bootstrap, node.process.pid)
    else:
        with run_kafka(directory, settings, heap=kafka_heap) as kafka:
            yield RunningBroker(kind, kafka.bootstrap, kafka.process.pid)


def advertised_apis(broker: RunningBroker, timeout: float = 10.0) -> set[int]:
    """The API keys the broker lists in its ApiVersions response (v3)."""
    body = build(
        request_type(ApiKey.API_VERSIONS, 3),
        client_software_name="gregor-tests",
        client_software_version="1",
    )
    answer: Any = call(broker.host_port, ApiKey.API_VERSIONS, 3, body, timeout=timeout)
    if answer.error_code != ErrorCode.none:
        raise AssertionError(f"{broker.kind} answered ApiVersions with {answer.error_code!r}")
    return {int(entry.api_key) for entry in answer.api_keys}


def _name(key: int) -> str:
    with contextlib.suppress(ValueError):
        return "".join(word.title() for word in ApiKey(key).name.split("_"))
    return f"API key {key}"


def require_apis(broker: RunningBroker, needed: Iterable[ApiKey]) -> None:
    """Fail, naming each missing API in Kafka's words, unless the broker serves all of
    `needed`. The scenario then runs in full as soon as the broker serves them."""
    served = advertised_apis(broker)
    missing = sorted(int(key) for key in needed if int(key) not in served)
    if missing:
        raise AssertionError(
            f"{broker.kind} does not serve {', '.join(_name(k) for k in missing)}, which this "
            f"scenario needs (it serves {', '.join(_name(k) for k in sorted(served))})"
        )
