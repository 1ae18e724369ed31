"""The broker's Prometheus metrics: what Kafka users look at first, under the names they know.

Names follow Kafka's JMX MBeans as the Prometheus JMX exporter rules shipped with Strimzi
(`lowercaseOutputName: true`) turn them into series, so existing dashboards and alerts work:
`kafka.server:type=BrokerTopicMetrics,name=BytesInPerSec[,topic=T]` becomes
`kafka_server_brokertopicmetrics_bytesin_total[{topic="T"}]` — the all-topics series without a
`topic` label, each topic's with one — and `kafka.log:type=Log,name=Size,topic=T,partition=P`
becomes `kafka_log_log_size{topic="T",partition="P"}`. Request latency is a real Prometheus
histogram, `kafka_network_requestmetrics_totaltimems`, in milliseconds as Kafka's is.

What it owns: the counters (plain ints in dicts, bumped on the event loop), the collector that
turns them and the node's state (partitions, logs, metadata) into metric families at scrape
time, and the HTTP endpoint that serves them on the same loop — so a scrape reads the state
between two requests, never halfway through one, and no lock is needed.
What it must never do: look at individual records (bytes and messages are counted per batch
and per partition from sizes and batch headers the append already read), raise into the
request path (a bug in counting is logged once and the request goes on), or block the loop on
I/O: a scrape is one read and one write per connection. The hooks cost about 1.5 µs per
single-partition Produce request, plus about 0.4 µs per further partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import types
import typing
import urllib.parse
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, Union

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from broker.aio import wait_for
from broker.protocol import ApiKey, ErrorCode, Request, ResponseBody
from broker.protocol.fetch import FetchResponse
from broker.replica import AppendResult, ReplicaManager

__all__ = ["LATENCY_BUCKETS_MS", "BrokerMetrics", "MetricsEndpoint"]

log = logging.getLogger(__name__)

LATENCY_BUCKETS_MS = (0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
"""Upper bounds of the request latency histogram, in ms. The low end resolves the Python request
path (a small Produce or Metadata takes a few hundred µs to a few ms on loopback), 500 ms is
the clients' default `fetch.max.wait.ms`, so an idle long-poll Fetch lands in the 500–1000
bucket, and the top buckets catch JoinGroup waiting for a rebalance (seconds to tens of
seconds). Fifteen buckets × the APIs in use keeps the series count small."""

# Kafka does not count these as failed produce / fetch requests: they are the client's or the
# cluster's expected states (ReplicaManager's "known exceptions"), not a broker failing.
_EXPECTED_PRODUCE_ERRORS = frozenset(
    {
        ErrorCode.none,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.not_leader_or_follower,
        ErrorCode.message_too_large,
        ErrorCode.record_list_too_large,
        ErrorCode.corrupt_message,
        ErrorCode.kafka_storage_error,
    }
)
_EXPECTED_FETCH_ERRORS = frozenset(
    {
        ErrorCode.none,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.not_leader_or_follower,
        ErrorCode.kafka_storage_error,
        ErrorCode.offset_out_of_range,
        ErrorCode.fenced_leader_epoch,
        ErrorCode.unknown_leader_epoch,
    }
)

# Slots of a topic's counters (one list per topic, and one for all topics).
_BYTES_IN, _BYTES_OUT, _MESSAGES_IN = 0, 1, 2
_TOTAL_PRODUCE, _FAILED_PRODUCE, _TOTAL_FETCH, _FAILED_FETCH = 3, 4, 5, 6
_REPLICATION_BYTES_OUT = 7
_TOPIC_COUNTERS = (
    (_BYTES_IN, "bytesin", "BytesInPerSec: bytes of record batches appended by producers"),
    (_BYTES_OUT, "bytesout", "BytesOutPerSec: bytes of record batches sent to consumers"),
    (_MESSAGES_IN, "messagesin", "MessagesInPerSec: records appended (from batch headers)"),
    (_TOTAL_PRODUCE, "totalproducerequests", "TotalProduceRequestsPerSec: partition appends"),
    (_FAILED_PRODUCE, "failedproducerequests", "FailedProduceRequestsPerSec: appends failed"),
    (_TOTAL_FETCH, "totalfetchrequests", "TotalFetchRequestsPerSec: partition reads"),
    (_FAILED_FETCH, "failedfetchrequests", "FailedFetchRequestsPerSec: partition reads failed"),
    (
        _REPLICATION_BYTES_OUT,
        "replicationbytesout",
        "ReplicationBytesOutPerSec: bytes of record batches sent to follower replicas",
    ),
)

# Where a response class keeps its error codes: its own error fields, then nested entities
# (field name, whether it is a sequence, the nested class's plan).
_ErrorPlan = tuple[tuple[str, ...], tuple[tuple[str, bool, "_ErrorPlan"], ...]]


def _nested_entity(annotation: Any) -> tuple[bool, type[Any] | None]:
    """(is a sequence, the message struct) of a field's type, or (False, None)."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) != 1:
            return False, None
        annotation, origin = members[0], typing.get_origin(members[0])
    many = origin is tuple
    if many:
        annotation = typing.get_args(annotation)[0]
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return many, annotation
    return False, None


