"""The group APIs through real frames: encode_request → Dispatcher.dispatch → decode_response,
at old and new versions, over a group service on a real commit log."""

from __future__ import annotations

import dataclasses
import itertools
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from broker.groups import GroupConfig, GroupService, LogGroupLog
from broker.groups.records import subscribed_topics
from broker.handlers import groups
from broker.protocol import (
    SUPPORTED,
    ApiKey,
    RequestHeader,
    build,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    request_type,
)
from broker.protocol import ErrorCode as E
from broker.protocol.messages import request_module
from broker.server import Dispatcher, Handler
from tests.golden.verify import CLIENTS, GOLDEN_DIR
from tests.strategies import sample
from tests.unit.groups.brokers import Broker, run

T_ID = uuid.UUID("5f2a0f5e-3c1b-4d7e-9a0b-1c2d3e4f5a6b")


class Node:
    """What the handlers need of a node: one broker on PLAINTEXT, and topic `t` (id `T_ID`)
    with 2 partitions."""

    node_id = 1

    def __init__(self) -> None:
        self.topic_requests = 0

    def coordinator_endpoint(self, group_id: str, listener: str) -> tuple[int, str, int] | None:
        return (1, "broker-1", 9092) if listener == "PLAINTEXT" else None

    async def ensure_offsets_topic(self) -> bool:
        self.topic_requests += 1
        return True

    def partition_exists(self, topic: str, partition: int) -> bool:
        return topic == "t" and 0 <= partition < 2

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        return "t" if topic_id == T_ID else None

    def topic_id(self, name: str) -> uuid.UUID | None:
        return T_ID if name == "t" else None


class Client:
    def __init__(self, dispatcher: Dispatcher, listener: str = "PLAINTEXT") -> None:
        self.dispatcher = dispatcher
        self.listener = listener
        self.correlation = itertools.count(1)

    async def send(self, api: ApiKey, version: int, /, **values: Any) -> Any:
        module = request_module(api, version)
        body = build(request_type(api, version), **_nested(module, api, version, values))
        correlation = next(self.correlation)
        frame = encode_request(RequestHeader(api, version, correlation, "app"), body)
        answer = await self.dispatcher.dispatch(frame[4:], self.listener, "127.0.0.1:50000")
        assert isinstance(answer, bytes)
        got, response = decode_response(api, version, answer[4:])
        assert got == correlation
        return response


def _nested(module: Any, key: ApiKey, version: int, values: dict[str, Any]) -> dict[str, Any]:
    """Turn plain dicts in `values` into the version's nested request structs."""
    structs = {
        ApiKey.JOIN_GROUP: {"protocols": "JoinGroupRequestProtocol"},
        ApiKey.SYNC_GROUP: {"assignments": "SyncGroupRequestAssignment"},
        ApiKey.LEAVE_GROUP: {"members": "MemberIdentity"},
        ApiKey.OFFSET_DELETE: {"topics": "OffsetDeleteRequestTopic"},
    }.get(key, {})
    out = dict(values)
    for name, struct in structs.items():
        if name in out:
            out[name] = tuple(build(getattr(module, struct), **v) for v in out[name])
    if key == ApiKey.OFFSET_DELETE and "topics" in values:
        out["topics"] = tuple(
            build(
                module.OffsetDeleteRequestTopic,
                name=t["name"],
                partitions=tuple(
                    build(module.OffsetDeleteRequestPartition, partition_index=p)
                    for p in t["partitions"]
                ),
            )
            for t in values["topics"]
        )
    if key == ApiKey.OFFSET_COMMIT and "topics" in values:
        out["topics"] = tuple(
            build(
                module.OffsetCommitRequestTopic,
                name=t["name"],
                partitions=tuple(
                    build(module.OffsetCommitRequestPartition, **p) for p in t["partitions"]
                ),
            )
            for t in values["topics"]
        )
    if key == ApiKey.OFFSET_FETCH:
        topic_type = (
            module.OffsetFetchRequestTopics if version >= 8 else module.OffsetFetchRequestTopic
        )

        def topics(ts: Any) -> Any:
            return None if ts is None else tuple(build(topic_type, **t) for t in ts)

        if "groups" in values:
            out["groups"] = tuple(
                build(
                    module.OffsetFetchRequestGroup,
                    group_id=g["group_id"],
                    topics=topics(g["topics"]),
                )
                for g in values["groups"]
            )
        if "topics" in values:
            out["topics"] = topics(values["topics"])
    return out


