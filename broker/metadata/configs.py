"""Topic and broker configs as Kafka's admin APIs show them: names, types, defaults, sources.

A topic setting resolves the way Kafka resolves it: the topic's own value (DYNAMIC_TOPIC_CONFIG),
else a dynamic broker default set with kafka-configs (DYNAMIC_BROKER_CONFIG for this broker,
DYNAMIC_DEFAULT_BROKER_CONFIG for all), else the broker's `server.properties`
(STATIC_BROKER_CONFIG), else Kafka's default (DEFAULT_CONFIG). Validation reuses the storage
layer's parsing for the settings it owns, so one set of rules decides what is valid.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from broker.storage.config import (
    COMPRESSION_TYPES,
    LONG_MAX,
    TIMESTAMP_TYPES,
    InvalidConfig,
    LogConfig,
)

__all__ = [
    "TOPIC_CONFIGS",
    "ConfigDef",
    "ConfigSource",
    "ConfigType",
    "ResolvedConfig",
    "Synonym",
    "broker_levels",
    "log_config",
    "resolve_topic_configs",
    "validate_topic_configs",
]


class ConfigType(enum.IntEnum):
    """DescribeConfigs v3+ `config_type`."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


class ConfigSource(enum.IntEnum):
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


Validator = Callable[[str, str], None]


_REPLICA = re.compile(r"\s*\d+\s*:\s*\d+\s*")


def _throttled_replicas(key: str, value: str) -> None:
    """Kafka's ThrottledReplicaListValidator: `*`, or `partition:broker` pairs (or nothing)."""
    if value.strip() in ("", "*"):
        return
    if not all(_REPLICA.fullmatch(pair) for pair in value.split(",")):
        raise InvalidConfig(
            key,
            value,
            f"{key} must be the literal '*' or a list of replicas in the following format: "
            "[partitionId]:[brokerId],[partitionId]:[brokerId],...",
        )


def _one_of(*choices: str) -> Validator:
    def check(key: str, value: str) -> None:
        if value not in choices:
            raise InvalidConfig(key, value, f"must be one of {', '.join(choices)}")

    return check


def _boolean(key: str, value: str) -> None:
    if value.strip().lower() not in ("true", "false"):
        raise InvalidConfig(key, value, "must be true or false")


def _integer(minimum: int, maximum: int = LONG_MAX) -> Validator:
    def check(key: str, value: str) -> None:
        try:
            number = int(value)
        except ValueError:
            raise InvalidConfig(key, value, "not an integer") from None
        if not minimum <= number <= maximum:
            raise InvalidConfig(key, value, f"must be between {minimum} and {maximum}")

    return check


def _storage(key: str, value: str) -> None:
    LogConfig.from_properties({key: value})


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    type: ConfigType
    default: str
    broker_name: str | None
    """The broker-level synonym whose value is the default for every topic."""
    validate: Validator
    doc: str


_INT_MAX = 2**31 - 1

