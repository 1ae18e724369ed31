"""The `config` maps of `KafkaCluster` and `Topic`: one typed field per Kafka property.

What it owns: which Kafka properties a resource may set, and the YAML type of each (a boolean
is `true`, a size is an integer). Each is a field of its own in the CRD's schema, so the API
server refuses a misspelt or operator-owned key (`.spec.config.log.retention.hour: field not
declared in schema` under server-side apply, `unknown field` under kubectl's strict
validation), checks each value's type, and CEL rules can read them (`min.insync.replicas`
below the replication factor); a map with values of any type would hide its keys from CEL.
The broker's own checks (an allowed `cleanup.policy`, a positive `segment.bytes`) run when the
operator reads a resource. What it must never do: know how a resource is reconciled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from broker.config import kafka_text
from broker.metadata.broker_config_table import BROKER_CONFIGS
from broker.metadata.configs import TOPIC_CONFIGS, ConfigType, validate_topic_configs
from broker.storage.config import InvalidConfig

__all__ = [
    "OWNED_BROKER_CONFIGS",
    "BrokerConfig",
    "TopicConfig",
    "cel_field",
    "kafka_properties",
]

OWNED_BROKER_CONFIGS = frozenset(
    {
        "advertised.listeners",
        "broker.id",
        "broker.rack",
        "controller.listener.names",
        "controller.quorum.bootstrap.servers",
        "controller.quorum.voters",
        "gregor.metrics.listener",
        "inter.broker.listener.name",
        "listener.security.protocol.map",
        "listeners",
        "log.dir",
        "log.dirs",
        "metadata.log.dir",
        "node.id",
        "process.roles",
    }
)
"""Properties the operator writes itself, from the spec and each pod's place: a value in
`config` would fight it."""

_PYTHON_TYPES: dict[ConfigType, Any] = {
    ConfigType.BOOLEAN: bool,
    ConfigType.SHORT: int,
    ConfigType.INT: int,
    ConfigType.LONG: int,
    ConfigType.DOUBLE: float,
    ConfigType.STRING: str,
    ConfigType.LIST: str,
    ConfigType.CLASS: str,
}
"""A Kafka config type as YAML writes it. A LIST is Kafka's comma-separated text. PASSWORD
properties are left out: secrets do not belong in a resource anyone may read."""


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False)

    def properties(self) -> dict[str, str]:
        """The properties set, with Kafka's names, as Kafka's properties text writes them."""
        return kafka_properties(self.model_dump(by_alias=True, exclude_none=True))


def kafka_properties(values: Mapping[str, Any]) -> dict[str, str]:
    """The properties set, as Kafka's properties text writes them (`true`, not `True`)."""
    return {name: text for name, value in values.items() if (text := kafka_text(value)) is not None}


def _field_name(name: str) -> str:
    return name.replace(".", "_").replace("-", "_")


def cel_field(name: str) -> str:
    """How a CEL rule names the property (`min.insync.replicas` → `min__dot__insync__dot__…`)."""
    return name.replace("_", "__underscores__").replace(".", "__dot__").replace("-", "__dash__")


def _model(
    name: str, doc: str, properties: Iterable[tuple[str, ConfigType]], base: type[_Config]
) -> type[_Config]:
    fields: dict[str, Any] = {
        _field_name(prop): (_PYTHON_TYPES[kind] | None, Field(None, alias=prop))
        for prop, kind in sorted(properties)
        if kind in _PYTHON_TYPES
    }
    model: type[_Config] = create_model(name, __base__=base, __doc__=doc, **fields)
    return model


class _BrokerConfigBase(_Config):
    @model_validator(mode="before")
    @classmethod
    def _not_owned(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            owned = sorted(set(data) & OWNED_BROKER_CONFIGS)
            if owned:
                raise ValueError(f"config sets {', '.join(owned)}, which the operator sets itself")
        return data


class _TopicConfigBase(_Config):
    @model_validator(mode="after")
    def _kafka_accepts(self) -> _TopicConfigBase:
        try:
            validate_topic_configs(self.properties())
        except InvalidConfig as exc:
            raise ValueError(str(exc)) from None
        return self


if TYPE_CHECKING:  # what the checker can know of a model built at run time
    BrokerConfig = _BrokerConfigBase
    TopicConfig = _TopicConfigBase
else:
    BrokerConfig = _model(
        "BrokerConfig",
        "Broker properties with Kafka's names (`min.insync.replicas`, `log.retention.ms`, …), "
        "written into every node's server.properties.",
        [
            (definition.name, definition.type)
            for definition in BROKER_CONFIGS.values()
            if definition.name not in OWNED_BROKER_CONFIGS
        ],
        _BrokerConfigBase,
    )

    TopicConfig = _model(
        "TopicConfig",
        "Topic properties with Kafka's names (`retention.ms`, `cleanup.policy`, …).",
        [(definition.name, definition.type) for definition in TOPIC_CONFIGS.values()],
        _TopicConfigBase,
    )
