"""The cluster's facts about the audited topics, through Kafka's Admin API.

What it owns: asking the cluster, with the Java Admin client that Spark's Kafka connector brings
(in the driver's JVM, so that `--command-config` properties mean exactly what they mean to
Spark's reader and to Kafka's tools), for: the topics and their partitions' leaders
(DescribeTopics), their effective configurations and the broker's
`log.retention.check.interval.ms` (DescribeConfigs), log start and end offsets (ListOffsets), and
the leaders' replica sizes on disk (DescribeLogDirs, broker by broker). What the audit cannot
learn of a topic makes that topic an `Error` with the cluster's reason (it does not exist, it
has a leaderless partition, its size cannot be read while `retention.bytes` bounds it); what it
cannot learn of the cluster is a warning in the report; a cluster that does not answer at all is
`ClusterUnreachable`. `java_failure` turns any Py4J error into one line naming its root cause.

What it must never do: change anything on the cluster, or wait longer than the settings' timeout
for any one answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gregor_audit.findings import PartitionFacts, Policy, TopicFacts
from gregor_audit.settings import AuditSettings

__all__ = ["ClusterFacts", "ClusterUnreachable", "ConnectorMissing", "gather", "java_failure"]

_DEFAULT_CHECK_INTERVAL_MS = 300_000
_UNKNOWN_TOPIC = "UnknownTopicOrPartitionException"
_WRAPPERS = ("ExecutionException", "CompletionException", "KafkaException", "Py4JJavaError")


class ClusterUnreachable(RuntimeError):
    """The cluster did not answer, or refused the audit's client."""


class ConnectorMissing(RuntimeError):
    """Kafka's client classes are not on the driver's class path."""


def _root(exc: BaseException) -> Any:
    """The innermost Java exception behind a Py4J error (None: not a Java failure)."""
    java = getattr(exc, "java_exception", None)
    while java is not None and java.getCause() is not None:
        java = java.getCause()
    return java