TOPIC_CONFIGS: dict[str, ConfigDef] = {
    d.name: d
    for d in (
        ConfigDef(
            "cleanup.policy",
            ConfigType.LIST,
            "delete",
            "log.cleanup.policy",
            _storage,
            "delete, compact, or both: what happens to old segments.",
        ),
        ConfigDef(
            "compression.type",
            ConfigType.STRING,
            "producer",
            "compression.type",
            _one_of(*COMPRESSION_TYPES),
            "The codec batches are stored with; producer keeps the producer's.",
        ),
        ConfigDef(
            "delete.retention.ms",
            ConfigType.LONG,
            "86400000",
            "log.cleaner.delete.retention.ms",
            _storage,
            "How long tombstones survive compaction.",
        ),
        ConfigDef(
            "file.delete.delay.ms",
            ConfigType.LONG,
            "60000",
            "log.segment.delete.delay.ms",
            _storage,
            "Delay before a deleted segment's files are removed.",
        ),
        ConfigDef(
            "flush.messages",
            ConfigType.LONG,
            str(LONG_MAX),
            "log.flush.interval.messages",
            _storage,
            "fsync after this many records.",
        ),
        ConfigDef(
            "flush.ms",
            ConfigType.LONG,
            str(LONG_MAX),
            "log.flush.interval.ms",
            _storage,
            "fsync when the oldest unflushed record is this old.",
        ),
        ConfigDef(
            "index.interval.bytes",
            ConfigType.INT,
            "4096",
            "log.index.interval.bytes",
            _storage,
            "Log bytes between offset index entries.",
        ),
        ConfigDef(
            "max.compaction.lag.ms",
            ConfigType.LONG,
            str(LONG_MAX),
            "log.cleaner.max.compaction.lag.ms",
            _storage,
            "Longest time a record stays uncompacted.",
        ),
        ConfigDef(
            "max.message.bytes",
            ConfigType.INT,
            "1048588",
            "message.max.bytes",
            _storage,
            "Largest record batch accepted.",
        ),
        ConfigDef(
            "message.timestamp.type",
            ConfigType.STRING,
            "CreateTime",
            "log.message.timestamp.type",
            _one_of(*TIMESTAMP_TYPES),
            "CreateTime keeps the producer's timestamps; LogAppendTime stamps the broker's.",
        ),
        ConfigDef(
            "message.timestamp.before.max.ms",
            ConfigType.LONG,
            str(LONG_MAX),
            "log.message.timestamp.before.max.ms",
            _integer(0),
            "How far in the past a CreateTime timestamp may be.",
        ),
        ConfigDef(
            "message.timestamp.after.max.ms",
            ConfigType.LONG,
            "3600000",
            "log.message.timestamp.after.max.ms",
            _integer(0),
            "How far in the future a CreateTime timestamp may be.",
        ),
        ConfigDef(
            "min.cleanable.dirty.ratio",
            ConfigType.DOUBLE,
            "0.5",
            "log.cleaner.min.cleanable.ratio",
            _storage,
            "Share of the log that must be uncompacted before compaction runs.",
        ),
        ConfigDef(
            "min.compaction.lag.ms",
            ConfigType.LONG,
            "0",
            "log.cleaner.min.compaction.lag.ms",
            _storage,
            "Records younger than this are never compacted.",
        ),
        ConfigDef(
            "min.insync.replicas",
            ConfigType.INT,
            "1",
            "min.insync.replicas",
            _integer(1, _INT_MAX),
            "Replicas that must have a record before acks=all succeeds.",
        ),
        ConfigDef(
            "preallocate",
            ConfigType.BOOLEAN,
            "false",
            "log.preallocate",
            _boolean,
            "Preallocate segment files (accepted; Gregor does not preallocate).",
        ),
        ConfigDef(
            "retention.bytes",
            ConfigType.LONG,
            "-1",
            "log.retention.bytes",
            _storage,
            "Partition size above which the oldest segments are deleted.",
        ),
        ConfigDef(
            "retention.ms",
            ConfigType.LONG,
            "604800000",
            "log.retention.ms",
            _storage,
            "Age after which closed segments are deleted.",
        ),
        ConfigDef(
            "segment.bytes",
            ConfigType.INT,
            "1073741824",
            "log.segment.bytes",
            _storage,
            "Segment size at which a new segment starts.",
        ),
        ConfigDef(
            "segment.index.bytes",
            ConfigType.INT,
            "10485760",
            "log.index.size.max.bytes",
            _storage,
            "Size of each segment's offset index.",
        ),
        ConfigDef(
            "segment.jitter.ms",
            ConfigType.LONG,
            "0",
            "log.roll.jitter.ms",
            _integer(0),
            "Random jitter subtracted from segment.ms (accepted; not applied).",
        ),
        ConfigDef(
            "segment.ms",
            ConfigType.LONG,
            "604800000",
            "log.roll.ms",
            _storage,
            "Age at which a segment rolls even if not full.",
        ),
        ConfigDef(
            "unclean.leader.election.enable",
            ConfigType.BOOLEAN,
            "false",
            "unclean.leader.election.enable",
            _boolean,
            "Allow a replica outside the ISR to lead (may lose data).",
        ),
        ConfigDef(
            "leader.replication.throttled.replicas",
            ConfigType.LIST,
            "",
            None,
            _throttled_replicas,
            "Replicas whose leader-side replication is throttled.",
        ),
        ConfigDef(
            "follower.replication.throttled.replicas",
            ConfigType.LIST,
            "",
            None,
            _throttled_replicas,
            "Replicas whose follower-side replication is throttled.",
        ),
    )
}


