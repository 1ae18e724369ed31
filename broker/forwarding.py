"""Admin writes that reach a broker which is not the active controller are forwarded to it, as
Kafka's brokers do (KIP-590): the client's request frame, whole, inside an Envelope request
to the leader's controller listener, which handles it as if the client had sent it there and
returns the response frame, whole, which goes back to the client unchanged (its correlation id
included).

When this node is the active controller, or no controller can be reached, the request is
handled here: the controller's decision, or NOT_CONTROLLER, which clients retry.

A broker also sends its own requests this way (`send_as_broker`): the creation of
`__consumer_offsets` on first use, which clients may not ask for, marked with the broker
principal so that the controller allows it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
from typing import Any

from broker.config import BrokerConfig
from broker.kraft import MetadataService
from broker.peer import ActiveControllerPeers, PeerUnavailable
from broker.protocol import ApiKey, ErrorCode, build, encode_frame, request_type

__all__ = ["BROKER_PRINCIPAL", "FORWARDED_APIS", "Forwarding"]

log = logging.getLogger(__name__)

FORWARDED_APIS = frozenset(
    {
        ApiKey.CREATE_TOPICS,
        ApiKey.DELETE_TOPICS,
        ApiKey.CREATE_PARTITIONS,
        ApiKey.ALTER_CONFIGS,
        ApiKey.INCREMENTAL_ALTER_CONFIGS,
        ApiKey.ELECT_LEADERS,
        ApiKey.ALTER_PARTITION_REASSIGNMENTS,
        ApiKey.LIST_PARTITION_REASSIGNMENTS,
        ApiKey.UNREGISTER_BROKER,
        ApiKey.DESCRIBE_QUORUM,
    }
)
"""The requests whose answer is the active controller's: they write metadata (or, for
ListPartitionReassignments, read what it has committed; for DescribeQuorum, which Kafka 4's
brokers forward too, what only the quorum's leader knows: its voters' and observers' progress)."""
BROKER_PRINCIPAL = b"gregor-broker"
"""An Envelope's principal when a broker sends a request on its own behalf."""
ENVELOPE_VERSION = 0


class Forwarding:
    def __init__(self, config: BrokerConfig, metadata: MetadataService) -> None:
        self._config = config
        self._metadata = metadata
        self._peers = ActiveControllerPeers(
            config.controller_quorum_voters, f"forwarder-{config.node_id}"
        )

    async def forward(self, frame: bytes, client_address: str) -> bytes | None:
        """The `Dispatcher.forwarder` of the client listeners (offered `FORWARDED_APIS`)."""
        return await self._envelope(frame, client_address, principal=None)

    async def send_as_broker(self, frame: bytes) -> bytes | None:
        """This broker's own request, answered by the active controller (None: unreachable,
        or this node is it)."""
        return await self._envelope(frame, "", principal=BROKER_PRINCIPAL)

    async def _envelope(
        self, frame: bytes, client_address: str, *, principal: bytes | None
    ) -> bytes | None:
        metadata = self._metadata
        if metadata.is_active_controller:
            return None
        peer = self._peers.to(metadata.driver.leader)
        if peer is None:
            return None
        body = build(
            request_type(ApiKey.ENVELOPE, ENVELOPE_VERSION),
            request_data=frame,
            request_principal=principal,
            client_host_address=_address_bytes(client_address),
        )
        timeout_s = self._config.controller_quorum_request_timeout_ms / 1000 + 30
        response: Any = None
        with contextlib.suppress(PeerUnavailable, TimeoutError):
            response = await peer.request(
                ApiKey.ENVELOPE, ENVELOPE_VERSION, body, timeout_s=timeout_s
            )
        if response is None or response.error_code != ErrorCode.none:
            return None
        if response.response_data is None:
            return None
        return encode_frame(response.response_data)

    async def close(self) -> None:
        await self._peers.close()


def _address_bytes(client_address: str) -> bytes:
    """The client's IP address as Kafka's Envelope carries it (4 or 16 bytes)."""
    host = client_address.rsplit(":", 1)[0].strip("[]")
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host).packed
    return b""
