"""The node's configuration: a `server.properties` file with Kafka's own names and defaults.

`BrokerConfig.load(path, overrides)` parses the Java properties syntax, applies
`--override key=value` on top, and validates: an invalid value raises `InvalidConfig` naming
the key, so the node stops at start with a message an operator can act on. Names Gregor does not
use yet are kept in `extra` (Kafka's tools pass many) rather than refused, except security
settings: a node that ignored them would be believed to encrypt, authenticate or authorize.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from broker.storage.config import InvalidConfig, LogConfig

__all__ = [
    "SECURITY_PROTOCOL_IDS",
    "BrokerConfig",
    "InvalidConfig",
    "Listener",
    "kafka_text",
    "parse_properties",
]

SECURITY_PROTOCOL_IDS = {"PLAINTEXT": 0, "SSL": 1, "SASL_PLAINTEXT": 2, "SASL_SSL": 3}
"""The security protocols `listener.security.protocol.map` may name, with Kafka's
`SecurityProtocol` ids. Gregor serves only PLAINTEXT so far: a listener the node uses on
another stops it at start (`BrokerConfig._validate_security`)."""

_PLAINTEXT_ONLY = "Gregor serves only PLAINTEXT listeners so far (no TLS or SASL)"
_IGNORED_BY_PLAINTEXT = f"{_PLAINTEXT_ONLY} and would ignore it"
_NO_AUTHORIZER = "Gregor has no authorizer yet and would ignore it: every client may do everything"


class _Unserved(NamedTuple):
    """A security setting Gregor cannot honour yet."""

    accepted: frozenset[str]
    """The values (in lower case) that ask for nothing; any other stops the node."""
    reason: str
    secret: bool = False
    """A PASSWORD setting: its value is not repeated in the message, as Kafka hides it."""


_UNSET = frozenset({""})
_UNSERVED_SECURITY: dict[str, _Unserved] = {
    "security.inter.broker.protocol": _Unserved(frozenset({"", "plaintext"}), _PLAINTEXT_ONLY),
    "sasl.enabled.mechanisms": _Unserved(_UNSET, _IGNORED_BY_PLAINTEXT),
    "sasl.jaas.config": _Unserved(_UNSET, _IGNORED_BY_PLAINTEXT, secret=True),
    "ssl.keystore.location": _Unserved(_UNSET, _IGNORED_BY_PLAINTEXT),
    "ssl.keystore.key": _Unserved(_UNSET, _IGNORED_BY_PLAINTEXT, secret=True),
    "ssl.truststore.location": _Unserved(_UNSET, _IGNORED_BY_PLAINTEXT),
    "ssl.client.auth": _Unserved(frozenset({"", "none"}), _IGNORED_BY_PLAINTEXT),
    "authorizer.class.name": _Unserved(_UNSET, _NO_AUTHORIZER),
    "super.users": _Unserved(_UNSET, _NO_AUTHORIZER),
}
"""The security settings refused, under a listener prefix too
(`listener.name.external.ssl.keystore.location`). Kafka's default `sasl.enabled.mechanisms`
is GSSAPI, which only SASL listeners read: written out, it asks for SASL all the same."""

_LISTENER = re.compile(r"^(?P<name>[A-Za-z0-9_]+)://(?P<host>\[[^\]]*\]|[^:]*):(?P<port>\d+)$")
_HTTP_LISTENER = re.compile(
    r"^http://(?P<host>\[[^\]]*\]|[^:/\[\]]*):(?P<port>\d+)/?$", re.IGNORECASE
)


@dataclass(frozen=True, slots=True)
class Listener:
    """One `listeners` entry: `NAME://host:port` (an empty host binds every interface)."""

    name: str
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.name}://{self.host}:{self.port}"


def parse_properties(text: str) -> dict[str, str]:
    """Java `.properties`: `key=value` or `key: value`, `#`/`!` comments, `\\` continuations."""
    result: dict[str, str] = {}
    logical = ""
    for raw in text.splitlines():
        line = raw.strip() if not logical else raw.lstrip()
        if not logical and (not line or line.startswith(("#", "!"))):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            logical += line[:-1]
            continue
        logical += line
        match = re.match(r"^((?:\\.|[^=:\s])+)\s*[=:\s]\s*(.*)$", logical)
        if match:
            result[match.group(1).replace("\\", "")] = match.group(2)
        elif logical:
            result[logical] = ""
        logical = ""
    return result


def _int(minimum: int | None = None) -> Callable[[str, str], int]:
    def parse(key: str, raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise InvalidConfig(key, raw, "not an integer") from None
        if minimum is not None and value < minimum:
            raise InvalidConfig(key, raw, f"must be at least {minimum}")
        return value

    return parse


def _bool(key: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise InvalidConfig(key, raw, "must be true or false")
    return value == "true"


def _list(key: str, raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def _roles(key: str, raw: str) -> frozenset[str]:
    roles = frozenset(_list(key, raw))
    if not roles or not roles <= {"broker", "controller"}:
        raise InvalidConfig(key, raw, "must be broker, controller, or broker,controller")
    return roles


def _listeners(key: str, raw: str) -> tuple[Listener, ...]:
    listeners = []
    for entry in _list(key, raw):
        match = _LISTENER.match(entry)
        if match is None:
            raise InvalidConfig(key, raw, f"{entry!r} is not NAME://host:port")
        port = int(match["port"])
        if port > 65535:
            raise InvalidConfig(key, raw, f"port {port} is out of range")
        listeners.append(Listener(match["name"].upper(), match["host"].strip("[]"), port))
    names = [listener.name for listener in listeners]
    if len(set(names)) != len(names):
        raise InvalidConfig(key, raw, "each listener name may appear only once")
    return tuple(listeners)


def _http_listener(key: str, raw: str) -> tuple[str, int] | None:
    value = raw.strip()
    if not value:
        return None
    match = _HTTP_LISTENER.match(value)
    if match is None:
        raise InvalidConfig(key, raw, "must be http://host:port, or empty for no endpoint")
    port = int(match["port"])
    if port > 65535:
        raise InvalidConfig(key, raw, f"port {port} is out of range")
    return match["host"].strip("[]"), port


def _protocol_map(key: str, raw: str) -> dict[str, str]:
    mapping = {}
    for entry in _list(key, raw):
        name, _, protocol = entry.partition(":")
        protocol = protocol.strip().upper()
        if protocol not in SECURITY_PROTOCOL_IDS:
            raise InvalidConfig(key, raw, f"unknown security protocol {protocol!r}")
        mapping[name.strip().upper()] = protocol
    return mapping


def _security_setting(key: str) -> str | None:
    """Which of `_UNSERVED_SECURITY` `key` sets, directly or under a listener prefix
    (`listener.name.external.plain.sasl.jaas.config` sets `sasl.jaas.config`)."""
    if key in _UNSERVED_SECURITY:
        return key
    if key.startswith("listener.name."):
        return next((name for name in _UNSERVED_SECURITY if key.endswith(f".{name}")), None)
    return None


def _voters(key: str, raw: str) -> dict[int, tuple[str, int]]:
    voters = {}
    for entry in _list(key, raw):
        match = re.match(r"^(\d+)@(\[[^\]]*\]|[^:]+):(\d+)$", entry)
        if match is None:
            raise InvalidConfig(key, raw, f"{entry!r} is not id@host:port")
        voters[int(match[1])] = (match[2].strip("[]"), int(match[3]))
    return voters


def _default_protocol_map() -> dict[str, str]:
    return {p: p for p in SECURITY_PROTOCOL_IDS} | {"CONTROLLER": "PLAINTEXT"}


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerConfig:
    """A node's settings. Defaults are Kafka's unless a docstring says why not."""

    process_roles: frozenset[str] = frozenset({"broker", "controller"})
    """`process.roles`: Kafka requires it; Gregor defaults to combined mode for `make run`."""
    node_id: int = 1
    """`node.id`: unique across brokers and controllers of the cluster."""
    controller_quorum_voters: dict[int, tuple[str, int]] = field(default_factory=dict)
    """`controller.quorum.voters`: `id@host:port,…`."""
    listeners: tuple[Listener, ...] = (Listener("PLAINTEXT", "", 9092),)
    """`listeners`: where the node accepts connections."""
    advertised_listeners: tuple[Listener, ...] = ()
    """`advertised.listeners`: what clients are told; defaults to `listeners`."""
    listener_security_protocol_map: dict[str, str] = field(default_factory=_default_protocol_map)
    inter_broker_listener_name: str = "PLAINTEXT"
    controller_listener_names: tuple[str, ...] = ()
    log_dirs: tuple[Path, ...] = (Path("/tmp/kafka-logs"),)
    """`log.dirs` (or `log.dir`)."""
    broker_rack: str | None = None
    replica_selector_class: str | None = None
    """`replica.selector.class` (KIP-392): None, or Kafka's RackAwareReplicaSelector, which
    points a consumer that names its rack (`client.rack`) at a replica in that rack."""
    num_partitions: int = 1
    default_replication_factor: int = 1
    min_insync_replicas: int = 1
    auto_create_topics_enable: bool = True
    offsets_topic_replication_factor: int = 3
    offsets_topic_num_partitions: int = 50
    socket_request_max_bytes: int = 104_857_600
    max_connections: int = 2_147_483_647
    """`max.connections`: connections the node holds at once; one more is closed when accepted."""
    max_connections_per_ip: int = 2_147_483_647
    """`max.connections.per.ip`: connections one address may hold; one more is closed."""
    max_connections_per_ip_overrides: dict[str, int] = field(default_factory=dict)
    """`max.connections.per.ip.overrides`: `address:count,…`, per-address exceptions."""
    queued_max_request_bytes: int = -1
    """`queued.max.request.bytes`: bytes of received requests not yet processed, across all
    connections, before reading pauses (-1, Kafka's default: no bound; the operator sets one)."""
    connections_max_idle_ms: int = 600_000
    group_initial_rebalance_delay_ms: int = 3_000
    """`group.initial.rebalance.delay.ms`: how long a new group waits for more members before
    its first rebalance completes (`make run` and the tests set 0)."""
    group_min_session_timeout_ms: int = 6_000
    group_max_session_timeout_ms: int = 1_800_000
    group_max_size: int = 2_147_483_647
    offsets_retention_minutes: int = 10_080
    """`offsets.retention.minutes`: committed offsets of an empty group expire after this."""
    offsets_retention_check_interval_ms: int = 600_000
    offset_metadata_max_bytes: int = 4_096
    producer_id_expiration_ms: int = 86_400_000
    """`producer.id.expiration.ms`: an idle producer's state is dropped after this."""
    log_retention_check_interval_ms: int = 300_000
    """`log.retention.check.interval.ms`: how often segments past `retention.ms` or
    `retention.bytes` are deleted (Kafka's 5 minutes: records with an old CreateTime are not
    deleted the second after they were acknowledged)."""
    log_cleaner_enable: bool = True
    """`log.cleaner.enable`: compact the logs of compacted topics (off: they only grow)."""
    log_cleaner_backoff_ms: int = 15_000
    """`log.cleaner.backoff.ms`: the pause between compaction rounds."""
    log_cleaner_dedupe_buffer_size: int = 134_217_728
    """`log.cleaner.dedupe.buffer.size`: the memory one round's offset map may take (128 MiB,
    about a million keys); a log with more distinct keys in its dirty range is cleaned over
    several rounds."""
    offsets_commit_timeout_ms: int = 5000
    """`offsets.commit.timeout.ms`: a group coordinator's write waits this long for the ISR
    of its `__consumer_offsets` partition."""
    max_incremental_fetch_session_cache_slots: int = 1000
    """`max.incremental.fetch.session.cache.slots`: fetch sessions (KIP-227) this node keeps;
    0 answers every fetch without one."""
    replica_fetch_wait_max_ms: int = 500
    """`replica.fetch.wait.max.ms`: how long a follower's fetch waits at the leader for data."""
    replica_fetch_min_bytes: int = 1
    replica_fetch_max_bytes: int = 1_048_576
    """`replica.fetch.max.bytes`: a follower's fetch asks this much of each partition."""
    replica_fetch_response_max_bytes: int = 10_485_760
    replica_fetch_backoff_ms: int = 1000
    """`replica.fetch.backoff.ms`: a follower waits this long after a failed fetch."""
    replica_lag_time_max_ms: int = 30_000
    """`replica.lag.time.max.ms`: a follower that has not caught up with its leader's log end
    for this long leaves the ISR."""
    auto_leader_rebalance_enable: bool = True
    """`auto.leader.rebalance.enable`: the active controller moves each partition's leadership
    back to its preferred replica once that is in the ISR again..."""
    leader_imbalance_check_interval_seconds: int = 300
    """...checking every `leader.imbalance.check.interval.seconds`."""
    unclean_leader_election_enable: bool = False
    """`unclean.leader.election.enable`: a partition with no live in-sync replica may be led
    by another live replica, losing what only the lost ones had (a topic may override it)..."""
    unclean_leader_election_interval_ms: int = 300_000
    """...which the active controller also checks every `unclean.leader.election.interval.ms`."""
    broker_heartbeat_interval_ms: int = 2000
    """`broker.heartbeat.interval.ms`: how often a broker tells the active controller it is
    alive."""
    broker_session_timeout_ms: int = 9000
    """`broker.session.timeout.ms`: a broker not heard from this long is fenced."""
    controller_quorum_election_timeout_ms: int = 1000
    """`controller.quorum.election.timeout.ms`: without a leader this long (plus up to as much
    again at random), a voter campaigns."""
    controller_quorum_fetch_timeout_ms: int = 2000
    """`controller.quorum.fetch.timeout.ms`: a follower whose leader is silent this long
    campaigns."""
    controller_quorum_election_backoff_max_ms: int = 1000
    controller_quorum_request_timeout_ms: int = 2000
    controller_quorum_retry_backoff_ms: int = 20
    """`controller.quorum.retry.backoff.ms`: after a quorum request fails without an answer
    (the peer refused the connection, or it broke), how long before the next one."""
    metadata_log_max_record_bytes_between_snapshots: int = 20_971_520
    """`metadata.log.max.record.bytes.between.snapshots`: records applied since the last
    snapshot before the next is written (and the log below it deleted)."""
    metadata_log_segment_bytes: int = 1_073_741_824
    metadata_log_dir: Path | None = None
    """`metadata.log.dir`: where `__cluster_metadata-0` lives (default: the first log dir)."""
    metrics_listener: tuple[str, int] | None = None
    """`gregor.metrics.listener` (Gregor's own name, so it cannot clash with Kafka's): host and
    port of the Prometheus endpoint, written `http://0.0.0.0:9404` (the port Strimzi reserves
    for metrics; an empty host binds every interface). Off by default: Kafka opens no such
    port, so a ported `server.properties` must not expose topic names on an unauthenticated
    socket, and several nodes on one host would clash on a fixed port; the operator turns it
    on, as Strimzi's `metricsConfig` does."""
    log: LogConfig = field(default_factory=LogConfig)
    """Topic defaults from the broker-level `log.*` names."""
    extra: dict[str, str] = field(default_factory=dict)
    """Names Gregor accepts but does not act on yet."""
    properties: dict[str, str] = field(default_factory=dict)
    """Every name as written (file and overrides): what DescribeConfigs reports as static."""

    @property
    def advertised(self) -> tuple[Listener, ...]:
        return self.advertised_listeners or self.listeners

    @property
    def metadata_dir(self) -> Path:
        """Where the metadata log lives: `metadata.log.dir`, else the first of `log.dirs`."""
        return self.metadata_log_dir or self.log_dirs[0]

    @property
    def storage_dirs(self) -> tuple[Path, ...]:
        """Every dir with a `meta.properties`: the metadata log dir first, then the log dirs
        (what `gregor format` formats, as `kafka-storage format` does)."""
        return (self.metadata_dir, *(d for d in self.log_dirs if d != self.metadata_dir))

    @property
    def is_voter(self) -> bool:
        """Whether this node is one of the static voters of the metadata quorum."""
        return "controller" in self.process_roles and self.node_id in self.controller_quorum_voters

    def kafka_values(self) -> dict[str, str | None]:
        """The value the node runs with for each Kafka name it reads, written as Kafka writes
        it, set or not: what DescribeConfigs reports where `server.properties` is silent (a
        default may differ from Kafka's: `process.roles`, `node.id`, `log.dirs`, ...). The
        `log.*` topic defaults are Kafka's and resolve through their own chain."""
        values: dict[str, str | None] = {}
        for key, (attribute, _) in _BROKER.items():
            if key in _NOT_KAFKA:
                continue
            values[key] = kafka_text(getattr(self, attribute))
        values["controller.quorum.voters"] = ",".join(
            f"{node}@{host}:{port}" for node, (host, port) in self.controller_quorum_voters.items()
        )
        values["listener.security.protocol.map"] = ",".join(
            f"{name}:{protocol}" for name, protocol in self.listener_security_protocol_map.items()
        )
        values["max.connections.per.ip.overrides"] = ",".join(
            f"{host}:{count}" for host, count in self.max_connections_per_ip_overrides.items()
        )
        values["process.roles"] = ",".join(sorted(self.process_roles))
        values["advertised.listeners"] = ",".join(map(str, self.advertised))
        return values

    @classmethod
    def load(cls, path: Path | None, overrides: Mapping[str, str] | None = None) -> BrokerConfig:
        properties = parse_properties(path.read_text()) if path is not None else {}
        properties.update(overrides or {})
        return cls.from_properties(properties)

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> BrokerConfig:
        values: dict[str, Any] = {}
        extra: dict[str, str] = {}
        log_properties: dict[str, str] = {}
        source_keys: dict[str, str] = {}
        # Kafka's precedence: log.retention.ms over .minutes over .hours (same for log.roll).
        for key, raw in sorted(properties.items(), key=_precedence):
            if key in _BROKER:
                attribute, parse = _BROKER[key]
                values[attribute] = parse(key, raw)
            elif key in _LOG_DEFAULTS:
                log_properties[_LOG_DEFAULTS[key]] = _scaled(key, raw)
                source_keys[_LOG_DEFAULTS[key]] = key
            else:
                extra[key] = raw
        if "log.dirs" not in properties and "log.dir" in properties:
            values["log_dirs"] = (Path(properties["log.dir"]),)
        try:
            values["log"] = LogConfig.from_properties(log_properties)
        except InvalidConfig as exc:
            # Name the key the operator wrote (log.cleanup.policy), not the topic-level name.
            written = source_keys.get(exc.key, exc.key)
            raise InvalidConfig(written, properties.get(written), exc.reason) from None
        config = cls(**values, extra=extra, properties=dict(properties))
        config._validate()
        return config

    def _validate(self) -> None:
        self._validate_security()
        names = {listener.name for listener in self.listeners}
        for listener in self.listeners:
            if listener.name not in self.listener_security_protocol_map:
                raise InvalidConfig(
                    "listener.security.protocol.map",
                    ",".join(f"{k}:{v}" for k, v in self.listener_security_protocol_map.items()),
                    f"no security protocol for listener {listener.name}",
                )
        for listener in self.advertised_listeners:
            if listener.name not in names:
                raise InvalidConfig(
                    "advertised.listeners",
                    ",".join(map(str, self.advertised_listeners)),
                    f"{listener.name} is not in listeners",
                )
        voters = ",".join(
            f"{node}@{host}:{port}" for node, (host, port) in self.controller_quorum_voters.items()
        )
        if "controller" in self.process_roles:
            if not self.controller_quorum_voters:
                # Combined mode on one node: the node is the only voter.
                pass
            elif self.node_id not in self.controller_quorum_voters:
                raise InvalidConfig(
                    "controller.quorum.voters",
                    voters,
                    f"node.id {self.node_id} has the controller role but is not a voter",
                )
            elif len(self.controller_quorum_voters) > 1 and not (
                set(self.controller_listener_names) & names
            ):
                raise InvalidConfig(
                    "controller.listener.names",
                    ",".join(self.controller_listener_names),
                    "a voter of a quorum needs one of listeners to be its controller listener",
                )
        elif not self.controller_quorum_voters:
            raise InvalidConfig(
                "controller.quorum.voters",
                "",
                "a node without the controller role must be told where the controllers are",
            )
        self._validate_role_listeners(names, voters)
        if not self.log_dirs:
            raise InvalidConfig("log.dirs", "", "at least one directory is required")
        if self.default_replication_factor < 1:
            raise InvalidConfig(
                "default.replication.factor", self.default_replication_factor, "must be >= 1"
            )

    def _validate_security(self) -> None:
        """Until Gregor serves TLS, SASL and ACLs, a listener the node uses (to accept, or to
        reach the controllers on) mapped to another protocol than PLAINTEXT, or a security
        setting asking for one, stops it: served in plaintext, a port its user believes
        encrypted and authenticated would not be. Map entries no listener uses stay accepted:
        Kafka's default map has SSL, SASL_PLAINTEXT and SASL_SSL."""
        protocols = self.listener_security_protocol_map
        used = [listener.name for listener in self.listeners] + list(self.controller_listener_names)
        for name in dict.fromkeys(used):
            protocol = protocols.get(name, "PLAINTEXT")
            if protocol != "PLAINTEXT":
                raise InvalidConfig(
                    "listener.security.protocol.map",
                    ",".join(f"{k}:{v}" for k, v in protocols.items()),
                    f"listener {name} uses {protocol}, but {_PLAINTEXT_ONLY}",
                )
        for key, raw in sorted(self.properties.items()):
            setting = _security_setting(key)
            if setting is None:
                continue
            unserved = _UNSERVED_SECURITY[setting]
            if raw.strip().lower() not in unserved.accepted:
                raise InvalidConfig(key, "[hidden]" if unserved.secret else raw, unserved.reason)

    def _validate_role_listeners(self, names: set[str], voters: str) -> None:
        """Kafka's rules for a node with one role: a dedicated controller listens only on
        controller listeners and needs voters (brokers find it there); a broker-only node
        listens on none (its controllers do), and is told which one it talks to them with."""
        controller_names = set(self.controller_listener_names)
        listeners = ",".join(map(str, self.listeners))
        if self.process_roles == {"controller"}:
            if not self.controller_quorum_voters:
                raise InvalidConfig(
                    "controller.quorum.voters",
                    voters,
                    "a dedicated controller (process.roles=controller) needs the quorum's voters",
                )
            others = sorted(names - controller_names)
            if others or not names:
                raise InvalidConfig(
                    "listeners",
                    listeners,
                    "a dedicated controller (process.roles=controller) listens only on its "
                    f"controller listeners ({','.join(self.controller_listener_names) or 'none'}"
                    f" in controller.listener.names); not on {','.join(others) or 'nothing'}",
                )
        elif self.process_roles == {"broker"}:
            if not controller_names:
                raise InvalidConfig(
                    "controller.listener.names",
                    "",
                    "a broker-only node (process.roles=broker) must name the controllers' "
                    "listener it talks to them on",
                )
            clash = sorted(names & controller_names)
            if clash:
                raise InvalidConfig(
                    "listeners",
                    listeners,
                    f"{','.join(clash)} is a controller listener (controller.listener.names), "
                    "which a broker-only node (process.roles=broker) must not listen on",
                )
        if "broker" in self.process_roles and self.inter_broker_listener_name not in names:
            raise InvalidConfig(
                "inter.broker.listener.name",
                self.inter_broker_listener_name,
                f"not one of listeners ({listeners}); other brokers fetch replicas there",
            )


def kafka_text(value: object) -> str | None:
    """A property's value as Kafka's properties text writes it: `true`, not `True`; lists
    comma-separated; None stays None."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def _ip_overrides(key: str, raw: str) -> dict[str, int]:
    overrides: dict[str, int] = {}
    for entry in _list(key, raw):
        host, _, count = entry.rpartition(":")
        if not host or not count.strip().isdigit():
            raise InvalidConfig(key, raw, f"{entry!r} is not host:count")
        overrides[host.strip().strip("[]")] = int(count)
    return overrides


def _queued_bytes(key: str, raw: str) -> int:
    value = _int()(key, raw)
    if value == 0 or value < -1:
        raise InvalidConfig(key, raw, "must be -1 (no bound) or a positive number of bytes")
    return value


def _paths(key: str, raw: str) -> tuple[Path, ...]:
    return tuple(Path(p) for p in _list(key, raw))


def _rack(key: str, raw: str) -> str | None:
    return raw.strip() or None


RACK_AWARE_SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"
LEADER_SELECTOR = "org.apache.kafka.common.replica.LeaderSelector"


def _selector(key: str, raw: str) -> str | None:
    """Kafka's two selectors by class name (the leader's is the same as none); a class of
    one's own cannot be loaded by a Python broker."""
    name = raw.strip()
    if name in ("", LEADER_SELECTOR):
        return None
    if name != RACK_AWARE_SELECTOR:
        raise InvalidConfig(key, name, f"only {RACK_AWARE_SELECTOR} or {LEADER_SELECTOR}")
    return name


