"""DescribeConfigs, AlterConfigs, IncrementalAlterConfigs for topics and brokers.

Topic configs are listed in full with Kafka's names, effective values and sources (topic, dynamic
broker, static broker, default) and, when asked, their synonyms and documentation. Broker
configs list what `server.properties` set, the dynamic values set through these APIs, and the
defaults of the topic-level settings a broker provides. Changes go through the controller and
reach the partition logs once committed.
"""

from __future__ import annotations

from typing import Any

from broker.metadata import ConfigOp, ConfigSource, ConfigType, QuorumController
from broker.metadata.configs import TOPIC_CONFIGS, broker_levels
from broker.metadata.image import BROKER_RESOURCE, TOPIC_RESOURCE
from broker.protocol import ApiKey, ErrorCode, ResponseBody, build, response_module
from broker.server import RequestContext

from .context import NO_THROTTLE, NodeState

__all__ = ["AlterConfigs", "DescribeConfigs", "IncrementalAlterConfigs"]

_SENSITIVE_MARKERS = ("password", "secret", "sasl.jaas.config")


def _sensitive(name: str) -> bool:
    return any(marker in name for marker in _SENSITIVE_MARKERS)


class DescribeConfigs:
    def __init__(self, state: NodeState) -> None:
        self._state = state

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = context.header.api_version
        schema = response_module(ApiKey.DESCRIBE_CONFIGS, version)
        synonyms_wanted = getattr(request, "include_synonyms", False)
        docs_wanted = getattr(request, "include_documentation", False)
        results = []
        for resource in request.resources:
            error, message, entries = self._entries(resource.resource_type, resource.resource_name)
            keys = resource.configuration_keys
            if keys is not None:
                entries = [e for e in entries if e[0] in keys]
            configs = tuple(
                build(
                    schema.DescribeConfigsResourceResult,
                    name=name,
                    value=None if _sensitive(name) else value,
                    read_only=read_only,
                    config_source=int(source),
                    is_default=source == ConfigSource.DEFAULT_CONFIG,
                    is_sensitive=_sensitive(name),
                    synonyms=tuple(
                        build(schema.DescribeConfigsSynonym, name=n, value=v, source=int(s))
                        for n, v, s in synonyms
                    )
                    if synonyms_wanted
                    else (),
                    config_type=int(kind),
                    documentation=doc if docs_wanted else None,
                )
                for name, value, source, read_only, synonyms, kind, doc in entries
            )
            results.append(
                build(
                    schema.DescribeConfigsResult,
                    error_code=error,
                    error_message=message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    configs=configs,
                )
            )
        response: ResponseBody = build(
            schema.DescribeConfigsResponse, throttle_time=NO_THROTTLE, results=tuple(results)
        )
        return response

    def _entries(self, resource_type: int, name: str) -> tuple[ErrorCode, str | None, list[Any]]:
        state = self._state
        image = state.metadata.image
        if resource_type == TOPIC_RESOURCE:
            if name not in image.topics:
                return (
                    ErrorCode.unknown_topic_or_partition,
                    f"Topic {name} does not exist",
                    [],
                )
            resolved = state.metadata.resolved_topic_configs(image.topic_config(name))
            return (
                ErrorCode.none,
                None,
                [
                    (
                        r.name,
                        r.value,
                        r.source,
                        False,
                        r.synonyms,
                        r.definition.type,
                        r.definition.doc,
                    )
                    for r in resolved
                ],
            )
        if resource_type == BROKER_RESOURCE:
            if name and name != str(state.node_id):
                return ErrorCode.invalid_request, f"Unexpected broker id {name}", []
            return (
                ErrorCode.none,
                None,
                self._broker_entries(
                    state.metadata.broker_dynamic_configs, state.metadata.cluster_dynamic_configs
                ),
            )
        return ErrorCode.invalid_request, f"Unsupported resource type {resource_type}", []

    def _broker_entries(
        self, broker_dynamic: dict[str, str], cluster_dynamic: dict[str, str]
    ) -> list[Any]:
        static = self._state.config.properties
        entries: dict[str, Any] = {}
        for definition in TOPIC_CONFIGS.values():
            if definition.broker_name is None:
                continue
            key = definition.broker_name
            levels = broker_levels(key, broker_dynamic, cluster_dynamic, static.get(key))
            levels.append((key, definition.default, ConfigSource.DEFAULT_CONFIG))
            _, value, source = levels[0]
            entries[key] = (key, value, source, False, tuple(levels), definition.type, None)
        for key, value in static.items():
            if key not in entries:
                levels = [(key, value, ConfigSource.STATIC_BROKER_CONFIG)]
                entries[key] = (
                    key,
                    value,
                    ConfigSource.STATIC_BROKER_CONFIG,
                    True,
                    tuple(levels),
                    ConfigType.STRING,
                    None,
                )
        return [entries[k] for k in sorted(entries)]


class _Alter:
    incremental = False
    api_key = ApiKey.ALTER_CONFIGS

    def __init__(self, state: NodeState) -> None:
        self._state = state

    def _ops(self, resource: Any) -> list[ConfigOp]:
        if self.incremental:
            return [ConfigOp(c.name, c.config_operation, c.value) for c in resource.configs]
        return [ConfigOp(c.name, 0, c.value) for c in resource.configs]

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = context.header.api_version
        schema = response_module(self.api_key, version)
        responses = []
        for resource in request.resources:
            ops = self._ops(resource)

            def decide(
                controller: QuorumController, resource: Any = resource, ops: Any = ops
            ) -> tuple[list[Any], Any]:
                records, outcome = controller.alter_configs(
                    resource.resource_type,
                    resource.resource_name,
                    ops,
                    replace=not self.incremental,
                )
                return ([] if request.validate_only else records), outcome

            outcome = await self._state.metadata.propose(decide)
            responses.append(
                build(
                    schema.AlterConfigsResourceResponse,
                    error_code=outcome.error,
                    error_message=outcome.message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                )
            )
        response_type = (
            schema.IncrementalAlterConfigsResponse
            if self.incremental
            else schema.AlterConfigsResponse
        )
        response: ResponseBody = build(
            response_type, throttle_time=NO_THROTTLE, responses=tuple(responses)
        )
        return response


class AlterConfigs(_Alter):
    pass


class IncrementalAlterConfigs(_Alter):
    incremental = True
    api_key = ApiKey.INCREMENTAL_ALTER_CONFIGS
