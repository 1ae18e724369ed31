"""CreateTopics, DeleteTopics, CreatePartitions: admin changes decided by the controller and
answered once their records are committed. `validate_only` runs every check and commits
nothing."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from broker.metadata import Outcome, QuorumController, TopicRequest, TopicResult
from broker.protocol import ApiKey, ErrorCode, ResponseBody, build, response_module
from broker.server import RequestContext

from .context import NO_THROTTLE, NodeState, in_turns

__all__ = ["CreatePartitions", "CreateTopics", "DeleteTopics"]


class CreateTopics:
    def __init__(self, state: NodeState) -> None:
        self._state = state

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = context.header.api_version
        schema = response_module(ApiKey.CREATE_TOPICS, version)
        wanted = await in_turns(_topic_request, request.topics)
        validate_only = getattr(request, "validate_only", False)

        by_broker = context.from_broker

        def decide(controller: QuorumController) -> tuple[list[Any], list[Any]]:
            records, results = controller.create_topics(wanted, by_broker=by_broker)
            return ([] if validate_only else records), results

        results = await self._state.metadata.propose(decide)
        # Each created topic's configs as the node resolves them right after the commit, all
        # read before the answer is built in turns (a config change meanwhile would otherwise
        # answer some topics with the old defaults and others with the new).
        resolved = [
            self._resolved(request_topic) if result.ok and version >= 5 else None
            for request_topic, result in zip(wanted, results, strict=True)
        ]

        def answer(pair: tuple[TopicResult, list[Any] | None]) -> Any:
            result, topic_configs = pair
            configs = None
            if topic_configs is not None:
                configs = tuple(
                    build(
                        schema.CreatableTopicConfigs,
                        name=c.name,
                        value=c.value,
                        read_only=False,
                        config_source=int(c.source),
                        is_sensitive=False,
                    )
                    for c in topic_configs
                )
            return build(
                schema.CreatableTopicResult,
                name=result.name,
                topic_id=result.topic_id,
                error_code=result.error,
                error_message=result.message,
                topic_config_error_code=0,
                num_partitions=result.num_partitions,
                replication_factor=result.replication_factor,
                configs=configs,
            )

        topics = await in_turns(answer, zip(results, resolved, strict=True))
        response: ResponseBody = build(
            schema.CreateTopicsResponse, throttle_time=NO_THROTTLE, topics=tuple(topics)
        )
        return response

    def _resolved(self, topic: TopicRequest) -> list[Any]:
        return self._state.metadata.resolved_topic_configs(
            {k: v for k, v in topic.configs.items() if v is not None}
        )


def _topic_request(topic: Any) -> TopicRequest:
    return TopicRequest(
        name=topic.name,
        num_partitions=topic.num_partitions,
        replication_factor=topic.replication_factor,
        assignments={a.partition_index: tuple(a.broker_ids) for a in topic.assignments},
        configs={c.name: c.value for c in topic.configs},
    )


class DeleteTopics:
    def __init__(self, state: NodeState) -> None:
        self._state = state

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = context.header.api_version
        schema = response_module(ApiKey.DELETE_TOPICS, version)
        if version >= 6:
            # The codec reads the zero UUID, "no id", as None.
            pairs = [(t.name, t.topic_id or _NO_ID) for t in request.topics]
        else:
            pairs = [(name, _NO_ID) for name in request.topic_names]
        names, ids, refused = _deletions(pairs)
        results = refused + await self._state.metadata.propose(
            lambda controller: controller.delete_topics(names, ids)
        )

        def answer(deletion: Deletion) -> Any:
            name, topic_id, outcome = deletion
            return build(
                schema.DeletableTopicResult,
                name=name,
                topic_id=topic_id,
                error_code=outcome.error,
                error_message=outcome.message,
            )

        responses = await in_turns(answer, results)
        response: ResponseBody = build(
            schema.DeleteTopicsResponse, throttle_time=NO_THROTTLE, responses=tuple(responses)
        )
        return response


_NO_ID = uuid.UUID(int=0)

Deletion = tuple[str | None, uuid.UUID | None, Outcome]


def _deletions(
    pairs: list[tuple[str | None, uuid.UUID]],
) -> tuple[list[str], list[uuid.UUID], list[Deletion]]:
    """The names and ids a DeleteTopics may delete, and its refusals, as Kafka's controller
    decides them: a name or an id given twice deletes nothing and is answered INVALID_REQUEST
    once ("Duplicate topic name."), as is an entry with both a name and an id, or neither."""
    refused: list[Deletion] = []
    names: Counter[str] = Counter()
    ids: Counter[uuid.UUID] = Counter()
    for name, topic_id in pairs:
        if name is None and topic_id == _NO_ID:
            message = "Neither topic name nor id were specified."
            refused.append((None, _NO_ID, Outcome(ErrorCode.invalid_request, message)))
        elif name is not None and topic_id != _NO_ID:
            message = "You may not specify both topic name and topic id."
            refused.append((name, topic_id, Outcome(ErrorCode.invalid_request, message)))
        elif name is not None:
            names[name] += 1
        else:
            ids[topic_id] += 1
    duplicate = Outcome(ErrorCode.invalid_request, "Duplicate topic name.")
    refused += [(name, _NO_ID, duplicate) for name, count in names.items() if count > 1]
    duplicate = Outcome(ErrorCode.invalid_request, "Duplicate topic id.")
    refused += [(None, topic_id, duplicate) for topic_id, count in ids.items() if count > 1]
    return (
        [name for name, count in names.items() if count == 1],
        [topic_id for topic_id, count in ids.items() if count == 1],
        refused,
    )


class CreatePartitions:
    def __init__(self, state: NodeState) -> None:
        self._state = state

    async def __call__(self, context: RequestContext, request: Any) -> ResponseBody:
        version = context.header.api_version
        schema = response_module(ApiKey.CREATE_PARTITIONS, version)
        wanted = [
            (
                topic.name,
                topic.count,
                None
                if topic.assignments is None
                else [tuple(a.broker_ids) for a in topic.assignments],
            )
            for topic in request.topics
        ]

        def decide(controller: QuorumController) -> tuple[list[Any], list[Any]]:
            records, outcomes = controller.create_partitions_all(wanted)
            return ([] if request.validate_only else records), outcomes

        outcomes = await self._state.metadata.propose(decide)

        def answer(pair: tuple[tuple[str, Any, Any], Outcome]) -> Any:
            (name, _, _), outcome = pair
            return build(
                schema.CreatePartitionsTopicResult,
                name=name,
                error_code=outcome.error,
                error_message=outcome.message,
            )

        results = await in_turns(answer, zip(wanted, outcomes, strict=True))
        response: ResponseBody = build(
            schema.CreatePartitionsResponse, throttle_time=NO_THROTTLE, results=tuple(results)
        )
        return response