_BROKER: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "process.roles": ("process_roles", _roles),
    "node.id": ("node_id", _int(0)),
    "broker.id": ("node_id", _int(0)),
    "controller.quorum.voters": ("controller_quorum_voters", _voters),
    "listeners": ("listeners", _listeners),
    "advertised.listeners": ("advertised_listeners", _listeners),
    "listener.security.protocol.map": ("listener_security_protocol_map", _protocol_map),
    "inter.broker.listener.name": ("inter_broker_listener_name", lambda k, v: v.strip().upper()),
    "controller.listener.names": (
        "controller_listener_names",
        lambda k, v: tuple(n.upper() for n in _list(k, v)),
    ),
    "log.dirs": ("log_dirs", _paths),
    "broker.rack": ("broker_rack", _rack),
    "replica.selector.class": ("replica_selector_class", _selector),
    "num.partitions": ("num_partitions", _int(1)),
    "default.replication.factor": ("default_replication_factor", _int(1)),
    "min.insync.replicas": ("min_insync_replicas", _int(1)),
    "auto.create.topics.enable": ("auto_create_topics_enable", _bool),
    "offsets.topic.replication.factor": ("offsets_topic_replication_factor", _int(1)),
    "offsets.topic.num.partitions": ("offsets_topic_num_partitions", _int(1)),
    "socket.request.max.bytes": ("socket_request_max_bytes", _int(1)),
    "max.connections": ("max_connections", _int(0)),
    "max.connections.per.ip": ("max_connections_per_ip", _int(0)),
    "max.connections.per.ip.overrides": ("max_connections_per_ip_overrides", _ip_overrides),
    "queued.max.request.bytes": ("queued_max_request_bytes", _queued_bytes),
    "connections.max.idle.ms": ("connections_max_idle_ms", _int(-1)),
    "group.initial.rebalance.delay.ms": ("group_initial_rebalance_delay_ms", _int(0)),
    "group.min.session.timeout.ms": ("group_min_session_timeout_ms", _int(0)),
    "group.max.session.timeout.ms": ("group_max_session_timeout_ms", _int(0)),
    "group.max.size": ("group_max_size", _int(1)),
    "offsets.retention.minutes": ("offsets_retention_minutes", _int(1)),
    "offsets.retention.check.interval.ms": ("offsets_retention_check_interval_ms", _int(1)),
    "offset.metadata.max.bytes": ("offset_metadata_max_bytes", _int(0)),
    "producer.id.expiration.ms": ("producer_id_expiration_ms", _int(1)),
    "log.retention.check.interval.ms": ("log_retention_check_interval_ms", _int(1)),
    "log.cleaner.enable": ("log_cleaner_enable", _bool),
    "log.cleaner.backoff.ms": ("log_cleaner_backoff_ms", _int(0)),
    "log.cleaner.dedupe.buffer.size": ("log_cleaner_dedupe_buffer_size", _int(1)),
    "offsets.commit.timeout.ms": ("offsets_commit_timeout_ms", _int(1)),
    "max.incremental.fetch.session.cache.slots": (
        "max_incremental_fetch_session_cache_slots",
        _int(0),
    ),
    "replica.fetch.wait.max.ms": ("replica_fetch_wait_max_ms", _int(0)),
    "replica.fetch.min.bytes": ("replica_fetch_min_bytes", _int(1)),
    "replica.fetch.max.bytes": ("replica_fetch_max_bytes", _int(1)),
    "replica.fetch.response.max.bytes": ("replica_fetch_response_max_bytes", _int(1)),
    "replica.fetch.backoff.ms": ("replica_fetch_backoff_ms", _int(0)),
    "replica.lag.time.max.ms": ("replica_lag_time_max_ms", _int(1)),
    "auto.leader.rebalance.enable": ("auto_leader_rebalance_enable", _bool),
    "leader.imbalance.check.interval.seconds": (
        "leader_imbalance_check_interval_seconds",
        _int(1),
    ),
    "unclean.leader.election.enable": ("unclean_leader_election_enable", _bool),
    "unclean.leader.election.interval.ms": ("unclean_leader_election_interval_ms", _int(1)),
    "broker.heartbeat.interval.ms": ("broker_heartbeat_interval_ms", _int(1)),
    "broker.session.timeout.ms": ("broker_session_timeout_ms", _int(1)),
    "controller.quorum.election.timeout.ms": ("controller_quorum_election_timeout_ms", _int(1)),
    "controller.quorum.fetch.timeout.ms": ("controller_quorum_fetch_timeout_ms", _int(1)),
    "controller.quorum.election.backoff.max.ms": (
        "controller_quorum_election_backoff_max_ms",
        _int(1),
    ),
    "controller.quorum.request.timeout.ms": ("controller_quorum_request_timeout_ms", _int(1)),
    "controller.quorum.retry.backoff.ms": ("controller_quorum_retry_backoff_ms", _int(0)),
    "metadata.log.max.record.bytes.between.snapshots": (
        "metadata_log_max_record_bytes_between_snapshots",
        _int(1),
    ),
    "metadata.log.segment.bytes": ("metadata_log_segment_bytes", _int(8 * 1024 * 1024)),
    "metadata.log.dir": ("metadata_log_dir", lambda k, v: Path(v.strip()) if v.strip() else None),
    "gregor.metrics.listener": ("metrics_listener", _http_listener),
}