def _error_plan(message: type[Any]) -> _ErrorPlan | None:
    """Computed once per response class, so counting a response's errors touches only the
    fields that lead to an error code (per partition at most, never per record)."""
    hints = typing.get_type_hints(message)
    codes: list[str] = []
    nested: list[tuple[str, bool, _ErrorPlan]] = []
    for field in dataclasses.fields(message):
        if field.metadata.get("kafka_type") == "error_code":
            codes.append(field.name)
            continue
        many, entity = _nested_entity(hints[field.name])
        if entity is not None and (plan := _error_plan(entity)) is not None:
            nested.append((field.name, many, plan))
    return (tuple(codes), tuple(nested)) if codes or nested else None


def _count_errors(value: Any, plan: _ErrorPlan, counts: dict[int, int]) -> None:
    codes, nested = plan
    for name in codes:
        code = getattr(value, name)
        counts[code] = counts.get(code, 0) + 1
    for name, many, inner in nested:
        child = getattr(value, name)
        if child is None:
            continue
        if many:
            for item in child:
                _count_errors(item, inner, counts)
        else:
            _count_errors(child, inner, counts)


class _Latency:
    __slots__ = ("buckets", "name", "total_ms")

    def __init__(self, name: str) -> None:
        self.name = name
        self.buckets = [0] * (len(LATENCY_BUCKETS_MS) + 1)
        self.total_ms = 0.0


class MetadataErrors(Protocol):
    """What the node's metadata service counts of its failures (`broker.kraft`)."""

    @property
    def load_error_count(self) -> int: ...
    @property
    def apply_error_count(self) -> int: ...