def with_client(
    tmp_path: Path, scenario: Callable[[Client, Node], Awaitable[None]], *, start: bool = True
) -> None:
    async def body() -> None:
        broker = Broker(tmp_path / "data")
        node = Node()
        handlers: dict[int, Handler] = {}
        responders = groups.register(handlers, broker.service, node)
        dispatcher = Dispatcher(handlers, responders)
        if start:
            await broker.service.start()
        try:
            await scenario(Client(dispatcher), node)
        finally:
            await broker.stop()

    run(body)


MS = timedelta(milliseconds=1)


def join_values(**changes: Any) -> dict[str, Any]:
    """A new consumer's JoinGroup to group `g` with protocol `range`, and `changes`."""
    return {
        "group_id": "g",
        "session_timeout": 10_000 * MS,
        "rebalance_timeout": 10_000 * MS,
        "member_id": "",
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"sub"}],
    } | changes


# -- FindCoordinator --------------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_find_coordinator_names_this_node(tmp_path: Path, version: int) -> None:
    async def scenario(client: Client, node: Node) -> None:
        response = await client.send(ApiKey.FIND_COORDINATOR, version, key="g", key_type=0)
        assert (response.error_code, response.node_id, response.host, response.port) == (
            E.none,
            1,
            "broker-1",
            9092,
        )
        assert node.topic_requests == 1  # __consumer_offsets is created on first use

    with_client(tmp_path, scenario)


def test_find_coordinator_v4_answers_each_key_and_refuses_transactions(tmp_path: Path) -> None:
    async def scenario(client: Client, node: Node) -> None:
        response = await client.send(
            ApiKey.FIND_COORDINATOR, 4, key_type=0, coordinator_keys=("a", "b")
        )
        assert [(c.key, c.node_id, c.error_code) for c in response.coordinators] == [
            ("a", 1, E.none),
            ("b", 1, E.none),
        ]
        response = await client.send(
            ApiKey.FIND_COORDINATOR, 4, key_type=1, coordinator_keys=("tx",)
        )
        ((key, error, message),) = [
            (c.key, c.error_code, c.error_message) for c in response.coordinators
        ]
        # Fatal for clients at once, not the retriable COORDINATOR_NOT_AVAILABLE.
        assert (key, error) == ("tx", E.transactional_id_authorization_failed)
        assert "does not support transactions" in message

    with_client(tmp_path, scenario)


def test_find_coordinator_on_a_listener_without_endpoint(tmp_path: Path) -> None:
    async def scenario(client: Client, node: Node) -> None:
        client.listener = "INTERNAL"
        response = await client.send(ApiKey.FIND_COORDINATOR, 1, key="g")
        assert (response.error_code, response.node_id) == (E.coordinator_not_available, -1)

    with_client(tmp_path, scenario)


# -- a consumer's whole life, at old and new versions -----------------------------------------

VERSION_SETS = {
    # join, sync, heartbeat, leave, commit, fetch
    "oldest": (0, 0, 0, 0, 2, 1),
    "static-capable": (5, 3, 3, 3, 6, 5),
    "newest": (9, 5, 4, 5, 8, 8),
}


