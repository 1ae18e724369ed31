"""What the cluster says of the run's topics, asked of every node itself; and creating and
deleting those topics through a real client.

Each node answers Metadata from its own copy of the metadata log, and a client library keeps
whichever answer it got first, so "every partition has its full ISR" is asked of each node by
hand (Metadata v12 on a fresh connection): the cluster has recovered when all three list all
three brokers, every partition of every topic with a leader and an ISR that is its whole
replica set, under one topic id. What it must never do: take one node's word for the
cluster's.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from broker.protocol import ApiKey, ErrorCode, request_type
from tests.support.clusters import ThreeNodes
from tests.support.requests import fill
from tests.support.wire import call

__all__ = [
    "NODE_IDS",
    "QUIET",
    "NotSettled",
    "PartitionView",
    "TopicView",
    "address",
    "assignment",
    "create_topic",
    "delete_topic",
    "describe",
    "render",
    "topic_id",
    "unsettled",
    "wait_settled",
]

NODE_IDS = (1, 2, 3)
QUIET = {"log_level": 0}
"""librdkafka logs every refused connection to stderr; a fault run makes many."""


@dataclass(frozen=True, slots=True)
class PartitionView:
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TopicView:
    error_code: int
    topic_id: uuid.UUID
    partitions: Mapping[int, PartitionView]


NodeView = tuple[frozenset[int], Mapping[str, TopicView]]
"""The brokers a node lists, and the topics as it describes them."""


class NotSettled(AssertionError):
    """The cluster did not come back to full ISR in time; the message says what each node
    said."""


def assignment(partitions: int) -> list[list[int]]:
    """Replicas of each partition: all three nodes, the preferred leader rotating."""
    return [[(p + i) % 3 + 1 for i in range(3)] for p in range(partitions)]


def address(nodes: ThreeNodes, node_id: int) -> tuple[str, int]:
    host, port = nodes.bootstrap.split(",")[node_id - 1].rsplit(":", 1)
    return host, int(port)


def _ask(nodes: ThreeNodes, node_id: int, topics: Sequence[str]) -> NodeView:
    request = fill(
        request_type(ApiKey.METADATA, 12),
        {"topics": [{"name": t} for t in topics], "allow_auto_topic_creation": False},
    )
    answer: Any = call(address(nodes, node_id), ApiKey.METADATA, 12, request, 5.0)
    described = {
        t.name: TopicView(
            int(t.error_code),
            t.topic_id,
            {
                p.partition_index: PartitionView(
                    p.leader_id, p.leader_epoch, tuple(p.replica_nodes), tuple(p.isr_nodes)
                )
                for p in t.partitions
            },
        )
        for t in answer.topics
    }
    return frozenset(b.node_id for b in answer.brokers), described


def describe(
    nodes: ThreeNodes, topics: Sequence[str], node_ids: Sequence[int] = NODE_IDS
) -> dict[int, NodeView | str]:
    """What each node says of `topics`, or why it did not answer."""
    views: dict[int, NodeView | str] = {}
    for node_id in node_ids:
        try:
            views[node_id] = _ask(nodes, node_id, topics)
        except (OSError, ConnectionError, AssertionError) as error:
            views[node_id] = f"no answer ({error!r})"
    return views


def unsettled(views: Mapping[int, NodeView | str], topics: Mapping[str, int]) -> list[str]:
    """Why the cluster is not at full ISR as `views` show it (none: it is). `topics` gives
    each topic's partition count."""
    reasons: list[str] = []
    ids: dict[str, set[uuid.UUID]] = {}
    for node_id, view in sorted(views.items()):
        if isinstance(view, str):
            reasons.append(f"node {node_id}: {view}")
            continue
        brokers, described = view
        if brokers != set(NODE_IDS):
            reasons.append(f"node {node_id} lists brokers {sorted(brokers)}")
        for topic, count in topics.items():
            found = described.get(topic)
            if found is None or found.error_code != ErrorCode.none:
                code = None if found is None else found.error_code
                reasons.append(f"node {node_id}: {topic} not described (error {code})")
                continue
            ids.setdefault(topic, set()).add(found.topic_id)
            if sorted(found.partitions) != list(range(count)):
                reasons.append(f"node {node_id}: {topic} has partitions {sorted(found.partitions)}")
            for index, partition in sorted(found.partitions.items()):
                if partition.leader < 0 or set(partition.isr) != set(partition.replicas):
                    reasons.append(
                        f"node {node_id}: {topic}-{index} leader {partition.leader}, "
                        f"replicas {list(partition.replicas)}, isr {list(partition.isr)}"
                    )
    reasons.extend(
        f"{topic} has topic ids {sorted(map(str, found))} on different nodes"
        for topic, found in ids.items()
        if len(found) > 1
    )
    return reasons