class BrokerMetrics(Collector):
    """The node's metrics: `appended` and `request_done` are the hooks the replica manager and
    the dispatcher call on the event loop; `registry` is what the endpoint exposes."""

    def __init__(
        self,
        replicas: ReplicaManager,
        *,
        active_controller: Callable[[], bool],
        metadata: MetadataErrors | None = None,
    ) -> None:
        self._replicas = replicas
        self._active_controller = active_controller
        self._metadata = metadata
        self._all_topics = [0] * len(_TOPIC_COUNTERS)
        self._topics: dict[str, list[int]] = {}
        self._requests: dict[tuple[int, int], int] = {}
        self._latency: dict[int, _Latency] = {}
        self._errors: dict[int, dict[int, int]] = {}
        self._plans: dict[type[Any], _ErrorPlan | None] = {}
        self._logged_failure = False
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)

    def _topic(self, topic: str) -> list[int]:
        counters = self._topics.get(topic)
        if counters is None:
            counters = self._topics[topic] = [0] * len(_TOPIC_COUNTERS)
        return counters

    # -- hooks on the request path --------------------------------------------------------

    def appended(self, topic: str, result: AppendResult, size: int) -> None:
        """A produce append to one partition: `size` bytes of batches, decided `result`."""
        try:
            self._appended(topic, result, size)
        except Exception:
            self._failed()

    def request_done(
        self, request: Request, response: ResponseBody | FetchResponse | None, elapsed_ns: int
    ) -> None:
        """A request answered (`response` None: nothing was sent back) after `elapsed_ns`."""
        try:
            self._request_done(request, response, elapsed_ns)
        except Exception:
            self._failed()

    def _failed(self) -> None:
        """A bug here must not fail a request: log it once, keep serving."""
        if not self._logged_failure:
            self._logged_failure = True
            log.exception("counting a request for the metrics failed (logged once)")

    def _appended(self, topic: str, result: AppendResult, size: int) -> None:
        counters, all_topics = self._topic(topic), self._all_topics
        counters[_TOTAL_PRODUCE] += 1
        all_topics[_TOTAL_PRODUCE] += 1
        if result.error == ErrorCode.none and result.info is not None:
            records = result.info.record_count
            counters[_BYTES_IN] += size
            all_topics[_BYTES_IN] += size
            counters[_MESSAGES_IN] += records
            all_topics[_MESSAGES_IN] += records
        elif result.error not in _EXPECTED_PRODUCE_ERRORS:
            counters[_FAILED_PRODUCE] += 1
            all_topics[_FAILED_PRODUCE] += 1

    def _request_done(
        self, request: Request, response: ResponseBody | FetchResponse | None, elapsed_ns: int
    ) -> None:
        header = request.header
        key = (header.api_key, header.api_version)
        self._requests[key] = self._requests.get(key, 0) + 1
        latency = self._latency.get(header.api_key)
        if latency is None:
            name = type(request.body).__name__.removesuffix("Request")
            latency = self._latency[header.api_key] = _Latency(name)
        elapsed_ms = elapsed_ns / 1e6
        latency.buckets[bisect_left(LATENCY_BUCKETS_MS, elapsed_ms)] += 1
        latency.total_ms += elapsed_ms
        if response is None:
            return
        kind = type(response)
        if kind not in self._plans:
            self._plans[kind] = _error_plan(kind)
        plan = self._plans[kind]
        if plan is not None:
            errors = self._errors.get(header.api_key)
            if errors is None:
                errors = self._errors[header.api_key] = {}
            _count_errors(response, plan, errors)
        if header.api_key == ApiKey.FETCH:
            self._fetched(request.body, response)

    def _fetched(self, request: Any, response: Any) -> None:
        """Bytes out and partition reads, from the response actually sent (a long poll reads
        the log more than once; only its last read reaches the consumer)."""
        to_follower = getattr(request, "replica_id", -1) >= 0
        slot = _REPLICATION_BYTES_OUT if to_follower else _BYTES_OUT
        all_topics = self._all_topics
        for topic in response.responses:
            # An unknown topic id (Fetch v13+) has no name and no series of its own.
            counters = self._topic(topic.topic) if topic.topic else [0] * len(_TOPIC_COUNTERS)
            for partition in topic.partitions:
                size = len(partition.records) if partition.records else 0
                counters[slot] += size
                all_topics[slot] += size
                counters[_TOTAL_FETCH] += 1
                all_topics[_TOTAL_FETCH] += 1
                if partition.error_code not in _EXPECTED_FETCH_ERRORS:
                    counters[_FAILED_FETCH] += 1
                    all_topics[_FAILED_FETCH] += 1

    # -- scrape time ------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        yield from self._topic_metrics()
        yield from self._request_metrics()
        yield from self._replica_metrics()
        yield from self._controller_metrics()
        yield from self._metadata_metrics()

    def _topic_metrics(self) -> Iterator[Metric]:
        # A deleted topic's series go, as Kafka removes its topic metrics on deletion.
        existing = self._replicas.image.topics
        for topic in [t for t in self._topics if t not in existing]:
            del self._topics[topic]
        for slot, name, help_text in _TOPIC_COUNTERS:
            family = CounterMetricFamily(
                f"kafka_server_brokertopicmetrics_{name}",
                f"kafka.server:type=BrokerTopicMetrics,name={help_text}",
            )
            family.add_sample(family.name + "_total", {}, self._all_topics[slot])
            for topic, counters in sorted(self._topics.items()):
                family.add_sample(family.name + "_total", {"topic": topic}, counters[slot])
            yield family

    def _request_metrics(self) -> Iterator[Metric]:
        names = {api_key: latency.name for api_key, latency in self._latency.items()}
        requests = CounterMetricFamily(
            "kafka_network_requestmetrics_requests",
            "kafka.network:type=RequestMetrics,name=RequestsPerSec: requests answered",
            labels=("request", "version"),
        )
        for (api_key, version), count in sorted(self._requests.items()):
            requests.add_metric((names[api_key], str(version)), count)
        yield requests
        errors = CounterMetricFamily(
            "kafka_network_requestmetrics_errors",
            "kafka.network:type=RequestMetrics,name=ErrorsPerSec: error codes in responses, "
            "every one counted (NONE: success)",
            labels=("request", "error"),
        )
        for api_key, counts in sorted(self._errors.items()):
            for code, count in sorted(counts.items()):
                errors.add_metric((names[api_key], ErrorCode(code).name.upper()), count)
        yield errors
        total_time = HistogramMetricFamily(
            "kafka_network_requestmetrics_totaltimems",
            "kafka.network:type=RequestMetrics,name=TotalTimeMs: ms from decoding a request "
            "to its encoded response (long-poll waits included)",
            labels=("request",),
        )
        bounds = [*map(floatToGoString, LATENCY_BUCKETS_MS), "+Inf"]
        for _, latency in sorted(self._latency.items()):
            cumulative, buckets = 0, []
            for bound, count in zip(bounds, latency.buckets, strict=True):
                cumulative += count
                buckets.append((bound, float(cumulative)))
            total_time.add_metric((latency.name,), buckets, latency.total_ms)
        yield total_time

    def _replica_metrics(self) -> Iterator[Metric]:
        replicas = self._replicas
        node_id = replicas.node_id
        partitions = sorted(replicas.partitions.items())
        leaders = [p for _, p in partitions if p.state.leader == node_id]
        under = sum(1 for p in leaders if len(p.state.isr) < len(p.state.replicas))

        def gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(
                f"kafka_server_replicamanager_{name}",
                f"kafka.server:type=ReplicaManager,name={help_text}",
                value=value,
            )

        yield gauge("partitioncount", "PartitionCount: replicas on this node", len(partitions))
        yield gauge("leadercount", "LeaderCount: partitions this node leads", len(leaders))
        yield gauge(
            "underreplicatedpartitions",
            "UnderReplicatedPartitions: led here, with fewer in-sync replicas than replicas",
            under,
        )
        yield gauge(
            "offlinereplicacount",
            "OfflineReplicaCount: replicas whose log dir failed",
            len(replicas.logs.offline),
        )
        yield CounterMetricFamily(
            "kafka_log_logmanager_straylogs",
            "kafka.log:type=LogManager,name=StrayLogs: partition directories set aside, never "
            "served, because the metadata does not assign them here under their topic id",
            value=replicas.logs.strays,
        )
        log_gauges = {
            name: GaugeMetricFamily(
                f"kafka_log_log_{name}",
                f"kafka.log:type=Log,name={help_text}",
                labels=("topic", "partition"),
            )
            for name, help_text in (
                ("size", "Size: bytes of the partition's log segments"),
                ("logstartoffset", "LogStartOffset: first offset a consumer can read"),
                ("logendoffset", "LogEndOffset: offset of the next record appended"),
                ("numlogsegments", "NumLogSegments: segments of the partition's log"),
            )
        }
        for (topic, index), partition in partitions:
            labels = (topic, str(index))
            log_ = partition.log
            log_gauges["size"].add_metric(labels, log_.size_in_bytes)
            log_gauges["logstartoffset"].add_metric(labels, log_.log_start_offset)
            log_gauges["logendoffset"].add_metric(labels, log_.log_end_offset)
            log_gauges["numlogsegments"].add_metric(labels, len(log_.segments))
        yield from log_gauges.values()

    def _controller_metrics(self) -> Iterator[Metric]:
        image = self._replicas.image
        active = self._active_controller()
        values = (
            ("activecontrollercount", "ActiveControllerCount: 1 on the active controller", 1),
            ("globaltopiccount", "GlobalTopicCount: topics in the cluster", len(image.topics)),
            (
                "globalpartitioncount",
                "GlobalPartitionCount: partitions in the cluster",
                sum(len(t.partitions) for t in image.topics.values()),
            ),
            (
                "offlinepartitionscount",
                "OfflinePartitionsCount: partitions without a leader",
                sum(
                    1 for t in image.topics.values() for p in t.partitions.values() if p.leader < 0
                ),
            ),
        )
        for name, help_text, value in values:
            # As in Kafka, only the active controller reports the cluster-wide counts.
            yield GaugeMetricFamily(
                f"kafka_controller_kafkacontroller_{name}",
                f"kafka.controller:type=KafkaController,name={help_text}",
                value=value if active else 0,
            )

    def _metadata_metrics(self) -> Iterator[Metric]:
        metadata = self._metadata
        if metadata is None:
            return
        for name, help_text, value in (
            (
                "load_error_count",
                "committed metadata records this node could not apply to its image",
                metadata.load_error_count,
            ),
            (
                "apply_error_count",
                "metadata changes this node could not act on",
                metadata.apply_error_count,
            ),
        ):
            yield GaugeMetricFamily(
                f"kafka_server_broker_metadata_metrics_metadata_{name}",
                f"kafka.server:type=broker-metadata-metrics,name=metadata-"
                f"{name.replace('_', '-')}: {help_text}",
                value=value,
            )