@pytest.mark.parametrize("versions", VERSION_SETS.values(), ids=VERSION_SETS.keys())
def test_a_consumer_joins_syncs_commits_fetches_and_leaves(
    tmp_path: Path, versions: tuple[int, ...]
) -> None:
    join_v, sync_v, heartbeat_v, leave_v, commit_v, fetch_v = versions

    async def scenario(client: Client, node: Node) -> None:
        joined = await client.send(ApiKey.JOIN_GROUP, join_v, **join_values())
        if join_v >= 4:
            assert joined.error_code == E.member_id_required
            again = join_values(member_id=joined.member_id)
            joined = await client.send(ApiKey.JOIN_GROUP, join_v, **again)
        assert joined.error_code == E.none
        member, generation = joined.member_id, joined.generation_id
        assert member.startswith("app-")
        assert (joined.leader, joined.protocol_name, generation) == (member, "range", 1)
        assert [(m.member_id, m.metadata) for m in joined.members] == [(member, b"sub")]

        synced = await client.send(
            ApiKey.SYNC_GROUP,
            sync_v,
            group_id="g",
            generation_id=generation,
            member_id=member,
            assignments=[{"member_id": member, "assignment": b"mine"}],
        )
        assert (synced.error_code, synced.assignment) == (E.none, b"mine")
        beat = await client.send(
            ApiKey.HEARTBEAT, heartbeat_v, group_id="g", generation_id=generation, member_id=member
        )
        assert beat.error_code == E.none

        committed = await client.send(
            ApiKey.OFFSET_COMMIT,
            commit_v,
            group_id="g",
            generation_id_or_member_epoch=generation,
            member_id=member,
            topics=[
                {
                    "name": "t",
                    "partitions": [
                        {"partition_index": 0, "committed_offset": 10, "committed_metadata": "x"},
                        {"partition_index": 5, "committed_offset": 1, "committed_metadata": None},
                    ],
                }
            ],
        )
        assert [(p.partition_index, p.error_code) for p in committed.topics[0].partitions] == [
            (0, E.none),
            (5, E.unknown_topic_or_partition),
        ]

        wanted = [{"name": "t", "partition_indexes": (0, 1)}]
        if fetch_v >= 8:
            fetched = await client.send(
                ApiKey.OFFSET_FETCH, fetch_v, groups=[{"group_id": "g", "topics": wanted}]
            )
            (group,) = fetched.groups
            assert group.error_code == E.none
            partitions = group.topics[0].partitions
        else:
            fetched = await client.send(ApiKey.OFFSET_FETCH, fetch_v, group_id="g", topics=wanted)
            partitions = fetched.topics[0].partitions
        assert [(p.partition_index, p.committed_offset, p.metadata) for p in partitions] == [
            (0, 10, "x"),
            (1, -1, ""),
        ]

        if leave_v >= 3:
            left = await client.send(
                ApiKey.LEAVE_GROUP, leave_v, group_id="g", members=[{"member_id": member}]
            )
            assert [(m.member_id, m.error_code) for m in left.members] == [(member, E.none)]
        else:
            left = await client.send(ApiKey.LEAVE_GROUP, leave_v, group_id="g", member_id=member)
        assert left.error_code == E.none
        described = await client.send(ApiKey.DESCRIBE_GROUPS, 0, groups=("g",))
        assert described.groups[0].group_state == "Empty"

    with_client(tmp_path, scenario)


def test_leave_group_v0_reports_the_members_error_at_the_top(tmp_path: Path) -> None:
    async def scenario(client: Client, node: Node) -> None:
        left = await client.send(ApiKey.LEAVE_GROUP, 0, group_id="nope", member_id="m")
        assert left.error_code == E.unknown_member_id

    with_client(tmp_path, scenario)


def test_static_member_fields_travel_from_join_group_v5(tmp_path: Path) -> None:
    async def scenario(client: Client, node: Node) -> None:
        joined = await client.send(ApiKey.JOIN_GROUP, 5, **join_values(group_instance_id="host-1"))
        assert joined.error_code == E.none
        assert joined.members[0].group_instance_id == "host-1"
        beat = await client.send(
            ApiKey.HEARTBEAT,
            3,
            group_id="g",
            generation_id=1,
            member_id="someone-else",
            group_instance_id="host-1",
        )
        assert beat.error_code == E.fenced_instance_id

    with_client(tmp_path, scenario)


# -- offsets: group-level errors by version ----------------------------------------------------


def test_offset_fetch_errors_before_the_coordinator_is_loaded(tmp_path: Path) -> None:
    async def scenario(client: Client, node: Node) -> None:
        wanted = [{"name": "t", "partition_indexes": (0, 1)}]
        v1 = await client.send(ApiKey.OFFSET_FETCH, 1, group_id="g", topics=wanted)
        assert [p.error_code for p in v1.topics[0].partitions] == [E.not_coordinator] * 2
        v2 = await client.send(ApiKey.OFFSET_FETCH, 2, group_id="g", topics=wanted)
        assert (v2.error_code, v2.topics) == (E.not_coordinator, ())
        v8 = await client.send(
            ApiKey.OFFSET_FETCH, 8, groups=[{"group_id": "g", "topics": None}], require_stable=True
        )
        assert v8.groups[0].error_code == E.not_coordinator

    with_client(tmp_path, scenario, start=False)