def render(views: Mapping[int, NodeView | str]) -> str:
    """Every node's description, one partition a line: the evidence when a wait fails."""
    lines: list[str] = []
    for node_id, view in sorted(views.items()):
        if isinstance(view, str):
            lines.append(f"node {node_id}: {view}")
            continue
        brokers, described = view
        lines.append(f"node {node_id}: brokers {sorted(brokers)}")
        for topic, found in sorted(described.items()):
            lines.append(f"  {topic} id {found.topic_id} error {found.error_code}")
            lines.extend(
                f"    {topic}-{index} leader {p.leader} epoch {p.leader_epoch} "
                f"replicas {list(p.replicas)} isr {list(p.isr)}"
                for index, p in sorted(found.partitions.items())
            )
    return "\n".join(lines)


def wait_settled(
    nodes: ThreeNodes, topics: Mapping[str, int], timeout: float, settle: float = 1.0
) -> float:
    """Until every node says every partition has its full ISR, and still says so `settle`
    seconds later (a node just restarted may first be described as it was before its fault,
    until the controller notices it went away). Returns the seconds waited; raises
    `NotSettled` with every node's description after `timeout`."""
    started = time.monotonic()
    deadline = started + timeout
    settled_since: float | None = None
    while True:
        views = describe(nodes, list(topics))
        reasons = unsettled(views, topics)
        now = time.monotonic()
        if reasons:
            settled_since = None
        elif settled_since is None:
            settled_since = now
        elif now - settled_since >= settle:
            return settled_since - started
        if now > deadline:
            raise NotSettled(
                f"not at full ISR within {timeout:.0f} s: "
                + "; ".join(reasons[:6])
                + "\n"
                + render(views)
            )
        time.sleep(0.25)


def _retry(what: str, attempt: Callable[[], bool], timeout: float) -> None:
    """`attempt` until it returns True; errors of a cluster in the middle of a fault (no
    controller, a request timed out) are retried until `timeout`."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            if attempt():
                return
        except (KafkaException, TimeoutError) as error:  # a future's result() times out
            last = error
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")


def create_topic(
    nodes: ThreeNodes,
    topic: str,
    partitions: int,
    configs: Mapping[str, str],
    *,
    not_id: uuid.UUID | None = None,
    timeout: float = 60.0,
) -> None:
    """CreateTopics with every node a replica of every partition (`assignment`). Retried:
    when a try timed out but went through, TOPIC_ALREADY_EXISTS with a topic id other than
    `not_id` (the incarnation deleted before) says it did."""

    def created() -> bool:
        admin = AdminClient({"bootstrap.servers": nodes.bootstrap, **QUIET})
        new = NewTopic(
            topic, partitions, replica_assignment=assignment(partitions), config=dict(configs)
        )
        try:
            admin.create_topics([new], operation_timeout=15)[topic].result(20)
        except KafkaException as error:
            if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
            for view in describe(nodes, [topic]).values():
                if isinstance(view, str):
                    continue
                found = view[1].get(topic)
                if found is not None and found.error_code == 0 and found.topic_id != not_id:
                    return True
            return False
        return True

    _retry(f"{topic} created", created, timeout)


def delete_topic(
    nodes: ThreeNodes, topic: str, running: Sequence[int], *, timeout: float = 60.0
) -> None:
    """DeleteTopics, retried; returns once every node in `running` says the topic is gone."""

    def deleted() -> bool:
        admin = AdminClient({"bootstrap.servers": nodes.bootstrap, **QUIET})
        try:
            admin.delete_topics([topic], operation_timeout=15)[topic].result(20)
        except KafkaException as error:
            if error.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
        return True

    def gone() -> bool:
        for view in describe(nodes, [topic], running).values():
            if isinstance(view, str):
                return False
            found = view[1].get(topic)
            if found is not None and found.error_code != ErrorCode.unknown_topic_or_partition:
                return False
        return True

    _retry(f"{topic} deleted", deleted, timeout)
    _retry(f"{topic} gone from nodes {list(running)}", gone, timeout)


def topic_id(nodes: ThreeNodes, topic: str) -> uuid.UUID | None:
    """The topic's id as the first node that describes it says."""
    for view in describe(nodes, [topic]).values():
        if not isinstance(view, str):
            found = view[1].get(topic)
            if found is not None and found.error_code == ErrorCode.none:
                return found.topic_id
    return None