Readiness = Callable[[], str | None]
"""Why the node is not ready to serve (None: it is)."""

Route = Callable[[Mapping[str, list[str]]], tuple[int, Any]]
"""A JSON resource: given the query's parameters, an HTTP status and what to encode."""

_STATUS_TEXT = {200: "OK", 400: "Bad Request", 503: "Service Unavailable"}


_TEXT = "text/plain; charset=utf-8"


class MetricsEndpoint:
    """`GET /metrics` over HTTP/1.1 on the event loop (one request per connection), the
    probes Kubernetes asks: `/livez` (the event loop answers) and `/readyz` (`readiness`), and
    the JSON resources in `routes` (`/v1/state`, `/v1/restart-verdict`). It serves from the
    node's first moments, before its logs are loaded: `registry` and `readiness` are set again
    once the node has more to say."""

    READ_TIMEOUT_S = 10.0
    """A scraper that has not sent its request head by then is dropped."""

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        readiness: Readiness = lambda: None,
        routes: Mapping[str, Route] | None = None,
    ) -> None:
        self.registry = registry
        self.readiness = readiness
        self.routes = dict(routes or {})
        self._host = host or None
        self._port = port
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        """Listen; return the bound port."""
        self._server = await asyncio.start_server(self._serve, self._host, self._port)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            head = await wait_for(reader.readuntil(b"\r\n\r\n"), self.READ_TIMEOUT_S)
            status, content_type, body = self._answer(head.decode("latin-1"))
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    def _answer(self, head: str) -> tuple[str, str, bytes]:
        lines = head.split("\r\n")
        method, _, rest = lines[0].partition(" ")
        path, _, query = rest.partition(" ")[0].partition("?")
        if path not in ("/metrics", "/livez", "/readyz", *self.routes):
            known = ", ".join(("/metrics", "/livez", "/readyz", *sorted(self.routes)))
            return "404 Not Found", _TEXT, f"see {known}\n".encode()
        if method != "GET":
            return "405 Method Not Allowed", _TEXT, b"use GET\n"
        if path == "/livez":
            return "200 OK", _TEXT, b"ok\n"
        if path in self.routes:
            return self._json(self.routes[path], query)
        if path == "/readyz":
            reason = self.readiness()
            if reason is None:
                return "200 OK", _TEXT, b"ready\n"
            return "503 Service Unavailable", _TEXT, f"not ready: {reason}\n".encode()
        accept = ""
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "accept":
                accept = value.strip()
        encoder, content_type = choose_encoder(accept)
        try:
            return "200 OK", content_type, encoder(self.registry)
        except Exception:
            log.exception("collecting metrics failed")
            return "500 Internal Server Error", _TEXT, b"see the log\n"

    @staticmethod
    def _json(route: Route, query: str) -> tuple[str, str, bytes]:
        try:
            code, document = route(urllib.parse.parse_qs(query))
            body = json.dumps(document, indent=2, sort_keys=True).encode() + b"\n"
        except Exception:
            log.exception("answering a JSON resource failed")
            return "500 Internal Server Error", _TEXT, b"see the log\n"
        return f"{code} {_STATUS_TEXT.get(code, 'Unknown')}", "application/json", body