def test_offset_fetch_v8_answers_several_groups(tmp_path: Path) -> None:
    async def scenario(client: Client, node: Node) -> None:
        for group in ("a", "b"):
            await client.send(
                ApiKey.OFFSET_COMMIT,
                8,
                group_id=group,
                member_id="",
                topics=[
                    {
                        "name": "t",
                        "partitions": [
                            {
                                "partition_index": 1,
                                "committed_offset": 3,
                                "committed_leader_epoch": 4,
                                "committed_metadata": group,
                            }
                        ],
                    }
                ],
            )
        fetched = await client.send(
            ApiKey.OFFSET_FETCH,
            8,
            groups=[{"group_id": "a", "topics": None}, {"group_id": "b", "topics": None}],
            require_stable=True,
        )
        assert [
            (
                g.group_id,
                [
                    (p.partition_index, p.committed_offset, p.committed_leader_epoch, p.metadata)
                    for t in g.topics
                    for p in t.partitions
                ],
            )
            for g in fetched.groups
        ] == [("a", [(1, 3, 4, "a")]), ("b", [(1, 3, 4, "b")])]

    with_client(tmp_path, scenario)


def test_offset_delete_and_delete_groups(tmp_path: Path) -> None:
    async def scenario(client: Client, node: Node) -> None:
        await client.send(
            ApiKey.OFFSET_COMMIT,
            2,
            group_id="g",
            member_id="",
            generation_id_or_member_epoch=-1,
            topics=[
                {
                    "name": "t",
                    "partitions": [
                        {"partition_index": 0, "committed_offset": 3, "committed_metadata": ""}
                    ],
                }
            ],
        )
        deleted = await client.send(
            ApiKey.OFFSET_DELETE,
            0,
            group_id="g",
            topics=[{"name": "t", "partitions": [0]}, {"name": "x", "partitions": [0]}],
        )
        assert deleted.error_code == E.none
        assert [
            (t.name, [(p.partition_index, p.error_code) for p in t.partitions])
            for t in deleted.topics
        ] == [
            ("t", [(0, E.none)]),
            ("x", [(0, E.unknown_topic_or_partition)]),
        ]
        missing = await client.send(ApiKey.OFFSET_DELETE, 0, group_id="nope", topics=[])
        assert missing.error_code == E.group_id_not_found
        for version in (0, 2):
            result = await client.send(ApiKey.DELETE_GROUPS, version, groups_names=("g", "nope"))
            assert [(r.group_id, r.error_code) for r in result.results] == [
                ("g", E.none if version == 0 else E.group_id_not_found),
                ("nope", E.group_id_not_found),
            ]

    with_client(tmp_path, scenario)


# -- DescribeGroups and ListGroups ----------------------------------------------------------------


def test_describe_and_list_groups_across_versions(tmp_path: Path) -> None:
    async def scenario(client: Client, node: Node) -> None:
        joined = await client.send(ApiKey.JOIN_GROUP, 3, **join_values())
        await client.send(
            ApiKey.SYNC_GROUP,
            2,
            group_id="g",
            generation_id=1,
            member_id=joined.member_id,
            assignments=[{"member_id": joined.member_id, "assignment": b"asg"}],
        )
        v0 = await client.send(ApiKey.DESCRIBE_GROUPS, 0, groups=("g", "nope"))
        stable, dead = v0.groups
        assert (stable.group_state, stable.protocol_type, stable.protocol_data) == (
            "Stable",
            "consumer",
            "range",
        )
        (m,) = stable.members
        assert (m.client_id, m.client_host, m.member_metadata, m.member_assignment) == (
            "app",
            "/127.0.0.1",
            b"sub",
            b"asg",
        )
        assert (dead.error_code, dead.group_state) == (E.none, "Dead")
        v5 = await client.send(
            ApiKey.DESCRIBE_GROUPS, 5, groups=("g",), include_authorized_operations=True
        )
        # READ, DELETE, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS: Kafka 4's group operations.
        assert v5.groups[0].authorized_operations == 3400
        v6 = await client.send(
            ApiKey.DESCRIBE_GROUPS, 6, groups=("nope",), include_authorized_operations=True
        )
        (unknown,) = v6.groups
        assert (unknown.error_code, unknown.error_message, unknown.group_state) == (
            E.group_id_not_found,
            "Group nope not found.",
            "Dead",
        )

        listed = await client.send(ApiKey.LIST_GROUPS, 0)
        assert [(g.group_id, g.protocol_type) for g in listed.groups] == [("g", "consumer")]
        empty = await client.send(ApiKey.LIST_GROUPS, 4, states_filter=("Empty",))
        assert empty.groups == ()
        v5_list = await client.send(
            ApiKey.LIST_GROUPS, 5, states_filter=("stable",), types_filter=("classic",)
        )
        assert [(g.group_id, g.group_state, g.group_type) for g in v5_list.groups] == [
            ("g", "Stable", "classic")
        ]

    with_client(tmp_path, scenario)


