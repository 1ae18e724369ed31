"""Broker configs as Kafka's admin APIs show and change them: which names a broker lists, the
value and source of each, and which dynamic updates Kafka accepts at which scope.

A broker config resolves as Kafka's `DynamicBrokerConfig` resolves it: this broker's dynamic
value (DYNAMIC_BROKER_CONFIG), else the dynamic default of every broker
(DYNAMIC_DEFAULT_BROKER_CONFIG), else `server.properties` (STATIC_BROKER_CONFIG), else the
default (DEFAULT_CONFIG) — the one the node actually runs with where Gregor has the setting,
Kafka's otherwise. Validation follows Kafka's order and words, so a refusal reads the same from
either broker: names that are not dynamic, security configs without a listener prefix, values
of the wrong type or out of range, then per-broker names sent to the cluster default; every
refusal is INVALID_REQUEST, as Kafka answers (KAFKA-13609 keeps it so).

What it must never do: know where the values come from (the caller passes the levels), or
decide what a value does once accepted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .broker_config_table import BROKER_CONFIGS, BrokerConfigDef, UpdateMode
from .configs import TOPIC_CONFIGS, ConfigSource, ConfigType

__all__ = [
    "BROKER_CONFIGS",
    "CONTROLLER_DECIDED",
    "LIVE_PER_BROKER_CONFIGS",
    "BrokerConfigDef",
    "BrokerSynonym",
    "DescribedConfig",
    "UpdateMode",
    "describe_broker",
    "describe_cluster_default",
    "invalid_broker_update",
    "is_list_config",
]

_LISTENER_PREFIXED = re.compile(r"^listener\.name\.[^.]*\.(.*)$")
"""`listener.name.<listener>.<config>`: a config for one listener (Kafka's ListenerConfigRegex)."""

LISTENER_ONLY_SECURITY_CONFIGS = frozenset(
    {
        "ssl.keystore.type",
        "ssl.keystore.location",
        "ssl.keystore.password",
        "ssl.key.password",
        "ssl.truststore.type",
        "ssl.truststore.location",
        "ssl.truststore.password",
        "ssl.keystore.certificate.chain",
        "ssl.keystore.key",
        "ssl.truststore.certificates",
    }
)
"""The SSL stores: dynamic only under a listener prefix (Kafka's
`SslConfigs.RECONFIGURABLE_CONFIGS`), so one listener's certificate can change alone."""

CLUSTER_LEVEL_LISTENER_CONFIGS = frozenset(
    {"max.connections", "max.connection.creation.rate", "num.network.threads"}
)
"""Listener-prefixed configs that may still be set as every broker's default."""

LISTED_ONLY_WHEN_SET = frozenset(
    {
        "leader.replication.throttled.rate",
        "follower.replication.throttled.rate",
        "replica.alter.log.dirs.io.max.bytes.per.second",
    }
)
"""The replication quotas: dynamic broker configs that are not `KafkaConfig` settings, so
Kafka lists them only once a dynamic value sets them."""

_SYNONYMS: dict[str, tuple[str, ...]] = {}
for _group in (
    ("log.roll.ms", "log.roll.hours"),
    ("log.roll.jitter.ms", "log.roll.jitter.hours"),
    ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
):
    for _name in _group:
        _SYNONYMS[_name] = _group
_SYNONYMS["log.flush.interval.ms"] = ("log.flush.interval.ms", "log.flush.scheduler.interval.ms")


CONTROLLER_DECIDED = frozenset({"min.insync.replicas", "unclean.leader.election.enable"})
"""Broker configs the controller also weighs (eligible leader replicas, unclean elections),
reading only a topic's value, every broker's dynamic default and its own file: a value set
for one broker alone would leave the controller deciding by another."""

LIVE_PER_BROKER_CONFIGS = frozenset(
    name
    for name in (
        {d.broker_name for d in TOPIC_CONFIGS.values() if d.broker_name is not None}
        | {"max.connections", "max.connections.per.ip", "max.connections.per.ip.overrides"}
    )
    if name in BROKER_CONFIGS and BROKER_CONFIGS[name].dynamic and name not in CONTROLLER_DECIDED
)
"""The broker configs a running node acts on as soon as they are set for it alone
(IncrementalAlterConfigs on `BROKER <node.id>`): the default of every topic's setting (its
logs are reconfigured at once) and the connection limits (for connections accepted from
then on). Any other change to `server.properties` needs a restart to take effect."""

BrokerSynonym = tuple[str, str | None, ConfigSource]
"""(name, value, source): one level that sets a broker config; the value None if sensitive."""


def is_list_config(name: str) -> bool:
    definition = BROKER_CONFIGS.get(name)
    return definition is not None and definition.type is ConfigType.LIST


@dataclass(frozen=True, slots=True)
class DescribedConfig:
    """One DescribeConfigs entry of a broker resource."""

    name: str
    value: str | None
    """None for a sensitive (PASSWORD) config, and where Kafka has no value (null)."""
    source: ConfigSource
    read_only: bool
    sensitive: bool
    type: int
    """DescribeConfigs `config_type`; 0 (UNKNOWN) for a name Kafka does not define."""
    synonyms: tuple[BrokerSynonym, ...]
    doc: str | None


def _sensitive(name: str) -> bool:
    """A PASSWORD config, or one under a listener prefix (`listener.name.x.ssl.key.password`,
    `listener.name.x.plain.sasl.jaas.config`), as Kafka's `isPasswordConfig`."""
    definition = BROKER_CONFIGS.get(name)
    if definition is not None:
        return definition.type is ConfigType.PASSWORD
    return any(
        name.endswith(d.name)
        for d in BROKER_CONFIGS.values()
        if d.type is ConfigType.PASSWORD and d.dynamic
    )


def _synonyms(
    name: str, levels: Iterable[tuple[Mapping[str, str], ConfigSource]]
) -> list[BrokerSynonym]:
    """Kafka's `configSynonyms`: every synonym name set at each level, most specific level
    first, then everything before the first entry of `name` itself dropped (so
    `log.retention.ms` lists its own value over `log.retention.hours`, but is empty when only
    the hours are set, as Kafka answers)."""
    names = _SYNONYMS.get(name, (name,))
    found: list[BrokerSynonym] = [
        (synonym, values[synonym], source)
        for values, source in levels
        for synonym in names
        if synonym in values
    ]
    for index, (synonym, _, _) in enumerate(found):
        if synonym == name:
            return found[index:]
    return []


def _entry(
    name: str,
    levels: list[tuple[Mapping[str, str], ConfigSource]],
    value: str | None,
) -> DescribedConfig:
    definition = BROKER_CONFIGS.get(name)
    sensitive = _sensitive(name)
    synonyms = _synonyms(name, levels)
    if sensitive:
        synonyms = [(n, None, s) for n, _, s in synonyms]
    return DescribedConfig(
        name=name,
        value=None if sensitive else value,
        source=synonyms[0][2] if synonyms else ConfigSource.DEFAULT_CONFIG,
        read_only=definition is None or not definition.dynamic,
        sensitive=sensitive,
        type=0 if definition is None else int(definition.type),
        synonyms=tuple(synonyms),
        doc=None,  # Kafka's prose is not carried (broker_config_table)
    )


def describe_broker(
    broker_dynamic: Mapping[str, str],
    cluster_dynamic: Mapping[str, str],
    static: Mapping[str, str],
    defaults: Mapping[str, str | None],
) -> list[DescribedConfig]:
    """Every config of this broker, as DescribeConfigs lists them for its id: every name Kafka
    defines (the replication quotas only once set), and every name `server.properties` sets.
    `defaults` are Kafka's defaults with the node's own values over them where it has one;
    dynamic values of names Kafka does not define are stored but not listed, as in Kafka."""
    default_values = {k: v for k, v in defaults.items() if v is not None}
    levels = [
        (broker_dynamic, ConfigSource.DYNAMIC_BROKER_CONFIG),
        (cluster_dynamic, ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG),
        (static, ConfigSource.STATIC_BROKER_CONFIG),
        (default_values, ConfigSource.DEFAULT_CONFIG),
    ]
    entries = []
    for name in sorted(BROKER_CONFIGS.keys() | static.keys()):
        if name in broker_dynamic:
            value: str | None = broker_dynamic[name]
        elif name in cluster_dynamic:
            value = cluster_dynamic[name]
        elif name in static:
            value = static[name]
        elif name in LISTED_ONLY_WHEN_SET:
            continue
        else:
            value = defaults.get(name)
        entries.append(_entry(name, levels, value))
    return entries


def describe_cluster_default(cluster_dynamic: Mapping[str, str]) -> list[DescribedConfig]:
    """The cluster-wide default resource (empty name): only what was set for every broker."""
    levels = [(cluster_dynamic, ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)]
    return [_entry(name, levels, cluster_dynamic[name]) for name in sorted(cluster_dynamic)]


# -- validation ---------------------------------------------------------------------------------


def _names(names: Iterable[str]) -> str:
    return "[" + ", ".join(sorted(names)) + "]"


def invalid_broker_update(configs: Mapping[str, str | None], *, per_broker: bool) -> str | None:
    """Why Kafka refuses to hold `configs` as a broker's dynamic configs (or, with
    `per_broker` False, as every broker's default); None if it accepts them. A None value is a
    deletion and is never refused. Names Kafka does not define are accepted, as Kafka accepts
    them (custom settings for plugins)."""
    names = [name for name, value in configs.items() if value is not None]
    fixed = [n for n in names if n in BROKER_CONFIGS and not BROKER_CONFIGS[n].dynamic]
    if fixed:
        return f"Cannot update these configs dynamically: {_names(fixed)}"
    unprefixed = [n for n in names if n in LISTENER_ONLY_SECURITY_CONFIGS]
    if unprefixed:
        return (
            "These security configs can be dynamically updated only per-listener using the "
            f"listener prefix: {_names(unprefixed)}"
        )
    for name in names:
        prefixed = _LISTENER_PREFIXED.match(name)
        base = prefixed.group(1) if prefixed else name
        definition = BROKER_CONFIGS.get(base)
        value = configs[name]
        if definition is not None and definition.dynamic and value is not None:
            problem = invalid_value(definition, value)
            if problem is not None:
                return f"Invalid value {value} for configuration {base}: {problem}"
    if not per_broker:
        only_per_broker = [n for n in names if _per_broker_only(n)]
        if only_per_broker:
            return (
                "Cannot update these configs at default cluster level, broker id must be "
                f"specified: {_names(only_per_broker)}"
            )
    return None


def _per_broker_only(name: str) -> bool:
    prefixed = _LISTENER_PREFIXED.match(name)
    if prefixed:
        return prefixed.group(1) not in CLUSTER_LEVEL_LISTENER_CONFIGS
    definition = BROKER_CONFIGS.get(name)
    return definition is not None and definition.mode is UpdateMode.PER_BROKER


_INTEGER = re.compile(r"^[+-]?[0-9]+$")
_DOUBLE = re.compile(r"^[+-]?(NaN|Infinity|([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?)[fFdD]?$")
_BOUNDS = {
    ConfigType.SHORT: (-(2**15), 2**15 - 1),
    ConfigType.INT: (-(2**31), 2**31 - 1),
    ConfigType.LONG: (-(2**63), 2**63 - 1),
}
_RANGE = re.compile(r"^\[(?P<min>[^,\]]*),\.\.\.(?:,(?P<max>[^\]]*))?\](?P<or> or -1)?$")
_CHOICES = re.compile(r"^\[(?P<choices>[^\]]*)\]$")


def invalid_value(definition: BrokerConfigDef, raw: str) -> str | None:
    """What Kafka's ConfigDef says of `raw` for this config (its words after "Invalid value
    ... for configuration ...: "), or None if it parses and is allowed."""
    kind = definition.type
    value = raw.strip()
    number: float | None = None
    if kind is ConfigType.BOOLEAN:
        if value.lower() not in ("true", "false"):
            return "Expected value to be either true or false"
        return None
    if kind in _BOUNDS:
        low, high = _BOUNDS[kind]
        if not _INTEGER.match(value) or not low <= int(value) <= high:
            return f"Not a number of type {kind.name}"
        number = int(value)
    elif kind is ConfigType.DOUBLE:
        if not _DOUBLE.match(value):
            return "Not a number of type DOUBLE"
        number = float(value.rstrip("fFdD"))
    return _outside(definition.valid_values, number, value, kind)


def _outside(valid: str, number: float | None, value: str, kind: ConfigType) -> str | None:
    if not valid:
        return None
    bounds = _RANGE.match(valid)
    if bounds is not None:
        if number is None:
            return None
        low = float(bounds["min"]) if bounds["min"] else None
        high = float(bounds["max"]) if bounds["max"] else None
        if bounds["or"]:
            inside = number == -1 or (
                (low is None or number >= low) and (high is None or number <= high)
            )
            if inside:
                return None
            return f"Value must be between {bounds['min']} and {bounds['max']} or equal to -1"
        if low is not None and number < low:
            return f"Value must be at least {bounds['min']}"
        if high is not None and number > high:
            return f"Value must be no more than {bounds['max']}"
        return None
    listed = _CHOICES.match(valid)
    if listed is None or kind not in (ConfigType.STRING, ConfigType.LIST):
        return None
    choices = [c.strip() for c in listed["choices"].split(",")]
    items = (
        [v.strip() for v in value.split(",") if v.strip()] if kind is ConfigType.LIST else [value]
    )
    for item in items:
        if item not in choices:
            return f"String must be one of: {', '.join(choices)}"
    return None