def java_failure(exc: BaseException) -> str:
    """One line for a failure that may come from the JVM: its root cause's class and message."""
    java = _root(exc)
    if java is None:
        text = str(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__
    message = str(java.getMessage() or "").strip().splitlines()
    name = str(java.getClass().getSimpleName())
    return f"{name}: {message[0]}" if message else name


def _cause_name(exc: BaseException) -> str:
    java = _root(exc)
    return "" if java is None else str(java.getClass().getSimpleName())


@dataclass(slots=True)
class ClusterFacts:
    topics: dict[str, TopicFacts]
    warnings: list[str] = field(default_factory=list)
    """What the audit could not learn of the cluster and assumed instead."""


class _Admin:
    def __init__(self, jvm: Any, settings: AuditSettings) -> None:
        from py4j.java_gateway import JavaClass  # noqa: PLC0415 - Py4J comes with PySpark

        self._jvm = jvm
        self.bootstrap = settings.bootstrap_servers
        self.timeout_ms = settings.timeout_ms
        admin_class = jvm.org.apache.kafka.clients.admin.Admin
        if not isinstance(admin_class, JavaClass):
            raise ConnectorMissing(
                "Kafka's client classes are not on Spark's class path: run the audit with "
                "Spark's Kafka connector (spark-sql-kafka-0-10) and its jars"
            )
        props = jvm.java.util.Properties()
        for key, value in settings.client_properties.items():
            props.setProperty(key, value)
        props.setProperty("bootstrap.servers", settings.bootstrap_servers)
        props.setProperty("client.id", "gregor-retention-audit")
        props.setProperty("request.timeout.ms", str(self.timeout_ms))
        props.setProperty("default.api.timeout.ms", str(self.timeout_ms))
        try:
            self.client = admin_class.create(props)
        except Exception as exc:
            raise ClusterUnreachable(self.unreachable(java_failure(exc))) from None

    def unreachable(self, why: str) -> str:
        return f"cannot reach the Kafka cluster at {self.bootstrap}: {why}"

    def get(self, future: Any) -> Any:
        unit = self._jvm.java.util.concurrent.TimeUnit.MILLISECONDS
        return future.get(self.timeout_ms, unit)

    def list_of(self, items: Iterable[Any]) -> Any:
        result = self._jvm.java.util.ArrayList()
        for item in items:
            result.add(item)
        return result

    def close(self) -> None:
        self.client.close(self._jvm.java.time.Duration.ofSeconds(5))


def _node_ids(admin: _Admin) -> list[int]:
    try:
        nodes = admin.get(admin.client.describeCluster().nodes())
    except Exception as exc:
        why = java_failure(exc)
        if _cause_name(exc) == "TimeoutException":
            why = f"no answer within {admin.timeout_ms / 1000:g} s"
        raise ClusterUnreachable(admin.unreachable(why)) from None
    return sorted(int(node.id()) for node in nodes.toArray())


def _descriptions(admin: _Admin, topics: Iterable[str]) -> tuple[dict[str, Any], dict[str, str]]:
    futures = admin.client.describeTopics(admin.list_of(topics)).topicNameValues()
    found: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for topic in topics:
        try:
            found[topic] = admin.get(futures.get(topic))
        except Exception as exc:
            errors[topic] = (
                f"topic {topic} does not exist"
                if _cause_name(exc) == _UNKNOWN_TOPIC
                else f"cannot describe topic {topic}: {java_failure(exc)}"
            )
    return found, errors


def _configs(
    admin: _Admin, resources: list[Any], errors: dict[str, str]
) -> dict[str, dict[str, str]]:
    """Each resource's configuration by name; why one could not be read, in `errors`."""
    futures = admin.client.describeConfigs(admin.list_of(resources)).values()
    result: dict[str, dict[str, str]] = {}
    for resource in resources:
        name = str(resource.name())
        try:
            config = admin.get(futures.get(resource))
        except Exception as exc:
            errors[name] = f"cannot read the configuration of {name}: {java_failure(exc)}"
            continue
        result[name] = {
            str(entry.name()): str(entry.value())
            for entry in config.entries().toArray()
            if entry.value() is not None
        }
    return result


def _offsets(
    admin: _Admin, partitions: list[Any], spec: Any, errors: dict[str, str]
) -> dict[tuple[str, int], int]:
    """Each partition's offset of `spec`; a partition without one makes its topic an error."""
    request = admin._jvm.java.util.HashMap()
    for tp in partitions:
        request.put(tp, spec)
    answer = admin.client.listOffsets(request)
    offsets: dict[tuple[str, int], int] = {}
    for tp in partitions:
        topic, partition = str(tp.topic()), int(tp.partition())
        try:
            offsets[(topic, partition)] = int(admin.get(answer.partitionResult(tp)).offset())
        except Exception as exc:
            errors.setdefault(
                topic, f"cannot list the offsets of {topic}-{partition}: {java_failure(exc)}"
            )
    return offsets


def _sizes(
    admin: _Admin, leaders: dict[tuple[str, int], int]
) -> tuple[dict[tuple[str, int], int], dict[int, str]]:
    """Each partition's size on its leader (the replica the audit reads), asking each leader
    alone so that one broker's failure costs only its partitions; why a broker did not say."""
    node_ids = sorted(set(leaders.values()))
    answer = admin.client.describeLogDirs(admin.list_of(node_ids)).descriptions()
    sizes: dict[tuple[str, int], int] = {}
    failures: dict[int, str] = {}
    for node_id in node_ids:
        try:
            dirs = admin.get(answer.get(node_id))
        except Exception as exc:
            failures[node_id] = java_failure(exc)
            continue
        # Py4J gives Java maps Python's mapping interface.
        for directory in dirs.values():
            for tp, replica in directory.replicaInfos().items():
                key = (str(tp.topic()), int(tp.partition()))
                if leaders.get(key) == node_id and not replica.isFuture():
                    sizes[key] = int(replica.size())
    return sizes, failures


def _check_interval(admin: _Admin, node_id: int, warnings: list[str]) -> int:
    jvm = admin._jvm
    config_type = getattr(jvm.org.apache.kafka.common.config, "ConfigResource$Type")
    resource = jvm.org.apache.kafka.common.config.ConfigResource(config_type.BROKER, str(node_id))
    failed: dict[str, str] = {}
    configs = _configs(admin, [resource], failed).get(str(node_id), {})
    raw = configs.get("log.retention.check.interval.ms")
    if raw is None:
        why = failed.get(str(node_id), f"broker {node_id} did not list it")
        warnings.append(
            f"log.retention.check.interval.ms assumed to be Kafka's default, "
            f"{_DEFAULT_CHECK_INTERVAL_MS} ms ({why})"
        )
        return _DEFAULT_CHECK_INTERVAL_MS
    return int(raw)


def gather(jvm: Any, settings: AuditSettings) -> ClusterFacts:
    """Every audited topic's facts, by name (`jvm` is the Spark driver's Py4J view)."""
    admin = _Admin(jvm, settings)
    warnings: list[str] = []
    try:
        node_ids = _node_ids(admin)
        described, errors = _descriptions(admin, settings.topics)
        check_interval = _check_interval(admin, node_ids[0], warnings)
        config_type = getattr(jvm.org.apache.kafka.common.config, "ConfigResource$Type")
        resource = jvm.org.apache.kafka.common.config.ConfigResource
        topic_configs = _configs(admin, [resource(config_type.TOPIC, t) for t in described], errors)
        leaders: dict[tuple[str, int], int] = {}
        partitions: list[Any] = []
        for topic, description in described.items():
            for info in description.partitions().toArray():
                leader = info.leader()
                if leader is None:
                    errors.setdefault(
                        topic, f"{topic}-{info.partition()} has no leader: it cannot be read"
                    )
                    continue
                leaders[(topic, int(info.partition()))] = int(leader.id())
                partitions.append(
                    jvm.org.apache.kafka.common.TopicPartition(topic, int(info.partition()))
                )
        spec = jvm.org.apache.kafka.clients.admin.OffsetSpec
        starts = _offsets(admin, partitions, spec.earliest(), errors) if partitions else {}
        ends = _offsets(admin, partitions, spec.latest(), errors) if partitions else {}
        sizes, size_failures = _sizes(admin, leaders) if leaders else ({}, {})
    finally:
        admin.close()
    result: dict[str, TopicFacts] = {}
    for topic in settings.topics:
        if topic in errors:
            result[topic] = TopicFacts(topic, error=errors[topic])
            continue
        try:
            policy = Policy.from_configs(topic_configs[topic], check_interval)
        except ValueError as exc:
            result[topic] = TopicFacts(topic, error=f"{topic}: {exc}")
            continue
        keys = sorted(key for key in leaders if key[0] == topic)
        unsized = [key for key in keys if key not in sizes]
        if policy.promised_bytes is not None and unsized:
            topic_name, partition = unsized[0]
            node_id = leaders[unsized[0]]
            why = size_failures.get(node_id, f"broker {node_id} did not list it")
            result[topic] = TopicFacts(
                topic,
                error=f"cannot read the size of {topic_name}-{partition} on disk, which "
                f"retention.bytes bounds: {why}",
            )
            continue
        result[topic] = TopicFacts(
            topic,
            policy,
            tuple(
                PartitionFacts(p, starts[(topic, p)], ends[(topic, p)], sizes.get((topic, p)))
                for _, p in keys
            ),
        )
    return ClusterFacts(result, warnings)