# -- error responders ----------------------------------------------------------------------------

GROUP_APIS = [
    ApiKey.FIND_COORDINATOR,
    ApiKey.JOIN_GROUP,
    ApiKey.SYNC_GROUP,
    ApiKey.HEARTBEAT,
    ApiKey.LEAVE_GROUP,
    ApiKey.OFFSET_COMMIT,
    ApiKey.OFFSET_FETCH,
    ApiKey.OFFSET_DELETE,
    ApiKey.DESCRIBE_GROUPS,
    ApiKey.LIST_GROUPS,
    ApiKey.DELETE_GROUPS,
]


@pytest.mark.parametrize(
    ("key", "version"), [(k, v) for k in GROUP_APIS for v in SUPPORTED[k]], ids=str
)
def test_every_version_has_an_encodable_error_response(key: ApiKey, version: int) -> None:
    handlers: dict[int, Handler] = {}
    service = GroupService(
        GroupConfig(), LogGroupLog(lambda partition: None, lambda: 0), now_ms=lambda: 0
    )
    responders = groups.register(handlers, service, Node())
    request = sample(request_type(key, version))
    body = responders[key](request, E.unknown_server_error)
    frame = encode_response(RequestHeader(key, version, 1, "app"), body)
    _, decoded = decode_response(key, version, frame[4:])
    assert decoded == body
    assert set(handlers) == set(GROUP_APIS)


# -- real clients' bytes ------------------------------------------------------------------------


@pytest.mark.parametrize("client_name", CLIENTS)
def test_captured_client_requests_find_this_coordinator_and_join(
    tmp_path: Path, client_name: str
) -> None:
    captures = sorted((GOLDEN_DIR / client_name).glob("*.bin"))
    find = next(p for p in captures if "-FindCoordinator-" in p.name).read_bytes()
    join = next(p for p in captures if "-JoinGroup-" in p.name).read_bytes()

    async def scenario(client: Client, node: Node) -> None:
        async def dispatch(frame: bytes) -> Any:
            request = decode_request(frame)
            answer = await client.dispatcher.dispatch(frame, "PLAINTEXT", "127.0.0.1:50000")
            assert isinstance(answer, bytes)
            header = request.header
            return request, decode_response(header.api_key, header.api_version, answer[4:])[1]

        _, found = await dispatch(find)
        errors = (
            [c.error_code for c in found.coordinators]
            if hasattr(found, "coordinators")
            else [found.error_code]
        )
        assert errors == [E.none] * len(errors)

        request, joined = await dispatch(join)
        assert joined.error_code == E.member_id_required
        again = dataclasses.replace(request.body, member_id=joined.member_id)
        frame = encode_request(request.header, again)[4:]
        _, joined = await dispatch(frame)
        assert joined.error_code == E.none
        (protocol,) = [p for p in request.body.protocols if p.name == joined.protocol_name]
        assert [m.metadata for m in joined.members] == [protocol.metadata]
        # The client's real subscription parses: the group knows which topics it consumes.
        assert subscribed_topics(protocol.metadata)

    with_client(tmp_path, scenario)
