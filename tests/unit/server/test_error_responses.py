"""A handler that fails answers with its API's error response, at every version the broker
serves, instead of closing the client's connection: every item the request named comes back
with the error and its identity, so the client retries or reports that item."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from broker.handlers import classify_error
from broker.handlers.errors import error_response
from broker.protocol import SUPPORTED, ApiKey, ErrorCode, RequestHeader, request_type
from broker.protocol.messages import decode_response, encode_request
from broker.protocol.versions import is_decodable
from broker.quorum import NotController
from broker.server import CloseConnection, Dispatcher, RequestContext
from broker.storage import LogOffline
from tests.support.requests import ANY_TOPIC_ID, TEMPLATES, TOPIC, error_codes, fill

CASES = [
    (api_key, version)
    for api_key in sorted(TEMPLATES)
    for version in SUPPORTED[api_key]
    if is_decodable(api_key, version)
]


def _dispatch(api_key: ApiKey, version: int, body: Any, failure: Exception) -> Any:
    async def failing(context: RequestContext, request: Any) -> None:
        raise failure

    dispatcher = Dispatcher({api_key: failing}, fallback=error_response, classify=classify_error)
    frame = encode_request(RequestHeader(api_key, version, 7, "unit"), body)[4:]
    answer = asyncio.run(dispatcher.dispatch(frame, "PLAINTEXT", "127.0.0.1:1"))
    assert isinstance(answer, bytes)
    correlation_id, response = decode_response(api_key, version, answer[4:])
    assert correlation_id == 7
    return response


@pytest.mark.parametrize(
    ("api_key", "version"), CASES, ids=[f"{ApiKey(k).name}-v{v}" for k, v in CASES]
)
def test_a_failed_handler_answers_with_the_apis_error_response(
    api_key: ApiKey, version: int
) -> None:
    body = fill(request_type(api_key, version), TEMPLATES[api_key](version, ANY_TOPIC_ID))
    response = _dispatch(api_key, version, body, RuntimeError("a bug"))
    codes = [code for _, code in error_codes(response)]
    if api_key == ApiKey.DESCRIBE_LOG_DIRS and version < 3:
        # No error field before v3: Kafka's error response is no log dirs at all.
        assert response.results == ()
        return
    assert codes, "the response carries no error at all"
    assert set(codes) == {ErrorCode.unknown_server_error}
    # The items named come back named, so the client knows which failed.
    quoted = repr(TOPIC)
    if quoted in repr(body) and api_key not in (ApiKey.DESCRIBE_LOG_DIRS, ApiKey.DESCRIBE_CLUSTER):
        assert quoted in repr(response)


def test_a_failed_disk_under_a_handler_is_kafka_storage_error() -> None:
    body = fill(
        request_type(ApiKey.LIST_OFFSETS, 7), TEMPLATES[ApiKey.LIST_OFFSETS](7, ANY_TOPIC_ID)
    )
    response = _dispatch(ApiKey.LIST_OFFSETS, 7, body, LogOffline("log dir /d1 is offline"))
    ((partition,),) = [topic.partitions for topic in response.topics]
    assert partition.error_code == ErrorCode.kafka_storage_error
    assert response.topics[0].name == TOPIC


def test_an_acks_0_produce_that_fails_closes_the_connection() -> None:
    values = dict(TEMPLATES[ApiKey.PRODUCE](9, ANY_TOPIC_ID), acks=0)
    body = fill(request_type(ApiKey.PRODUCE, 9), values)

    async def failing(context: RequestContext, request: Any) -> None:
        raise RuntimeError("a bug")

    dispatcher = Dispatcher(
        {ApiKey.PRODUCE: failing}, fallback=error_response, classify=classify_error
    )
    frame = encode_request(RequestHeader(ApiKey.PRODUCE, 9, 7, "unit"), body)[4:]
    with pytest.raises(CloseConnection):
        asyncio.run(dispatcher.dispatch(frame, "PLAINTEXT", "127.0.0.1:1"))


def test_an_admin_write_on_a_node_that_is_not_the_controller_is_no_error_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """DeleteTopics while the controller moves is answered NOT_CONTROLLER, which the client
    retries: the node logs it at INFO, not as a failed handler with a traceback (the
    fault-injection run's 1,000 faults logged 140 such ERRORs)."""
    body = fill(
        request_type(ApiKey.DELETE_TOPICS, 6), TEMPLATES[ApiKey.DELETE_TOPICS](6, ANY_TOPIC_ID)
    )
    with caplog.at_level(logging.INFO, logger="broker.server.dispatcher"):
        response = _dispatch(ApiKey.DELETE_TOPICS, 6, body, NotController(2))
    assert {code for _, code in error_codes(response)} == {ErrorCode.not_controller}
    assert [r.levelname for r in caplog.records] == ["INFO"]
    assert "handler failed" not in caplog.text