_NOT_KAFKA = frozenset({"gregor.metrics.listener", "unclean.leader.election.interval.ms"})
"""Gregor's own names, and Kafka's internal ones (which its DescribeConfigs does not list):
listed only when `server.properties` sets them."""

# Broker-level names that set a topic default, and the topic name they set.
_LOG_DEFAULTS = {
    "log.segment.bytes": "segment.bytes",
    "log.roll.ms": "segment.ms",
    "log.roll.hours": "segment.ms",
    "log.index.size.max.bytes": "segment.index.bytes",
    "log.index.interval.bytes": "index.interval.bytes",
    "log.retention.ms": "retention.ms",
    "log.retention.minutes": "retention.ms",
    "log.retention.hours": "retention.ms",
    "log.retention.bytes": "retention.bytes",
    "log.flush.interval.messages": "flush.messages",
    "log.flush.interval.ms": "flush.ms",
    "log.cleanup.policy": "cleanup.policy",
    "log.cleaner.min.cleanable.ratio": "min.cleanable.dirty.ratio",
    "log.cleaner.min.compaction.lag.ms": "min.compaction.lag.ms",
    "log.cleaner.max.compaction.lag.ms": "max.compaction.lag.ms",
    "log.cleaner.delete.retention.ms": "delete.retention.ms",
    "log.segment.delete.delay.ms": "file.delete.delay.ms",
    "message.max.bytes": "max.message.bytes",
}
_UNITS_MS = {"hours": 3_600_000, "minutes": 60_000}


def _precedence(item: tuple[str, str]) -> int:
    unit = item[0].rsplit(".", 1)[-1]
    return {"hours": 0, "minutes": 1}.get(unit, 2)


def _scaled(key: str, raw: str) -> str:
    """`log.retention.hours=168` → `604800000` (ms); other names pass through."""
    unit = key.rsplit(".", 1)[-1]
    if unit not in _UNITS_MS:
        return raw
    try:
        return str(int(raw) * _UNITS_MS[unit])
    except ValueError:
        raise InvalidConfig(key, raw, "not an integer") from None
