"""The operator's Kafka client: what a cluster's brokers say of themselves, through the Admin
API of a well-kept client library (confluent-kafka), never hand-written protocol.

What it owns: asking a cluster for the facts the planner weighs (which brokers are registered
and unfenced, how many partitions are under-replicated) and, for topics, the Admin calls a
`Topic` needs. What it must never do: decide anything, or block a reconciliation for long: every
call has a short timeout, and a cluster that does not answer is reported as unreachable.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka.admin import AdminClient

from .planner import BrokerFacts

__all__ = ["TIMEOUT_S", "admin", "broker_facts"]

log = logging.getLogger(__name__)

TIMEOUT_S = 5.0
"""How long one Admin call may take before the cluster counts as unreachable."""


def admin(bootstrap: str) -> AdminClient:
    return AdminClient(
        {
            "bootstrap.servers": bootstrap,
            "socket.timeout.ms": int(TIMEOUT_S * 1000),
            "client.id": "gregor-operator",
            "log_level": 3,
        }
    )


def broker_facts(bootstrap: str) -> BrokerFacts | None:
    """The brokers that are registered and unfenced (a KRaft cluster describes only those),
    and how many partitions have fewer in-sync replicas than replicas; None when the cluster
    does not answer within TIMEOUT_S."""
    client = admin(bootstrap)
    try:
        described: Any = client.describe_cluster(request_timeout=TIMEOUT_S).result(
            timeout=TIMEOUT_S * 2
        )
        metadata = client.list_topics(timeout=TIMEOUT_S)
    except Exception as exc:  # the client raises KafkaException or a timeout, both mean "no"
        log.info("cluster at %s did not answer: %s", bootstrap, exc)
        return None
    under = sum(
        1
        for topic in metadata.topics.values()
        for partition in topic.partitions.values()
        if len(partition.isrs) < len(partition.replicas)
    )
    return BrokerFacts(
        brokers={int(node.id): "Unfenced" for node in described.nodes},
        under_replicated=under,
        active_controller=None,
    )