def validate_topic_configs(configs: Mapping[str, str | None]) -> None:
    """Raise `InvalidConfig` for an unknown topic config name or a value Kafka refuses."""
    for name, value in configs.items():
        definition = TOPIC_CONFIGS.get(name)
        if definition is None:
            raise InvalidConfig(name, value, "unknown topic config name")
        if value is not None:
            definition.validate(name, value)


Synonym = tuple[str, str, ConfigSource]
"""(name, value, source): one level that sets a config (DescribeConfigs `synonyms`)."""


@dataclass(frozen=True, slots=True)
class ResolvedConfig:
    name: str
    value: str
    source: ConfigSource
    definition: ConfigDef
    synonyms: tuple[Synonym, ...]
    """Every level that sets it, most specific first (DescribeConfigs `include_synonyms`)."""


def broker_levels(
    broker_name: str,
    broker_dynamic: Mapping[str, str],
    cluster_dynamic: Mapping[str, str],
    static: str | None,
) -> list[Synonym]:
    """The broker-level values of `broker_name`, most specific first: this broker's dynamic
    value, the dynamic default of every broker, then `static` (`server.properties`)."""
    levels: list[Synonym] = []
    if broker_name in broker_dynamic:
        levels.append(
            (broker_name, broker_dynamic[broker_name], ConfigSource.DYNAMIC_BROKER_CONFIG)
        )
    if broker_name in cluster_dynamic:
        levels.append(
            (broker_name, cluster_dynamic[broker_name], ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)
        )
    if static is not None:
        levels.append((broker_name, static, ConfigSource.STATIC_BROKER_CONFIG))
    return levels


def resolve_topic_configs(
    topic_overrides: Mapping[str, str],
    broker_static: Mapping[str, str],
    broker_dynamic: Mapping[str, str],
    cluster_dynamic: Mapping[str, str],
) -> list[ResolvedConfig]:
    """Every topic config with its effective value and where that value comes from."""
    resolved = []
    for definition in TOPIC_CONFIGS.values():
        levels: list[Synonym] = []
        if definition.name in topic_overrides:
            levels.append(
                (
                    definition.name,
                    topic_overrides[definition.name],
                    ConfigSource.DYNAMIC_TOPIC_CONFIG,
                )
            )
        broker_name = definition.broker_name
        if broker_name is not None:
            static = _static_value(broker_name, broker_static)
            levels += broker_levels(broker_name, broker_dynamic, cluster_dynamic, static)
        levels.append((definition.name, definition.default, ConfigSource.DEFAULT_CONFIG))
        _, value, source = levels[0]
        resolved.append(ResolvedConfig(definition.name, value, source, definition, tuple(levels)))
    return resolved


def _static_value(broker_name: str, broker_static: Mapping[str, str]) -> str | None:
    """The `server.properties` value of `broker_name`; `log.retention.minutes|hours` and
    `log.roll.hours` stand in for the ms names when those are not set, as in Kafka."""
    if broker_name in broker_static:
        return broker_static[broker_name]
    if broker_name == "log.retention.ms":
        for unit, scale in (("minutes", 60_000), ("hours", 3_600_000)):
            raw = broker_static.get(f"log.retention.{unit}")
            if raw is not None:
                return str(int(raw) * scale)
    if broker_name == "log.roll.ms" and "log.roll.hours" in broker_static:
        return str(int(broker_static["log.roll.hours"]) * 3_600_000)
    return None


def log_config(resolved: list[ResolvedConfig]) -> LogConfig:
    """The storage settings a partition's log runs with."""
    return LogConfig.from_properties({r.name: r.value for r in resolved})
