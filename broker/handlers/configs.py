"""DescribeConfigs, AlterConfigs, IncrementalAlterConfigs for topics and brokers.

Topic configs are listed in full with Kafka's names, effective values and sources (topic, dynamic
broker, static broker, default) and, when asked, their synonyms and documentation. A broker
lists every config a Kafka broker lists (`broker.metadata.broker_configs`), with the values it
runs with; the cluster default (empty name) lists what was set for every broker. Changes go
through the controller and reach the partition logs and the connection limits once committed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from broker.config import BrokerConfig
from broker.metadata import ConfigOp, ConfigSource, Outcome, QuorumController
from broker.metadata.broker_configs import (
    BROKER_CONFIGS,
    describe_broker,
    describe_cluster_default,
)
from broker.metadata.image import BROKER_RESOURCE, TOPIC_RESOURCE
from broker.protocol import ApiKey, ErrorCode, ResponseBody, build, response_module
from broker.server import RequestContext, SendOn

from .context import NO_THROTTLE, NodeState

__all__ = ["AlterConfigs", "DescribeConfigs", "IncrementalAlterConfigs"]


class DescribeConfigs:
    def __init__(self, state: NodeState) -> None:
        self._state = state
        self._levels: tuple[dict[str, str], dict[str, str | None]] | None = None

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
                    value=None if sensitive else value,
                    read_only=read_only,
                    config_source=int(source),
                    is_default=source == ConfigSource.DEFAULT_CONFIG,
                    is_sensitive=sensitive,
                    synonyms=tuple(
                        build(schema.DescribeConfigsSynonym, name=n, value=v, source=int(s))
                        for n, v, s in synonyms
                    )
                    if synonyms_wanted
                    else (),
                    config_type=int(kind),
                    documentation=doc if docs_wanted else None,
                )
                for name, value, source, read_only, synonyms, kind, doc, sensitive in entries
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
                        False,
                    )
                    for r in resolved
                ],
            )
        if resource_type == BROKER_RESOURCE:
            if not name:
                described = describe_cluster_default(state.metadata.cluster_dynamic_configs)
            elif not _is_int(name):
                return (
                    ErrorCode.invalid_request,
                    f"Broker id must be an integer, but it is: {name}",
                    [],
                )
            elif int(name) != state.node_id:
                return (
                    ErrorCode.invalid_request,
                    f"Unexpected broker id, expected {state.node_id} or empty string, but "
                    f"received {name}",
                    [],
                )
            else:
                static, defaults = self._broker_levels()
                described = describe_broker(
                    state.metadata.broker_dynamic_configs,
                    state.metadata.cluster_dynamic_configs,
                    static,
                    defaults,
                )
            return (
                ErrorCode.none,
                None,
                [
                    (d.name, d.value, d.source, d.read_only, d.synonyms, d.type, d.doc, d.sensitive)
                    for d in described
                ],
            )
        return ErrorCode.invalid_request, f"Unsupported resource type {resource_type}", []

    def _broker_levels(self) -> tuple[dict[str, str], dict[str, str | None]]:
        """This node's `server.properties` and its defaults under every broker config name:
        Kafka's, with the value the node runs with over them where it has the setting (the
        advertised listeners as registered, their ports bound). Both are fixed once the node
        serves, so they are assembled once."""
        if self._levels is None:
            config = self._state.config
            static = dict(config.properties)
            if "node.id" in static:
                # Kafka's KRaft mode sets broker.id from node.id among the given properties.
                static.setdefault("broker.id", static["node.id"])
            # A name the file sets has the node's default under it; one it leaves alone, the
            # value the node derived (advertised.listeners from listeners, log.dirs from log.dir).
            defaults: dict[str, str | None] = {
                name: d.default for name, d in BROKER_CONFIGS.items()
            }
            defaults.update(BrokerConfig().kafka_values())
            effective = config.kafka_values()
            advertised = self._state.advertised
            if advertised:
                effective["advertised.listeners"] = ",".join(
                    f"{listener}://{e.host}:{e.port}" for listener, e in advertised.items()
                )
            defaults.update((k, v) for k, v in effective.items() if k not in static)
            self._levels = static, defaults
        return self._levels


def _is_int(name: str) -> bool:
    return name.lstrip("-").isdigit()


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

            refused = (
                None
                if context.forwarded  # the broker that forwarded it checked this
                else self._other_broker(resource.resource_type, resource.resource_name)
            )
            if refused is not None:
                outcome = Outcome(ErrorCode.invalid_request, refused)
            else:
                outcome = await self._state.metadata.propose(decide)
            responses.append(_resource_answer(schema, resource, outcome))
        return self._answer(schema, responses, NO_THROTTLE)

    def _answer(self, schema: Any, responses: list[Any], throttle: Any) -> ResponseBody:
        response_type = (
            schema.IncrementalAlterConfigsResponse
            if self.incremental
            else schema.AlterConfigsResponse
        )
        response: ResponseBody = build(
            response_type, throttle_time=throttle, responses=tuple(responses)
        )
        return response

    async def before_forwarding(
        self, context: RequestContext, request: Any, send_on: SendOn
    ) -> ResponseBody | None:
        """The `ForwardCheck` of a broker that is not the active controller: the resources
        that name another broker are refused here (only that broker knows they are its own),
        the others go on to the controller, and the answer keeps the request's order."""
        refusals = [
            self._other_broker(resource.resource_type, resource.resource_name)
            for resource in request.resources
        ]
        if all(refusal is None for refusal in refusals):
            return None  # forwarded as it came
        schema = response_module(self.api_key, context.header.api_version)
        kept = [r for r, refusal in zip(request.resources, refusals, strict=True) if not refusal]
        answered: Any = None
        if kept:
            answered = await send_on(dataclasses.replace(request, resources=tuple(kept)))
            if answered is None:
                return None  # this node decides after all: its handler checks the same
        controller_answers = iter(() if answered is None else answered.responses)
        responses = []
        for resource, refusal in zip(request.resources, refusals, strict=True):
            if refusal is None:
                responses.append(next(controller_answers))
                continue
            refused = Outcome(ErrorCode.invalid_request, refusal)
            responses.append(_resource_answer(schema, resource, refused))
        throttle = NO_THROTTLE if answered is None else answered.throttle_time
        return self._answer(schema, responses, throttle)

    def _other_broker(self, resource_type: int, name: str) -> str | None:
        """A broker's own configs are changed through that broker (as Kafka's clients send
        them), so a request naming another one is refused in Kafka's words."""
        if resource_type != BROKER_RESOURCE or not name:
            return None
        if not _is_int(name):
            return f"Node id must be an integer, but it is: {name}"
        if int(name) != self._state.node_id:
            return f"Unexpected broker id, expected {self._state.node_id}, but received {name}"
        return None


def _resource_answer(schema: Any, resource: Any, outcome: Outcome) -> Any:
    return build(
        schema.AlterConfigsResourceResponse,
        error_code=outcome.error,
        error_message=outcome.message,
        resource_type=resource.resource_type,
        resource_name=resource.resource_name,
    )


class AlterConfigs(_Alter):
    pass


class IncrementalAlterConfigs(_Alter):
    incremental = True
    api_key = ApiKey.INCREMENTAL_ALTER_CONFIGS
