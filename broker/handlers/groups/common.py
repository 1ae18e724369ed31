"""What the group API handlers share: the node facts they need, version and time helpers."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any, Protocol

from broker.groups import GroupService
from broker.protocol import ErrorCode
from broker.server import RequestContext

__all__ = ["E", "GroupApi", "GroupNodeInfo", "client_host", "ms", "version_of"]

E = ErrorCode


class GroupNodeInfo(Protocol):
    """What the group handlers need from the node."""

    @property
    def node_id(self) -> int: ...

    def coordinator_endpoint(self, group_id: str, listener: str) -> tuple[int, str, int] | None:
        """The group's coordinator: the leader of its `__consumer_offsets` partition, as
        (node id, host, port) on `listener`; None while it has no leader or no endpoint
        there."""

    async def ensure_offsets_topic(self) -> bool:
        """Create `__consumer_offsets` if it does not exist; False if it cannot be."""

    def partition_exists(self, topic: str, partition: int) -> bool: ...

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        """The name of the topic with this id, None if the metadata image has no such topic."""

    def topic_id(self, name: str) -> uuid.UUID | None:
        """The id of the topic with this name, None if the metadata image has no such topic."""


def ms(value: timedelta) -> int:
    return value // timedelta(milliseconds=1)


def version_of(body: Any) -> int:
    return int(body.__version__)


def client_host(context: RequestContext) -> str:
    """Kafka's `InetAddress.toString()` of the client: "/127.0.0.1"."""
    return "/" + context.client_address.rsplit(":", 1)[0]


class GroupApi:
    """A group API's handler: it speaks to the group service."""

    def __init__(self, service: GroupService) -> None:
        self._service = service
