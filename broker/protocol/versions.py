"""The API versions Gregor speaks: the one place that says so.

`SUPPORTED` is what the broker can serve once a handler exists for the API; what it advertises
in ApiVersions is this table restricted to the APIs with a handler (`advertised`), so clients
never see a promise the broker cannot keep. `gregor api-versions` prints that advertisement.

Why these ranges (ADR 0001 has the rest of the story):
- the maxima are Kafka 4.3's for every API a handler serves, each honoured, not just decoded:
  Produce v13 and Fetch v13+ take topic ids (KIP-516) and answer an unknown id
  UNKNOWN_TOPIC_ID; Produce v10+ and Fetch v16+ name a moved partition's leader (KIP-951);
  ListOffsets v8–v11 answer -4/-5/-6 as Kafka without tiered storage; Metadata v13 has its
  top-level error; OffsetCommit/OffsetFetch v9 keep classic-group semantics and v10 take topic
  ids; DescribeGroups v6 says GROUP_ID_NOT_FOUND (KIP-1043); FindCoordinator v6 refuses share
  keys as Kafka does without share groups; DescribeCluster v2 lists fenced brokers on request;
  DescribeLogDirs v5 reports no cordoned dir. Clients infer a broker's release from these
  maxima (kafka-python reads DescribeLogDirs v5 as 4.3) and then use them;
- InitProducerId stops at v5: v6 (KIP-939, two-phase commit) is unstable in Kafka 4.3, which
  does not advertise it either;
- OffsetForLeaderEpoch keeps its range: no handler serves it yet, so it is not advertised;
- the floors match Kafka 4's (KIP-896) so Java 4 clients negotiate normally, except where an
  older client in the field still needs a lower version: librdkafka before 2.11.1 checks for
  exact versions such as Produce v2, JoinGroup v0 and ListOffsets v1;
- Produce is advertised from v0 for that reason but v0–v2 (message format v0/v1) are refused by
  closing the connection, as Kafka 4 does (KAFKA-18659).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = [
    "REFUSED",
    "SUPPORTED",
    "ApiKey",
    "VersionRange",
    "advertised",
    "is_decodable",
    "is_supported",
]


class ApiKey(enum.IntEnum):
    """Kafka's API keys, named as in Kafka's `ApiKeys` enum."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    VOTE = 52
    BEGIN_QUORUM_EPOCH = 53
    END_QUORUM_EPOCH = 54
    DESCRIBE_QUORUM = 55
    ALTER_PARTITION = 56
    ENVELOPE = 58
    FETCH_SNAPSHOT = 59
    DESCRIBE_CLUSTER = 60
    BROKER_REGISTRATION = 62
    BROKER_HEARTBEAT = 63
    UNREGISTER_BROKER = 64
    ALLOCATE_PRODUCER_IDS = 67
    LIST_CONFIG_RESOURCES = 74
    DESCRIBE_TOPIC_PARTITIONS = 75


@dataclass(frozen=True, slots=True)
class VersionRange:
    min: int
    max: int

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.min <= version <= self.max

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.min, self.max + 1))


def _table(entries: Mapping[ApiKey, tuple[int, int]]) -> Mapping[ApiKey, VersionRange]:
    return MappingProxyType({key: VersionRange(lo, hi) for key, (lo, hi) in entries.items()})


SUPPORTED: Mapping[ApiKey, VersionRange] = _table(
    {
        ApiKey.PRODUCE: (0, 13),
        ApiKey.FETCH: (4, 18),
        ApiKey.LIST_OFFSETS: (1, 11),
        ApiKey.METADATA: (0, 13),
        ApiKey.OFFSET_COMMIT: (2, 10),
        ApiKey.OFFSET_FETCH: (1, 10),
        ApiKey.FIND_COORDINATOR: (0, 6),
        ApiKey.JOIN_GROUP: (0, 9),
        ApiKey.HEARTBEAT: (0, 4),
        ApiKey.LEAVE_GROUP: (0, 5),
        ApiKey.SYNC_GROUP: (0, 5),
        ApiKey.DESCRIBE_GROUPS: (0, 6),
        ApiKey.LIST_GROUPS: (0, 5),
        ApiKey.SASL_HANDSHAKE: (0, 1),
        ApiKey.API_VERSIONS: (0, 4),
        ApiKey.CREATE_TOPICS: (2, 7),
        ApiKey.DELETE_TOPICS: (1, 6),
        ApiKey.DELETE_RECORDS: (0, 2),
        ApiKey.INIT_PRODUCER_ID: (0, 5),
        ApiKey.OFFSET_FOR_LEADER_EPOCH: (2, 4),
        ApiKey.DESCRIBE_CONFIGS: (1, 4),
        ApiKey.ALTER_CONFIGS: (0, 2),
        ApiKey.DESCRIBE_LOG_DIRS: (1, 5),
        ApiKey.SASL_AUTHENTICATE: (0, 2),
        ApiKey.CREATE_PARTITIONS: (0, 3),
        ApiKey.DELETE_GROUPS: (0, 2),
        ApiKey.ELECT_LEADERS: (0, 2),
        ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1),
        ApiKey.ALTER_PARTITION_REASSIGNMENTS: (0, 1),
        ApiKey.LIST_PARTITION_REASSIGNMENTS: (0, 0),
        ApiKey.OFFSET_DELETE: (0, 0),
        ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
        ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
        ApiKey.DESCRIBE_CLUSTER: (0, 2),
        ApiKey.UNREGISTER_BROKER: (0, 0),
        ApiKey.LIST_CONFIG_RESOURCES: (0, 1),
        ApiKey.DESCRIBE_TOPIC_PARTITIONS: (0, 0),
        # The metadata quorum's and the brokers' own, served on the controller listener only;
        # DescribeQuorum on the client listeners too, forwarded as Kafka 4's brokers do.
        ApiKey.VOTE: (0, 2),
        ApiKey.BEGIN_QUORUM_EPOCH: (0, 1),
        ApiKey.END_QUORUM_EPOCH: (0, 1),
        ApiKey.DESCRIBE_QUORUM: (0, 2),
        ApiKey.FETCH_SNAPSHOT: (0, 1),
        ApiKey.BROKER_REGISTRATION: (0, 4),
        ApiKey.BROKER_HEARTBEAT: (0, 1),
        ApiKey.ALLOCATE_PRODUCER_IDS: (0, 0),
        ApiKey.ALTER_PARTITION: (2, 3),
        ApiKey.ENVELOPE: (0, 0),
    }
)
"""The APIs and versions a node will serve, each on the listeners that have its handler."""

REFUSED: Mapping[ApiKey, VersionRange] = _table({ApiKey.PRODUCE: (0, 2)})
"""Advertised for old clients' exact-version checks, but answered by closing the connection."""


def is_supported(api_key: int, api_version: int) -> bool:
    """Whether the version is in the table (advertised once a handler exists)."""
    versions = SUPPORTED.get(api_key)  # type: ignore[call-overload]
    return versions is not None and api_version in versions


def is_decodable(api_key: int, api_version: int) -> bool:
    """Whether requests at this version are decoded and served rather than refused."""
    refused = REFUSED.get(api_key)  # type: ignore[call-overload]
    return is_supported(api_key, api_version) and not (refused and api_version in refused)


def advertised(handled: Iterable[int]) -> dict[ApiKey, VersionRange]:
    """The ApiVersions entries for a broker whose handlers serve `handled` API keys."""
    keys = set(handled)
    return {key: versions for key, versions in SUPPORTED.items() if key in keys}
