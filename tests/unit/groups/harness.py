"""Drive the pure group coordinator by hand: requests in, answers and records out, time
advanced explicitly. Member ids are predictable (`<client or instance>-id<n>`)."""

from __future__ import annotations

import itertools
import struct
from typing import Any

from broker.groups import GroupConfig, GroupCoordinator, JoinRequest, SyncRequest
from broker.groups.api import HeartbeatRequest, LeaveRequest, OffsetCommitRequest
from broker.groups.effects import Append
from broker.protocol import ErrorCode

PROTOCOLS = (("range", b"r-meta"),)


def subscription(*topics: str) -> bytes:
    """A ConsumerProtocolSubscription v0: version, topics, user data."""
    body = struct.pack(">hi", 0, len(topics))
    for topic in topics:
        body += struct.pack(">h", len(topic)) + topic.encode()
    return body + struct.pack(">i", -1)


class Core:
    def __init__(self, **config: Any) -> None:
        settings: dict[str, Any] = {
            "num_partitions": 1,
            "initial_rebalance_delay_ms": 0,
            "min_session_timeout_ms": 1_000,
        }
        settings.update(config)
        self.config = GroupConfig(**settings)
        ids = itertools.count(1)
        self.core = GroupCoordinator(self.config, member_id_suffix=lambda: f"id{next(ids)}")
        self.now = 1_000_000
        for partition in range(self.config.num_partitions):
            self.core.begin_load(partition)
            self.core.complete_load(partition, self.now)
        self.answers: dict[int, object] = {}
        self.records: list[tuple[int, bytes, bytes | None]] = []
        self.effects: list[object] = []

    def drain(self) -> None:
        for effect in self.core.outbox.take():
            self.effects.append(effect)
            if isinstance(effect, Append):
                self.records += [(effect.partition, k, v) for k, v in effect.records]
            else:
                self.answers[effect.ticket] = effect.result

    def answer(self, ticket: int) -> Any:
        """The answer to a request, or None while it is parked."""
        return self.answers.pop(ticket, None)

    def advance(self, ms: int) -> None:
        self.now += ms
        self.core.tick(self.now)
        self.drain()

    # -- requests -----------------------------------------------------------------------

    def join(
        self,
        member_id: str = "",
        *,
        group: str = "g",
        instance: str | None = None,
        protocols: tuple[tuple[str, bytes], ...] = PROTOCOLS,
        protocol_type: str = "consumer",
        session: int = 10_000,
        rebalance: int = 30_000,
        client: str = "c",
        version: int = 9,
    ) -> int:
        ticket = self.core.join_group(
            JoinRequest(
                group_id=group,
                member_id=member_id,
                group_instance_id=instance,
                client_id=client,
                client_host="/127.0.0.1",
                session_timeout_ms=session,
                rebalance_timeout_ms=rebalance,
                protocol_type=protocol_type,
                protocols=protocols,
                requires_known_member_id=version >= 4,
                supports_skip_assignment=version >= 9,
            ),
            self.now,
        )
        self.drain()
        return ticket

    def join_new(self, client: str = "c", **kwargs: Any) -> str:
        """A dynamic member's first JoinGroup (MEMBER_ID_REQUIRED) and its rejoin; returns
        the ticket of the parked rejoin through `self.last` and the member id."""
        first = self.answer(self.join(client=client, **kwargs))
        assert first.error == ErrorCode.member_id_required
        self.last = self.join(first.member_id, client=client, **kwargs)
        return str(first.member_id)

    def sync(
        self,
        member_id: str,
        generation: int,
        *,
        group: str = "g",
        assignments: tuple[tuple[str, bytes], ...] = (),
        instance: str | None = None,
        protocol_name: str | None = None,
    ) -> int:
        ticket = self.core.sync_group(
            SyncRequest(
                group_id=group,
                member_id=member_id,
                group_instance_id=instance,
                generation_id=generation,
                protocol_name=protocol_name,
                assignments=assignments,
            ),
            self.now,
        )
        self.drain()
        return ticket

    def heartbeat(
        self, member_id: str, generation: int, *, group: str = "g", instance: str | None = None
    ) -> ErrorCode:
        error = self.core.heartbeat(
            HeartbeatRequest(
                group_id=group,
                member_id=member_id,
                group_instance_id=instance,
                generation_id=generation,
            ),
            self.now,
        )
        self.drain()
        return error

    def leave(self, *members: tuple[str, str | None], group: str = "g") -> Any:
        ticket = self.core.leave_group(LeaveRequest(group_id=group, members=members), self.now)
        self.drain()
        return self.answer(ticket)

    def commit(self, request: OffsetCommitRequest) -> Any:
        ticket = self.core.commit_offsets(request, self.now)
        self.drain()
        return self.answer(ticket)

    def stable_group(self, *clients: str, **kwargs: Any) -> list[str]:
        """Members of a Stable group at generation 1, the first one leading, all synced."""
        ids = []
        tickets = []
        for client in clients:
            ids.append(self.join_new(client, **kwargs))
            tickets.append(self.last)
        self.advance(0)
        joined = [self.answer(t) for t in tickets]
        assert all(j.error == ErrorCode.none for j in joined), joined
        generation = joined[0].generation_id
        syncs = [
            self.sync(
                member_id,
                generation,
                group=kwargs.get("group", "g"),
                assignments=tuple((m, f"a-{m}".encode()) for m in ids) if i == 0 else (),
            )
            for i, member_id in enumerate(ids)
        ]
        assert all(self.answer(t).error == ErrorCode.none for t in syncs)
        return ids


__all__ = ["PROTOCOLS", "Core", "subscription"]
